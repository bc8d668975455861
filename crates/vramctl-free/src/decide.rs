//! The decision, as a pure function: a process holding GPU memory now, what the evidence
//! says about it on each of its GPUs, and a policy → a candidate with the reasons, or the
//! first rule it fails.
//!
//! A process is a candidate when it passes the policy's filters (GPUs, user, `match`,
//! `exclude`), holds at least `min_mem` over all its GPUs, and is idle on **every** GPU it
//! holds memory on for at least `idle_for` by the analysis's idle evidence (`docs/leaks.md`:
//! per-process SM activity, device utilization, CPU time), with evidence that reaches the
//! present, and nothing now contradicts it (SM activity in this sample, CPU time used since
//! the history's last reading).

use std::sync::Arc;

use serde::Serialize;
use vramctl_core::types::DeviceInfo;
use vramctl_leaks::analysis::{Evidence, SeriesReport, Verdict, human_duration};

use crate::policy::Policy;
use vramctl_observe::gpu_holdings::{GpuHolding, total_bytes};
use vramctl_observe::observation::HostProcess;
use vramctl_observe::units;

/// Where a verdict's evidence came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The recorded history (`record`, `serve --record`), analysed as `leaks` does.
    History,
    /// `reap --every` watching the GPUs itself (`FleetTracker`).
    Live,
}

impl Source {
    /// `history`, `live`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::History => "history",
            Self::Live => "live",
        }
    }
}

/// What the analysis says about a process on one GPU, and from where.
#[derive(Debug, Clone)]
pub struct GpuEvidence {
    /// History or live.
    pub source: Source,
    /// The series' report (its `idle` part is the evidence).
    pub report: SeriesReport,
}

/// A process's memory on one GPU now, with the evidence about it there.
#[derive(Debug, Clone)]
pub struct GpuNow {
    /// What the driver attributes to it now.
    pub holding: GpuHolding,
    /// The device.
    pub info: Arc<DeviceInfo>,
    /// Its SM activity in this sample, where the driver reports it.
    pub sm_percent_now: Option<u32>,
    /// The analysis of its series there, when some evidence reaches the present.
    pub evidence: Option<GpuEvidence>,
}

/// CPU time a process used since the history's last reading of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuSince {
    /// CPU time used, ms.
    pub used_ms: u64,
    /// Over this much wall-clock time, ms.
    pub over_ms: i64,
}

/// A process holding GPU memory now.
#[derive(Debug, Clone)]
pub struct Observed {
    /// PID.
    pub pid: u32,
    /// Start time (clock ticks after boot), when /proc shows it.
    pub start_time_ticks: Option<u64>,
    /// Real uid.
    pub uid: Option<u32>,
    /// User name.
    pub user: Option<String>,
    /// Command line (or the driver's name for it).
    pub command: Option<String>,
    /// Its GPUs, in index order.
    pub gpus: Vec<GpuNow>,
    /// CPU time since the history's last reading, for history evidence.
    pub cpu_since_history: Option<CpuSince>,
    /// What /proc (and the kubelet) said of it: its container, pod and Slurm job for the
    /// owner filters (`--job`, `--pod`, `--container`); `None` when /proc cannot see it.
    pub host: Option<HostProcess>,
}

impl Observed {
    /// Memory over all its GPUs; `None` when the driver does not say for one.
    pub fn used_bytes(&self) -> Option<u64> {
        let holdings: Vec<GpuHolding> = self.gpus.iter().map(|g| g.holding.clone()).collect();
        total_bytes(&holdings)
    }
}

/// How far a process got through a policy's rules; a higher stage is the more telling
/// reason when several policies exclude it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// GPUs, user, `match`, `exclude`.
    Filter,
    /// Under `min_mem`.
    Memory,
    /// Nothing shows whether it is idle.
    NoEvidence,
    /// Active, or not idle long enough.
    Busy,
    /// The safe path would not signal it (another user's, not visible, ...).
    Refused,
    /// Over `max_kills` this run.
    Limit,
}

/// Why a process is not reaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exclusion {
    /// Which rule.
    pub stage: Stage,
    /// In words.
    pub reason: String,
}

/// Why a process is reaped.
#[derive(Debug, Clone, PartialEq)]
pub struct Chosen {
    /// The latest start of its idle spans over its GPUs.
    pub idle_since_unix_ms: i64,
    /// The shortest idle span over its GPUs, seconds.
    pub idle_s: f64,
    /// The sources the evidence came from.
    pub sources: Vec<Source>,
    /// In words: how long idle, by what, and how much it holds.
    pub why: String,
}

/// What the decision needs besides the process and the policy.
pub struct Context<'a> {
    /// A process using at most this fraction of a core is idle by its CPU time.
    pub cpu_idle_fraction: f64,
    /// CPU time is counted in clock ticks: this much more is rounding, not activity.
    pub cpu_slack_ms: u64,
    /// Why a GPU without evidence has none (no history, stale history, not watched yet).
    pub missing: &'a str,
    /// How times are shown.
    pub time: &'a dyn Fn(i64) -> String,
}

fn exclude(stage: Stage, reason: String) -> Result<Chosen, Exclusion> {
    Err(Exclusion { stage, reason })
}

fn evidence_words(evidence: &[Evidence]) -> String {
    let names: Vec<&str> = evidence.iter().map(|e| e.describe()).collect();
    names.join(", ")
}

/// Judges `p` against `policy` (module docs).
///
/// # Errors
/// The first rule it fails, as an [`Exclusion`].
pub fn decide(p: &Observed, policy: &Policy, ctx: &Context<'_>) -> Result<Chosen, Exclusion> {
    if !p.gpus.iter().any(|g| policy.gpu_ok(&g.info)) {
        return exclude(
            Stage::Filter,
            format!("holds no memory on GPU {}", policy.gpus.join(", ")),
        );
    }
    if !policy.user_ok(p.user.as_deref(), p.uid) {
        let who = match (&p.user, p.uid) {
            (Some(u), _) => format!("user '{u}'"),
            (None, Some(uid)) => format!("uid {uid}"),
            (None, None) => "its user (unknown)".to_owned(),
        };
        return exclude(
            Stage::Filter,
            format!("{who} is not one of {}", policy.users.join(", ")),
        );
    }
    if let Some(selector) = policy
        .owners
        .iter()
        .find(|s| !p.host.as_ref().is_some_and(|h| s.matches(h)))
    {
        return exclude(
            Stage::Filter,
            match &p.host {
                Some(_) => format!("not selected by {}", selector.describe()),
                None => format!(
                    "its owner cannot be known here (not visible in this PID namespace), so {} does not select it",
                    selector.describe()
                ),
            },
        );
    }
    if let Some(re) = &policy.pattern {
        if !p.command.as_deref().is_some_and(|c| re.is_match(c)) {
            return exclude(
                Stage::Filter,
                format!("its command line does not match '{}'", re.as_str()),
            );
        }
    }
    if let Some(re) = policy
        .exclude
        .iter()
        .find(|re| p.command.as_deref().is_some_and(|c| re.is_match(c)))
    {
        return exclude(
            Stage::Filter,
            format!("its command line matches the exclusion '{}'", re.as_str()),
        );
    }
    let Some(used) = p.used_bytes() else {
        return exclude(
            Stage::Memory,
            "the driver does not report how much memory it holds".to_owned(),
        );
    };
    if used < policy.min_mem_bytes {
        return exclude(
            Stage::Memory,
            format!(
                "holds {}, under {}",
                units::bytes(used),
                units::bytes(policy.min_mem_bytes)
            ),
        );
    }
    let idle_for_s = policy.idle_for.as_secs_f64();
    let mut since = i64::MIN;
    let mut shortest = f64::INFINITY;
    let mut sources: Vec<Source> = Vec::new();
    let mut per_gpu: Vec<String> = Vec::new();
    for g in &p.gpus {
        let gpu = format!("GPU {}", g.info.index);
        let Some(ev) = &g.evidence else {
            return exclude(
                Stage::NoEvidence,
                format!("no evidence of idleness on {gpu}: {}", ctx.missing),
            );
        };
        let idle = &ev.report.idle;
        if ev.report.verdict == Verdict::Leak {
            return exclude(
                Stage::Busy,
                format!(
                    "its memory grows on {gpu} (leak verdict, {}): not idle; `vramctl leaks` \
                     explains",
                    ev.source.as_str()
                ),
            );
        }
        let (Some(from), Some(idle_s)) = (idle.idle_since_unix_ms, idle.idle_sec) else {
            return match idle.last_active_unix_ms {
                Some(t) => exclude(
                    Stage::Busy,
                    format!(
                        "active on {gpu} at {} ({})",
                        (ctx.time)(t),
                        ev.source.as_str()
                    ),
                ),
                None if idle.sources.is_empty() => exclude(
                    Stage::NoEvidence,
                    format!(
                        "no evidence of idleness on {gpu}: no SM activity, device utilization \
                         or CPU time in the {}",
                        ev.source.as_str()
                    ),
                ),
                // One sample shows a state, not a span: nothing yet either way.
                None if ev.report.samples < 2 => exclude(
                    Stage::NoEvidence,
                    format!(
                        "not shown idle on {gpu} yet: one sample of {} so far ({})",
                        evidence_words(&idle.sources),
                        ev.source.as_str()
                    ),
                ),
                None => exclude(
                    Stage::Busy,
                    format!(
                        "not shown idle on {gpu}: its CPU time grows and {} cannot tell GPU \
                         work apart ({})",
                        evidence_words(&idle.sources),
                        ev.source.as_str()
                    ),
                ),
            };
        };
        if idle_s < idle_for_s {
            return exclude(
                Stage::Busy,
                format!(
                    "idle for only {} on {gpu} (since {}, by {}; {}), under {}",
                    human_duration(idle_s),
                    (ctx.time)(from),
                    evidence_words(&idle.evidence),
                    ev.source.as_str(),
                    human_duration(idle_for_s)
                ),
            );
        }
        if let Some(sm) = g.sm_percent_now.filter(|sm| *sm > 0) {
            return exclude(
                Stage::Busy,
                format!("busy now: SM activity {sm} % on {gpu}"),
            );
        }
        since = since.max(from);
        shortest = shortest.min(idle_s);
        if !sources.contains(&ev.source) {
            sources.push(ev.source);
        }
        per_gpu.push(format!(
            "{} on {gpu} by {} ({})",
            human_duration(idle_s),
            evidence_words(&idle.evidence),
            ev.source.as_str()
        ));
    }
    if let Some(cpu) = p.cpu_since_history {
        // The counter bridges the time since the history's last sample.
        let allowed = ctx.cpu_idle_fraction * cpu.over_ms.max(0) as f64 + ctx.cpu_slack_ms as f64;
        if cpu.used_ms as f64 > allowed {
            return exclude(
                Stage::Busy,
                format!(
                    "busy now: used {} of CPU in the {} since the history's last sample",
                    units::seconds(cpu.used_ms as f64 / 1000.0),
                    human_duration(cpu.over_ms.max(0) as f64 / 1000.0)
                ),
            );
        }
    }
    Ok(Chosen {
        idle_since_unix_ms: since,
        idle_s: shortest,
        sources,
        why: format!(
            "idle {} (≥ {}); holds {} (≥ {})",
            per_gpu.join(", "),
            human_duration(idle_for_s),
            units::bytes(used),
            units::bytes(policy.min_mem_bytes)
        ),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use vramctl_core::types::ProcessKind;
    use vramctl_leaks::analysis::{
        ActivityInputs, CpuSample, LeakConfig, Sample, SeriesContext, SmSample, analyze,
    };

    use super::*;
    use vramctl_observe::pattern::compile_regex;

    const GIB: u64 = 1 << 30;
    const T0: i64 = 1_795_984_291_000;
    const MIN: i64 = 60_000;

    fn policy() -> Policy {
        Policy {
            name: "test".into(),
            idle_for: Duration::from_secs(30 * 60),
            min_mem_bytes: GIB,
            users: Vec::new(),
            pattern: None,
            exclude: Vec::new(),
            gpus: Vec::new(),
            max_kills: None,
            owners: Vec::new(),
        }
    }

    /// A report over `minutes` of samples at 1 min, SM at `sm` % from `busy_until` on.
    fn report(minutes: i64, bytes: u64, sm: impl Fn(i64) -> u32) -> SeriesReport {
        let samples: Vec<Sample> = (0..=minutes)
            .map(|i| Sample::new(T0 + i * MIN, bytes))
            .collect();
        let sm: Vec<SmSample> = (0..=minutes)
            .map(|i| SmSample {
                t_unix_ms: T0 + i * MIN,
                sm_percent: sm(i),
            })
            .collect();
        let cpu: Vec<CpuSample> = Vec::new();
        analyze(
            &samples,
            &ActivityInputs {
                process_sm: &sm,
                device: &[],
                cpu: &cpu,
            },
            &SeriesContext::default(),
            &LeakConfig::default(),
        )
        .unwrap()
    }

    fn observed(gpus: Vec<(u64, Option<SeriesReport>)>) -> Observed {
        Observed {
            host: None,
            pid: 4242,
            start_time_ticks: Some(7),
            uid: Some(1000),
            user: Some("alice".into()),
            command: Some("python -m ipykernel_launcher -f kernel.json".into()),
            gpus: gpus
                .into_iter()
                .enumerate()
                .map(|(i, (bytes, report))| {
                    let index = u32::try_from(i).unwrap();
                    GpuNow {
                        holding: GpuHolding {
                            index,
                            uuid: format!("GPU-{i}"),
                            used_bytes: Some(bytes),
                            kind: ProcessKind::Compute,
                            gpu_instance_id: None,
                            compute_instance_id: None,
                            mig_uuid: None,
                        },
                        info: Arc::new(DeviceInfo::new(index, format!("GPU-{i}"))),
                        sm_percent_now: Some(0),
                        evidence: report.map(|report| GpuEvidence {
                            source: Source::History,
                            report,
                        }),
                    }
                })
                .collect(),
            cpu_since_history: Some(CpuSince {
                used_ms: 0,
                over_ms: 1000,
            }),
        }
    }

    fn clock(t: i64) -> String {
        format!("+{}min", (t - T0) / MIN)
    }

    fn run(p: &Observed, policy: &Policy) -> Result<Chosen, Exclusion> {
        decide(
            p,
            policy,
            &Context {
                cpu_idle_fraction: 0.01,
                cpu_slack_ms: 10,
                missing: "no history",
                time: &clock,
            },
        )
    }

    fn stage(p: &Observed, policy: &Policy) -> Stage {
        run(p, policy).unwrap_err().stage
    }

    #[test]
    fn an_idle_holder_over_the_thresholds_is_chosen_with_its_evidence() {
        let p = observed(vec![(8 * GIB, Some(report(60, 8 * GIB, |_| 0)))]);
        let chosen = run(&p, &policy()).unwrap();
        assert_eq!(chosen.idle_since_unix_ms, T0);
        assert_eq!(chosen.idle_s, 3600.0);
        assert_eq!(chosen.sources, [Source::History]);
        assert_eq!(
            chosen.why,
            "idle 1 h 0 min on GPU 0 by per-process SM activity (history) (≥ 30 min); holds 8.0 GiB \
             (≥ 1.0 GiB)"
        );
    }

    #[test]
    fn every_gpu_must_be_idle_and_memory_counts_over_all() {
        // 600 MiB on each of two GPUs: 1.2 GiB in all passes 1 GiB.
        let idle = || Some(report(60, 600 << 20, |_| 0));
        let p = observed(vec![(600 << 20, idle()), (600 << 20, idle())]);
        assert!(run(&p, &policy()).is_ok());
        // Busy on the second GPU ten minutes ago.
        let p = observed(vec![
            (600 << 20, idle()),
            (
                600 << 20,
                Some(report(60, 600 << 20, |i| u32::from(i == 50) * 40)),
            ),
        ]);
        let e = run(&p, &policy()).unwrap_err();
        assert_eq!(e.stage, Stage::Busy);
        assert_eq!(
            e.reason,
            "idle for only 10 min on GPU 1 (since +50min, by per-process SM activity; history), \
             under 30 min"
        );
        // No evidence at all on one GPU.
        let p = observed(vec![(4 * GIB, idle()), (GIB, None)]);
        let e = run(&p, &policy()).unwrap_err();
        assert_eq!(e.stage, Stage::NoEvidence);
        assert_eq!(e.reason, "no evidence of idleness on GPU 1: no history");
    }

    #[test]
    fn owner_selectors_filter_by_what_the_process_is_known_to_belong_to() {
        use vramctl_observe::owners::OwnerSelector;
        use vramctl_procs::slurm::{SlurmJob, SlurmSource};
        let idle = || Some(report(60, 8 * GIB, |_| 0));
        let mut p = observed(vec![(8 * GIB, idle())]);
        let mut pol = policy();
        pol.owners = vec![OwnerSelector::Job(1234)];
        // Not visible here: its job cannot be known, so it is not selected.
        assert_eq!(
            run(&p, &pol).unwrap_err().reason,
            "its owner cannot be known here (not visible in this PID namespace), so --job 1234 \
             does not select it"
        );
        p.host = Some(HostProcess {
            pid: p.pid,
            slurm: Some(SlurmJob {
                job_id: 1234,
                step: None,
                user: None,
                uid: None,
                partition: None,
                source: SlurmSource::Cgroup,
                environ_conflict: None,
            }),
            ..HostProcess::default()
        });
        assert!(run(&p, &pol).is_ok());
        pol.owners.push(OwnerSelector::pod("ml/train-0").unwrap());
        let e = run(&p, &pol).unwrap_err();
        assert_eq!(
            (e.stage, e.reason.as_str()),
            (Stage::Filter, "not selected by --pod ml/train-0")
        );
    }

    #[test]
    fn filters_come_first_then_memory() {
        let idle = || Some(report(60, 8 * GIB, |_| 0));
        let p = observed(vec![(8 * GIB, idle())]);
        let mut pol = policy();
        pol.users = vec!["bob".into()];
        let e = run(&p, &pol).unwrap_err();
        assert_eq!(e.reason, "user 'alice' is not one of bob");
        pol.users = vec!["1000".into()];
        assert!(run(&p, &pol).is_ok());
        pol.pattern = Some(compile_regex("--match", "train\\.py").unwrap());
        assert_eq!(
            run(&p, &pol).unwrap_err().reason,
            "its command line does not match 'train\\.py'"
        );
        pol.pattern = Some(compile_regex("--match", "ipykernel").unwrap());
        pol.exclude = vec![compile_regex("--exclude", "kernel\\.json").unwrap()];
        assert_eq!(
            run(&p, &pol).unwrap_err().reason,
            "its command line matches the exclusion 'kernel\\.json'"
        );
        pol.exclude.clear();
        pol.gpus = vec!["1".into()];
        assert_eq!(
            run(&p, &pol).unwrap_err().reason,
            "holds no memory on GPU 1"
        );
        pol.gpus = vec!["0".into()];
        pol.min_mem_bytes = 16 * GIB;
        let e = run(&p, &pol).unwrap_err();
        assert_eq!(
            (e.stage, e.reason.as_str()),
            (Stage::Memory, "holds 8.0 GiB, under 16.0 GiB")
        );
        assert!(Stage::Filter < Stage::Memory && Stage::Busy < Stage::Refused);
    }

    #[test]
    fn activity_now_overrides_the_history() {
        let mut p = observed(vec![(8 * GIB, Some(report(60, 8 * GIB, |_| 0)))]);
        p.gpus[0].sm_percent_now = Some(35);
        assert_eq!(
            run(&p, &policy()).unwrap_err().reason,
            "busy now: SM activity 35 % on GPU 0"
        );
        p.gpus[0].sm_percent_now = None;
        // 1 % of 20 s is 200 ms (+10 ms of rounding): 150 ms is idle, 900 ms is not.
        p.cpu_since_history = Some(CpuSince {
            used_ms: 150,
            over_ms: 20_000,
        });
        assert!(run(&p, &policy()).is_ok());
        p.cpu_since_history = Some(CpuSince {
            used_ms: 900,
            over_ms: 20_000,
        });
        let e = run(&p, &policy()).unwrap_err();
        assert_eq!(e.stage, Stage::Busy);
        assert_eq!(
            e.reason,
            "busy now: used 0.90 s of CPU in the 20 s since the history's last sample"
        );
    }

    #[test]
    fn an_active_or_unknown_process_is_not_chosen() {
        let p = observed(vec![(8 * GIB, Some(report(60, 8 * GIB, |_| 50)))]);
        let e = run(&p, &policy()).unwrap_err();
        assert_eq!(e.stage, Stage::Busy);
        assert_eq!(e.reason, "active on GPU 0 at +60min (history)");
        // Memory samples but no activity source at all.
        let samples: Vec<Sample> = (0..=60).map(|i| Sample::new(T0 + i * MIN, GIB)).collect();
        let bare = analyze(
            &samples,
            &ActivityInputs::default(),
            &SeriesContext::default(),
            &LeakConfig::default(),
        )
        .unwrap();
        let p = observed(vec![(8 * GIB, Some(bare))]);
        assert_eq!(stage(&p, &policy()), Stage::NoEvidence);
    }
}
