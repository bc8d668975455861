//! What `vramctl --version` names besides the version: the git commit and the build date,
//! as `VRAMCTL_GIT_COMMIT` and `VRAMCTL_BUILD_DATE` for `env!` in `cli.rs`.
//!
//! Never fails the build: without git (a tarball, a crate from the registry) the commit is
//! `unknown`, and a malformed `SOURCE_DATE_EPOCH` is a warning, not an error.
//!
//! The commit, first found of:
//! 1. `VRAMCTL_GIT_COMMIT` in the environment (a distribution building from a tarball);
//! 2. `.cargo_vcs_info.json`, which `cargo package` writes into a published crate, so that
//!    `cargo install vramctl` names the commit it was packaged from (and not the commit of
//!    whatever repository the crate happens to be unpacked in);
//! 3. `git rev-parse HEAD` in this checkout;
//! 4. `unknown`.
//!
//! The date is `SOURCE_DATE_EPOCH` (reproducible builds; the packaging scripts set it to
//! the commit's time) or now, as a UTC calendar date.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Hex digits of the commit shown (git's default abbreviation grows with the repository;
/// a fixed length keeps the version line stable).
const COMMIT_DIGITS: usize = 12;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=VRAMCTL_GIT_COMMIT");
    println!("cargo:rerun-if-env-changed=SOURCE_DATE_EPOCH");
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());

    let (commit, source) = match from_env() {
        Some(commit) => (commit, "env"),
        None => match from_vcs_info(&manifest_dir) {
            Some(commit) => (commit, "vcs-info"),
            None => match from_git(&manifest_dir) {
                Some(commit) => (commit, "git"),
                None => ("unknown".to_owned(), "none"),
            },
        },
    };
    println!("cargo:rustc-env=VRAMCTL_GIT_COMMIT={commit}");
    // Where the commit came from, for the test that checks it against `git rev-parse`.
    println!("cargo:rustc-env=VRAMCTL_GIT_COMMIT_SOURCE={source}");
    println!("cargo:rustc-env=VRAMCTL_BUILD_DATE={}", build_date());
}

fn from_env() -> Option<String> {
    let commit = std::env::var("VRAMCTL_GIT_COMMIT").ok()?;
    let commit = commit.trim();
    (!commit.is_empty()).then(|| short(commit))
}

/// `{"git": {"sha1": "..."}, ...}`, written by `cargo package`; read with a plain search so
/// that the build script needs no JSON parser.
fn from_vcs_info(manifest_dir: &Path) -> Option<String> {
    let path = manifest_dir.join(".cargo_vcs_info.json");
    let text = std::fs::read_to_string(&path).ok()?;
    println!("cargo:rerun-if-changed={}", path.display());
    let (_, rest) = text.split_once("\"sha1\"")?;
    let (_, rest) = rest.split_once('"')?;
    let (sha, _) = rest.split_once('"')?;
    let is_hex = !sha.is_empty() && sha.chars().all(|c| c.is_ascii_hexdigit());
    is_hex.then(|| short(sha))
}

fn from_git(manifest_dir: &Path) -> Option<String> {
    let sha = git(manifest_dir, &["rev-parse", "HEAD"])?;
    // Build again when HEAD moves: HEAD itself (a checkout), the branch it names (a
    // commit), packed-refs (a ref that git packed). Only files that exist: cargo re-runs a
    // script on every build while a path it watches is missing.
    let mut watched = vec![git(manifest_dir, &["rev-parse", "--git-path", "HEAD"])];
    if let Some(branch) = git(manifest_dir, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(git(manifest_dir, &["rev-parse", "--git-path", &branch]));
    }
    watched.push(git(
        manifest_dir,
        &["rev-parse", "--git-path", "packed-refs"],
    ));
    for path in watched.into_iter().flatten() {
        let path = manifest_dir.join(path);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    Some(short(&sha))
}

/// One line of git's output, or `None` if git is missing, fails, or this is no checkout.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let line = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (!line.is_empty()).then_some(line)
}

fn short(sha: &str) -> String {
    sha.chars().take(COMMIT_DIGITS).collect()
}

fn build_date() -> String {
    let epoch = match std::env::var("SOURCE_DATE_EPOCH") {
        Ok(text) => match text.trim().parse::<i64>() {
            Ok(seconds) => jiff::Timestamp::from_second(seconds).ok(),
            Err(_) => None,
        }
        .or_else(|| {
            println!(
                "cargo:warning=SOURCE_DATE_EPOCH '{text}' is not seconds since 1970; using the time now"
            );
            None
        }),
        Err(_) => None,
    };
    epoch
        .unwrap_or_else(jiff::Timestamp::now)
        .strftime("%Y-%m-%d")
        .to_string()
}
