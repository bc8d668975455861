//! A real full disk under `record` and `serve --record`: a small tmpfs holds the history, a
//! filler file fills it until writes fail, then is deleted. Sampling goes on, the ticks that
//! could not be written are one `write-failed` gap, writing resumes, and the write lock is
//! never held across the failure (`kill`'s audit row is refused for want of space, never for
//! "database is locked"). Mounting needs root (CAP_SYS_ADMIN): elsewhere these tests say
//! they are skipped; the store's own tests cover the same path with SQLite's page cap.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use vramctl_store::{Metric, OpenMode, Store, TimeRange, WRITE_FAILED};

use crate::harness::vramctl_std;
use crate::real_processes::{Holder, Scenario, audit_rows, ends, sleeper};
use crate::serve::{get, serve};

/// A tmpfs mounted on a fresh directory, unmounted (lazily: a process may still hold a
/// file there) when dropped.
struct SmallDisk {
    _dir: tempfile::TempDir,
    mount: PathBuf,
}

impl SmallDisk {
    /// A tmpfs of `size` (`mount -o size=`); `None`, said on stderr, where this test may
    /// not mount one (not root, a container without CAP_SYS_ADMIN).
    fn mount(size: &str, test: &str) -> Option<Self> {
        let dir = tempfile::tempdir().expect("temp dir");
        let mount = dir.path().join("disk");
        std::fs::create_dir(&mount).expect("mount point");
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(&mount)
            .output();
        match out {
            Ok(out) if out.status.success() => Some(Self { _dir: dir, mount }),
            other => {
                let why = match other {
                    Ok(out) => String::from_utf8_lossy(&out.stderr).trim().to_owned(),
                    Err(err) => err.to_string(),
                };
                eprintln!(
                    "SKIPPED {test}: cannot mount a tmpfs here ({why}); run as root to test a \
                     real full disk (the store's page-cap tests still ran)"
                );
                None
            }
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mount.join(name)
    }

    /// Fills the disk until a write fails for want of space (large writes, then single
    /// bytes for the last page's tail).
    fn fill(&self) {
        let mut filler = std::fs::File::create(self.path("filler")).expect("create the filler");
        for chunk in [64 * 1024, 1] {
            let buf = vec![0xA5u8; chunk];
            loop {
                match filler.write(&buf) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::StorageFull => break,
                    Err(err) => panic!("filling the disk: {err}"),
                }
            }
        }
    }

    /// Deletes the filler: space again.
    fn free(&self) {
        std::fs::remove_file(self.path("filler")).expect("remove the filler");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}

/// A recorder's stderr lines, read on a thread (so it never blocks on the pipe).
struct Log {
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl Log {
    fn of(child: &mut Child) -> Self {
        let stderr = child.stderr.take().expect("stderr piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            lines: rx,
            seen: Vec::new(),
        }
    }

    /// Reads until `n` more lines contain `what` (60 s at most).
    fn wait_for(&mut self, what: &str, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut found = 0;
        while found < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    found += usize::from(line.contains(what));
                    self.seen.push(line);
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    panic!("never {n} x {what:?}:\n{}", self.seen.join("\n"))
                }
            }
        }
    }

    /// Every line until the recorder closed stderr.
    fn drain(&mut self) {
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(60)) {
            self.seen.push(line);
        }
    }

    /// The `t_ms` of every line containing `what`.
    fn times(&self, what: &str) -> Vec<i64> {
        self.seen
            .iter()
            .filter(|l| l.contains(what))
            .filter_map(|l| {
                let rest = l.split("t_ms=").nth(1)?;
                rest.split_whitespace().next()?.parse().ok()
            })
            .collect()
    }
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// `vramctl kill --yes --json PID` with `db` as its audit log.
fn kill(scenario: &Scenario, db: &Path, pid: u32) -> std::process::Output {
    vramctl_std(scenario.path())
        .env("VRAMCTL_DB", db)
        .stdin(Stdio::null())
        .args(["kill", "--yes", "--json", &pid.to_string()])
        .output()
        .expect("run vramctl kill")
}

/// The failed COMMIT used to leave its transaction open: "Writing works again" 50 ms later,
/// yet no sample was ever written again, no gap said so, and `kill` with that history as
/// its audit log failed with "database is locked".
#[test]
fn a_full_disk_becomes_a_gap_and_recording_resumes_when_space_returns() {
    let Some(disk) = SmallDisk::mount(
        "16m",
        "a_full_disk_becomes_a_gap_and_recording_resumes_when_space_returns",
    ) else {
        return;
    };
    let db = disk.path("history.db");
    let during = sleeper();
    let mut after = sleeper();
    let scenario = Scenario::new(
        1,
        &[
            Holder::real(0, during.pid(), "2 GiB"),
            Holder::real(0, after.pid(), "3 GiB"),
        ],
    );
    let mut recorder = vramctl_std(scenario.path())
        .env("VRAMCTL_LOG", "vramctl=debug")
        .arg("--db")
        .arg(&db)
        .args(["record", "--interval", "50ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the recorder");
    let mut log = Log::of(&mut recorder);
    log.wait_for("Committed a tick.", 5);

    disk.fill();
    log.wait_for("Could not write a tick.", 5);
    // The write lock is free while writes fail: kill's audit row is refused because the
    // disk is full, never because the recorder holds the database; and without its row
    // nothing is signalled.
    let refused = kill(&scenario, &db, during.pid());
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(!said.contains("locked"), "{said}");
    assert!(said.contains("is full"), "{said}");
    assert_ne!(refused.status.code(), Some(0), "{said}");
    assert!(during.alive(), "nothing is signalled without its audit row");

    disk.free();
    log.wait_for("Writing works again", 1);
    log.wait_for("Committed a tick.", 5);
    let killed = kill(&scenario, &db, after.pid());
    assert_eq!(
        killed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&killed.stderr)
    );
    assert!(ends(after.pid()));
    assert_eq!(after.killed_by(), Some(15));
    log.wait_for("Committed a tick.", 3);
    sigterm(&recorder);
    log.drain();
    let status = recorder.wait().expect("wait for the recorder");
    assert_eq!(status.code(), Some(0), "{}", log.seen.join("\n"));

    let committed = log.times("Committed a tick.");
    let failed = log.times("Could not write a tick.");
    assert!(failed.len() >= 5, "{failed:?}");
    let mut store = Store::open(&db, OpenMode::ReadOnly).expect("open the history");
    assert_eq!(store.integrity_check().unwrap(), vec!["ok".to_owned()]);
    // Every tick committed is stored, and nothing else.
    let device = store.devices().unwrap()[0].id;
    let stored: Vec<i64> = store
        .device_metric(device, Metric::UsedBytes, TimeRange::ALL)
        .unwrap()
        .iter()
        .map(|p| p.unix_ms)
        .collect();
    assert_eq!(stored, committed);
    // One gap, covering exactly the ticks that could not be written.
    let gaps: Vec<_> = store
        .gaps(TimeRange::ALL)
        .unwrap()
        .into_iter()
        .filter(|g| g.reason.starts_with(WRITE_FAILED))
        .collect();
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    let gap = &gaps[0];
    let (first, last) = (failed[0], failed[failed.len() - 1]);
    assert_eq!((gap.from_ms, gap.to_ms), (first, last));
    assert_eq!(
        gap.reason,
        format!(
            "{WRITE_FAILED}: disk full; {} samples not written",
            failed.len()
        )
    );
    assert!(
        !stored.iter().any(|t| (first..=last).contains(t)),
        "no stored tick inside the gap"
    );
    assert!(stored.iter().filter(|&&t| t > last).count() >= 8);
    // The audit log has the kill after the failure, and nothing of the one refused.
    let rows = audit_rows(&db);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].record.target.pid, after.pid());

    // `history` reads the samples after the gap, and the gap with its reason.
    let out = vramctl_std(scenario.path())
        .arg("--db")
        .arg(&db)
        .args(["history", "--since", "all", "--format", "json"])
        .output()
        .expect("run vramctl history");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let samples: Vec<i64> = json["devices"][0]["samples"]
        .as_array()
        .expect("samples")
        .iter()
        .filter_map(|s| s["unix_ms"].as_i64())
        .collect();
    assert_eq!(samples, committed);
    assert!(
        json["gaps"]
            .as_array()
            .expect("gaps")
            .iter()
            .any(|g| g["reason"].as_str() == Some(gap.reason.as_str())),
        "{}",
        json["gaps"]
    );
}

/// `serve --record`'s `/healthz` said "ok" while no sample was written.
#[test]
fn serve_record_healthz_says_degraded_while_the_disk_is_full() {
    let Some(disk) = SmallDisk::mount(
        "16m",
        "serve_record_healthz_says_degraded_while_the_disk_is_full",
    ) else {
        return;
    };
    let db = disk.path("history.db");
    let db_arg = db.to_str().expect("utf-8 path");
    let scenario = Scenario::new(1, &[]);
    let served = serve(
        vramctl_std(scenario.path()),
        &["--interval", "0.05", "--record", db_arg],
    );
    let health_until = |what: &str, done: &dyn Fn(u16, &str) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = get(served.addr, "/healthz", &[]);
            if done(r.status, &r.body) {
                return r.body;
            }
            assert!(
                Instant::now() < deadline,
                "never {what}: {} {}",
                r.status,
                r.body
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    health_until("ok", &|status, body| status == 200 && body == "ok\n");
    disk.fill();
    let degraded = health_until("degraded", &|status, body| {
        status == 503 && body.starts_with("degraded: history writes have failed")
    });
    assert!(degraded.contains("is full"), "{degraded}");
    assert!(degraded.contains("metrics are served"), "{degraded}");
    // Metrics are still served meanwhile.
    assert_eq!(get(served.addr, "/metrics", &[]).status, 200);
    disk.free();
    health_until("ok again", &|status, body| status == 200 && body == "ok\n");
    std::thread::sleep(Duration::from_millis(300));
    let mut served = served;
    sigterm(&served.child);
    assert!(served.child.wait().expect("wait for serve").success());

    let mut store = Store::open(&db, OpenMode::ReadOnly).expect("open the history");
    assert_eq!(store.integrity_check().unwrap(), vec!["ok".to_owned()]);
    let device = store.devices().unwrap()[0].id;
    let stored: Vec<i64> = store
        .device_metric(device, Metric::UsedBytes, TimeRange::ALL)
        .unwrap()
        .iter()
        .map(|p| p.unix_ms)
        .collect();
    let gaps: Vec<_> = store
        .gaps(TimeRange::ALL)
        .unwrap()
        .into_iter()
        .filter(|g| g.reason.starts_with(WRITE_FAILED))
        .collect();
    assert_eq!(gaps.len(), 1, "{gaps:?}");
    let gap = &gaps[0];
    assert!(
        !stored.iter().any(|t| (gap.from_ms..=gap.to_ms).contains(t)),
        "no stored tick inside the gap"
    );
    assert!(stored.iter().any(|&t| t < gap.from_ms));
    assert!(stored.iter().any(|&t| t > gap.to_ms), "written after it");
}
