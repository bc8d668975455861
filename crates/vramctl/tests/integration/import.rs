//! `import` (and `leaks FILE`, which reads files through the same importer): what goes in
//! comes out again, one transaction per import, the sanity rules of live samples, logs
//! without a GPU column, real GPU-Z logs, each file read as its own kind, a file's control
//! characters never echoed raw.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::harness::{MovedPids, scenario, stdout_of, vramctl, vramctl_std};

/// 2026-11-29T20:31:31Z.
const T0: i64 = 1_795_984_291_000;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/import")
        .join(name)
}

fn gpuz_log(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/gpuz")
        .join(name)
}

fn on_db(db: &Path) -> assert_cmd::Command {
    let mut cmd = vramctl(&scenario("h200-idle.toml"));
    cmd.arg("--db").arg(db);
    cmd
}

fn import(db: &Path, args: &[&str], files: &[&Path]) -> Output {
    let mut cmd = on_db(db);
    cmd.args(["import", "--tz", "UTC"]).args(args);
    for f in files {
        cmd.arg(f);
    }
    cmd.output().expect("run vramctl")
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "vramctl failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn export(db: &Path, format: &str) -> String {
    stdout_of(on_db(db).args(["export", "--tz", "UTC", "--format", format]))
}

#[test]
fn smi_apps_export_reimports_command_lines_with_commas_quotes_and_newlines() {
    let dir = tempfile::tempdir().unwrap();
    let scenario = dir.path().join("scenario.toml");
    // The fictional PIDs moved to free ones: a real process on one mid-record would be
    // recorded with its own command line.
    let moved = MovedPids::new(&[32701, 32702]);
    std::fs::write(
        &scenario,
        moved.scenario(
            r#"[clock]
mode = "step"
step_s = 1.0

[[gpu]]
name = "NVIDIA H200"
uuid = "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2"
pci_bus_id = "00000000:00:06.0"
memory_total = 150754820096

[[gpu.process]]
pid = 32701
name = "python train.py --lr=0.1,0.2 --tag \"a, b\""
memory = { steps = { values = ["1 GiB", "2 GiB", "3 GiB"], every_s = 1.0 } }

[[gpu.process]]
pid = 32702
name = "bash -c 'echo one\necho two'"
memory = "2 GiB"
"#,
        ),
    )
    .unwrap();
    let (a, b) = (dir.path().join("a.db"), dir.path().join("b.db"));
    let recorded = vramctl(&scenario)
        .env_remove("FAKE_NVML_TIME")
        .arg("--db")
        .arg(&a)
        .args(["record", "--interval", "1s", "--ticks", "3"])
        .args(["--simulated-clock", &T0.to_string()])
        .output()
        .unwrap();
    ok(&recorded);
    let apps = export(&a, "smi-apps");
    assert!(
        apps.contains(r#"" python train.py --lr=0.1,0.2 --tag ""a, b"""#),
        "{apps}"
    );
    assert!(apps.contains("echo one\necho two"), "{apps}");
    let file = dir.path().join("apps.csv");
    std::fs::write(&file, &apps).unwrap();
    let gpu = dir.path().join("gpu.csv");
    std::fs::write(&gpu, export(&a, "smi-gpu")).unwrap();
    let stderr = ok(&import(&b, &["--strict"], &[&gpu, &file]));
    assert!(!stderr.contains("skipped"), "{stderr}");
    assert_eq!(
        export(&b, "smi-apps"),
        apps,
        "the same rows, command lines whole"
    );
    // And the command lines are stored whole, not only written back alike.
    let csv = stdout_of(on_db(&b).args(["history", "--since", "all", "--format", "csv"]));
    assert!(
        csv.contains(r#""python train.py --lr=0.1,0.2 --tag ""a, b""""#),
        "{csv}"
    );
    assert!(csv.contains("\"bash -c 'echo one\necho two'\""), "{csv}");
}

/// An nvidia-smi GPU log and apps log of one GPU and one process for `seconds` seconds.
fn large_logs(dir: &Path, seconds: usize) -> (PathBuf, PathBuf) {
    use std::fmt::Write;
    let uuid = "GPU-00000000-1111-2222-3333-444444444444";
    let mut gpu = String::from(
        "timestamp, index, uuid, memory.total [MiB], memory.used [MiB], utilization.gpu [%]\n",
    );
    let mut apps = String::from("timestamp, gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n");
    for s in 0..seconds {
        let stamp = format!(
            "2026/11/{:02} {:02}:{:02}:{:02}.000",
            1 + s / 86_400,
            s / 3600 % 24,
            s / 60 % 60,
            s % 60
        );
        let used = 1000 + (s * 7) % 50_000;
        writeln!(
            gpu,
            "{stamp}, 0, {uuid}, 143771 MiB, {used} MiB, {} %",
            s % 100
        )
        .expect("write the logs");
        writeln!(apps, "{stamp}, {uuid}, 1000, python w.py, {} MiB", used / 2)
            .expect("write the logs");
    }
    let (g, a) = (dir.join("gpu.csv"), dir.join("apps.csv"));
    std::fs::write(&g, gpu).expect("write the logs");
    std::fs::write(&a, apps).expect("write the logs");
    (g, a)
}

fn spawn_import(db: &Path, files: &[&Path], pause: Option<(&str, &Path)>) -> std::process::Child {
    let mut cmd = vramctl_std(&scenario("h200-idle.toml"));
    cmd.arg("--db")
        .arg(db)
        .args(["import", "--tz", "UTC"])
        .args(files)
        .stderr(std::process::Stdio::null());
    if let Some((point, ready)) = pause {
        cmd.env(
            vramctl_store::format::TEST_PAUSE_ENV,
            format!("{point}:{}", ready.display()),
        );
    }
    cmd.spawn().expect("start vramctl import")
}

#[test]
fn a_killed_import_leaves_the_history_as_it_was_and_the_retry_works() {
    // The import stops at a known point (a debug build's test hook), says so through a
    // file, and is killed there: before anything is written, after the first sample, and
    // with everything written but not committed. Guessing the moment from CPU time was
    // flaky under load (the kill could land after the commit).
    if !cfg!(debug_assertions) {
        eprintln!("SKIPPED: the import's pause hook exists only in debug builds");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (gpu, apps) = large_logs(dir.path(), 600);
    let clean = dir.path().join("clean.db");
    assert!(
        spawn_import(&clean, &[&gpu, &apps], None)
            .wait()
            .unwrap()
            .success()
    );
    let db = dir.path().join("h.db");
    for point in ["begin", "written", "commit"] {
        let ready = dir.path().join(format!("ready-{point}"));
        let mut child = spawn_import(&db, &[&gpu, &apps], Some((point, &ready)));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while !ready.exists() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the import ended ({status}) before it reached '{point}'");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the import did not reach '{point}' in 120 s"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        child.kill().unwrap();
        let status = child.wait().unwrap();
        assert!(status.code().is_none(), "killed at '{point}': {status}");
        // Nothing of it is in the history.
        let out = on_db(&db)
            .args(["history", "--since", "all", "--format", "csv"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).lines().count(),
            1,
            "only the header: the import killed at '{point}' left rows"
        );
    }
    // The same import again works, and gives what the clean import gave.
    ok(&import(&db, &[], &[&gpu, &apps]));
    assert_eq!(export(&db, "smi-gpu"), export(&clean, "smi-gpu"));
    assert_eq!(export(&db, "smi-apps"), export(&clean, "smi-apps"));
}

#[test]
fn the_gpu_log_and_the_apps_log_of_one_run_import_in_two_commands() {
    let dir = tempfile::tempdir().unwrap();
    let (gpu, apps) = (fixture("smi-gpu-h200.csv"), fixture("smi-apps-h200.csv"));
    let one = dir.path().join("one.db");
    ok(&import(&one, &[], &[&gpu, &apps]));
    for (name, first, second) in [
        ("gpu-then-apps", &gpu, &apps),
        ("apps-then-gpu", &apps, &gpu),
    ] {
        let two = dir.path().join(format!("{name}.db"));
        ok(&import(&two, &[], &[first]));
        ok(&import(&two, &[], &[second]));
        assert_eq!(export(&two, "smi-gpu"), export(&one, "smi-gpu"), "{name}");
        assert_eq!(export(&two, "smi-apps"), export(&one, "smi-apps"), "{name}");
        let leaks = |db: &Path| {
            let mut v: serde_json::Value = serde_json::from_str(&stdout_of(
                on_db(db).args(["leaks", "--since", "all", "--json"]),
            ))
            .unwrap();
            v["database"] = serde_json::Value::Null;
            v
        };
        assert_eq!(leaks(&two), leaks(&one), "{name}");
    }
    // Longer than a key-frame interval and a read batch of the merge: 3 000 s at 1 s.
    let (big_gpu, big_apps) = large_logs(dir.path(), 3_000);
    let one_big = dir.path().join("one-big.db");
    ok(&import(&one_big, &[], &[&big_gpu, &big_apps]));
    let two_big = dir.path().join("two-big.db");
    ok(&import(&two_big, &[], &[&big_gpu]));
    ok(&import(&two_big, &[], &[&big_apps]));
    assert_eq!(export(&two_big, "smi-gpu"), export(&one_big, "smi-gpu"));
    assert_eq!(export(&two_big, "smi-apps"), export(&one_big, "smi-apps"));
    // The same log twice is not merged: it would count every sample twice.
    let again = import(&one, &[], &[&apps]);
    assert_eq!(again.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(stderr.contains("already has process lists"), "{stderr}");
}

#[test]
fn imported_values_get_the_sanity_checks_of_live_samples() {
    let dir = tempfile::tempdir().unwrap();
    let gpu = dir.path().join("gpu.csv");
    let uuid = "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2";
    std::fs::write(
        &gpu,
        format!(
            "timestamp, uuid, memory.total [MiB], memory.used [MiB]\n\
             2026/11/29 20:31:30.000, {uuid}, 1000 MiB, 10 MiB\n\
             2026/11/29 20:31:31.000, {uuid}, 1000 MiB, 2000 MiB\n\
             2026/11/29 20:31:32.000, {uuid}, 1000 MiB, 8796093022208 MiB\n\
             2026/11/29 20:31:33.000, {uuid}, 2000000 MiB, 1194 GB\n\
             2026/11/29 20:31:34.000, {uuid}, 1000 MiB, 1194 bananas\n\
             2026/11/29 20:31:35.000, {uuid}, 1000 MiB, 20 MiB\n"
        ),
    )
    .unwrap();
    let apps = dir.path().join("apps.csv");
    std::fs::write(
        &apps,
        format!(
            "timestamp, gpu_uuid, pid, used_gpu_memory [MiB]\n\
             2026/11/29 20:31:30.500, {uuid}, 4242, 5 MiB\n\
             2026/11/29 20:31:31.500, {uuid}, 4242, 3000000 MiB\n\
             2026/11/29 20:31:32.500, {uuid}, 0, 5 MiB\n"
        ),
    )
    .unwrap();
    let db = dir.path().join("h.db");
    let strict = import(&db, &["--strict"], &[&gpu]);
    assert_eq!(strict.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert!(
        stderr.starts_with(&format!(
            "vramctl: error: {}:3: impossible memory: used 2097152000 bytes is more than the total",
            gpu.display()
        )),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let stderr = ok(&import(&db, &[], &[&gpu, &apps]));
    let file = gpu.display();
    for (line, what) in [
        (
            3,
            "used 2097152000 bytes is more than the total 1048576000 bytes",
        ),
        (4, "more than any GPU has (2^50 bytes, 1 PiB)"),
        (6, "'1194 bananas': 'bananas' is not a unit of memory"),
    ] {
        assert!(
            stderr.contains(&format!("skipped {file}:{line}: ")),
            "{line}: {stderr}"
        );
        assert!(stderr.contains(what), "{what}: {stderr}");
    }
    let file = apps.display();
    assert!(
        stderr.contains(&format!(
            "skipped {file}:3: impossible process entry: 3145728000000 bytes is more than the \
             device's 2097152000000 bytes"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "skipped {file}:4: impossible process entry: pid 0"
        )),
        "{stderr}"
    );
    // `vramctl status --json` lines get the same rules.
    let status = stdout_of(vramctl(&scenario("h200-idle.toml")).args(["status", "--json"]));
    let mut doc: serde_json::Value = serde_json::from_str(&status).unwrap();
    let total = doc["devices"][0]["memory"]["total_bytes"].as_u64().unwrap();
    doc["devices"][0]["memory"]["used_bytes"] = (total + 1).into();
    let status_file = dir.path().join("status.ndjson");
    std::fs::write(&status_file, format!("{doc}\n")).unwrap();
    let out = import(&dir.path().join("s.db"), &["--strict"], &[&status_file]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}:1: impossible memory: used",
            status_file.display()
        )),
        "{stderr}"
    );
    // `1194 GB` in a [MiB] column is 1194 GB (1138687 MiB), not 1194 MiB.
    let rows = export(&db, "smi-gpu");
    assert!(rows.contains(", 1138687 MiB,"), "{rows}");
    assert!(!rows.contains(", 1194 MiB,"), "{rows}");
}

#[test]
fn an_apps_log_without_a_gpu_column_goes_on_its_only_gpu_or_on_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let apps = dir.path().join("apps.csv");
    std::fs::write(
        &apps,
        "timestamp, pid, used_gpu_memory [MiB]\n\
         2026/11/29 20:31:37.352, 456, 6308 MiB\n\
         2026/11/29 20:31:37.852, 456, 6400 MiB\n\
         2026/11/29 20:31:38.352, 456, 6500 MiB\n",
    )
    .unwrap();
    let gpu = fixture("smi-gpu-h200.csv");
    // With its GPU log (one GPU): on that GPU, said in a note.
    let db = dir.path().join("a.db");
    let stderr = ok(&import(&db, &[], &[&gpu, &apps]));
    assert!(
        stderr.contains(&format!(
            "vramctl: note: '{}' has no GPU column: its rows are put on GPU 0 \
             (GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2), the only GPU of the other files",
            apps.display()
        )),
        "{stderr}"
    );
    let rows = export(&db, "smi-apps");
    assert!(
        rows.contains("GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2, 456, [N/A], 6500 MiB"),
        "{rows}"
    );
    // Imported after its GPU log, by a second command: on the history's GPU.
    let db = dir.path().join("b.db");
    ok(&import(&db, &[], &[&gpu]));
    let stderr = ok(&import(&db, &[], &[&apps]));
    assert!(stderr.contains("the only GPU of the history"), "{stderr}");
    // Alone: one unnamed GPU.
    let db = dir.path().join("c.db");
    let stderr = ok(&import(&db, &[], &[&apps]));
    assert!(
        stderr.contains("a single unnamed GPU 'GPU-unnamed'"),
        "{stderr}"
    );
    // leaks on the file reads it the same way, with and without --skip-bad-rows.
    for extra in [&[][..], &["--skip-bad-rows"]] {
        let out = on_db(&dir.path().join("none.db"))
            .args(["leaks", "--tz", "UTC"])
            .args(extra)
            .arg(&apps)
            .output()
            .unwrap();
        let stderr = ok(&out);
        assert!(stderr.contains("has no GPU column"), "{stderr}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("GPU-unnamed"));
    }
    // With two GPUs in the other file: refused, naming them; --gpu chooses.
    let two = dir.path().join("two.csv");
    std::fs::write(
        &two,
        "timestamp, index, uuid, memory.total [MiB], memory.used [MiB]\n\
         2026/11/29 20:31:37.000, 0, GPU-aaaaaaaa-0000-0000-0000-000000000000, 1000 MiB, 10 MiB\n\
         2026/11/29 20:31:37.000, 1, GPU-bbbbbbbb-0000-0000-0000-000000000000, 80000 MiB, 10 MiB\n",
    )
    .unwrap();
    let db = dir.path().join("d.db");
    let out = import(&db, &[], &[&two, &apps]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim(),
        format!(
            "vramctl: error: '{}' has no gpu_uuid or gpu_bus_id column, and its rows could be on \
             any of the 2 GPUs of the other files: 0 (GPU-aaaaaaaa-0000-0000-0000-000000000000), \
             1 (GPU-bbbbbbbb-0000-0000-0000-000000000000); name the GPU of its rows with --gpu \
             (an index or UUID)",
            apps.display()
        )
    );
    assert!(!db.exists(), "a failed import leaves no database behind");
    let stderr = ok(&import(&db, &["--gpu", "1"], &[&two, &apps]));
    assert!(
        stderr.contains("its rows are put on GPU 1 (GPU-bbbbbbbb"),
        "{stderr}"
    );
    assert!(export(&db, "smi-apps").contains("GPU-bbbbbbbb-0000-0000-0000-000000000000, 456,"));
    let out = on_db(&dir.path().join("none.db"))
        .args(["leaks", "--tz", "UTC", "--gpu", "1"])
        .arg(&two)
        .arg(&apps)
        .output()
        .unwrap();
    ok(&out);
}

#[test]
fn control_characters_from_a_file_are_escaped_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("evil.csv");
    std::fs::write(
        &file,
        "timestamp, uuid, memory.used [MiB]\n\
         2026/11/29 20:31:30.000, GPU-x, \x1b[2J\x1b]0;owned\x07 MiB\n\
         \x1b[31myesterday\x08, GPU-x, 5 MiB\n",
    )
    .unwrap();
    let out = import(&dir.path().join("h.db"), &[], &[&file]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains('\x1b') && !stderr.contains('\x07') && !stderr.contains('\x08'),
        "{stderr:?}"
    );
    assert!(stderr.contains(r"\u{1b}[2J\u{1b}]0;owned\u{7}"), "{stderr}");
    assert!(stderr.contains(r"'\u{1b}[31myesterday\u{8}'"), "{stderr}");
    // A first line that is no known header is quoted escaped too.
    std::fs::write(&file, "\x1b[5mhello, world\n").unwrap();
    let out = import(&dir.path().join("h.db"), &[], &[&file]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(r"'\u{1b}[5mhello, world'"), "{stderr}");
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
}

#[test]
fn each_file_is_read_as_its_own_kind_with_input_format_ndjson() {
    let dir = tempfile::tempdir().unwrap();
    // An export (of an imported H200 log) and `status --json --watch` output.
    let source = dir.path().join("source.db");
    ok(&import(&source, &[], &[&fixture("smi-gpu-h200.csv")]));
    let export_file = dir.path().join("export.ndjson");
    std::fs::write(&export_file, export(&source, "ndjson")).unwrap();
    let status_file = dir.path().join("status.ndjson");
    let status = stdout_of(vramctl(&scenario("h200-idle.toml")).args(["status", "--json"]));
    std::fs::write(&status_file, status.replace('\n', "") + "\n").unwrap();
    let db = dir.path().join("h.db");
    let stderr = ok(&import(
        &db,
        &["--input-format", "ndjson"],
        &[&export_file, &status_file],
    ));
    assert!(stderr.contains("export.ndjson (ndjson)"), "{stderr}");
    assert!(stderr.contains("status.ndjson (status-json)"), "{stderr}");
    let out = on_db(&dir.path().join("none.db"))
        .args(["leaks", "--input-format", "ndjson", "--json"])
        .arg(&export_file)
        .arg(&status_file)
        .output()
        .unwrap();
    ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["files"][0]["format"], "ndjson");
    assert_eq!(json["files"][1]["format"], "status-json");
}

/// Rows with a memory value in the smi-gpu export of a GPU-Z log's import.
fn gpuz_memory_rows(db: &Path) -> Vec<String> {
    stdout_of(on_db(db).args([
        "export",
        "--tz",
        "UTC",
        "--format",
        "smi-gpu",
        "--query",
        "timestamp,memory.used",
    ]))
    .lines()
    .skip(1)
    .filter(|l| !l.contains("[N/A]"))
    .map(str::to_owned)
    .collect()
}

#[test]
fn real_gpuz_logs_keep_their_memory_and_their_logging_sessions() {
    let dir = tempfile::tempdir().unwrap();
    // The logs the column table was drawn from, then the held-out ones (testdata/gpuz/README.md):
    // (file, data rows, rows with memory, logging sessions, first memory value).
    let logs: [(&str, usize, usize, usize, &str); 7] = [
        (
            "nvidia-2016-older-gpuz.txt",
            268,
            265,
            3,
            "2016/01/09 15:10:13.000, 0 MiB",
        ),
        (
            "amd-rx580-2017.txt",
            3,
            3,
            1,
            "2017/06/17 15:37:57.000, 213 MiB",
        ),
        (
            "amd-rx5700xt-2020.txt",
            273,
            273,
            3,
            "2020/03/16 17:13:05.000, 534 MiB",
        ),
        (
            "nvidia-2021.txt",
            9,
            9,
            1,
            "2021/08/02 23:28:33.000, 1697 MiB",
        ),
        (
            "nvidia-2023.txt",
            249,
            248,
            1,
            "2023/06/16 10:17:08.000, 7469 MiB",
        ),
        (
            "nvidia-2024.txt",
            249,
            249,
            1,
            "2024/04/20 13:02:09.000, 5392 MiB",
        ),
        (
            "nul-padded-header-2024.txt",
            47,
            47,
            1,
            "2024/04/11 14:43:15.000, 698 MiB",
        ),
    ];
    for (name, rows, with_memory, sessions, first) in logs {
        let db = dir.path().join(format!("{name}.db"));
        let stderr = ok(&import(&db, &["--strict"], &[&gpuz_log(name)]));
        assert!(
            stderr.contains(&format!("from {rows} rows of")),
            "{name}: {stderr}"
        );
        let memory = gpuz_memory_rows(&db);
        assert_eq!(memory.len(), with_memory, "{name}");
        assert_eq!(memory[0], first, "{name}");
        let gaps = stdout_of(on_db(&db).args(["history", "--since", "all", "--tz", "UTC"]));
        let session_gaps = gaps
            .matches("GPU-Z logging stopped and started again")
            .count();
        assert_eq!(session_gaps, sessions - 1, "{name}: {gaps}");
        if sessions > 1 {
            assert!(
                stderr.contains(&format!("holds {sessions} GPU-Z logging sessions")),
                "{stderr}"
            );
        }
    }
    // The dynamic (shared system) memory of AMD and older GPU-Z is not taken for VRAM.
    let stderr = ok(&import(
        &dir.path().join("dyn.db"),
        &[],
        &[&gpuz_log("amd-rx5700xt-2020.txt")],
    ));
    assert!(
        stderr.contains("Memory Used (Dynamic) [MB]"),
        "listed as ignored: {stderr}"
    );
}

/// The nvidia-smi logs of the H200 recording (`testdata/h200/README.md`).
fn h200_log(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/h200")
        .join(name)
}

/// Data lines of a CSV log (all but its header).
fn data_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .expect("as the test arranged")
        .lines()
        .count()
        - 1
}

fn history_json(db: &Path) -> serde_json::Value {
    let mut json: serde_json::Value = serde_json::from_str(&stdout_of(
        on_db(db).args(["history", "--since", "all", "--json"]),
    ))
    .expect("as the test arranged");
    // The range asked for ends now; everything else is the history's.
    json.as_object_mut()
        .expect("as the test arranged")
        .remove("to");
    json
}

/// `leaks --json` without what names the database.
fn leaks_json(db: &Path) -> serde_json::Value {
    let mut json: serde_json::Value = serde_json::from_str(&stdout_of(
        on_db(db).args(["leaks", "--since", "all", "--json", "--tz", "UTC"]),
    ))
    .expect("as the test arranged");
    json.as_object_mut()
        .expect("as the test arranged")
        .remove("database");
    json
}

fn process_rows(history: &serde_json::Value, pid: Option<u64>) -> usize {
    history["processes"]
        .as_array()
        .expect("as the test arranged")
        .iter()
        .filter(|p| pid.is_none_or(|pid| p["pid"] == pid))
        .map(|p| p["samples"].as_array().expect("as the test arranged").len())
        .sum()
}

#[test]
fn history_lists_each_logged_process_sample_once() {
    // The GPU log and the apps log alternate (their loops are milliseconds apart): each
    // imported frame samples one of them, and the other's values are only carried over.
    // `history` once listed those too: 4,250 apps-log rows became 8,496 process rows.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let (gpu, apps) = (
        h200_log("smi-query-gpu.csv"),
        h200_log("smi-query-compute-apps.csv"),
    );
    ok(&import(&db, &[], &[&gpu, &apps]));
    let history = history_json(&db);
    assert_eq!(process_rows(&history, None), data_lines(&apps));
    // PID 1013 (the 4 GiB check) is in three lines of the apps log.
    let lines_1013 = std::fs::read_to_string(&apps)
        .unwrap()
        .lines()
        .filter(|l| l.contains(", 1013, "))
        .count();
    assert_eq!(lines_1013, 3);
    assert_eq!(process_rows(&history, Some(1013)), lines_1013);
    let device_rows: usize = history["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["samples"].as_array().unwrap().len())
        .sum();
    assert_eq!(device_rows, data_lines(&gpu));

    // An apps log of another day, imported with a GPU log of a later one: its processes
    // are not listed through the later log's samples.
    let later = dir.path().join("later-gpu.csv");
    let text = std::fs::read_to_string(&gpu)
        .unwrap()
        .replace("2026/11/29", "2026/12/08");
    std::fs::write(&later, text).unwrap();
    let db2 = dir.path().join("two-days.db");
    ok(&import(&db2, &[], &[&apps, &later]));
    let history = history_json(&db2);
    assert_eq!(process_rows(&history, None), data_lines(&apps));
    for p in history["processes"].as_array().unwrap() {
        for s in p["samples"].as_array().unwrap() {
            assert!(s["t"].as_str().unwrap().starts_with("2026-11-29"), "{s}");
        }
    }
}

/// Imports `files` into a fresh database and returns it.
fn imported(dir: &Path, name: &str, files: &[&Path]) -> PathBuf {
    let db = dir.join(name);
    let stderr = ok(&import(&db, &["--strict"], files));
    assert!(!stderr.contains("skipped"), "{stderr}");
    db
}

/// What nvidia-smi's CSV cannot carry, taken out of `history --json` or `leaks --json`: a
/// process's identity beyond its PID and name (boot id, start time, user, container) and
/// the per-process SM samples that are idle evidence.
fn without_what_smi_cannot_carry(mut json: serde_json::Value) -> serde_json::Value {
    for key in ["processes", "series"] {
        for p in json[key].as_array_mut().into_iter().flatten() {
            let p = p.as_object_mut().expect("as the test arranged");
            for field in [
                "boot_id",
                "start_time_ticks",
                "user",
                "container_id",
                "pod_uid",
            ] {
                p.remove(field);
            }
            if let Some(idle) = p.get_mut("idle").and_then(|i| i.as_object_mut()) {
                idle.remove("sources");
            }
        }
    }
    json
}

/// Exports `db` in each format, imports each export into a fresh database, and checks
/// that `history --json` and `leaks --json` say the same of every copy: everything through
/// NDJSON; through the two nvidia-smi CSV formats together everything they can hold.
fn assert_round_trips(dir: &Path, db: &Path) {
    let (history, leaks) = (history_json(db), leaks_json(db));
    let ndjson = dir.join("export.ndjson");
    std::fs::write(&ndjson, export(db, "ndjson")).expect("as the test arranged");
    let copy = imported(dir, "from-ndjson.db", &[&ndjson]);
    assert_eq!(
        history_json(&copy),
        history,
        "history after an ndjson round trip"
    );
    assert_eq!(leaks_json(&copy), leaks, "leaks after an ndjson round trip");

    let (gpu, apps) = (dir.join("export-gpu.csv"), dir.join("export-apps.csv"));
    std::fs::write(&gpu, export(db, "smi-gpu")).expect("as the test arranged");
    std::fs::write(&apps, export(db, "smi-apps")).expect("as the test arranged");
    let copy = imported(dir, "from-smi.db", &[&gpu, &apps]);
    assert_eq!(
        without_what_smi_cannot_carry(history_json(&copy)),
        without_what_smi_cannot_carry(history),
        "history after an smi-gpu + smi-apps round trip"
    );
    assert_eq!(
        without_what_smi_cannot_carry(leaks_json(&copy)),
        without_what_smi_cannot_carry(leaks),
        "leaks after an smi-gpu + smi-apps round trip"
    );
}

#[test]
fn export_and_import_again_keeps_every_sample_and_every_verdict() {
    // The H200 recording's nvidia-smi logs.
    let dir = tempfile::tempdir().unwrap();
    let db = imported(
        dir.path(),
        "h200.db",
        &[
            &h200_log("smi-query-gpu.csv"),
            &h200_log("smi-query-compute-apps.csv"),
        ],
    );
    assert_round_trips(dir.path(), &db);

    // A recorded leak that ends before the recording does: it was once imported back as
    // still on the GPU ("GPU 0 is full in …"), since an export cannot write a loop that
    // found no process — the importer now reads such a pause in the apps log as that loop.
    let scenario = dir.path().join("ended.toml");
    // Its PID moved to a free one, as for every recording of a fictional process.
    let moved = MovedPids::new(&[4242]);
    std::fs::write(
        &scenario,
        moved.scenario(
            r#"[clock]
mode = "step"
step_s = 1.0

[[gpu]]
name = "NVIDIA H200"
uuid = "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2"
memory_total = 150754820096

[[gpu.process]]
pid = 4242
name = "python leak.py"
end_s = 40
memory = { ramp = { from = "1 GiB", rate_per_s = "200 MiB" } }
"#,
        ),
    )
    .unwrap();
    let recorded = dir.path().join("recorded.db");
    ok(&vramctl(&scenario)
        .env_remove("FAKE_NVML_TIME")
        .arg("--db")
        .arg(&recorded)
        .args(["record", "--interval", "1s", "--ticks", "80"])
        .args(["--simulated-clock", &T0.to_string()])
        .output()
        .unwrap());
    let leaks = leaks_json(&recorded);
    let series = leaks["series"].as_array().unwrap();
    let leak = series.iter().find(|s| s["pid"] == moved.to(4242)).unwrap();
    assert_eq!(leak["time_to_full_sec"], serde_json::Value::Null, "{leak}");
    let round = dir.path().join("round");
    std::fs::create_dir(&round).unwrap();
    assert_round_trips(&round, &recorded);
}

#[test]
fn values_no_gpu_can_mean_become_gaps_with_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("gpu.csv");
    std::fs::write(
        &log,
        "timestamp, uuid, memory.total [MiB], memory.used [MiB], utilization.gpu [%], temperature.gpu, power.draw [W]\n\
         2026/11/29 20:31:31.000, GPU-1, 143771 MiB, 1000 MiB, 50 %, 40, 120.00 W\n\
         2026/11/29 20:31:32.000, GPU-1, 143771 MiB, 1000 MiB, 250 %, 900, 99999999 W\n\
         2026/11/29 20:31:33.000, GPU-1, 143771 MiB, 1000 MiB, 100 %, 41, 700.00 W\n",
    )
    .unwrap();
    let db = dir.path().join("h.db");
    let stderr = ok(&import(&db, &["--strict"], &[&log]));
    assert!(
        stderr.contains("3 values no GPU can mean were dropped"),
        "{stderr}"
    );
    let history = history_json(&db);
    let samples = history["devices"][0]["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 3);
    assert_eq!(samples[0]["utilization_gpu_percent"], 50);
    assert_eq!(samples[2]["utilization_gpu_percent"], 100);
    assert_eq!(samples[2]["power_mw"], 700_000);
    for field in ["utilization_gpu_percent", "temperature_c", "power_mw"] {
        assert_eq!(samples[1][field], serde_json::Value::Null, "{field}");
    }
    assert_eq!(samples[1]["used_bytes"], 1000u64 << 20);
    let gaps = history["gaps"].as_array().unwrap();
    let reasons: Vec<&str> = gaps.iter().filter_map(|g| g["reason"].as_str()).collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("250 % is more than 100 %")),
        "{reasons:?}"
    );
    assert!(reasons.iter().any(|r| r.contains("900 °C")), "{reasons:?}");
    assert!(
        reasons.iter().any(|r| r.contains("99999999 W")),
        "{reasons:?}"
    );
}

#[test]
fn quoted_fields_after_nvidia_smis_spaces_are_read_whole() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("apps.csv");
    std::fs::write(
        &log,
        "timestamp, gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n\
         2026/11/29 20:31:31.000, GPU-1, 4242, \"python a.py --tags x,y\", 100 MiB\n\
         2026/11/29 20:31:32.000, GPU-1, 4242, \"python a.py --tags x,y\", 200 MiB\n",
    )
    .unwrap();
    let db = dir.path().join("h.db");
    ok(&import(&db, &["--strict"], &[&log]));
    let history = history_json(&db);
    assert_eq!(
        history["processes"][0]["command"], "python a.py --tags x,y",
        "{history}"
    );
    assert_eq!(process_rows(&history, Some(4242)), 2);
}

#[test]
fn import_of_dev_zero_stops_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("h.db");
    let one_line = |out: &Output, what: &str| {
        assert_eq!(out.status.code(), Some(2), "{what}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{what}: {stderr}");
        stderr.into_owned()
    };
    // A device: refused before anything is read (it never ends).
    let stderr = one_line(&import(&db, &[], &[Path::new("/dev/zero")]), "/dev/zero");
    assert!(
        stderr.contains("'/dev/zero' is a character device, not a regular file"),
        "{stderr}"
    );
    let stderr = one_line(
        &import(
            &db,
            &["--input-format", "smi-gpu"],
            &[Path::new("/dev/zero")],
        ),
        "/dev/zero as smi-gpu",
    );
    assert!(stderr.contains("character device"), "{stderr}");
    // A FIFO nobody writes: refused at once (opening it does not wait for a writer).
    let fifo = dir.path().join("fifo");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let mut child = vramctl_std(&scenario("h200-idle.toml"))
        .arg("--db")
        .arg(&db)
        .arg("import")
        .arg(&fifo)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("import of a FIFO did not end in 30 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let stderr = one_line(&child.wait_with_output().unwrap(), "a FIFO");
    assert!(
        stderr.contains("a FIFO (a pipe), not a regular file"),
        "{stderr}"
    );
    // A file of one endless line (what /dev/zero copied into a file looks like): one line
    // at the limit, not the whole file in memory.
    let zeros = dir.path().join("zeros.csv");
    std::fs::write(
        &zeros,
        format!(
            "timestamp, uuid, memory.used [MiB]\n{}",
            "\0".repeat(vramctl_store::format::MAX_LINE_BYTES + 1)
        ),
    )
    .unwrap();
    let stderr = one_line(&import(&db, &[], &[&zeros]), "a line too long");
    assert!(
        stderr.contains(":2: the line is longer than 4 MiB"),
        "{stderr}"
    );
    // Nothing was created.
    assert!(!db.exists());
}
