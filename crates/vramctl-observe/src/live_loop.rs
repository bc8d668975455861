//! What every command that samples the GPUs in a loop sets up the same way: one NVML
//! session ([`open_backend`], [`open_sampler`], [`sampler_on`]), the test-only simulated
//! clock ([`simulated_clock`]), the pacing of ticks ([`wait_next_tick`]) and the stop
//! signals ([`stop_signals`]).
//!
//! Frontends hold a [`LiveSampler`]: the sampler over a boxed [`Backend`], NVML live or a
//! recorded history replayed (`vramctl_store::replay`), and ask the backend only through
//! the trait.

use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::Context;
use vramctl_core::clock::{Clock, ManualClock, SystemClock, WallStep};
use vramctl_core::sanity::SanityLimits;
use vramctl_gpu::{Backend, CombinedBackend, DrmBackend, InitError, NvmlBackend, Sampler};

/// The sampler every frontend holds: one per process, over whichever backend was opened.
pub type LiveSampler = Sampler<Box<dyn Backend>>;

/// Which GPU sources a command reads (`--backend`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BackendChoice {
    /// NVIDIA GPUs through NVML only.
    Nvml,
    /// AMD and Intel GPUs through sysfs and DRM fdinfo only.
    Drm,
    /// Both: NVML's GPUs first (their indices as NVML counts them), the DRM ones after.
    #[default]
    All,
}

/// Where the GPU sources are: `--backend`, `--nvml-lib`, the DRM root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BackendOptions {
    /// Which sources.
    pub choice: BackendChoice,
    /// NVML library to load instead of `libnvidia-ml.so.1`.
    pub nvml_lib: Option<PathBuf>,
    /// The root the DRM backend reads `sys/` and `proc/` under (`/`; tests set
    /// `VRAMCTL_DRM_ROOT`).
    pub drm_root: Option<PathBuf>,
}

impl BackendOptions {
    /// NVML from `nvml_lib` only: what the commands read before `--backend` existed.
    pub fn nvml(nvml_lib: Option<PathBuf>) -> Self {
        Self {
            choice: BackendChoice::Nvml,
            nvml_lib,
            drm_root: None,
        }
    }

    /// Whether a running daemon's answer means what reading here would: a daemon reads
    /// every source (its own `--backend` is not in its answer), so `--backend nvml|drm`
    /// reads here.
    pub fn daemon_may_answer(&self) -> bool {
        self.choice == BackendChoice::All
    }

    fn drm(&self) -> DrmBackend {
        match &self.drm_root {
            Some(root) => DrmBackend::with_root(root),
            None => DrmBackend::open(),
        }
    }
}

/// Opens the GPU sources `options` names: NVML (from `nvml_lib`, else the driver's
/// library), the DRM backend, or both. With `all`, a machine without NVIDIA's driver reads
/// its DRM GPUs and one without DRM GPUs reads NVML alone, as before; only when neither
/// has anything is it NVML's error (exit 3).
///
/// # Errors
/// NVML cannot be loaded or started (and, with `all`, no DRM GPU was found either), or
/// `drm` found no GPU; each with a hint for the user.
pub fn open_backend(options: &BackendOptions) -> Result<Box<dyn Backend>, InitError> {
    let nvml_lib = options.nvml_lib.as_deref();
    match options.choice {
        BackendChoice::Nvml => Ok(Box::new(NvmlBackend::open(nvml_lib)?)),
        BackendChoice::Drm => {
            let drm = options.drm();
            if drm.card_count() == 0 {
                return Err(InitError::NoDrmDevices {
                    dir: drm.root().join("sys/class/drm"),
                });
            }
            Ok(Box::new(drm))
        }
        BackendChoice::All => {
            let drm = options.drm();
            match (NvmlBackend::open(nvml_lib), drm.card_count()) {
                (Ok(nvml), 0) => Ok(Box::new(nvml)),
                (Ok(nvml), _) => Ok(Box::new(CombinedBackend::new(vec![
                    Box::new(nvml),
                    Box::new(drm),
                ]))),
                (Err(err), 0) => Err(err),
                (Err(err), cards) => {
                    tracing::info!(error = %err, cards, "No NVML; reading the DRM GPUs only.");
                    Ok(Box::new(drm))
                }
            }
        }
    }
}

/// A sampler over `backend`, timed by `clock`, reading per-process SM activity when
/// `process_activity`.
///
/// # Errors
/// When the device list cannot be read.
pub fn sampler_on(
    mut backend: Box<dyn Backend>,
    clock: Box<dyn Clock>,
    process_activity: bool,
) -> Result<LiveSampler, vramctl_gpu::DeviceError> {
    backend.set_read_process_activity(process_activity);
    Sampler::with_clock(backend, clock, SanityLimits::from_system())
}

/// The simulated clock when there is one (`--simulated-clock`, shared: the caller advances
/// it), else the system's.
pub fn clock_of(manual: Option<&ManualClock>) -> Box<dyn Clock> {
    match manual {
        Some(m) => Box::new(m.clone()),
        None => Box::new(SystemClock),
    }
}

/// Opens the GPU sources and enumerates the GPUs (one NVML session for the whole process).
///
/// # Errors
/// NVML cannot be loaded or started, or the GPUs cannot be listed.
pub fn open_sampler(options: &BackendOptions) -> anyhow::Result<LiveSampler> {
    let started = std::time::Instant::now();
    let backend = open_backend(options)?;
    let loaded = started.elapsed();
    let sampler = Sampler::new(backend).context("cannot list the GPUs")?;
    tracing::debug!(
        nvml_init_ms = loaded.as_secs_f64() * 1e3,
        enumerate_ms = (started.elapsed() - loaded).as_secs_f64() * 1e3,
        devices = sampler.devices().len(),
        "Started NVML."
    );
    Ok(sampler)
}

/// The test-only simulated clock of `--simulated-clock START` with its
/// `--simulated-clock-step`s; `None` for the system clock.
pub fn simulated_clock(start_unix_ms: Option<i64>, steps: &[WallStep]) -> Option<ManualClock> {
    start_unix_ms.map(|start| ManualClock::with_steps(start, steps.to_vec()))
}

/// Waits until tick number `n + 1` is due (`n` × `interval_ms` after `started`, so the
/// interval does not drift) or, on a simulated clock, advances it by one interval; whether
/// a stop signal came. Shared by `record` and `reap --every`.
pub fn wait_next_tick(
    manual: Option<&ManualClock>,
    signals: &Receiver<()>,
    started: Instant,
    n: u64,
    interval_ms: i64,
) -> bool {
    match manual {
        Some(m) => {
            m.advance_ms(interval_ms);
            signals.try_recv().is_ok()
        }
        None => {
            let next = started
                + Duration::from_millis(
                    u64::try_from(interval_ms).unwrap_or(1000).saturating_mul(n),
                );
            match signals.recv_timeout(next.saturating_duration_since(Instant::now())) {
                Ok(()) => true,
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => false,
            }
        }
    }
}

/// A channel that receives `()` on SIGINT or SIGTERM.
pub fn stop_signals() -> anyhow::Result<Receiver<()>> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .context("cannot install signal handlers")?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("vramctl-signals".into())
        .spawn(move || {
            for _ in signals.forever() {
                if tx.send(()).is_err() {
                    break;
                }
            }
        })
        .context("cannot start the signal thread")?;
    Ok(rx)
}
