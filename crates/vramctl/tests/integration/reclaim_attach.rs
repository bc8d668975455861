//! `vramctl reclaim --attach` run by root against another user's process, as that user would
//! attack it (issue 29, items 1 and 2). Each test creates its own user (`useradd`) and
//! removes it; without root they say so and pass without checking anything.
//!
//! The target is a copy of this machine's Python interpreter owned by the test user, named
//! `python3.14`, started as that user. Where a test needs the target to look like 3.14, the
//! copy's `Py_Version` constant is changed to 3.14 (nothing reads it but tools like
//! vramctl). The real `sys.remote_exec` needs 3.14 on both sides, which CI does not have:
//! there a root-owned stand-in helper in a root-owned directory hands the script's path to
//! the target through a file, and the target runs it on its main thread in `__main__`, as
//! `sys.remote_exec` would.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use vramctl_agent::remote_exec::{elf, helper};

use crate::harness::vramctl_std;
use crate::reclaim::scenario;

/// A user made for one test, removed (with its group and its files here) when dropped.
struct TestUser {
    name: String,
    uid: u32,
    gid: u32,
    /// `/tmp/vramctl-evil-…`: the user's own directory.
    home: PathBuf,
}

fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .expect("urandom");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

fn id_of(flag: &str, name: &str) -> u32 {
    let out = Command::new("id")
        .args([flag, name])
        .output()
        .expect("id runs");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a number")
}

impl TestUser {
    /// `None` (said on stderr) when not root or `useradd` fails.
    fn create(test: &str) -> Option<Self> {
        if rustix::process::geteuid().as_raw() != 0 {
            eprintln!("SKIPPED {test}: needs root to create a user and attach as root");
            return None;
        }
        let name = format!("vrat{}", random_hex(4));
        let made = Command::new("useradd")
            .args([
                "--no-create-home",
                "--user-group",
                "--shell",
                "/bin/false",
                &name,
            ])
            .status();
        if !made.as_ref().is_ok_and(|s| s.success()) {
            eprintln!("SKIPPED {test}: useradd {name} failed ({made:?})");
            return None;
        }
        let home = PathBuf::from(format!("/tmp/vramctl-evil-{}", random_hex(6)));
        std::fs::create_dir(&home).expect("mkdir");
        let user = Self {
            uid: id_of("-u", &name),
            gid: id_of("-g", &name),
            name,
            home,
        };
        std::os::unix::fs::chown(&user.home, Some(user.uid), Some(user.gid)).expect("chown");
        std::fs::set_permissions(&user.home, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        Some(user)
    }

    /// A command run as this user (no supplementary groups), in its directory.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .current_dir(&self.home)
            .uid(self.uid)
            .gid(self.gid);
        c
    }

    /// A file of this user's in its directory.
    fn write(&self, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = self.home.join(name);
        std::fs::write(&path, text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        std::os::unix::fs::chown(&path, Some(self.uid), Some(self.gid)).expect("chown");
        path
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        // Its processes are ended by their guards ([`Running`]) before this.
        let _ = std::fs::remove_dir_all(&self.home);
        let _ = Command::new("userdel").arg(&self.name).status();
        let _ = Command::new("groupdel")
            .arg(&self.name)
            .stderr(Stdio::null())
            .status();
    }
}

/// This machine's Python interpreter copied to the user's `python3.14` (theirs, 0755), with
/// its `Py_Version` changed to 3.14 when `as_3_14`, and its real `major.minor`; `None` when
/// no copy runs as the user.
fn python_copy(user: &TestUser, as_3_14: bool) -> Option<(PathBuf, (u32, u32))> {
    let mut candidates: Vec<PathBuf> = ["/usr/bin/python3", "/usr/local/bin/python3"]
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    if let Ok(out) = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
    {
        candidates.extend(std::fs::canonicalize(String::from_utf8_lossy(&out.stdout).trim()).ok());
    }
    let copy = user.home.join("python3.14");
    for candidate in candidates {
        let _ = std::fs::remove_file(&copy);
        if std::fs::copy(&candidate, &copy).is_err() {
            continue;
        }
        std::os::unix::fs::chown(&copy, Some(user.uid), Some(user.gid)).expect("chown");
        let Some(version) = std::fs::File::open(&copy)
            .ok()
            .and_then(|f| elf::py_version(&f))
        else {
            continue;
        };
        if as_3_14 {
            let hex: u64 = 0x030E_00F0;
            let mut bytes = hex.to_le_bytes()[..version.size as usize].to_vec();
            if version.big_endian {
                bytes = hex.to_be_bytes()[8 - version.size as usize..].to_vec();
            }
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&copy)
                .expect("open");
            std::os::unix::fs::FileExt::write_all_at(&f, &bytes, version.file_offset)
                .expect("patch");
        }
        let runs = user
            .command(&copy)
            .args(["-c", "pass"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if runs {
            return Some((copy, version.major_minor()));
        }
    }
    None
}

/// The target: `python` started as the user, printing `ready`, then looking every 20 ms for
/// a script path in `mailbox` and running it in `__main__` on its main thread (what
/// `sys.remote_exec` makes a 3.14 interpreter do).
fn start_target(user: &TestUser, python: &Path, mailbox: &Path) -> Running {
    let code = r#"
import os, sys, time
box = sys.argv[1]
print("ready", flush=True)
while True:
    time.sleep(0.02)
    try:
        with open(box) as f:
            path = f.read()
    except OSError:
        continue
    if path.endswith("\n"):
        os.unlink(box)
        try:
            exec(compile(open(path.strip()).read(), path.strip(), "exec"), globals())
        except Exception as err:
            print("script failed:", err, file=sys.stderr, flush=True)
"#;
    let mut child = user
        .command(python)
        .args(["-I", "-c", code])
        .arg(mailbox)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("target runs");
    let stdout = child.stdout.take().expect("piped");
    let child = Running(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("ready");
    assert_eq!(line.trim(), "ready");
    child
}

/// `vramctl reclaim --attach PID --json` as root with `path` first on `PATH`: (exit code,
/// the process's entry).
fn attach(user: &TestUser, pid: u32, path_first: &Path) -> (i32, serde_json::Value) {
    let scenario = scenario(&user.home, &[]);
    let db = user.home.join("history.db");
    let path = format!(
        "{}:{}",
        path_first.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = vramctl_std(&scenario)
        .env("PATH", path)
        .args([
            "reclaim",
            "--attach",
            &pid.to_string(),
            "--json",
            "--timeout",
            "5s",
            "--db",
        ])
        .arg(&db)
        .output()
        .expect("vramctl runs");
    let json: serde_json::Value =
        serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null);
    let code = output.status.code().unwrap_or(-1);
    let entry = json["processes"][0].clone();
    assert!(
        entry.is_object(),
        "{code} {json} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (code, entry)
}

/// A process this test started, ended (by its PID) when dropped, also when a test fails.
struct Running(Child);

impl Running {
    fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn kill(child: Running) {
    drop(child);
}

#[test]
fn attach_never_executes_the_targets_interpreter() {
    let Some(user) = TestUser::create("attach_never_executes_the_targets_interpreter") else {
        return;
    };
    // Each file of the user's that root might once have run leaves a mark naming who ran it.
    let trap = |name: &str| {
        user.write(
            name,
            &format!(
                "#!/bin/sh\necho \"$(id -u) {name}\" >> '{}/ran'\necho 3 14 True\n",
                user.home.display()
            ),
            0o755,
        )
    };
    for as_3_14 in [false, true] {
        let Some((python, real)) = python_copy(&user, as_3_14) else {
            eprintln!(
                "SKIPPED attach_never_executes_the_targets_interpreter: no Python copy runs as {}",
                user.name
            );
            return;
        };
        let target = start_target(&user, &python, &user.home.join("mailbox"));
        // The running copy deleted: /proc/PID/exe reads "<copy> (deleted)", and a script
        // waits at that very name and at the copy's own, which is first on root's PATH.
        std::fs::remove_file(&python).expect("rm");
        let exe = std::fs::read_link(format!("/proc/{}/exe", target.id())).expect("exe");
        assert!(
            exe.to_string_lossy().ends_with(" (deleted)"),
            "{}",
            exe.display()
        );
        trap(&exe.file_name().expect("name").to_string_lossy());
        trap("python3.14");
        let (code, entry) = attach(&user, target.id(), &user.home);
        kill(target);
        assert!(
            !user.home.join("ran").exists(),
            "a file of the target's user was run: {}",
            std::fs::read_to_string(user.home.join("ran")).unwrap_or_default()
        );
        let error = &entry["error"];
        if real >= (3, 14) {
            // A real 3.14 here may well attach (with root's own helper, as the user): only
            // what was run matters then.
        } else if as_3_14 {
            // Its version read as 3.14 from the file; its python3.14 not run, and why.
            assert_eq!(code, 1, "{entry}");
            let message = error["message"].as_str().unwrap_or_default();
            if error["code"] == "no_interpreter" {
                assert_eq!(entry["status"], "not_attachable", "{entry}");
                assert!(message.contains("as root does not control it"), "{error}");
                assert!(
                    message.contains(&user.home.display().to_string()),
                    "{error}"
                );
            } else {
                // A real python3.14 of root's here: it ran as the user and failed on a
                // process that is not really 3.14.
                assert_eq!(error["code"], "helper", "{error}");
            }
        } else {
            // The real version, read from the file, not from its name.
            assert_eq!(code, 1, "{entry}");
            assert_eq!(error["code"], "too_old", "{error}");
        }
        let _ = std::fs::remove_file(user.home.join("python3.14"));
    }
}

/// A root-owned directory of root-owned directories (`/opt/vramctl-test-…`), or `None` when
/// there is none here (said).
fn trusted_dir(test: &str) -> Option<tempfile::TempDir> {
    let dir = tempfile::Builder::new()
        .prefix("vramctl-test-")
        .tempdir_in("/opt")
        .ok()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).ok()?;
    let probe = dir.path().join("probe");
    std::fs::write(&probe, "#!/bin/sh\n").ok()?;
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o755)).ok()?;
    if let Err(why) = helper::trusted_executable(&probe, 0) {
        eprintln!("SKIPPED {test}: /opt is not root's alone ({why})");
        return None;
    }
    Some(dir)
}

#[test]
fn attach_writes_its_files_without_following_planted_symlinks() {
    let test = "attach_writes_its_files_without_following_planted_symlinks";
    let Some(user) = TestUser::create(test) else {
        return;
    };
    let Some(trusted) = trusted_dir(test) else {
        eprintln!("SKIPPED {test}: cannot make a root-owned directory in /opt");
        return;
    };
    let Some((python, _)) = python_copy(&user, true) else {
        eprintln!("SKIPPED {test}: no Python copy runs as {}", user.name);
        return;
    };
    // Root's file that every planted link points at.
    let victim = PathBuf::from(format!("/tmp/vramctl-victim-{}", random_hex(6)));
    std::fs::write(&victim, "root's own\n").expect("victim");
    let mailbox = user.home.join("mailbox");
    let log = user.home.join("helper.log");
    let mode = user.home.join("mode");
    // The stand-in helper (root's, in root's directory): answers the probe as 3.14 with
    // sys.remote_exec; asked to deliver, it is the target's user at the worst moment — the
    // files written, vramctl waiting — and tries to plant links over each file vramctl
    // wrote or will read, logs what it could do, then hands the script to the target.
    let stand_in = trusted.path().join("python3.14");
    std::fs::write(
        &stand_in,
        format!(
            r#"#!/bin/sh
log='{log}'
echo "ids $(id -u) $(id -g) $(id -G)" >> "$log"
case "$4" in
*"sys.remote_exec("*) ;;
*) echo 3 14 True; exit 0 ;;
esac
script=$(printf '%s' "$4" | sed -n 's/.*, "\(.*\)")$/\1/p')
dir=$(dirname "$script")
for f in request.json attach.py $(ls "$dir" | grep _vramctl_attach_ | sed 's|$|/_attach.py|') new-file; do
  if ln -sf '{victim}' "$dir/$f" 2>/dev/null; then echo "planted $f" >> "$log"; else echo "refused $f" >> "$log"; fi
  if (echo forged > "$dir/$f") 2>/dev/null; then echo "wrote $f" >> "$log"; fi
done
if [ "$(cat '{mode}')" = out-link ]; then
  ln -s '{victim}' "$dir/out/result.json" && echo "linked out/result.json" >> "$log"
else
  printf '%s\n' "$script" > '{mailbox}'
fi
"#,
            log = log.display(),
            victim = victim.display(),
            mode = mode.display(),
            mailbox = mailbox.display(),
        ),
    )
    .expect("stand-in");
    std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let target = start_target(&user, &python, &mailbox);
    // Meanwhile, the race of the issue: the user plants links in every attach directory it
    // can see, as fast as it can.
    let racer = Running(user
        .command("/bin/sh")
        .args([
            "-c",
            &format!(
                "while :; do for d in /tmp/vramctl-attach-*; do [ -d \"$d\" ] && echo \"$d\" >> seen; for f in request.json attach.py new \"$(ls \"$d\" | grep _vramctl_attach_)/_attach.py\"; do ln -s '{}' \"$d/$f\" 2>/dev/null && echo \"$d/$f\" >> planted; done; done; done",
                victim.display()
            ),
        ])
        .stderr(Stdio::null())
        .spawn()
        .expect("racer runs"));

    user.write("mode", "deliver", 0o644);
    let started = Instant::now();
    let (code, entry) = attach(&user, target.id(), trusted.path());
    // The target read root's files through its group and wrote its answer: the stand-in
    // torch is not loaded, so nothing to release.
    assert_eq!(entry["status"], "nothing_reclaimed", "{entry}");
    assert_eq!(entry["agent"]["outcome"], "no_gpu_allocator", "{entry}");
    assert_eq!(code, 1, "{entry}");
    assert!(started.elapsed() < Duration::from_secs(5), "{entry}");

    // Asked to answer through a link to root's file instead, the result is refused unread.
    user.write("mode", "out-link", 0o644);
    let (code, entry) = attach(&user, target.id(), trusted.path());
    assert_eq!(code, 1, "{entry}");
    assert_eq!(entry["error"]["code"], "malformed", "{entry}");
    assert!(
        entry["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("symbolic link")),
        "{entry}"
    );
    kill(target);
    kill(racer);

    let log = std::fs::read_to_string(&log).expect("the stand-in ran");
    let victim_text = std::fs::read_to_string(&victim).expect("victim");
    let _ = std::fs::remove_file(&victim);
    assert_eq!(
        victim_text, "root's own\n",
        "root's file was overwritten; {log}"
    );
    // Every run of the helper had the target's ids, never root's.
    let ids = format!("ids {uid} {gid} {gid}", uid = user.uid, gid = user.gid);
    assert!(
        log.lines()
            .filter(|l| l.starts_with("ids"))
            .all(|l| l == ids),
        "{log}"
    );
    assert!(
        log.lines().filter(|l| l.starts_with("ids")).count() >= 4,
        "{log}"
    );
    // Nothing planted or written in vramctl's directories (the racer's own log may not
    // exist: it never succeeded).
    assert!(!log.contains("planted") && !log.contains("wrote"), "{log}");
    assert!(
        log.contains("refused request.json") && log.contains("refused attach.py"),
        "{log}"
    );
    assert!(log.contains("refused _vramctl_attach_"), "{log}");
    assert!(log.contains("linked out/result.json"), "{log}");
    assert!(
        !user.home.join("planted").exists(),
        "the racer planted: {}",
        std::fs::read_to_string(user.home.join("planted")).unwrap_or_default()
    );
    // The stand-in's attempts above are made at the worst moment every time; the racer's
    // are as many as it could fit (said, not required: the window is short).
    let seen = std::fs::read_to_string(user.home.join("seen")).unwrap_or_default();
    eprintln!(
        "the racer tried {} times in an attach directory",
        seen.lines().count()
    );
    // And nothing left behind.
    let left: Vec<String> = std::fs::read_dir("/tmp")
        .expect("/tmp")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("vramctl-attach-{}-", entry["pid"])))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
