//! `vramctl serve`: the Prometheus exporter daemon (see `vramctl_exporter` for its shape).
//!
//! Publishes a starting exposition, starts the sampler thread and serves HTTP(S) at once,
//! until SIGTERM or SIGINT: HTTP never waits for NVML, so a hung `nvmlInit` leaves
//! `/metrics` answering `vramctl_nvml_up 0` (with a growing sample age) and `/healthz`
//! answering 503 "starting". NVML failing to start is not an error here: the exporter
//! serves `vramctl_nvml_up 0` and keeps retrying; a session that stops working (driver
//! reloaded, GPU reset) is reopened (`vramctl_exporter::source`). Bad flags, an unreadable web
//! config, an address in use, or with `--record` a history database that cannot be opened
//! (another recorder holds it, not ours, newer, damaged, unwritable) are errors (exit 2)
//! before anything is served. With `--record`, the history is flushed before the daemon exits. Every tick also
//! goes through the live leak and idle analysis (`vramctl_exporter::live_verdicts`; thresholds as for
//! `vramctl leaks`), whose verdicts are exported per process.
//!
//! Test only (hidden): `--simulated-clock UNIX_MS --ticks N` samples N times without
//! waiting, time moving by `--interval` per sample, and keeps serving the last sample; with
//! the fake NVML's `step` clock the exposition is then deterministic.

use std::io::Write as _;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use anyhow::{Context, bail};

use vramctl_observe::daemon_socket::server::{DaemonSettings, DaemonSocket};
use vramctl_store::{OpenMode, Retention, Store};

use super::db_path;
use super::leak_config;
use crate::cli::{GlobalArgs, ServeArgs};
use crate::exit::Exit;
use rustix::process::Rlimit;
use vramctl_exporter::cache::Cache;
use vramctl_exporter::collector::{Collector, CollectorConfig};
use vramctl_exporter::connections::Limits;
use vramctl_exporter::live_verdicts::LiveAnalysis;
use vramctl_exporter::metadata::DetailsSource;
use vramctl_exporter::recording::HistoryRecorder;
use vramctl_exporter::render::RenderOptions;
use vramctl_exporter::render::dcgm::DcgmLabels;
use vramctl_exporter::server::{self, ServerSettings};
use vramctl_exporter::webconfig::WebConfig;
use vramctl_fleet::prom_client::{ClientSettings, PrometheusClient};
use vramctl_history::recorder::{Procs, StoreFeed, channel_capacity, session};
use vramctl_web::live_feed::LiveFeed;
use vramctl_web::{WebSettings, WebView};

/// Runs `serve` until a termination signal.
pub fn run(global: &GlobalArgs, args: &ServeArgs) -> anyhow::Result<Exit> {
    let (interval, peak_window) = (args.interval, args.peak_window);
    let details = DetailsSource::from(args.process_details);
    if peak_window < interval {
        bail!(
            "--peak-window '{}' is shorter than --interval '{}'; make it at least the \
             scrape interval",
            vramctl_core::duration::format(peak_window),
            vramctl_core::duration::format(interval)
        );
    }
    if args.max_requests == 0 {
        bail!("--web.max-requests '0' would refuse every request; use 1 or more");
    }
    if args.max_connections == 0 {
        bail!("--web.max-connections '0' would refuse every connection; use 1 or more");
    }
    if args.max_connections_per_peer == 0 {
        bail!("--web.max-connections-per-peer '0' would refuse every connection; use 1 or more");
    }
    let limits = connection_limits(args.max_connections, args.max_connections_per_peer);
    let leak = leak_config(&args.analysis)?;
    // /proc is read only with `--process-details proc` (`DetailsSource::facts_source`): with
    // `nvml` or `none` the daemon may run outside the host's PID namespace.
    let analysis = LiveAnalysis::new(leak.clone()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let web = match &args.web_config_file {
        Some(path) => WebConfig::load(path)?,
        None => WebConfig::plain(),
    };
    if web.auth.is_some() && web.tls.is_none() {
        tracing::warn!("Basic auth without TLS sends passwords in the clear.");
    }
    // Snapshot files for the page: read and indexed before anything listens, so a bad one
    // fails the start.
    let snapshots = vramctl_web::snapshot_mode::open_files(&args.snapshots)?;
    // The database first: a second recorder is refused before anything listens.
    let mut history_db = None;
    let recorder = match (&args.record, &args.retain) {
        (Some(db), retain) => Some(open_recorder(
            global,
            db.as_deref(),
            retain.as_deref().unwrap_or(DEFAULT_RETAIN),
            interval,
            &mut history_db,
        )?),
        (None, Some(retain)) => {
            bail!("--retain '{retain}' applies to recorded history; add --record")
        }
        (None, None) => None,
    };
    // Checked before anything listens: a bad URL or CA file stops `serve` with exit 2.
    let prometheus = args
        .prometheus
        .as_deref()
        .map(|url| {
            let mut settings = ClientSettings::new(url);
            settings.ca_file.clone_from(&args.prometheus_ca);
            settings.timeout = args.prometheus_timeout;
            PrometheusClient::new(settings)
        })
        .transpose()?;
    let listener = std::net::TcpListener::bind(args.listen.as_str()).with_context(|| {
        format!(
            "cannot listen on '{}'; choose another address with --listen",
            args.listen
        )
    })?;
    let address = listener
        .local_addr()
        .context("cannot read the bound address")?;

    let cache = Arc::new(Cache::new());
    let mut collector = Collector::new(
        CollectorConfig {
            backends: global.backends(),
            interval,
            peak_window,
            details,
            render: RenderOptions {
                max_process_series: args.max_process_series,
                dcgm: args
                    .metrics_compat
                    .map(|crate::cli::MetricsCompat::Dcgm| DcgmLabels::from_environment()),
            },
            simulated_clock: vramctl_observe::live_loop::simulated_clock(
                args.simulated_clock,
                &args.simulated_clock_step,
            ),
            ticks: args.ticks,
        },
        Arc::clone(&cache),
    );
    collector.add_consumer(Box::new(analysis));
    let recording = recorder.as_ref().map(HistoryRecorder::writer_health);
    if let Some(recorder) = recorder {
        collector.add_consumer(Box::new(recorder));
    }
    // The web view (`/`, `/assets/`, `/api/`): after the analysis, so it sees this tick's
    // verdicts.
    let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
    let feed = LiveFeed::new(interval_ms);
    collector.add_consumer(feed.consumer());
    let view = WebView::new(
        &WebSettings {
            history_db,
            interval_ms,
            prometheus,
            leak,
            snapshots,
        },
        &feed,
    );
    // `status`, `ps` and `top` ask this daemon's sampler instead of starting NVML; /proc is
    // read for them only as for the labels.
    let socket = DaemonSocket::start(
        collector.shared_sampler(),
        DaemonSettings {
            daemon: "serve",
            facts: details.facts_source(),
            containers_socket: args.containers_socket,
        },
    );
    // Something to serve before NVML has said anything: NVML's first init may hang.
    collector.publish_starting();
    let (stop_tx, stop_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::sync_channel(1);
    let sampler = collector
        .spawn(stop_rx, Some(ready_tx))
        .context("cannot start the sampler thread")?;
    // The listener is bound: connections wait in its backlog until the server accepts
    // them. Tests and scripts read these lines.
    let scheme = if web.tls.is_some() { "https" } else { "http" };
    // Never `eprintln!` in a daemon: it panics when stderr is closed.
    let _ = writeln!(
        std::io::stderr(),
        "vramctl: serving {scheme}://{address}/metrics"
    );
    let _ = writeln!(
        std::io::stderr(),
        "vramctl: the web view is at {scheme}://{address}/"
    );
    std::thread::Builder::new()
        .name("vramctl-ready".into())
        .spawn(move || {
            // The sampler's first collection (with `--ticks`, its last), NVML up or not.
            if ready_rx.recv().is_ok() {
                let _ = writeln!(std::io::stderr(), "vramctl: the first collection is served");
            }
        })
        .context("cannot start a thread")?;

    let settings = ServerSettings {
        web,
        max_requests: args.max_requests,
        stale_after: (interval * 5).max(Duration::from_secs(10)),
        recording,
        limits,
        io_timeout: args.io_timeout.unwrap_or(server::IO_TIMEOUT),
        routes: Some(Arc::new(view)),
    };
    let served = server::serve(listener, cache, settings, server::termination());
    drop(socket);
    let _ = stop_tx.send(());
    if sampler.join().is_err() {
        tracing::error!("The sampler thread panicked.");
    }
    served.context("the HTTP server failed")?;
    Ok(Exit::Ok)
}

/// File descriptors kept for everything but connections: NVML, /proc, the history
/// database, the daemon socket, logs.
const RESERVED_DESCRIPTORS: u64 = 64;

/// The connection limits in force: the open-file limit's soft value is raised to its hard
/// one (as Go's runtime does), and `--web.max-connections` is cut to what it leaves room for,
/// so the cap, not EMFILE, is what a flood of connections meets.
fn connection_limits(max_connections: usize, max_per_peer: usize) -> Limits {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => limit = raised,
            Err(err) => tracing::debug!(error = %err, "Cannot raise the open-file limit."),
        }
    }
    let mut limits = Limits {
        max_connections,
        max_per_peer,
    };
    if let Some(soft) = limit.current {
        let room = usize::try_from(soft.saturating_sub(RESERVED_DESCRIPTORS))
            .unwrap_or(usize::MAX)
            .max(1);
        if room < max_connections {
            // On stderr, not only in the log (whose default level hides warnings): a flag
            // the operator set is not obeyed.
            let _ = writeln!(
                std::io::stderr(),
                "vramctl: --web.max-connections {max_connections} is more than the open-file \
                 limit ({soft}) leaves room for; serving at most {room} connections"
            );
            limits.max_connections = room;
        }
    }
    limits
}

/// Retention of `serve --record` when `--retain` is not given (as for `vramctl record`).
const DEFAULT_RETAIN: &str = "raw=24h,1m=30d";

/// Opens the history for `--record` (taking the single-writer lock) and starts its writer.
fn open_recorder(
    global: &GlobalArgs,
    db: Option<&std::path::Path>,
    retain: &str,
    interval: Duration,
    history_db: &mut Option<std::path::PathBuf>,
) -> anyhow::Result<HistoryRecorder> {
    let retention: Retention = retain.parse()?;
    let path = match db {
        Some(path) => path.to_path_buf(),
        None => db_path(global)?,
    };
    let mut store = Store::open(&path, OpenMode::Append)?;
    *history_db = Some(path.clone());
    let interval_ms = i64::try_from(interval.as_millis()).unwrap_or(i64::MAX);
    store.begin_session(&session("serve", interval_ms))?;
    tracing::info!(db = %path.display(), interval_ms, retain, "Recording.");
    let _ = writeln!(
        std::io::stderr(),
        "vramctl: recording history into {}",
        path.display()
    );
    let feed = StoreFeed::start(
        store,
        retention,
        interval_ms,
        channel_capacity(interval_ms),
        false,
    )?;
    // The processes' identities come from the collector's catalog, which reads /proc only
    // with `--process-details proc` (`DetailsSource::facts_source`).
    Ok(HistoryRecorder::new(feed, Procs::new()))
}
