//! What the live leak and idle analysis needs from /proc about a GPU process, in the
//! analysis's units: who it is (start time, for the series' identity and the start of its
//! warm-up) and how much CPU it used (idle evidence). One place for the three frontends
//! that run `vramctl_core::analysis::live::FleetTracker`:
//!
//! - `leaks --watch` and `serve` read /proc with [`FactsReader`] on their sampler thread;
//! - `top` already reads `/proc/PID/stat` for its table (`tui::observe::HostReader`, which
//!   converts with the same [`TickScale`]) and hands those facts over
//!   ([`facts_of_host`]), so it reads nothing twice.
//!
//! The tracker itself never reads /proc: it stays pure and testable on hand-built
//! snapshots.

use vramctl_core::analysis::live::ProcessFacts;
use vramctl_core::procinfo;

use crate::tui::observe::HostProcess;

/// Converts /proc's clock ticks (start time after boot, CPU time) into milliseconds and
/// wall-clock time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickScale {
    ticks_per_second: u64,
    boot_unix_ms: Option<i64>,
}

impl TickScale {
    /// This system's clock tick rate and boot time.
    pub fn system() -> Self {
        Self::new(
            procfs::ticks_per_second(),
            procfs::boot_time_secs()
                .ok()
                .and_then(|s| i64::try_from(s).ok())
                .map(|s| s.saturating_mul(1000)),
        )
    }

    /// A scale with `ticks_per_second` (0 is taken as 1) and the boot time, when known.
    pub fn new(ticks_per_second: u64, boot_unix_ms: Option<i64>) -> Self {
        Self {
            ticks_per_second: ticks_per_second.max(1),
            boot_unix_ms,
        }
    }

    /// Clock ticks per second.
    pub fn ticks_per_second(self) -> u64 {
        self.ticks_per_second
    }

    /// `ticks` in milliseconds.
    pub fn ms(self, ticks: u64) -> u64 {
        u64::try_from(u128::from(ticks) * 1000 / u128::from(self.ticks_per_second))
            .unwrap_or(u64::MAX)
    }

    /// A start time in ticks after boot as a wall-clock time; `None` when the boot time is
    /// unknown.
    pub fn started_at_unix_ms(self, start_time_ticks: u64) -> Option<i64> {
        let after = i64::try_from(self.ms(start_time_ticks)).ok()?;
        self.boot_unix_ms?.checked_add(after)
    }

    /// The facts of a process that started at `start_time_ticks` and has used `cpu_ticks`
    /// (user + system).
    pub fn facts(self, start_time_ticks: u64, cpu_ticks: u64) -> ProcessFacts {
        ProcessFacts {
            start_time_ticks: Some(start_time_ticks),
            started_at_unix_ms: self.started_at_unix_ms(start_time_ticks),
            cpu_time_ms: Some(self.ms(cpu_ticks)),
        }
    }
}

/// Reads [`ProcessFacts`] from /proc: one read of `/proc/PID/stat` per call.
#[derive(Debug, Clone, Copy)]
pub struct FactsReader {
    scale: TickScale,
    read_proc: bool,
}

impl Default for FactsReader {
    fn default() -> Self {
        Self::new()
    }
}

impl FactsReader {
    /// A reader of this system's /proc.
    pub fn new() -> Self {
        Self {
            scale: TickScale::system(),
            read_proc: true,
        }
    }

    /// A reader that reads nothing: every process is "not visible". For a daemon that may
    /// run outside the host's PID namespace, where /proc numbers other processes than the
    /// driver's PIDs (`serve --process-details nvml|none`).
    pub fn without_proc() -> Self {
        Self {
            scale: TickScale::system(),
            read_proc: false,
        }
    }

    /// Start and CPU time of `pid`; nothing (`ProcessFacts::default()`) for a process this
    /// PID namespace cannot see.
    pub fn facts(&self, pid: u32) -> ProcessFacts {
        if !self.read_proc {
            return ProcessFacts::default();
        }
        procinfo::cpu_time_ticks(pid).map_or_else(ProcessFacts::default, |t| {
            self.scale.facts(t.start_time_ticks, t.cpu_ticks)
        })
    }
}

/// The facts `top` already read for a process (`None`: not visible in /proc).
pub fn facts_of_host(host: Option<&HostProcess>) -> ProcessFacts {
    host.map_or_else(ProcessFacts::default, |h| ProcessFacts {
        start_time_ticks: h.start_time_ticks,
        started_at_unix_ms: h.started_at_unix_ms,
        cpu_time_ms: h.cpu_time_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_become_milliseconds_and_wall_clock_time() {
        let scale = TickScale::new(100, Some(1_700_000_000_000));
        assert_eq!(scale.ms(250), 2500);
        assert_eq!(scale.started_at_unix_ms(250), Some(1_700_000_002_500));
        assert_eq!(
            scale.facts(250, 42),
            ProcessFacts {
                start_time_ticks: Some(250),
                started_at_unix_ms: Some(1_700_000_002_500),
                cpu_time_ms: Some(420),
            }
        );
        assert_eq!(TickScale::new(100, None).started_at_unix_ms(1), None);
        // A zero rate cannot divide by zero.
        assert_eq!(TickScale::new(0, None).ms(3), 3000);
        assert_eq!(TickScale::new(1, None).ms(u64::MAX), u64::MAX);
    }

    #[test]
    fn our_own_facts_are_read_and_none_when_reading_is_off() {
        let me = std::process::id();
        let facts = FactsReader::new().facts(me);
        assert!(facts.start_time_ticks.is_some());
        assert!(facts.cpu_time_ms.is_some());
        assert_eq!(
            procinfo::cpu_time_ticks(me).map(|t| t.start_time_ticks),
            facts.start_time_ticks
        );
        assert_eq!(
            FactsReader::without_proc().facts(me),
            ProcessFacts::default()
        );
        // Above pid_max: never a process.
        assert_eq!(FactsReader::new().facts(4_194_305), ProcessFacts::default());
    }
}
