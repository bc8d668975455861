//! NVML for a daemon: a failed init is a state, not an exit, and a session that stops
//! working is replaced.
//!
//! A driver upgrade without a reboot (`version_mismatch`), a module not loaded yet at boot,
//! a container started before the toolkit mounted the library: the daemon keeps serving
//! `vramctl_nvml_up 0` and retries with exponential backoff, from one sampling interval up
//! to [`MAX_BACKOFF`]. It never caches a failure for good.
//!
//! A driver reloaded or a GPU reset under the running daemon leaves its session answering
//! errors (`UNINITIALIZED`, `DRIVER_NOT_LOADED`, or every device failing): the source then
//! shuts the session down and starts a new one the next tick, which enumerates the devices
//! again ([`SessionHealth`]: at once for a lost session, after
//! [`REOPEN_AFTER_FAILING_TICKS`](vramctl_gpu::sampler::REOPEN_AFTER_FAILING_TICKS) ticks
//! of failing devices, backing off while reopening does not help), counted in
//! `vramctl_nvml_reopens_total`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vramctl_core::clock::Clock;
use vramctl_core::types::Snapshot;
use vramctl_gpu::sampler::SessionHealth;
use vramctl_observe::daemon_socket::server::{self as socket, SharedSampler};
use vramctl_observe::live_loop::{BackendOptions, LiveSampler, open_backend, sampler_on};

use super::stats::Stats;

/// Longest wait between two init attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// The sampler, once NVML is up.
pub struct NvmlSource {
    backends: BackendOptions,
    clock: Arc<dyn Clock>,
    /// Shared with the local socket (`status`, `ps`), which makes an extra tick per request.
    sampler: SharedSampler,
    first_backoff: Duration,
    backoff: Duration,
    next_attempt: Option<Instant>,
    /// Why the last init attempt failed, while NVML is down.
    down_reason: Option<String>,
    /// Whether the session still works, or must be reopened.
    health: SessionHealth,
}

impl std::fmt::Debug for NvmlSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlSource")
            .field("backends", &self.backends)
            // Never wait for the lock here: a Debug print while sampling would deadlock.
            .field("up", &self.sampler.try_lock().map(|s| s.is_some()).ok())
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

impl NvmlSource {
    /// A source that opens `backends` (NVML from its library, the DRM GPUs, or both) on its
    /// first [`sample`](Self::sample), retrying after `first_backoff`, doubling; its
    /// snapshots are timed by `clock` (the system clock, or in tests a simulated one).
    pub fn new(backends: BackendOptions, first_backoff: Duration, clock: Arc<dyn Clock>) -> Self {
        let first_backoff = first_backoff.max(Duration::from_millis(10));
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Self {
            backends,
            clock,
            sampler: SharedSampler::default(),
            first_backoff,
            backoff: first_backoff,
            next_attempt: None,
            down_reason: None,
            health: SessionHealth::new(ms(first_backoff), ms(MAX_BACKOFF)),
        }
    }

    /// One snapshot, or `None` while NVML is down. Tries to start NVML when an attempt is
    /// due at `now`; counts failures in `stats`. A tick that shows the session no longer
    /// works is returned as it is, and the session is shut down: the next tick opens a new
    /// one.
    pub fn sample(&mut self, now: Instant, stats: &mut Stats) -> Option<Snapshot> {
        let shared = Arc::clone(&self.sampler);
        let mut slot = socket::lock(&shared);
        if slot.is_none() && self.next_attempt.is_none_or(|at| now >= at) {
            *slot = self.try_open(now, stats);
        }
        stats.nvml_up = slot.is_some();
        let sampler = slot.as_mut()?;
        let snapshot = sampler.tick();
        let lost = sampler.session_lost().map(str::to_owned);
        if let Some(reason) = self.health.check(&snapshot, lost.is_some()) {
            let why = lost.unwrap_or_else(|| "every GPU failed".to_owned());
            tracing::warn!(
                reason = reason.as_str(),
                error = %why,
                "NVML stopped answering; shutting the session down to start a new one."
            );
            stats.reopened(reason);
            // Dropping the sampler shuts its NVML session down (nvmlShutdown).
            *slot = None;
            self.next_attempt = Some(now);
            self.down_reason = Some(format!("NVML is being reopened: {why}"));
        }
        Some(snapshot)
    }

    /// The name the driver knows for `pid` (when /proc cannot see it).
    pub fn process_name(&mut self, pid: u32) -> Option<String> {
        socket::lock(&self.sampler)
            .as_mut()?
            .backend_mut()
            .process_name(pid)
    }

    /// The sampler, for the local socket.
    pub fn shared_sampler(&self) -> SharedSampler {
        Arc::clone(&self.sampler)
    }

    /// Why NVML is down (the last init attempt's error), while it is.
    pub fn down_reason(&self) -> Option<&str> {
        socket::lock(&self.sampler)
            .is_none()
            .then_some(self.down_reason.as_deref())
            .flatten()
    }

    /// When the next init attempt is due, while NVML is down.
    #[cfg(test)]
    pub fn next_attempt(&self) -> Option<Instant> {
        socket::lock(&self.sampler)
            .is_none()
            .then_some(self.next_attempt)
            .flatten()
    }

    /// Starts NVML, or schedules the next attempt.
    fn try_open(&mut self, now: Instant, stats: &mut Stats) -> Option<LiveSampler> {
        let clock = Box::new(SharedClock(Arc::clone(&self.clock)));
        let outcome = open_backend(&self.backends)
            .map_err(|err| (err.code(), format!("{err}; {}", err.hint())))
            .and_then(|backend| {
                // Per-process SM activity: the idle analysis' best evidence, where the
                // driver reports it (one more call per GPU per tick).
                sampler_on(backend, clock, true)
                    .map_err(|err| ("enumeration_failed", err.to_string()))
            });
        match outcome {
            Ok(mut sampler) => {
                // Once per NVML session: slow (NVML loads libcuda), and it does not change.
                sampler.read_cuda_driver_version();
                tracing::info!(devices = sampler.devices().len(), "NVML is up.");
                self.backoff = self.first_backoff;
                self.next_attempt = None;
                self.down_reason = None;
                Some(sampler)
            }
            Err((code, message)) => {
                stats.init_failed(code);
                tracing::warn!(
                    reason = code,
                    retry_in_s = self.backoff.as_secs_f64(),
                    error = %message,
                    "NVML did not start; retrying."
                );
                self.next_attempt = Some(now + self.backoff);
                self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                self.down_reason = Some(message);
                None
            }
        }
    }
}

/// The source's clock, handed to each sampler it starts.
struct SharedClock(Arc<dyn Clock>);

impl Clock for SharedClock {
    fn now_unix_ms(&self) -> i64 {
        self.0.now_unix_ms()
    }

    fn monotonic_ms(&self) -> i64 {
        self.0.monotonic_ms()
    }

    fn now(&self) -> vramctl_core::clock::ClockTime {
        self.0.now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn a_missing_library_is_retried_with_doubling_backoff() {
        let mut source = NvmlSource::new(
            BackendOptions::nvml(Some(PathBuf::from("/nonexistent/libnvidia-ml.so.1"))),
            Duration::from_secs(1),
            Arc::new(vramctl_core::clock::SystemClock),
        );
        let mut stats = Stats::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert!(source.sample(t0, &mut stats).is_none());
        assert!(!stats.nvml_up);
        assert_eq!(stats.nvml_init_failures.get("library_not_loaded"), Some(&1));
        assert_eq!(source.next_attempt(), Some(t0 + Duration::from_secs(1)));
        // Not due yet: no new attempt.
        assert!(
            source
                .sample(t0 + Duration::from_millis(500), &mut stats)
                .is_none()
        );
        assert_eq!(stats.nvml_init_failures.get("library_not_loaded"), Some(&1));
        let t1 = t0 + Duration::from_secs(1);
        assert!(source.sample(t1, &mut stats).is_none());
        assert_eq!(stats.nvml_init_failures.get("library_not_loaded"), Some(&2));
        assert_eq!(source.next_attempt(), Some(t1 + Duration::from_secs(2)));
    }

    #[test]
    fn the_backoff_stops_growing_at_the_cap() {
        let mut source = NvmlSource::new(
            BackendOptions::nvml(Some(PathBuf::from("/nonexistent/libnvidia-ml.so.1"))),
            Duration::from_secs(100),
            Arc::new(vramctl_core::clock::SystemClock),
        );
        let mut stats = Stats::new(Duration::from_secs(60));
        let mut now = Instant::now();
        for _ in 0..5 {
            source.sample(now, &mut stats);
            now = source.next_attempt().expect("still down");
        }
        let before = source.next_attempt().expect("down");
        source.sample(before, &mut stats);
        assert_eq!(source.next_attempt(), Some(before + MAX_BACKOFF));
    }
}
