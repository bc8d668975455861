//! Which Slurm job a process belongs to, read from the process itself: no prolog script,
//! no mapping file, no `scontrol` call.
//!
//! Two sources, in order of trust:
//!
//! - **The cgroup path** (`/proc/PID/cgroup`). With `ProctrackType=proctrack/cgroup` (or
//!   `TaskPlugin=task/cgroup`) slurmstepd puts every process of a step in the step's cgroup,
//!   and only root can move a process out of it. cgroup v2 (Slurm 22.05+):
//!   `/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>` (the stepd itself in
//!   `…/step_<step>/slurm`; the scope is `<node>_slurmstepd.scope` on builds with several
//!   slurmd per host). cgroup v1: `/slurm/uid_<uid>/job_<id>/step_<step>[/task_<n>]` in each
//!   controller Slurm uses (`/slurm_<node>/…` with several slurmd per host, as Debian builds
//!   it). `<step>` is a number, `batch`, `extern` or `interactive`.
//! - **The environment** (`/proc/PID/environ`): `SLURM_JOB_ID`, `SLURM_STEP_ID`,
//!   `SLURM_JOB_USER`, `SLURM_JOB_PARTITION`, set by slurmstepd for every task. It is what
//!   the process was started with (later `setenv` calls do not show), readable by root and by
//!   the process's own user only, and its owner can set any of it: a user can claim another
//!   job's id. It is the only source under `proctrack/linuxproc` or `proctrack/pgid`, and the
//!   only source of the partition (and of the user under cgroup v2).
//!
//! When both name a job and they disagree, the cgroup wins and nothing of the environment is
//! used (its user and partition belong to the job it claims, not to the one the process is
//! in); [`SlurmJob::environ_conflict`] keeps the claimed id so that it can be shown.
//!
//! Both files are another user's input: they are read with a size bound, and a file that is
//! missing or denied is `None`, never an error that stops a listing.

use std::io::Read;

use serde::{Deserialize, Serialize};

/// The most of `/proc/PID/cgroup` read: a path is at most `PATH_MAX` per hierarchy, and a
/// host has at most a dozen hierarchies.
pub const CGROUP_FILE_LIMIT_BYTES: u64 = 64 * 1024;

/// The most of `/proc/PID/environ` read. Slurm's variables come first in a task's
/// environment only by chance, so the bound is generous (the kernel allows a few MiB); a
/// variable cut by the bound is dropped, not read half.
pub const ENVIRON_FILE_LIMIT_BYTES: u64 = 1024 * 1024;

/// Slurm's step ids for the steps that have names (`slurm.h`: `SLURM_BATCH_SCRIPT`,
/// `SLURM_EXTERN_CONT`, `SLURM_INTERACTIVE_STEP`); they show as numbers in `SLURM_STEP_ID`
/// of some versions and as names in cgroup paths and `scontrol`.
const BATCH_STEP_ID: u32 = 0xffff_fffb;
const EXTERN_STEP_ID: u32 = 0xffff_fffc;
const INTERACTIVE_STEP_ID: u32 = 0xffff_fffa;
/// Ids above this are Slurm's markers (pending step and others), not steps a process runs in.
const MAX_NORMAL_STEP_ID: u32 = 0xffff_fff0;

/// A step of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum SlurmStep {
    /// The batch script of an `sbatch` job (`step_batch`).
    Batch,
    /// The external step: processes adopted into the job (`pam_slurm_adopt`, the extern
    /// container; `step_extern`).
    Extern,
    /// The interactive step of `salloc` with `LaunchParameters=use_interactive_step`.
    Interactive,
    /// A numbered step (`srun`): `step_0`, `step_1`, …
    Number(u32),
}

impl SlurmStep {
    /// Parses the step as cgroup paths, `scontrol` and `SLURM_STEP_ID` write it: a number,
    /// `batch`, `extern`, `interactive`, or Slurm's numeric ids of the named steps.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "batch" => return Some(Self::Batch),
            "extern" => return Some(Self::Extern),
            "interactive" => return Some(Self::Interactive),
            _ => {}
        }
        let id = decimal_u32(text)?;
        match id {
            BATCH_STEP_ID => Some(Self::Batch),
            EXTERN_STEP_ID => Some(Self::Extern),
            INTERACTIVE_STEP_ID => Some(Self::Interactive),
            id if id < MAX_NORMAL_STEP_ID => Some(Self::Number(id)),
            _ => None,
        }
    }
}

impl std::fmt::Display for SlurmStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Batch => f.write_str("batch"),
            Self::Extern => f.write_str("extern"),
            Self::Interactive => f.write_str("interactive"),
            Self::Number(n) => write!(f, "{n}"),
        }
    }
}

impl From<SlurmStep> for String {
    fn from(step: SlurmStep) -> Self {
        step.to_string()
    }
}

impl TryFrom<String> for SlurmStep {
    type Error = String;
    fn try_from(text: String) -> Result<Self, Self::Error> {
        Self::parse(&text).ok_or_else(|| format!("not a Slurm step: {text:?}"))
    }
}

/// Where the job id of a [`SlurmJob`] was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlurmSource {
    /// The process's cgroup path: set by slurmstepd, not changeable by the job's user.
    Cgroup,
    /// Only the process's environment: what the process was started with, which its user
    /// controls.
    Environ,
}

/// What the cgroup path says about a process's job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupJob {
    /// `job_<id>`.
    pub job_id: u32,
    /// `step_<step>`, when the process is below the job's level.
    pub step: Option<SlurmStep>,
    /// `uid_<uid>` of the cgroup v1 layout (cgroup v2 has no user level).
    pub uid: Option<u32>,
}

/// What the environment says about a process's job.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvironJob {
    /// `SLURM_JOB_ID` (or the older `SLURM_JOBID`).
    pub job_id: Option<u32>,
    /// `SLURM_STEP_ID` (or `SLURM_STEPID`); a batch script has none.
    pub step: Option<SlurmStep>,
    /// `SLURM_JOB_USER`.
    pub user: Option<String>,
    /// `SLURM_JOB_PARTITION`.
    pub partition: Option<String>,
}

/// A process's Slurm job, with where the id came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlurmJob {
    /// The job id (for an array task, its own job id, as in its cgroup).
    pub job_id: u32,
    /// The step, when known.
    #[serde(default)]
    pub step: Option<SlurmStep>,
    /// The job's user: `SLURM_JOB_USER` of an environment that agrees with the job id.
    /// (The process's own user is on the process; they differ for a job's root-owned
    /// helpers.)
    #[serde(default)]
    pub user: Option<String>,
    /// The job's uid from the cgroup v1 path (`uid_<uid>`).
    #[serde(default)]
    pub uid: Option<u32>,
    /// `SLURM_JOB_PARTITION` of an environment that agrees with the job id.
    #[serde(default)]
    pub partition: Option<String>,
    /// Where `job_id` was read.
    pub source: SlurmSource,
    /// A different job id the environment claimed, ignored because the cgroup names the
    /// job (a user set `SLURM_JOB_ID`, or a process started inside one job was moved into
    /// another by root).
    #[serde(default)]
    pub environ_conflict: Option<u32>,
}

/// Finds a Slurm job in the text of `/proc/PID/cgroup` (every hierarchy: v1 lines
/// `N:controllers:/path`, the v2 line `0::/path`).
///
/// A `job_<id>` component counts only below a Slurm root (`slurmstepd.scope`,
/// `<node>_slurmstepd.scope`, `slurm`, `slurm_<node>`), so that a user's own cgroup named
/// `job_7` (cgroup v2 delegation lets users make them) is not taken for a job; the root may
/// itself sit below a container's or a slice's path. The first hierarchy that names a job
/// answers (slurmstepd puts a step's processes in the same job in each of them).
pub fn parse_cgroup(text: &str) -> Option<CgroupJob> {
    text.lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .find_map(job_in_cgroup_path)
}

fn job_in_cgroup_path(path: &str) -> Option<CgroupJob> {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    // Below a user's slice (systemd delegates `user@<uid>.service` to the user, who may make
    // cgroups of any name there; rootless containers live there too) nothing is Slurm's.
    let users_own = components
        .iter()
        .position(|c| *c == "user.slice" || (c.starts_with("user@") && c.ends_with(".service")))
        .unwrap_or(components.len());
    let components = &components[..users_own];
    // The last Slurm root followed by a job: a nested layout (Slurm in a container on a
    // Slurm node) names the innermost job, the one the process runs in; and a step's own
    // `slurm` directory (where the stepd sits in cgroup v2) is a root followed by nothing.
    (0..components.len())
        .rev()
        .find_map(|at| job_below_root(components[at], &components[at + 1..]))
}

/// The job below a Slurm root: `<node>_slurmstepd.scope` or `slurmstepd.scope` then
/// `job_<id>` (cgroup v2); `slurm` or `slurm_<node>` then `uid_<uid>/job_<id>` (cgroup v1);
/// then `step_<step>` when the process is in a step.
fn job_below_root(root: &str, below: &[&str]) -> Option<CgroupJob> {
    let v2 = root == "slurmstepd.scope" || root.ends_with("_slurmstepd.scope");
    let v1 = root == "slurm" || root.starts_with("slurm_");
    let mut rest = below.iter();
    let uid = if v2 {
        None
    } else if v1 {
        Some(decimal_u32(rest.next()?.strip_prefix("uid_")?)?)
    } else {
        return None;
    };
    let job_id = decimal_u32(rest.next()?.strip_prefix("job_")?)?;
    let step = rest
        .next()
        .and_then(|c| c.strip_prefix("step_"))
        .and_then(SlurmStep::parse);
    Some(CgroupJob { job_id, step, uid })
}

/// Finds Slurm's variables in the bytes of `/proc/PID/environ` (`NAME=value` entries, each
/// ended by a NUL). `None` when no `SLURM_JOB_ID` is there. A value that is not UTF-8 or
/// not a number where one is due is ignored, not guessed at.
pub fn parse_environ(bytes: &[u8]) -> Option<EnvironJob> {
    let mut job = EnvironJob::default();
    let mut old_job_id = None;
    let mut old_step = None;
    for entry in bytes.split(|&b| b == 0) {
        let Some(eq) = entry.iter().position(|&b| b == b'=') else {
            continue;
        };
        let (name, value) = (&entry[..eq], &entry[eq + 1..]);
        if !name.starts_with(b"SLURM_") {
            continue;
        }
        let Ok(value) = std::str::from_utf8(value) else {
            continue;
        };
        match name {
            b"SLURM_JOB_ID" => job.job_id = decimal_u32(value),
            b"SLURM_JOBID" => old_job_id = decimal_u32(value),
            b"SLURM_STEP_ID" => job.step = SlurmStep::parse(value),
            b"SLURM_STEPID" => old_step = SlurmStep::parse(value),
            b"SLURM_JOB_USER" if !value.is_empty() => job.user = Some(value.to_owned()),
            b"SLURM_JOB_PARTITION" if !value.is_empty() => {
                job.partition = Some(value.to_owned());
            }
            _ => {}
        }
    }
    job.job_id = job.job_id.or(old_job_id);
    job.step = job.step.or(old_step);
    job.job_id.is_some().then_some(job)
}

/// One job from what the two sources say; the cgroup wins a disagreement (see the module's
/// documentation).
pub fn resolve(cgroup: Option<CgroupJob>, environ: Option<EnvironJob>) -> Option<SlurmJob> {
    match (cgroup, environ) {
        (None, None) => None,
        (None, Some(env)) => Some(SlurmJob {
            job_id: env.job_id?,
            step: env.step,
            user: env.user,
            uid: None,
            partition: env.partition,
            source: SlurmSource::Environ,
            environ_conflict: None,
        }),
        (Some(cg), env) => {
            let agrees = env.as_ref().is_some_and(|e| e.job_id == Some(cg.job_id));
            let conflict = env.as_ref().and_then(|e| e.job_id).filter(|_| !agrees);
            let env = env.filter(|_| agrees).unwrap_or_default();
            Some(SlurmJob {
                job_id: cg.job_id,
                // The environment's step only fills a gap (a process at the job's level).
                step: cg.step.or(env.step),
                user: env.user,
                uid: cg.uid,
                partition: env.partition,
                source: SlurmSource::Cgroup,
                environ_conflict: conflict,
            })
        }
    }
}

/// The Slurm job of `pid`, from its cgroup path and its environment, or `None` when neither
/// names one (not a job's process, gone, or both files unreadable here).
pub fn job_of(pid: u32) -> Option<SlurmJob> {
    let cgroup = read_proc_bounded(pid, "cgroup", CGROUP_FILE_LIMIT_BYTES)
        .and_then(|(bytes, _)| parse_cgroup(&String::from_utf8_lossy(&bytes)));
    let environ = read_environ(pid).and_then(|bytes| parse_environ(&bytes));
    resolve(cgroup, environ)
}

/// `/proc/PID/environ`, at most [`ENVIRON_FILE_LIMIT_BYTES`], with an entry cut by the
/// bound dropped. `None` when it is missing or denied (another user's process read by a
/// user who is not root, a process that exited).
pub fn read_environ(pid: u32) -> Option<Vec<u8>> {
    let (mut bytes, truncated) = read_proc_bounded(pid, "environ", ENVIRON_FILE_LIMIT_BYTES)?;
    if truncated {
        let keep = bytes.iter().rposition(|&b| b == 0).map_or(0, |at| at + 1);
        bytes.truncate(keep);
    }
    Some(bytes)
}

/// Up to `limit` bytes of `/proc/PID/<file>` and whether there was more. /proc/PID is the
/// kernel's, so no path here is one a user controls.
fn read_proc_bounded(pid: u32, file: &str, limit: u64) -> Option<(Vec<u8>, bool)> {
    if pid == 0 || i32::try_from(pid).is_err() {
        return None;
    }
    let handle = std::fs::File::open(format!("/proc/{pid}/{file}")).ok()?;
    let mut bytes = Vec::new();
    handle
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .ok()?;
    let truncated = bytes.len() as u64 > limit;
    if truncated {
        bytes.truncate(usize::try_from(limit).ok()?);
    }
    Some((bytes, truncated))
}

/// A decimal number without sign, spaces or leading `+` (what Slurm writes), fitting `u32`.
fn decimal_u32(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cg(text: &str) -> Option<(u32, Option<String>, Option<u32>)> {
        parse_cgroup(text).map(|j| (j.job_id, j.step.map(|s| s.to_string()), j.uid))
    }

    #[test]
    fn cgroup_v2_layout_of_slurm_22_and_23() {
        // A task of step 0, the batch script, the extern step's adopted process, the
        // interactive step, and the stepd itself (in `…/slurm`).
        let cases = [
            (
                "0::/system.slice/slurmstepd.scope/job_3385/step_0/user/task_0\n",
                (3385, Some("0"), None),
            ),
            (
                "0::/system.slice/slurmstepd.scope/job_3385/step_batch/user/task_0\n",
                (3385, Some("batch"), None),
            ),
            (
                "0::/system.slice/slurmstepd.scope/job_3385/step_extern/user/task_special\n",
                (3385, Some("extern"), None),
            ),
            (
                "0::/system.slice/slurmstepd.scope/job_12/step_interactive/user/task_0\n",
                (12, Some("interactive"), None),
            ),
            (
                "0::/system.slice/slurmstepd.scope/job_4294967/step_17/slurm\n",
                (4_294_967, Some("17"), None),
            ),
            (
                // Several slurmd per host (`--enable-multiple-slurmd`).
                "0::/system.slice/node07_slurmstepd.scope/job_9/step_2/user/task_3\n",
                (9, Some("2"), None),
            ),
            (
                // slurmd inside a Kubernetes pod (Slinky, soperator): the pod's path above.
                "0::/kubepods.slice/kubepods-pod1b2c.slice/cri-containerd-ab.scope/system.slice/slurmstepd.scope/job_77/step_0/user/task_1\n",
                (77, Some("0"), None),
            ),
        ];
        for (text, (job, step, uid)) in cases {
            assert_eq!(
                cg(text),
                Some((job, step.map(str::to_owned), uid)),
                "{text}"
            );
        }
    }

    #[test]
    fn cgroup_v2_job_level_without_a_step() {
        assert_eq!(
            cg("0::/system.slice/slurmstepd.scope/job_5\n"),
            Some((5, None, None))
        );
        // The scope's own `system` directory (slurmstepd between jobs) names no job.
        assert_eq!(cg("0::/system.slice/slurmstepd.scope/system\n"), None);
    }

    #[test]
    fn cgroup_v1_layout_with_uid() {
        // As Debian's Slurm 22.05 writes it (read from a real job of this crate's
        // integration test) and as the cgroup v1 plugin documents it.
        let debian = "9:name=systemd:/\n8:pids:/\n6:freezer:/slurm_vramctlnode/uid_65534/job_1/step_batch\n4:memory:/process_api/38061aa2ad\n0::/\n";
        assert_eq!(cg(debian), Some((1, Some("batch".into()), Some(65534))));
        let task = "11:memory:/slurm/uid_1000/job_42/step_0/task_3\n7:freezer:/slurm/uid_1000/job_42/step_0\n";
        assert_eq!(cg(task), Some((42, Some("0".into()), Some(1000))));
        let ext = "7:freezer:/slurm/uid_1000/job_42/step_extern\n";
        assert_eq!(cg(ext), Some((42, Some("extern".into()), Some(1000))));
        let job_level = "7:freezer:/slurm/uid_1000/job_42\n";
        assert_eq!(cg(job_level), Some((42, None, Some(1000))));
    }

    #[test]
    fn paths_that_are_not_slurm_jobs() {
        for text in [
            "0::/\n",
            "0::/user.slice/user-1000.slice/session-3.scope\n",
            // A user's delegated cgroup named like a job, with no Slurm root above it.
            "0::/user.slice/user-1000.slice/user@1000.service/job_7/step_0\n",
            "0::/system.slice/docker-0123abcd.scope\n",
            // Names a user can make in a delegated subtree.
            "0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_7/step_0\n",
            "0::/user.slice/user-1000.slice/slurm/uid_0/job_7\n",
            // A v1 root without its uid level, a v2 root with one.
            "7:freezer:/slurm/job_4/step_0\n",
            "0::/system.slice/slurmstepd.scope/uid_0/job_4\n",
            // A Slurm root with something else below it.
            "0::/system.slice/slurmstepd.scope/jobs_7\n",
            "0::/system.slice/slurmstepd.scope/job_\n",
            "0::/system.slice/slurmstepd.scope/job_-3\n",
            "0::/system.slice/slurmstepd.scope/job_+3\n",
            "0::/system.slice/slurmstepd.scope/job_99999999999\n",
            "7:freezer:/slurm/uid_x/job_4\n",
            "garbage without colons\n",
            "",
        ] {
            assert_eq!(cg(text), None, "{text:?}");
        }
    }

    #[test]
    fn an_unknown_step_name_keeps_the_job() {
        assert_eq!(
            cg("0::/system.slice/slurmstepd.scope/job_8/step_weird/user\n"),
            Some((8, None, None))
        );
        // Slurm's marker ids (pending step) are no step a process runs in.
        assert_eq!(SlurmStep::parse("4294967293"), None);
    }

    #[test]
    fn step_ids_as_names_and_numbers() {
        assert_eq!(SlurmStep::parse("batch"), Some(SlurmStep::Batch));
        assert_eq!(SlurmStep::parse("4294967291"), Some(SlurmStep::Batch));
        assert_eq!(SlurmStep::parse("4294967292"), Some(SlurmStep::Extern));
        assert_eq!(SlurmStep::parse("4294967290"), Some(SlurmStep::Interactive));
        assert_eq!(SlurmStep::parse("0"), Some(SlurmStep::Number(0)));
        assert_eq!(SlurmStep::parse(" 1"), None);
        assert_eq!(SlurmStep::parse(""), None);
        let json = serde_json::to_string(&[SlurmStep::Batch, SlurmStep::Number(3)]).ok();
        assert_eq!(json.as_deref(), Some(r#"["batch","3"]"#));
        let back: Vec<SlurmStep> = serde_json::from_str(r#"["extern","12"]"#).unwrap();
        assert_eq!(back, vec![SlurmStep::Extern, SlurmStep::Number(12)]);
        assert!(serde_json::from_str::<SlurmStep>(r#""nope""#).is_err());
    }

    fn environ(vars: &[&str]) -> Vec<u8> {
        let mut bytes = Vec::new();
        for var in vars {
            bytes.extend_from_slice(var.as_bytes());
            bytes.push(0);
        }
        bytes
    }

    #[test]
    fn environ_of_a_batch_script_and_of_a_step() {
        // The variables a batch script of Debian's Slurm 22.05 has (no step id).
        let batch = environ(&[
            "PATH=/usr/bin",
            "SLURM_JOB_NAME=wrap",
            "SLURM_JOB_ID=1",
            "SLURM_JOB_PARTITION=gpuq",
            "SLURM_JOBID=1",
            "SLURM_JOB_UID=65534",
            "SLURM_JOB_USER=nobody",
        ]);
        assert_eq!(
            parse_environ(&batch),
            Some(EnvironJob {
                job_id: Some(1),
                step: None,
                user: Some("nobody".into()),
                partition: Some("gpuq".into()),
            })
        );
        let step = environ(&[
            "SLURM_STEPID=0",
            "SLURM_STEP_ID=0",
            "SLURM_JOB_ID=2",
            "SLURM_JOB_USER=alice",
        ]);
        let parsed = parse_environ(&step);
        assert_eq!(
            parsed.as_ref().and_then(|j| j.step),
            Some(SlurmStep::Number(0))
        );
        assert_eq!(parsed.and_then(|j| j.job_id), Some(2));
    }

    #[test]
    fn environ_without_a_job_or_with_nonsense() {
        assert_eq!(parse_environ(b""), None);
        assert_eq!(
            parse_environ(&environ(&["HOME=/root", "SLURM_CONF=/x"])),
            None
        );
        assert_eq!(parse_environ(&environ(&["SLURM_JOB_ID=12abc"])), None);
        assert_eq!(parse_environ(&environ(&["SLURM_JOB_ID="])), None);
        // Not UTF-8: ignored, not guessed.
        assert_eq!(parse_environ(b"SLURM_JOB_ID=\xff1\0"), None);
        // The older name alone still names the job.
        assert_eq!(
            parse_environ(&environ(&["SLURM_JOBID=31"])).and_then(|j| j.job_id),
            Some(31)
        );
        // A name that only starts like one of them is not it.
        assert_eq!(parse_environ(&environ(&["SLURM_JOB_IDX=4"])), None);
    }

    fn cgroup_job(job_id: u32) -> CgroupJob {
        CgroupJob {
            job_id,
            step: Some(SlurmStep::Batch),
            uid: Some(1000),
        }
    }

    fn environ_job(job_id: u32) -> EnvironJob {
        EnvironJob {
            job_id: Some(job_id),
            step: Some(SlurmStep::Number(4)),
            user: Some("alice".into()),
            partition: Some("gpu".into()),
        }
    }

    #[test]
    fn the_cgroup_wins_a_disagreement() {
        let job = resolve(Some(cgroup_job(10)), Some(environ_job(11)));
        assert_eq!(
            job,
            Some(SlurmJob {
                job_id: 10,
                step: Some(SlurmStep::Batch),
                user: None,
                uid: Some(1000),
                partition: None,
                source: SlurmSource::Cgroup,
                environ_conflict: Some(11),
            })
        );
    }

    #[test]
    fn an_agreeing_environment_fills_user_and_partition() {
        let job = resolve(Some(cgroup_job(10)), Some(environ_job(10)));
        assert_eq!(
            job,
            Some(SlurmJob {
                job_id: 10,
                step: Some(SlurmStep::Batch),
                user: Some("alice".into()),
                uid: Some(1000),
                partition: Some("gpu".into()),
                source: SlurmSource::Cgroup,
                environ_conflict: None,
            })
        );
        // The environment's step fills a job-level cgroup's gap only.
        let job_level = CgroupJob {
            step: None,
            ..cgroup_job(10)
        };
        let job = resolve(Some(job_level), Some(environ_job(10)));
        assert_eq!(job.and_then(|j| j.step), Some(SlurmStep::Number(4)));
    }

    #[test]
    fn the_environment_alone_is_marked_as_such() {
        let job = resolve(None, Some(environ_job(11)));
        assert_eq!(job.as_ref().map(|j| j.source), Some(SlurmSource::Environ));
        assert_eq!(job.and_then(|j| j.partition), Some("gpu".into()));
        assert_eq!(resolve(None, None), None);
        let job = resolve(Some(cgroup_job(3)), None);
        assert_eq!(
            job.map(|j| (j.job_id, j.source)),
            Some((3, SlurmSource::Cgroup))
        );
    }

    #[test]
    fn json_names_the_source() {
        let job = resolve(Some(cgroup_job(10)), Some(environ_job(10)));
        let json = serde_json::to_value(job).unwrap();
        assert_eq!(json["source"], "cgroup");
        assert_eq!(json["step"], "batch");
        assert_eq!(json["job_id"], 10);
    }

    #[test]
    fn our_own_process_is_read_with_bounds() {
        // The test runner itself: environ is readable (same user), and holds no job unless
        // the tests run inside one.
        let bytes = read_environ(std::process::id());
        assert!(bytes.is_some());
        let in_a_job = std::env::var_os("SLURM_JOB_ID").is_some();
        assert_eq!(job_of(std::process::id()).is_some(), in_a_job);
        assert_eq!(read_environ(0), None);
        assert_eq!(read_environ(u32::MAX), None);
    }

    #[test]
    fn a_cut_environ_drops_the_cut_entry() {
        // A real environment larger than the bound: one variable may hold at most 128 KiB
        // (MAX_ARG_STRLEN), so eleven of 100 KiB. A child's variables are in name order:
        // the job id, the fillers, then the partition beyond the bound.
        let filler = "x".repeat(100 * 1024);
        let mut command = std::process::Command::new("sleep");
        command.arg("5").env_clear().env("SLURM_JOB_ID", "77");
        for n in 0..11 {
            command.env(format!("SLURM_JOB_J{n:02}"), &filler);
        }
        let mut child = command.env("SLURM_JOB_PARTITION", "gpu").spawn().unwrap();
        let bytes = read_environ(child.id());
        let _ = child.kill();
        let _ = child.wait();
        let bytes = bytes.unwrap();
        assert!(bytes.len() as u64 <= ENVIRON_FILE_LIMIT_BYTES);
        assert_eq!(bytes.last(), Some(&0), "ends with a whole entry");
        assert!(bytes.len() as u64 > ENVIRON_FILE_LIMIT_BYTES - 100 * 1024);
        let job = parse_environ(&bytes).unwrap();
        assert_eq!(job.job_id, Some(77));
        assert_eq!(job.partition, None, "beyond the bound");
    }
}
