//! One module per command; each exposes `run`. Shared here: opening the backend and
//! choosing devices.

pub mod export;
pub mod history;
pub mod import;
pub mod info;
pub mod kill;
pub mod leaks;
pub mod plot;
pub mod ps;
pub mod reap;
pub mod reclaim;
pub mod record;
pub mod serve;
pub mod status;
pub mod top;

use anyhow::{Context, bail};
use vramctl::daemon_socket::client::AskOptions;
use vramctl::live_source::LiveSource;
use vramctl_core::types::DeviceInfo;
use vramctl_core::{NvmlBackend, Sampler};

use crate::cli::{Cli, Command, GlobalArgs};
use crate::exit::Exit;

/// Runs the command the user chose.
pub fn run(cli: &Cli) -> anyhow::Result<Exit> {
    match &cli.command {
        Command::Status(args) => status::run(&cli.global, args),
        Command::Info(args) => info::run(&cli.global, args),
        Command::Serve(args) => serve::run(&cli.global, args),
        Command::Record(args) => record::run(&cli.global, args),
        Command::History(args) => history::run(&cli.global, args),
        Command::Export(args) => export::run(&cli.global, args),
        Command::Import(args) => import::run(&cli.global, args),
        Command::Top(args) => top::run(&cli.global, args),
        Command::Ps(args) => ps::run(&cli.global, args),
        Command::Kill(args) => kill::run(&cli.global, args),
        Command::Reap(args) => reap::run(&cli.global, args),
        Command::Reclaim(args) => reclaim::run(&cli.global, args),
        Command::Leaks(args) => leaks::run(&cli.global, args),
        Command::Plot(args) => plot::run(&cli.global, args),
    }
}

/// `d` in whole milliseconds, as the store and the analysis count time (saturating: a
/// duration flag is at most years long, far below `i64::MAX` ms).
pub fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The history database: `--db` / `VRAMCTL_DB`, else `$XDG_STATE_HOME/vramctl/history.db`,
/// else `~/.local/state/vramctl/history.db`.
pub fn db_path(global: &GlobalArgs) -> anyhow::Result<std::path::PathBuf> {
    if let Some(path) = &global.db {
        return Ok(path.clone());
    }
    let state = std::env::var_os("XDG_STATE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|home| std::path::PathBuf::from(home).join(".local/state"))
        })
        .context("cannot find where to keep the history; set --db or VRAMCTL_DB")?;
    Ok(state.join("vramctl/history.db"))
}

/// Opens the history for reading (`history`, `export`, `leaks`, `plot`, `history --audit`,
/// `reap`'s evidence): read-only, whoever owns it; what the user should know about the open
/// (the newest samples not readable) goes to stderr.
pub fn open_history(path: &std::path::Path) -> anyhow::Result<vramctl_store::Store> {
    let store = vramctl_store::Store::open(path, vramctl_store::OpenMode::ReadOnly)?;
    if let Some(notice) = store.notice() {
        eprintln!("vramctl: note: {notice}");
    }
    Ok(store)
}

/// Loads NVML and enumerates the GPUs (one NVML session for the whole process).
pub fn open_sampler(global: &GlobalArgs) -> anyhow::Result<Sampler<NvmlBackend>> {
    let started = std::time::Instant::now();
    let backend = NvmlBackend::open(global.nvml_lib.as_deref())?;
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

/// The devices now for `status` and `ps`: a running daemon's answer unless `no_daemon`
/// (its socket, `vramctl::daemon_socket`), else NVML here ([`open_sampler`]) — also when no
/// daemon answers. `process_stat`: the daemon reads `/proc/PID/stat` too (`ps`).
pub fn open_live(
    global: &GlobalArgs,
    no_daemon: bool,
    process_stat: bool,
) -> anyhow::Result<LiveSource> {
    let ask = (!no_daemon).then(|| AskOptions {
        nvml_library: global.nvml_lib.clone(),
        process_stat,
    });
    let global = global.clone();
    LiveSource::open(ask, Box::new(move || open_sampler(&global)))
}

/// Devices chosen with `--gpu` (index or UUID); all when none was given.
#[derive(Debug, Clone, Default)]
pub struct GpuFilter {
    selectors: Vec<String>,
}

impl GpuFilter {
    /// Checks every selector names one of `devices`.
    ///
    /// # Errors
    /// A selector that matches no device, with the devices that exist.
    pub fn new(
        selectors: &[String],
        devices: &[std::sync::Arc<DeviceInfo>],
    ) -> anyhow::Result<Self> {
        for selector in selectors {
            if !devices.iter().any(|d| selector_matches(selector, d)) {
                let known: Vec<String> = devices
                    .iter()
                    .map(|d| format!("{} ({})", d.index, d.uuid))
                    .collect();
                bail!(
                    "no GPU matches '{selector}'; use an index or UUID of: {}",
                    if known.is_empty() {
                        "none found".to_owned()
                    } else {
                        known.join(", ")
                    }
                );
            }
        }
        Ok(Self {
            selectors: selectors.to_vec(),
        })
    }

    /// Whether `device` was chosen.
    pub fn matches(&self, device: &DeviceInfo) -> bool {
        self.selectors.is_empty() || Self::selects(&self.selectors, device)
    }

    /// Whether one of `selectors` (indexes, UUIDs, UUID prefixes) names `device`.
    pub fn selects(selectors: &[String], device: &DeviceInfo) -> bool {
        selectors.iter().any(|s| selector_matches(s, device))
    }
}

fn selector_matches(selector: &str, device: &DeviceInfo) -> bool {
    let selector = selector.trim();
    selector.parse::<u32>().is_ok_and(|i| i == device.index)
        || device.uuid.eq_ignore_ascii_case(selector)
        || device.mig_instances.iter().any(|m| m.uuid.eq_ignore_ascii_case(selector))
        // A UUID prefix of at least 8 characters after `GPU-`, as people paste them short.
        || (selector.len() >= 12
            && device.uuid.to_ascii_lowercase().starts_with(&selector.to_ascii_lowercase()))
}
