//! What the packages are built from and ship besides the commands: `--version`, the shell
//! completions and the man pages (scripts/build-deb.sh and scripts/build-wheel.sh run these
//! same commands of the binary they package).

use std::path::Path;

use crate::harness::vramctl_on;

fn run_ok(args: &[&str]) -> String {
    let output = vramctl_on("h200-idle.toml")
        .args(args)
        .output()
        .expect("vramctl runs");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

/// The commands `vramctl --help` lists (its "Commands:" block), without `help`.
fn listed_commands() -> Vec<String> {
    let help = run_ok(&["--help"]);
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .filter(|name| name != "help")
        .collect()
}

#[test]
fn version_names_the_version_commit_and_build_date() {
    let pattern = regex::Regex::new(
        r"^vramctl (\d+\.\d+\.\d+\S*) \(commit ([0-9a-f]{12}|unknown), built (\d{4}-\d{2}-\d{2})\)\n$",
    )
    .unwrap();
    for flag in ["--version", "-V"] {
        let line = run_ok(&[flag]);
        let captures = pattern
            .captures(&line)
            .unwrap_or_else(|| panic!("{flag}: {line:?}"));
        assert_eq!(&captures[1], env!("CARGO_PKG_VERSION"));
        // In a git checkout (CI's clone, a developer's), the commit is HEAD's; build.rs
        // re-runs when HEAD moves, so the binary under test was built at this commit.
        let head = std::process::Command::new("git")
            .args(["rev-parse", "HEAD"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned());
        match (env!("VRAMCTL_GIT_COMMIT_SOURCE"), head) {
            // The builder named the commit (VRAMCTL_GIT_COMMIT): nothing to compare.
            ("env", _) => {}
            (_, Some(head)) => assert_eq!(&captures[2], &head[..12], "{line}"),
            (_, None) => assert_eq!(&captures[2], "unknown", "{line}"),
        }
        // YYYY-MM-DD compares as text; a date that is no date (2026-13-40) is refused.
        let built = &captures[3];
        let today = jiff::Timestamp::now().strftime("%Y-%m-%d").to_string();
        assert!(built <= today.as_str() && built >= "2026-01-01", "{line}");
        let month: u32 = built[5..7].parse().unwrap();
        let day: u32 = built[8..10].parse().unwrap();
        assert!(
            (1..=12).contains(&month) && (1..=31).contains(&day),
            "{line}"
        );
    }
}

#[test]
fn completions_of_each_shell_name_every_command() {
    let commands = listed_commands();
    assert!(commands.len() > 10, "{commands:?}");
    for shell in ["bash", "zsh", "fish"] {
        let script = run_ok(&["completions", shell]);
        for command in &commands {
            assert!(script.contains(command.as_str()), "{shell}: no '{command}'");
        }
    }
    // bash parses its script (zsh and fish are not on every machine that runs this).
    let script = run_ok(&["completions", "bash"]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vramctl.bash");
    std::fs::write(&path, script).unwrap();
    let status = std::process::Command::new("bash")
        .arg("-n")
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn completions_for_an_unknown_shell_is_a_usage_error() {
    let output = vramctl_on("h200-idle.toml")
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("'tcsh'"), "{stderr}");
}

fn page_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("the pages' directory")
        .map(|entry| {
            let entry = entry.expect("a directory entry");
            entry.file_name().to_string_lossy().into_owned()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn man_writes_a_page_per_command_and_nested_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("man1");
    let listed = run_ok(&["man", "--dir", out.to_str().unwrap()]);
    let names = page_names(&out);
    let mut expected: Vec<String> = listed_commands()
        .iter()
        .map(|c| format!("vramctl-{c}.1"))
        .chain(
            [
                "vramctl",
                "vramctl-snapshot-diff",
                "vramctl-snapshot-timeline",
                "vramctl-snapshot-view",
            ]
            .map(|page| format!("{page}.1")),
        )
        .collect();
    expected.sort();
    assert_eq!(names, expected);
    // It lists what it wrote, one path a line.
    assert_eq!(listed.lines().count(), names.len(), "{listed}");
    for name in &names {
        let page = std::fs::read_to_string(out.join(name)).unwrap();
        let title = name.trim_end_matches(".1");
        assert!(
            page.contains(&format!(".TH {title} 1 ")),
            "{name}: {}",
            &page[..200.min(page.len())]
        );
        assert!(page.contains(".SH NAME"), "{name}");
        assert!(
            page.contains(&format!("vramctl {}", env!("CARGO_PKG_VERSION"))),
            "{name}"
        );
    }
    let status = std::fs::read_to_string(out.join("vramctl-status.1")).unwrap();
    assert!(
        status.contains("\\-\\-json"),
        "status's flags are on its page"
    );
    assert!(
        status.contains("Examples:"),
        "status's examples are on its page"
    );
}

#[test]
fn man_into_a_file_is_one_line_naming_it_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let output = vramctl_on("h200-idle.toml")
        .args(["man", "--dir", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("'{}'", file.display())),
        "{stderr}"
    );
}
