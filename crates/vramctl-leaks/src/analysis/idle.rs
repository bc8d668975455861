//! Idle-holder evidence: when did the process last use the GPU, and since when has every
//! source we have said it was idle?
//!
//! Three sources, in the order we trust them:
//! - **process SM activity** from `nvmlDeviceGetProcessUtilization`, where the driver
//!   reports it (often it does not: on the H200 it mostly answered NOT_FOUND even for busy
//!   processes, so a missing sample is never taken as idleness);
//! - **device utilization**: 0 % means every process on the device was idle; above 0 %
//!   it proves activity only when the process is alone on the device;
//! - **CPU time** from /proc: launching GPU work takes CPU, so a process that used at most
//!   `cpu_idle_fraction` of a core did not keep the GPU busy. A busy CPU proves nothing.
//!   The counter moves in 10 ms ticks, so it is judged over windows of at least
//!   [`CPU_WINDOW_MS`]: over 100 ms one tick of a sleeping Python loop is 10 % of a core,
//!   and such windows broke every idle span on a real H200 (`leaks --watch` at 100 ms never
//!   called a 12 GiB holder that slept for 4 min idle).
//!
//! A change in the process's memory is activity too (it allocated or freed): on the H200 a
//! request loop that allocates and frees 4 GiB every 5 s used 0.2 % of a core, and CPU time
//! alone called it idle. [`IdleFold::report`] starts the current span no earlier than the
//! last change.
//!
//! Each sample covers the time since the previous sample of its source. The fold keeps the
//! current idle span (covered by idle evidence without a hole and with no activity in it)
//! and the closed spans at least `idle_for` long, so the batch analysis and the incremental
//! tracker are the same code.

use serde::{Deserialize, Serialize};

use super::series::MAX_ABS_T_MS;

/// Per-process SM activity, where the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmSample {
    /// When it was read.
    pub t_unix_ms: i64,
    /// SM utilisation of the process over the driver's sample window, percent.
    pub sm_percent: u32,
}

/// The device's utilization and how many processes held memory on it at that time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceActivitySample {
    /// When it was read.
    pub t_unix_ms: i64,
    /// `utilization.gpu`: percent of time a kernel ran.
    pub utilization_gpu_percent: u32,
    /// Processes the driver listed on the device at that time (the analysed one included).
    pub processes_on_device: u32,
}

/// The process's cumulative CPU time (user + system) from /proc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuSample {
    /// When it was read.
    pub t_unix_ms: i64,
    /// `(utime + stime) × 1000 / ticks_per_second`.
    pub cpu_time_ms: u64,
}

/// Where a piece of evidence came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Evidence {
    /// NVML per-process SM utilisation.
    ProcessSm,
    /// Device utilisation (0 % for everyone, or the process alone on the device).
    DeviceUtilization,
    /// CPU time from /proc.
    CpuTime,
}

impl Evidence {
    /// Human name for explanations.
    pub fn describe(self) -> &'static str {
        match self {
            Self::ProcessSm => "per-process SM activity",
            Self::DeviceUtilization => "device utilization",
            Self::CpuTime => "CPU time",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Self::ProcessSm => 1,
            Self::DeviceUtilization => 2,
            Self::CpuTime => 4,
        }
    }

    fn all_in(bits: u8) -> Vec<Self> {
        [Self::ProcessSm, Self::DeviceUtilization, Self::CpuTime]
            .into_iter()
            .filter(|e| bits & e.bit() != 0)
            .collect()
    }
}

/// A stretch of time in which the process did not use the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdlePeriod {
    /// Start, milliseconds since the Unix epoch.
    pub from_unix_ms: i64,
    /// End (the last evidence of idleness).
    pub to_unix_ms: i64,
    /// The sources that showed it idle.
    pub evidence: Vec<Evidence>,
}

/// What the activity evidence says at the end of the series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IdleReport {
    /// Start of the current idle span; `None` when the process is active or there is no
    /// evidence either way.
    pub idle_since_unix_ms: Option<i64>,
    /// Length of the current idle span in seconds.
    pub idle_sec: Option<f64>,
    /// The sources that showed the current span idle.
    pub evidence: Vec<Evidence>,
    /// Last time a source showed GPU activity.
    pub last_active_unix_ms: Option<i64>,
    /// The sources that had any sample at all.
    pub sources: Vec<Evidence>,
    /// Idle spans at least `idle_for` long (closed ones and the current one), oldest first:
    /// what `vramctl plot` draws as idle spans.
    pub periods: Vec<IdlePeriod>,
    /// The latest evidence (within `max_evidence_gap` of the end of the series) showed
    /// the process using the GPU or changing its memory, and no later sample of any
    /// source said otherwise.
    pub active_at_end: bool,
}

/// What an [`IdleReport`] says about the end of its series, read one way by every
/// display (`top`'s IDLE column, the exporter's idle seconds): absence of evidence is
/// never idleness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdleState {
    /// No source had a sample that could show idleness: nothing can be said.
    NoEvidence,
    /// The latest evidence showed activity (within `max_evidence_gap` of the end).
    Active,
    /// Idle since `since_unix_ms`, by evidence without a hole up to the end.
    Idle {
        /// Start of the idle span.
        since_unix_ms: i64,
        /// Activity was seen before the span: idle for exactly that long. `false`: idle
        /// since the evidence began, so for at least that long.
        activity_seen: bool,
    },
    /// There is evidence, but it shows neither at the end (a busy CPU on a shared GPU, a
    /// hole in the samples since the last activity).
    Unknown,
}

impl IdleReport {
    /// The state at the end of the series.
    pub fn state(&self) -> IdleState {
        if let Some(since_unix_ms) = self.idle_since_unix_ms {
            IdleState::Idle {
                since_unix_ms,
                activity_seen: self.last_active_unix_ms.is_some(),
            }
        } else if self.active_at_end {
            IdleState::Active
        } else if self.sources.is_empty() {
            IdleState::NoEvidence
        } else {
            IdleState::Unknown
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    Active,
    Idle(Evidence),
    Unknown,
}

#[derive(Debug, Clone, Copy)]
struct Span {
    from: i64,
    to: i64,
    evidence: u8,
}

/// Shortest window over which CPU time is judged: at `cpu_idle_fraction` = 1 % a window of
/// 10 s allows 10 ticks of 10 ms, so the counter's granularity no longer decides.
pub(crate) const CPU_WINDOW_MS: i64 = 10_000;

/// Most closed periods kept (the oldest are dropped first).
const MAX_PERIODS: usize = 256;

/// The fold over activity samples.
#[derive(Debug, Clone)]
pub(crate) struct IdleFold {
    max_gap_ms: i64,
    idle_for_ms: i64,
    cpu_idle_fraction: f64,
    last_sm: Option<i64>,
    last_device: Option<i64>,
    last_cpu: Option<CpuSample>,
    last_active: Option<i64>,
    /// Time of the latest sample of any source that said something (active, idle or
    /// neither): activity is "at the end" only when nothing later said otherwise.
    last_sample: Option<i64>,
    span: Option<Span>,
    periods: Vec<IdlePeriod>,
    sources: u8,
}

impl IdleFold {
    pub fn new(max_gap_ms: i64, idle_for_ms: i64, cpu_idle_fraction: f64) -> Self {
        Self {
            max_gap_ms,
            idle_for_ms,
            cpu_idle_fraction,
            last_sm: None,
            last_device: None,
            last_cpu: None,
            last_active: None,
            last_sample: None,
            span: None,
            periods: Vec::new(),
            sources: 0,
        }
    }

    /// The interval a sample covers: since the previous sample of its source, unless that
    /// is too long ago (then the time between is unknown and the sample covers nothing).
    fn covered(previous: Option<i64>, t: i64, max_gap_ms: i64) -> Option<(i64, i64)> {
        let prev = previous?;
        (t > prev && t - prev <= max_gap_ms).then_some((prev, t))
    }

    pub fn push_sm(&mut self, s: SmSample) {
        if self.last_sm.is_some_and(|p| s.t_unix_ms <= p) || s.t_unix_ms.abs() > MAX_ABS_T_MS {
            return;
        }
        self.sources |= Evidence::ProcessSm.bit();
        let interval = Self::covered(self.last_sm, s.t_unix_ms, self.max_gap_ms);
        self.last_sm = Some(s.t_unix_ms);
        let state = if s.sm_percent > 0 {
            State::Active
        } else {
            State::Idle(Evidence::ProcessSm)
        };
        self.apply(interval, s.t_unix_ms, state);
    }

    pub fn push_device(&mut self, s: DeviceActivitySample) {
        if self.last_device.is_some_and(|p| s.t_unix_ms <= p) || s.t_unix_ms.abs() > MAX_ABS_T_MS {
            return;
        }
        let interval = Self::covered(self.last_device, s.t_unix_ms, self.max_gap_ms);
        self.last_device = Some(s.t_unix_ms);
        let state = if s.utilization_gpu_percent == 0 {
            State::Idle(Evidence::DeviceUtilization)
        } else if s.processes_on_device == 1 {
            State::Active
        } else {
            // Busy, but someone else may be the one computing.
            State::Unknown
        };
        if !matches!(state, State::Unknown) {
            self.sources |= Evidence::DeviceUtilization.bit();
        }
        self.apply(interval, s.t_unix_ms, state);
    }

    pub fn push_cpu(&mut self, s: CpuSample) {
        if s.t_unix_ms.abs() > MAX_ABS_T_MS {
            return;
        }
        let Some(prev) = self.last_cpu else {
            self.last_cpu = Some(s);
            self.sources |= Evidence::CpuTime.bit();
            return;
        };
        if s.t_unix_ms <= prev.t_unix_ms {
            return;
        }
        // The previous sample stays the base until the window is long enough to judge; a
        // counter that went backwards (another process) restarts it at once.
        if s.t_unix_ms - prev.t_unix_ms < CPU_WINDOW_MS && s.cpu_time_ms >= prev.cpu_time_ms {
            return;
        }
        self.last_cpu = Some(s);
        // The counter is cumulative, so it bridges gaps in sampling; going backwards means
        // it is not the same process, and the interval says nothing.
        let state = match s.cpu_time_ms.checked_sub(prev.cpu_time_ms) {
            Some(used) => {
                let wall = (s.t_unix_ms - prev.t_unix_ms) as f64;
                if (used as f64) <= self.cpu_idle_fraction * wall {
                    State::Idle(Evidence::CpuTime)
                } else {
                    State::Unknown
                }
            }
            None => State::Unknown,
        };
        self.apply(Some((prev.t_unix_ms, s.t_unix_ms)), s.t_unix_ms, state);
    }

    fn apply(&mut self, interval: Option<(i64, i64)>, t: i64, state: State) {
        self.last_sample = Some(self.last_sample.map_or(t, |s| s.max(t)));
        match state {
            State::Active => {
                self.last_active = Some(self.last_active.map_or(t, |a| a.max(t)));
                if let Some(span) = self.span.take() {
                    let from = interval.map_or(t, |(f, _)| f);
                    self.close(Span {
                        to: span.to.min(from),
                        ..span
                    });
                }
            }
            State::Idle(evidence) => {
                let Some((from, to)) = interval else { return };
                let from = self.last_active.map_or(from, |a| from.max(a));
                if from >= to {
                    return;
                }
                // A span goes on across a stretch without evidence either way that is no
                // longer than one source's samples may be apart (no activity came in it:
                // that would have closed the span). Otherwise a process's exit, when its
                // CPU time's last window is not complete and the device falls idle,
                // restarted a 4-min idle span as 0.2 s.
                match self.span {
                    Some(ref mut span) if from <= span.to.saturating_add(self.max_gap_ms) => {
                        span.to = span.to.max(to);
                        span.evidence |= evidence.bit();
                    }
                    _ => {
                        if let Some(old) = self.span.take() {
                            self.close(old);
                        }
                        self.span = Some(Span {
                            from,
                            to,
                            evidence: evidence.bit(),
                        });
                    }
                }
            }
            State::Unknown => {}
        }
    }

    fn close(&mut self, span: Span) {
        if span.to - span.from >= self.idle_for_ms {
            if self.periods.len() == MAX_PERIODS {
                self.periods.remove(0);
            }
            self.periods.push(IdlePeriod {
                from_unix_ms: span.from,
                to_unix_ms: span.to,
                evidence: Evidence::all_in(span.evidence),
            });
        }
    }

    /// What changes when the evidence changes the picture (an idle span begins or ends),
    /// not when it merely goes on (a busy process stays busy, an idle one idle).
    pub fn state_key(&self) -> (Option<i64>, bool) {
        (self.span.map(|s| s.from), self.last_active.is_some())
    }

    /// The report as of `now` (the end of the memory series); evidence after `now` is
    /// not counted. `memory_changed_ms` is the last time the process's memory changed: the
    /// current span starts no earlier.
    pub fn report(&self, now: i64, memory_changed_ms: Option<i64>) -> IdleReport {
        let changed = memory_changed_ms.filter(|&c| c <= now);
        let current = self
            .span
            .map(|s| Span {
                from: changed.map_or(s.from, |c| s.from.max(c)),
                to: s.to.min(now),
                ..s
            })
            .filter(|s| now - s.to <= self.max_gap_ms && s.to > s.from);
        let last_active = match (self.last_active, changed) {
            (Some(a), Some(c)) => Some(a.max(c)),
            (a, c) => a.or(c),
        };
        let mut periods = self.periods.clone();
        if let Some(s) = current.filter(|s| s.to - s.from >= self.idle_for_ms) {
            periods.push(IdlePeriod {
                from_unix_ms: s.from,
                to_unix_ms: s.to,
                evidence: Evidence::all_in(s.evidence),
            });
        }
        IdleReport {
            idle_since_unix_ms: current.map(|s| s.from),
            idle_sec: current.map(|s| (s.to - s.from) as f64 / 1000.0),
            evidence: current.map_or_else(Vec::new, |s| Evidence::all_in(s.evidence)),
            last_active_unix_ms: last_active,
            sources: Evidence::all_in(self.sources),
            periods,
            active_at_end: current.is_none()
                && last_active.is_some_and(|a| {
                    a <= now
                        && now - a <= self.max_gap_ms
                        && self.last_sample.is_none_or(|s| a >= s.min(now))
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    fn fold() -> IdleFold {
        IdleFold::new(60_000, 30 * MIN, 0.01)
    }

    #[test]
    fn the_state_at_the_end_is_read_one_way() {
        // No sample of any source: nothing to say, whatever the memory did.
        assert_eq!(fold().report(10 * MIN, None).state(), IdleState::NoEvidence);
        // Active in the last sample.
        let mut f = fold();
        for i in 0..=10 {
            f.push_sm(SmSample {
                t_unix_ms: i * 1000,
                sm_percent: 30,
            });
        }
        assert_eq!(f.report(10_000, None).state(), IdleState::Active);
        // Then idle, by the same source: idle since the last activity.
        for i in 11..=100 {
            f.push_sm(SmSample {
                t_unix_ms: i * 1000,
                sm_percent: 0,
            });
        }
        assert_eq!(
            f.report(100_000, None).state(),
            IdleState::Idle {
                since_unix_ms: 10_000,
                activity_seen: true
            }
        );
        // A busy device shared with others proves nothing either way.
        let mut f = fold();
        for i in 0..=10 {
            f.push_device(DeviceActivitySample {
                t_unix_ms: i * 1000,
                utilization_gpu_percent: 90,
                processes_on_device: 3,
            });
            f.push_cpu(CpuSample {
                t_unix_ms: i * 1000,
                cpu_time_ms: 1000 * i as u64,
            });
        }
        assert_eq!(f.report(10_000, None).state(), IdleState::Unknown);
    }

    #[test]
    fn cpu_time_alone_proves_idleness() {
        let mut f = fold();
        for i in 0..=40 {
            f.push_cpu(CpuSample {
                t_unix_ms: i * MIN,
                cpu_time_ms: 5000,
            });
        }
        let r = f.report(40 * MIN, None);
        assert_eq!(r.idle_since_unix_ms, Some(0));
        assert_eq!(r.idle_sec, Some(2400.0));
        assert_eq!(r.evidence, vec![Evidence::CpuTime]);
        assert_eq!(r.periods.len(), 1);
    }

    #[test]
    fn a_sleeping_loop_read_every_100_ms_is_idle() {
        // The H200 idle holder: a Python loop that wakes once a second, one 10 ms tick of
        // CPU every 5 s, read every 100 ms as `leaks --watch` does. Judged per 100 ms, every
        // tick would be 10 % of a core and break the span.
        let mut f = IdleFold::new(5_000, MIN, 0.01);
        for i in 0..=1200 {
            f.push_cpu(CpuSample {
                t_unix_ms: i * 100,
                cpu_time_ms: (i as u64 / 50) * 10,
            });
        }
        let r = f.report(120_000, None);
        assert_eq!(r.idle_since_unix_ms, Some(0));
        assert_eq!(r.idle_sec, Some(120.0));
        // A burst of CPU (20 % of a core for 10 s) ends it; idleness resumes after.
        for i in 1201..=1400 {
            f.push_cpu(CpuSample {
                t_unix_ms: i * 100,
                cpu_time_ms: 240 + (i as u64 - 1200) * 20,
            });
        }
        let r = f.report(140_000, None);
        assert_eq!(r.idle_since_unix_ms, None);
    }

    #[test]
    fn a_memory_change_is_activity() {
        let mut f = fold();
        for i in 0..=40 {
            f.push_cpu(CpuSample {
                t_unix_ms: i * MIN,
                cpu_time_ms: 5000,
            });
        }
        // It allocated at minute 25: idle for 15 min, not 40; active then.
        let r = f.report(40 * MIN, Some(25 * MIN));
        assert_eq!(r.idle_since_unix_ms, Some(25 * MIN));
        assert_eq!(r.idle_sec, Some(900.0));
        assert_eq!(r.last_active_unix_ms, Some(25 * MIN));
        // A change at the last sample leaves no idle span at all.
        assert_eq!(f.report(40 * MIN, Some(40 * MIN)).idle_since_unix_ms, None);
    }

    #[test]
    fn a_busy_cpu_proves_nothing() {
        let mut f = fold();
        for i in 0..=40 {
            f.push_cpu(CpuSample {
                t_unix_ms: i * MIN,
                cpu_time_ms: (i as u64) * 30_000,
            });
        }
        let r = f.report(40 * MIN, None);
        assert_eq!(r.idle_since_unix_ms, None);
        assert_eq!(r.last_active_unix_ms, None);
    }

    #[test]
    fn device_activity_counts_only_when_alone() {
        let mut f = fold();
        // Busy device, shared: unknown. Then the other process leaves and it is still busy:
        // our process is active. Then 0 %: idle.
        for i in 0..10 {
            f.push_device(DeviceActivitySample {
                t_unix_ms: i * 1000,
                utilization_gpu_percent: 70,
                processes_on_device: 2,
            });
        }
        assert_eq!(f.report(9000, None).last_active_unix_ms, None);
        f.push_device(DeviceActivitySample {
            t_unix_ms: 10_000,
            utilization_gpu_percent: 70,
            processes_on_device: 1,
        });
        for i in 11..20 {
            f.push_device(DeviceActivitySample {
                t_unix_ms: i * 1000,
                utilization_gpu_percent: 0,
                processes_on_device: 3,
            });
        }
        let r = f.report(19_000, None);
        assert_eq!(r.last_active_unix_ms, Some(10_000));
        assert_eq!(r.idle_since_unix_ms, Some(10_000));
        assert_eq!(r.evidence, vec![Evidence::DeviceUtilization]);
    }

    #[test]
    fn activity_from_any_gpu_source_ends_the_span() {
        let mut f = IdleFold::new(60_000, 5_000, 0.01);
        for i in 0..=20 {
            f.push_cpu(CpuSample {
                t_unix_ms: i * 1000,
                cpu_time_ms: 0,
            });
            if i == 12 {
                f.push_sm(SmSample {
                    t_unix_ms: i * 1000,
                    sm_percent: 30,
                });
            }
        }
        let r = f.report(20_000, None);
        assert_eq!(r.idle_since_unix_ms, Some(12_000));
        assert_eq!(r.last_active_unix_ms, Some(12_000));
        // The closed span was long enough to be a period; CPU time is judged over 10 s
        // windows, so it ends with the last window before the activity.
        assert_eq!(r.periods.len(), 2);
        assert_eq!(r.periods[0].from_unix_ms, 0);
        assert_eq!(r.periods[0].to_unix_ms, 10_000);
    }

    #[test]
    fn holes_in_the_evidence_restart_the_span() {
        let mut f = IdleFold::new(5_000, 1_000, 0.01);
        for t in [0, 1000, 2000, 3000, 60_000, 61_000, 62_000] {
            f.push_sm(SmSample {
                t_unix_ms: t,
                sm_percent: 0,
            });
        }
        let r = f.report(62_000, None);
        assert_eq!(r.idle_since_unix_ms, Some(60_000));
        // Evidence that stopped long before the end is not current.
        assert_eq!(f.report(200_000, None).idle_since_unix_ms, None);
    }

    #[test]
    fn a_counter_that_goes_backwards_is_not_evidence() {
        let mut f = fold();
        f.push_cpu(CpuSample {
            t_unix_ms: 0,
            cpu_time_ms: 10_000,
        });
        f.push_cpu(CpuSample {
            t_unix_ms: 60_000,
            cpu_time_ms: 10,
        });
        assert_eq!(f.report(60_000, None).idle_since_unix_ms, None);
    }

    #[test]
    fn an_exit_does_not_restart_the_idle_span() {
        // Idle by its CPU time (read every 10 s) for 290 s on a busy shared GPU; it exits
        // at 295 s, before its CPU time's next window is complete, and the device falls
        // idle. The span goes on to the end: it was 0.2 s long (the H200's 4 min 50 s
        // holder ended `stable`) while it restarted at the device's first idle sample.
        let mut f = fold();
        for i in 0..=29 {
            f.push_cpu(CpuSample {
                t_unix_ms: i * 10_000,
                cpu_time_ms: 5000,
            });
        }
        for (t, util, procs) in [(294_800, 90, 3), (295_000, 0, 2), (295_200, 0, 2)] {
            f.push_device(DeviceActivitySample {
                t_unix_ms: t,
                utilization_gpu_percent: util,
                processes_on_device: procs,
            });
        }
        let r = f.report(295_200, None);
        assert_eq!(r.idle_since_unix_ms, Some(0));
        assert_eq!(r.idle_sec, Some(295.2));
        // A stretch longer than the evidence may be apart still breaks the span.
        f.push_device(DeviceActivitySample {
            t_unix_ms: 400_000,
            utilization_gpu_percent: 90,
            processes_on_device: 3,
        });
        for t in [500_000, 500_200] {
            f.push_device(DeviceActivitySample {
                t_unix_ms: t,
                utilization_gpu_percent: 0,
                processes_on_device: 2,
            });
        }
        assert_eq!(f.report(500_200, None).idle_since_unix_ms, Some(500_000));
    }
}
