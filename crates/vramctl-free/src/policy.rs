//! Who `reap` may end: policies from the command line or from a TOML file of named
//! policies (`docs/reap.md`).
//!
//! Which policies run:
//! - `--policy NAME...`: those of the file (`--config`, else the default path), in the
//!   file's order, with the filter flags given on the command line overriding their fields;
//! - else `--config PATH`, or the default file when it exists and no filter flag was given:
//!   every policy of the file, with the flags overriding;
//! - else one policy named `command-line`, from the flags and the defaults.
//!
//! The file is read strictly (`deny_unknown_fields`): a typo stops `reap` with the file and
//! line instead of quietly widening what it may kill.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use regex::Regex;
use serde::{Deserialize, Serialize};
use toml::Spanned;
use vramctl_core::types::DeviceInfo;

use vramctl_observe::owners::OwnerSelector;
use vramctl_observe::pattern::compile_regex;
use vramctl_observe::units::{self, parse_bytes};

/// Idle at least this long, unless a policy or `--idle-for` says otherwise (the same
/// default as `leaks`).
pub const DEFAULT_IDLE_FOR: Duration = Duration::from_secs(30 * 60);
/// Holding at least this much, unless a policy or `--min-mem` says otherwise.
pub const DEFAULT_MIN_MEM: u64 = 1 << 30;
/// The name of the policy the flags make when no file is used.
pub const COMMAND_LINE: &str = "command-line";

/// One policy, resolved.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Its name (`command-line` for the flags).
    pub name: String,
    /// Least time without GPU activity.
    pub idle_for: Duration,
    /// Least GPU memory held, summed over the GPUs.
    pub min_mem_bytes: u64,
    /// Only these users (names or uids); empty: anyone.
    pub users: Vec<String>,
    /// Only command lines matching this.
    pub pattern: Option<Regex>,
    /// Never command lines matching any of these.
    pub exclude: Vec<Regex>,
    /// Only processes holding memory on one of these GPUs (index or UUID); empty: any.
    pub gpus: Vec<String>,
    /// At most this many kills per run (per round with `--every`).
    pub max_kills: Option<usize>,
    /// Only processes every one of these selects (`--job`, `--pod`, `--container`; not in
    /// the policy file: a job or pod is a one-off, not a standing policy); empty: any.
    pub owners: Vec<OwnerSelector>,
}

/// A policy as `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyJson {
    name: String,
    idle_for_s: f64,
    min_mem_bytes: u64,
    users: Vec<String>,
    #[serde(rename = "match")]
    pattern: Option<String>,
    exclude: Vec<String>,
    gpus: Vec<String>,
    max_kills: Option<usize>,
    owners: Vec<OwnerSelector>,
}

impl Policy {
    /// The JSON form.
    pub fn json(&self) -> PolicyJson {
        PolicyJson {
            name: self.name.clone(),
            idle_for_s: self.idle_for.as_secs_f64(),
            min_mem_bytes: self.min_mem_bytes,
            users: self.users.clone(),
            pattern: self.pattern.as_ref().map(|r| r.as_str().to_owned()),
            exclude: self.exclude.iter().map(|r| r.as_str().to_owned()).collect(),
            gpus: self.gpus.clone(),
            max_kills: self.max_kills,
            owners: self.owners.clone(),
        }
    }

    /// One line: `idle ≥ 30 min, ≥ 1.0 GiB, users alice, match 'x', at most 2 kills`.
    pub fn describe(&self) -> String {
        let mut parts = vec![
            format!(
                "idle ≥ {}",
                vramctl_leaks::analysis::human_duration(self.idle_for.as_secs_f64())
            ),
            format!("holding ≥ {}", units::bytes(self.min_mem_bytes)),
        ];
        if !self.users.is_empty() {
            parts.push(format!("users {}", self.users.join(", ")));
        }
        if let Some(p) = &self.pattern {
            parts.push(format!("match '{}'", p.as_str()));
        }
        for e in &self.exclude {
            parts.push(format!("exclude '{}'", e.as_str()));
        }
        if !self.gpus.is_empty() {
            parts.push(format!("GPUs {}", self.gpus.join(", ")));
        }
        for owner in &self.owners {
            parts.push(owner.describe());
        }
        if let Some(n) = self.max_kills {
            parts.push(format!("at most {n} per run"));
        }
        parts.join(", ")
    }

    /// Whether `user`/`uid` passes the user filter.
    pub fn user_ok(&self, user: Option<&str>, uid: Option<u32>) -> bool {
        self.users.is_empty()
            || self
                .users
                .iter()
                .any(|u| user == Some(u.as_str()) || u.parse::<u32>().is_ok_and(|n| uid == Some(n)))
    }

    /// Whether `device` is one of the policy's GPUs.
    pub fn gpu_ok(&self, device: &DeviceInfo) -> bool {
        self.gpus.is_empty()
            || vramctl_observe::gpu_selection::GpuFilter::selects(&self.gpus, device)
    }
}

/// The file: `[[policy]]` tables.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    #[serde(default)]
    policy: Vec<Spanned<PolicySpec>>,
}

/// A size as a string (`"4GiB"`) or a number of bytes.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

/// A user as a name or a uid.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum User {
    Uid(u32),
    Name(String),
}

/// A GPU as an index or a UUID.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Gpu {
    Index(u32),
    Id(String),
}

/// One `[[policy]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicySpec {
    name: Spanned<String>,
    idle_for: Option<Spanned<String>>,
    min_mem: Option<Spanned<Size>>,
    #[serde(default)]
    users: Vec<User>,
    #[serde(rename = "match")]
    pattern: Option<Spanned<String>>,
    #[serde(default)]
    exclude: Vec<Spanned<String>>,
    #[serde(default)]
    gpus: Vec<Gpu>,
    max_kills: Option<usize>,
}

/// `$XDG_CONFIG_HOME/vramctl/reap.toml`, else `~/.config/vramctl/reap.toml`.
pub fn default_path() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    var("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|dir| dir.join("vramctl/reap.toml"))
}

/// What the command line says about the policies: which file and which of its policies,
/// and the filter flags (as typed; [`resolve`] checks them).
#[derive(Debug, Clone, Default)]
pub struct PolicyFlags {
    /// `--config PATH`.
    pub config: Option<PathBuf>,
    /// `--policy NAME...`.
    pub policy: Vec<String>,
    /// `--idle-for`.
    pub idle_for: Option<Duration>,
    /// `--min-mem` (a size such as `2GiB`).
    pub min_mem: Option<String>,
    /// `--user`.
    pub user: Vec<String>,
    /// `--match` (a regex).
    pub pattern: Option<String>,
    /// `--exclude` (regexes).
    pub exclude: Vec<String>,
    /// `--gpu`.
    pub gpu: Vec<String>,
    /// `--job`, `--pod`, `--container`.
    pub owners: Vec<OwnerSelector>,
}

/// The filter flags, checked.
#[derive(Debug, Default)]
struct Overrides {
    idle_for: Option<Duration>,
    min_mem: Option<u64>,
    users: Vec<String>,
    pattern: Option<Regex>,
    exclude: Vec<Regex>,
    gpus: Vec<String>,
    owners: Vec<OwnerSelector>,
}

impl Overrides {
    fn from_args(args: &PolicyFlags) -> anyhow::Result<Self> {
        Ok(Self {
            idle_for: args.idle_for,
            min_mem: args
                .min_mem
                .as_deref()
                .map(|t| parse_bytes(t).map_err(|e| anyhow!("--min-mem: {e}")))
                .transpose()?,
            users: args.user.clone(),
            pattern: args
                .pattern
                .as_deref()
                .map(|t| compile_regex("--match", t))
                .transpose()?,
            exclude: args
                .exclude
                .iter()
                .map(|t| compile_regex("--exclude", t))
                .collect::<anyhow::Result<_>>()?,
            gpus: args.gpu.clone(),
            owners: args.owners.clone(),
        })
    }

    fn any(&self) -> bool {
        self.idle_for.is_some()
            || self.min_mem.is_some()
            || !self.users.is_empty()
            || self.pattern.is_some()
            || !self.exclude.is_empty()
            || !self.gpus.is_empty()
            || !self.owners.is_empty()
    }

    /// The flags over `policy`: scalars and lists replace, except `--exclude`, which adds
    /// (an extra exclusion never widens what may be killed).
    fn apply(&self, mut policy: Policy) -> Policy {
        if let Some(d) = self.idle_for {
            policy.idle_for = d;
        }
        if let Some(m) = self.min_mem {
            policy.min_mem_bytes = m;
        }
        if !self.users.is_empty() {
            policy.users.clone_from(&self.users);
        }
        if self.pattern.is_some() {
            policy.pattern.clone_from(&self.pattern);
        }
        policy.exclude.extend(self.exclude.iter().cloned());
        if !self.gpus.is_empty() {
            policy.gpus.clone_from(&self.gpus);
        }
        // Narrows every policy: a selector never widens what may be killed.
        policy.owners.extend(self.owners.iter().cloned());
        policy
    }
}

/// `--idle-for` and `idle_for`: a duration longer than 0.
fn idle_duration(text: &str) -> Result<Duration, String> {
    let duration = vramctl_core::duration::parse(text).map_err(|e| e.to_string())?;
    if duration.is_zero() {
        return Err(format!("'{text}' must be longer than 0; use e.g. 30m"));
    }
    Ok(duration)
}

/// The policies this run applies (module docs), in order.
///
/// # Errors
/// A bad flag, a missing or malformed file (with its file:line), an unknown policy name.
pub fn resolve(args: &PolicyFlags) -> anyhow::Result<Vec<Policy>> {
    let overrides = Overrides::from_args(args)?;
    let default = default_path();
    let use_file = args.config.is_some()
        || !args.policy.is_empty()
        || (!overrides.any() && default.as_ref().is_some_and(|p| p.exists()));
    if !use_file {
        return Ok(vec![overrides.apply(Policy {
            name: COMMAND_LINE.to_owned(),
            idle_for: DEFAULT_IDLE_FOR,
            min_mem_bytes: DEFAULT_MIN_MEM,
            users: Vec::new(),
            pattern: None,
            exclude: Vec::new(),
            gpus: Vec::new(),
            max_kills: None,
            owners: Vec::new(),
        })]);
    }
    let path = match (&args.config, default) {
        (Some(p), _) => p.clone(),
        (None, Some(p)) => p,
        (None, None) => bail!(
            "--policy needs a policy file, and neither XDG_CONFIG_HOME nor HOME is set; pass \
             --config PATH"
        ),
    };
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "cannot read the policy file '{}'; create it (format in docs/reap.md) or pass \
             --config PATH",
            path.display()
        )
    })?;
    let all = parse(&path, &text)?;
    let chosen: Vec<Policy> = if args.policy.is_empty() {
        all
    } else {
        let mut chosen = Vec::new();
        for name in &args.policy {
            let policy = all.iter().find(|p| &p.name == name).ok_or_else(|| {
                let names: Vec<&str> = all.iter().map(|p| p.name.as_str()).collect();
                anyhow!(
                    "no policy '{name}' in '{}'; it has: {}",
                    path.display(),
                    names.join(", ")
                )
            })?;
            if !chosen.iter().any(|p: &Policy| &p.name == name) {
                chosen.push(policy.clone());
            }
        }
        chosen
    };
    Ok(chosen.into_iter().map(|p| overrides.apply(p)).collect())
}

/// Reads a policy file's text; errors name `path:line`.
///
/// # Errors
/// Malformed TOML, unknown keys, bad values, duplicate names, no policy at all.
pub fn parse(path: &Path, text: &str) -> anyhow::Result<Vec<Policy>> {
    let at = |offset: usize| {
        let line = text[..offset.min(text.len())].matches('\n').count() + 1;
        format!("{}:{line}", path.display())
    };
    let file: PolicyFile = toml::from_str(text).map_err(|e| {
        let place = e
            .span()
            .map_or_else(|| path.display().to_string(), |s| at(s.start));
        // One line: toml's message can wrap; its caret drawing is not used.
        let message = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
        anyhow!("{place}: {message}; the format is in docs/reap.md")
    })?;
    if file.policy.is_empty() {
        bail!(
            "{}: no [[policy]] in this file; add one (format in docs/reap.md)",
            path.display()
        );
    }
    let mut out: Vec<Policy> = Vec::new();
    for spanned in file.policy {
        let table_at = at(spanned.span().start);
        let spec = spanned.into_inner();
        let name = spec.name.get_ref().trim().to_owned();
        if name.is_empty() {
            bail!(
                "{}: a policy's name must not be empty",
                at(spec.name.span().start)
            );
        }
        if out.iter().any(|p| p.name == name) {
            bail!(
                "{}: a second policy named '{name}'; names must be unique",
                at(spec.name.span().start)
            );
        }
        let idle_for = match &spec.idle_for {
            Some(s) => idle_duration(s.get_ref())
                .map_err(|e| anyhow!("{}: idle_for {e}", at(s.span().start)))?,
            None => DEFAULT_IDLE_FOR,
        };
        let min_mem_bytes = match &spec.min_mem {
            Some(s) => match s.get_ref() {
                Size::Bytes(n) => *n,
                Size::Text(t) => {
                    parse_bytes(t).map_err(|e| anyhow!("{}: min_mem: {e}", at(s.span().start)))?
                }
            },
            None => DEFAULT_MIN_MEM,
        };
        let regex = |flag: &str, s: &Spanned<String>| {
            compile_regex(flag, s.get_ref()).map_err(|e| anyhow!("{}: {e}", at(s.span().start)))
        };
        let pattern = spec
            .pattern
            .as_ref()
            .map(|s| regex("match", s))
            .transpose()?;
        let exclude = spec
            .exclude
            .iter()
            .map(|s| regex("exclude", s))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if spec.max_kills == Some(0) {
            bail!(
                "{table_at}: max_kills = 0 would never reap; leave the policy out, or run reap without --apply"
            );
        }
        out.push(Policy {
            name,
            idle_for,
            min_mem_bytes,
            users: spec
                .users
                .into_iter()
                .map(|u| match u {
                    User::Uid(n) => n.to_string(),
                    User::Name(s) => s,
                })
                .collect(),
            pattern,
            exclude,
            gpus: spec
                .gpus
                .into_iter()
                .map(|g| match g {
                    Gpu::Index(n) => n.to_string(),
                    Gpu::Id(s) => s,
                })
                .collect(),
            max_kills: spec.max_kills,
            owners: Vec::new(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_text(text: &str) -> anyhow::Result<Vec<Policy>> {
        parse(Path::new("/etc/reap.toml"), text)
    }

    fn err(text: &str) -> String {
        format!("{:#}", parse_text(text).unwrap_err())
    }

    #[test]
    fn several_named_policies_in_file_order() {
        let policies = parse_text(
            r#"
# Notebooks left open over lunch.
[[policy]]
name = "notebooks"
idle_for = "2h"
min_mem = "4GiB"
match = "ipykernel_launcher"
exclude = ["keep-me", "important"]
users = ["alice", 1001]
gpus = [0, "GPU-1234"]
max_kills = 3

[[policy]]
name = "everything-else"
min_mem = 536870912
"#,
        )
        .unwrap();
        assert_eq!(policies.len(), 2);
        let nb = &policies[0];
        assert_eq!(nb.name, "notebooks");
        assert_eq!(nb.idle_for, Duration::from_secs(7200));
        assert_eq!(nb.min_mem_bytes, 4 << 30);
        assert_eq!(nb.pattern.as_ref().unwrap().as_str(), "ipykernel_launcher");
        assert_eq!(nb.exclude.len(), 2);
        assert_eq!(nb.users, ["alice", "1001"]);
        assert_eq!(nb.gpus, ["0", "GPU-1234"]);
        assert_eq!(nb.max_kills, Some(3));
        assert!(nb.user_ok(Some("alice"), Some(1000)));
        assert!(nb.user_ok(Some("carol"), Some(1001)));
        assert!(!nb.user_ok(Some("bob"), Some(1002)));
        assert_eq!(
            nb.describe(),
            "idle ≥ 2 h 0 min, holding ≥ 4.0 GiB, users alice, 1001, match 'ipykernel_launcher', \
             exclude 'keep-me', exclude 'important', GPUs 0, GPU-1234, at most 3 per run"
        );
        let rest = &policies[1];
        assert_eq!(rest.idle_for, DEFAULT_IDLE_FOR);
        assert_eq!(rest.min_mem_bytes, 512 << 20);
        assert!(rest.user_ok(None, None));
    }

    #[test]
    fn idle_for_takes_the_durations_every_flag_takes() {
        // The policy file had the store's parser: no `1h30m`, no bare seconds.
        let idle = |value: &str| {
            parse_text(&format!(
                "[[policy]]\nname = \"a\"\nidle_for = \"{value}\"\n"
            ))
            .unwrap()[0]
                .idle_for
        };
        assert_eq!(idle("1h30m"), Duration::from_secs(5400));
        assert_eq!(idle("5400"), Duration::from_secs(5400));
        assert_eq!(idle("1.5h"), Duration::from_secs(5400));
    }

    #[test]
    fn mistakes_name_the_file_and_line() {
        assert_eq!(
            err("[[policy]]\nname = \"a\"\nidel_for = \"1h\"\n"),
            "/etc/reap.toml:3: unknown field `idel_for`, expected one of `name`, `idle_for`, \
             `min_mem`, `users`, `match`, `exclude`, `gpus`, `max_kills`; the format is in \
             docs/reap.md"
        );
        let e = err("[[policy]]\nname = \"a\"\nidle_for = \"soon\"\n");
        assert!(
            e.starts_with("/etc/reap.toml:3: idle_for 'soon' is not a duration"),
            "{e}"
        );
        let e = err("[[policy]]\nname = \"a\"\n\nmin_mem = \"lots\"\n");
        assert!(
            e.starts_with("/etc/reap.toml:4: min_mem: 'lots' is not a size"),
            "{e}"
        );
        let e = err("[[policy]]\nname = \"a\"\nmatch = \"(unclosed\"\n");
        assert!(
            e.starts_with("/etc/reap.toml:3: match '(unclosed' is not a valid regular expression"),
            "{e}"
        );
        let e = err("[[policy]]\nname = \"a\"\n[[policy]]\nname = \"a\"\n");
        assert!(
            e.starts_with("/etc/reap.toml:4: a second policy named 'a'"),
            "{e}"
        );
        let e = err("[[policy]]\nidle_for = \"1h\"\n");
        assert!(
            e.starts_with("/etc/reap.toml:1: missing field `name`"),
            "{e}"
        );
        let e = err("[[policy]]\nname = \"a\"\nmax_kills = 0\n");
        assert!(
            e.starts_with("/etc/reap.toml:1: max_kills = 0 would never reap"),
            "{e}"
        );
        let e = err("[[policy]]\nname = \"a\"\nidle_for = \"0s\"\n");
        assert!(e.contains("must be longer than 0"), "{e}");
        let e = err("policy = 3\n");
        assert!(e.starts_with("/etc/reap.toml:1: "), "{e}");
        let e = err("[[policy]\nname = \"a\"\n");
        assert!(e.starts_with("/etc/reap.toml:1: "), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = err("# nothing yet\n");
        assert!(e.starts_with("/etc/reap.toml: no [[policy]]"), "{e}");
    }
}
