//! Cost of one DRM backend tick on a host of 200 processes × 20 descriptors each (issue 20):
//! the /proc walk (a `readlink` per descriptor, the fdinfo of each DRM one), the
//! per-client dedup, engine deltas, sysfs and hwmon reads.
//!
//! The tree is generated in a temporary directory (tmpfs or disk, not procfs: the kernel's
//! own cost of printing fdinfo is not in it; see docs/benchmarks.md). `raw_walk_*` makes
//! the same file-system calls with nothing around them: the yardstick: one amdgpu card from
//! `testdata/drm/amdgpu-dgpu`, and per process 20 descriptors of which `drm` are DRM
//! nodes (pairs sharing one client, as a `dup` does) and the rest `/dev/null`.
//!
//!   cargo bench -p vramctl-core --bench drm
#![allow(missing_docs, clippy::unwrap_used, clippy::print_stdout)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use vramctl_core::clock::ClockTime;
use vramctl_gpu::Backend;
use vramctl_gpu::backend::drm::DrmBackend;

const PROCESSES: u32 = 200;
const FDS: u32 = 20;

fn copy(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        let kind = entry.file_type().unwrap();
        if kind.is_symlink() {
            symlink(fs::read_link(entry.path()).unwrap(), &target).unwrap();
        } else if kind.is_dir() {
            copy(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The tree: the amdgpu card's sysfs, `PROCESSES` × `FDS` descriptors, `drm` of them DRM.
fn tree(drm: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/drm/amdgpu-dgpu");
    copy(&fixture.join("sys"), &dir.path().join("sys"));
    let fdinfo = fs::read_to_string(fixture.join("proc/4100/fdinfo/5")).unwrap();
    for p in 0..PROCESSES {
        let pid = 10_000 + p;
        let proc_dir = dir.path().join(format!("proc/{pid}"));
        fs::create_dir_all(proc_dir.join("fd")).unwrap();
        fs::create_dir_all(proc_dir.join("fdinfo")).unwrap();
        for fd in 0..FDS {
            let (target, text) = if fd < drm {
                // Two descriptors per client.
                let client = pid * 100 + fd / 2;
                (
                    "/dev/dri/renderD128",
                    fdinfo.replace(
                        "drm-client-id:\t4\n",
                        &format!("drm-client-id:\t{client}\n"),
                    ),
                )
            } else {
                (
                    "/dev/null",
                    "pos:\t0\nflags:\t0100002\nmnt_id:\t11\nino:\t40\n".to_owned(),
                )
            };
            symlink(target, proc_dir.join(format!("fd/{fd}"))).unwrap();
            fs::write(proc_dir.join(format!("fdinfo/{fd}")), text).unwrap();
        }
    }
    dir
}

fn bench(c: &mut Criterion) {
    for drm in [2, FDS] {
        let dir = tree(drm);
        let mut backend = DrmBackend::with_root(dir.path());
        let devices = backend.enumerate().unwrap().devices;
        assert_eq!(devices.len(), 1);
        let mut ms = 0;
        let mut tick = |backend: &mut DrmBackend| {
            ms += 1000;
            backend.begin_tick(ClockTime {
                unix_ms: 1_700_000_000_000 + ms,
                monotonic_ms: ms,
            });
            backend.read(&devices[0]).unwrap()
        };
        let reading = tick(&mut backend);
        println!(
            "{PROCESSES} processes × {FDS} fds, {drm} DRM each: {} processes listed",
            reading.processes.as_ref().map_or(0, Vec::len)
        );
        // The yardstick: the same file-system calls with nothing around them.
        let proc_dir = dir.path().join("proc");
        c.bench_function(&format!("raw_walk_{PROCESSES}x{FDS}_{drm}_drm"), |b| {
            b.iter(|| {
                let mut bytes = 0;
                for process in fs::read_dir(&proc_dir).unwrap() {
                    let process = process.unwrap().path();
                    for fd in fs::read_dir(process.join("fd")).unwrap() {
                        let fd = fd.unwrap();
                        let target = fs::read_link(fd.path()).unwrap();
                        if target.starts_with("/dev/dri") {
                            bytes +=
                                fs::read_to_string(process.join("fdinfo").join(fd.file_name()))
                                    .unwrap()
                                    .len();
                        }
                    }
                }
                std::hint::black_box(bytes)
            });
        });
        c.bench_function(&format!("drm_tick_{PROCESSES}x{FDS}_{drm}_drm"), |b| {
            b.iter(|| std::hint::black_box(tick(&mut backend)));
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
