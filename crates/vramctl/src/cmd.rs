//! One module per command; each exposes `run`. Shared here: what turns the command line
//! into the library's arguments (the history's path, the NVML session, the analysis'
//! settings, the samples to analyse); the work itself is in the library (`lib.rs`).

pub mod completions;
pub mod doctor;
pub mod estimate;
pub mod explain_oom;
pub mod export;
pub mod fit;
pub mod history;
pub mod import;
pub mod info;
pub mod kill;
pub mod leaks;
pub mod man;
pub mod plot;
pub mod ps;
pub mod reap;
pub mod reclaim;
pub mod record;
pub mod run;
pub mod serve;
pub mod slurm_epilog;
pub mod snapshot;
pub mod snapshot_timeline;
mod snapshot_top;
pub mod snapshot_view;
pub mod status;
pub mod top;

use anyhow::{anyhow, bail};
use vramctl_core::wall_time;
use vramctl_history::sample_source::{self, Source, SourceKind, Window};
use vramctl_leaks::analysis::LeakConfig;
use vramctl_observe::daemon_socket::client::AskOptions;
use vramctl_observe::live_loop::LiveSampler;
use vramctl_observe::live_source::LiveSource;
use vramctl_store::format::{Format, ImportOptions};

use crate::cli::{AnalysisArgs, Cli, Command, GlobalArgs, ImportFormat, SourceArgs};
use crate::exit::Exit;

/// Runs the command the user chose.
pub fn run(cli: &Cli) -> anyhow::Result<Exit> {
    match &cli.command {
        Command::Status(args) => status::run(&cli.global, args),
        Command::Info(args) => info::run(&cli.global, args),
        Command::Doctor(args) => doctor::run(&cli.global, args),
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
        Command::Snapshot(args) => snapshot::run(args),
        Command::ExplainOom(args) => explain_oom::run(&cli.global, args),
        Command::Leaks(args) => leaks::run(&cli.global, args),
        Command::Plot(args) => plot::run(&cli.global, args),
        Command::SlurmEpilog(args) => slurm_epilog::run(&cli.global, args),
        Command::Run(args) => run::run(&cli.global, args),
        Command::Fit(args) => fit::run(&cli.global, args),
        Command::Estimate(args) => estimate::run(&cli.global, args),
        Command::Completions(args) => completions::run(args),
        Command::Man(args) => man::run(args),
    }
}

/// `d` in whole milliseconds, as the store and the analysis count time (saturating: a
/// duration flag is at most years long, far below `i64::MAX` ms).
pub fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The history database's path (in its own module so that the audit sink, which the
/// commands here use, names it without naming this file).
pub use crate::db_location::db_path;

/// Opens the history for reading; its notice to stderr.
pub use vramctl_history::sample_source::open_history;

/// `--min-idle-mem`, `--idle-for`, `--warmup` over the documented defaults.
pub fn leak_config(args: &AnalysisArgs) -> anyhow::Result<LeakConfig> {
    let cfg = LeakConfig {
        min_idle_bytes: vramctl_observe::units::parse_bytes(&args.min_idle_mem)
            .map_err(|e| anyhow!("--min-idle-mem: {e}"))?,
        idle_for: args.idle_for,
        min_warmup: args.warmup,
        ..LeakConfig::default()
    };
    if cfg.min_warmup > cfg.max_warmup {
        bail!(
            "--warmup '{}' is longer than the analysis ever waits for warm-up ({}); use {} or less",
            vramctl_core::duration::format(args.warmup),
            vramctl_core::duration::format(cfg.max_warmup),
            vramctl_core::duration::format(cfg.max_warmup),
        );
    }
    cfg.validate().map_err(|e| anyhow!("{e}"))?;
    Ok(cfg)
}

/// Opens the GPU sources (`--backend`, `--nvml-lib`) and enumerates the GPUs (one NVML
/// session for the whole process).
pub fn open_sampler(global: &GlobalArgs) -> anyhow::Result<LiveSampler> {
    vramctl_observe::live_loop::open_sampler(&global.backends())
}

/// The devices now for `status` and `ps`: a running daemon's answer unless `no_daemon`
/// (its socket, `vramctl_observe::daemon_socket`), else NVML here ([`open_sampler`]) — also when no
/// daemon answers. `process_stat`: the daemon reads `/proc/PID/stat` too (`ps`).
pub fn open_live(
    global: &GlobalArgs,
    no_daemon: bool,
    process_stat: bool,
) -> anyhow::Result<LiveSource> {
    // A daemon reads the default sources; another `--backend` reads here.
    let no_daemon = no_daemon || !global.backends().daemon_may_answer();
    let ask = (!no_daemon).then(|| AskOptions {
        nvml_library: global.nvml_lib.clone(),
        process_stat,
        accept_mapped: true,
    });
    let global = global.clone();
    LiveSource::open(ask, Box::new(move || open_sampler(&global)))
}

/// `--format` of `import`, `leaks` and `plot`; `ndjson` covers both vramctl NDJSON kinds,
/// which the importer tells apart per file.
pub fn import_format(format: ImportFormat) -> Option<Format> {
    match format {
        ImportFormat::Auto => None,
        ImportFormat::SmiGpu => Some(Format::SmiGpu),
        ImportFormat::SmiApps => Some(Format::SmiApps),
        ImportFormat::Gpuz => Some(Format::Gpuz),
        ImportFormat::Ndjson => Some(Format::Ndjson),
    }
}

/// The samples `leaks` and `plot` analyse: the history (`--db`), or the log files given,
/// read into memory (`vramctl_history::sample_source`).
pub fn open_source(global: &GlobalArgs, args: &SourceArgs) -> anyhow::Result<Source> {
    let tz = wall_time::zone(args.tz.as_deref())?;
    let (store, kind) = if args.files.is_empty() {
        let path = db_path(global)?;
        (open_history(&path)?, SourceKind::Store(path))
    } else {
        let options = ImportOptions {
            format: import_format(args.format),
            strict: !args.skip_bad_rows,
            tz: tz.clone(),
            columns: args
                .columns
                .as_ref()
                .map(|c| c.split(',').map(|s| s.trim().to_owned()).collect()),
            // `--gpu` also names the GPU of an apps log without a GPU column (one is enough).
            gpu: args.gpu.first().cloned(),
        };
        let (store, files) = sample_source::read_files(&args.files, &options)?;
        (store, SourceKind::Files(files))
    };
    sample_source::resolve(
        store,
        kind,
        tz,
        Window {
            time: &args.window.settle(),
            gpu: &args.gpu,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;

    fn analysis(min_idle_mem: &str, idle_for: &str, warmup: &str) -> AnalysisArgs {
        let duration = |text| vramctl_core::duration::parse(text).unwrap();
        AnalysisArgs {
            min_idle_mem: min_idle_mem.into(),
            idle_for: duration(idle_for),
            warmup: duration(warmup),
        }
    }

    #[test]
    fn thresholds_map_to_the_analysis_and_bad_ones_are_named() {
        let cfg = leak_config(&analysis("1GiB", "30m", "0s")).unwrap();
        assert_eq!(cfg, LeakConfig::default());
        let cfg = leak_config(&analysis("512MiB", "2h", "5m")).unwrap();
        assert_eq!(cfg.min_idle_bytes, 512 << 20);
        assert_eq!(cfg.idle_for, Duration::from_secs(7200));
        assert_eq!(cfg.min_warmup, Duration::from_secs(300));
        for (args, needle) in [
            (
                analysis("x", "30m", "0s"),
                "--min-idle-mem: 'x' is not a size",
            ),
            (
                analysis("1GiB", "30m", "1h"),
                "--warmup '1h' is longer than",
            ),
        ] {
            let err = leak_config(&args).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }
}
