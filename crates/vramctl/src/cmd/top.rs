//! `vramctl top`: the live terminal UI (and `--replay` of a recording).
//!
//! This file wires the pieces of [`vramctl_tui`] together: it checks the flags, opens the
//! sampler (one NVML session, moved onto the sampler thread; when a running daemon answers
//! on its socket, its answer is the first frame and NVML opens on the sampler thread
//! meanwhile; when that daemon is the host's answering for our PID namespace, a container's,
//! it answers every frame, and NVML opens here only once it stops) and, when a recorder's
//! database is there, the history thread over it — or for `--replay DB` only the replay
//! thread over that database; starts the input and action threads, takes the terminal,
//! and runs the loop: wait for an event, update the state, carry out the effects, draw.
//! Drawing happens once per batch of queued events.
//!
//! The seams are filled here: live, `vramctl_observe::verdict::AnalysisJudge` (the live leak and idle
//! analysis) on the sampler thread; in a replay, `replay_verdicts::StoreJudge` (the batch analysis of
//! the recording before the cursor) on the replay thread; and `vramctl_tui::kill::SignalKiller`
//! (the signal path and audit sink of `vramctl kill`) on the action thread.

mod replay_verdicts;

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use vramctl_core::types::DeviceInfo;
use vramctl_observe::daemon_socket::SampleReply;
use vramctl_observe::daemon_socket::client::{AskOptions, ask};
use vramctl_observe::pid_view::PidView;
use vramctl_observe::verdict::AnalysisJudge;
use vramctl_procs::procinfo;
use vramctl_store::StoreError;
use vramctl_tui::app::{App, AppConfig, Effect, TICK_MS};
use vramctl_tui::event::{
    ActionRequest, Event, FirstSample, HistoryRequest, ReplayRequest, spawn_actions, spawn_history,
    spawn_input, spawn_replay, spawn_sampler_after, spawn_sampler_from_daemon, spawn_signals,
};
use vramctl_tui::kill::{Actions, SignalKiller};
use vramctl_tui::reclaim::AgentReclaimer;
use vramctl_tui::store::StoreSource;
use vramctl_tui::terminal::TerminalGuard;
use vramctl_tui::view;

use vramctl_observe::gpu_selection::GpuFilter;

use super::{db_path, leak_config, open_sampler};
use crate::cli::{ColorChoice, GlobalArgs, TopArgs};
use crate::exit::Exit;

/// Runs `top`.
pub fn run(global: &GlobalArgs, args: &TopArgs) -> anyhow::Result<Exit> {
    let interval = args.interval;
    let tz = vramctl_core::wall_time::zone(args.tz.as_deref())?;
    let leak = leak_config(&args.analysis)?;
    let color = match global.color {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
    };
    let (tx, rx) = channel::<Event>();

    // Live: the sampler feeds the UI, and the recorder's database (when there is one) the
    // charts' past. Replay: the recording feeds both; NVML is not touched.
    let mut replay: Option<Sender<ReplayRequest>> = None;
    let mut history: Option<Sender<HistoryRequest>> = None;
    let mut sampler_thread = None;
    let app_config = match &args.replay {
        Some(db) => {
            let source = StoreSource::open(db, None)
                .with_context(|| format!("cannot replay '{}'", db.display()))?;
            let devices = gpu_selection(&args.gpu.selectors, || {
                source
                    .gpus()
                    .map_err(|e| anyhow::anyhow!("cannot replay '{}': {e}", db.display()))
            })?;
            let judge = replay_verdicts::StoreJudge::open(db, leak.clone())
                .with_context(|| format!("cannot replay '{}'", db.display()))?
                .with_time_zone(tz.clone());
            need_terminal()?;
            let (requests, _replay) =
                spawn_replay(Box::new(source), Some(Box::new(judge)), tx.clone())
                    .context("cannot start the replay thread")?;
            replay = Some(requests);
            AppConfig {
                live_interval: None,
                // Actions are off in a replay whatever this says.
                readonly: args.readonly,
                color,
                devices,
                history_source: false,
                history_note: Some(format!("the recording '{}'", db.display())),
                analysis: true,
                time_zone: tz,
                by: args.by,
            }
        }
        None => {
            // The first frame from a running daemon when one answers (no wait for NVML to
            // start: it starts on the sampler thread meanwhile), else from NVML here. A host
            // daemon answering for our PID namespace (a container's) gives every frame:
            // NVML here would list host PIDs.
            let ask_options = AskOptions {
                nvml_library: global.nvml_lib.clone(),
                process_stat: false,
                accept_mapped: true,
            };
            let first = if args.no_daemon || !global.backends().daemon_may_answer() {
                None
            } else {
                ask(&ask_options).map(first_sample)
            };
            let mapped = first
                .as_ref()
                .is_some_and(|f| matches!(f.pid_view, PidView::Mapped(_)));
            let sampler = match first {
                Some(_) => None,
                None => Some(open_top_sampler(global)?),
            };
            let devices = gpu_selection(&args.gpu.selectors, || {
                Ok(match (&first, &sampler) {
                    (Some(first), _) => first
                        .snapshot
                        .devices
                        .iter()
                        .map(|d| Arc::clone(&d.info))
                        .collect(),
                    (None, Some(sampler)) => sampler.devices().to_vec(),
                    (None, None) => Vec::new(),
                })
            })?;
            need_terminal()?;
            let (source, note) = recorded_history(global);
            if let Some(source) = source {
                let (requests, _history) = spawn_history(Box::new(source), tx.clone())
                    .context("cannot start the history thread")?;
                history = Some(requests);
            }
            let judge = AnalysisJudge::new(leak.clone())
                .map_err(|e| anyhow!("{e}"))?
                .with_time_zone(tz.clone());
            let open_global = global.clone();
            let open = move || match sampler {
                Some(sampler) => Ok(sampler),
                None => open_top_sampler(&open_global).map_err(|e| format!("{e:#}")),
            };
            let spawned = match first {
                Some(first) if mapped => {
                    // Asked again for each frame; an answer that no longer is a mapping for
                    // us (the daemon was replaced by one in our namespace) ends it too.
                    let daemon = Box::new(move || {
                        ask(&ask_options)
                            .map(first_sample)
                            .filter(|f| matches!(f.pid_view, PidView::Mapped(_)))
                    });
                    spawn_sampler_from_daemon(
                        first,
                        daemon,
                        open,
                        interval,
                        Box::new(judge),
                        tx.clone(),
                    )
                }
                first => spawn_sampler_after(first, open, interval, Box::new(judge), tx.clone()),
            };
            sampler_thread = Some(spawned.context("cannot start the sampler thread")?);
            AppConfig {
                live_interval: Some(interval),
                readonly: args.readonly,
                color,
                devices,
                history_source: history.is_some(),
                history_note: Some(note),
                analysis: true,
                time_zone: tz,
                by: args.by,
            }
        }
    };
    let mut app = App::new(app_config);
    // The audit sink of `vramctl kill`, opened at the first kill (never when read-only).
    let sink_global = global.clone();
    let killer = SignalKiller::new(Box::new(move || {
        crate::audit_sink::open_sink(&sink_global).map_err(|e| format!("{e:#}"))
    }));
    // The reclaim key's audit records go to the same log (`vramctl reclaim`'s).
    let sink_global = global.clone();
    let reclaimer = AgentReclaimer::new(Box::new(move || {
        crate::audit_sink::open_sink(&sink_global).map_err(|e| format!("{e:#}"))
    }));
    let actions = Actions::new(args.readonly, Box::new(killer)).with_reclaimer(Box::new(reclaimer));
    let (actions, _actions) =
        spawn_actions(actions, tx.clone()).context("cannot start the action thread")?;

    let (guard, mut terminal) = TerminalGuard::enter().context("cannot set up the terminal")?;
    let size = terminal.size().context("cannot read the terminal size")?;
    app.update(Event::Resize(size.width, size.height));
    spawn_input(tx.clone()).context("cannot start the input thread")?;
    spawn_signals(tx.clone()).context("cannot watch for termination signals")?;
    drop(tx);

    let tick = Duration::from_millis(u64::try_from(TICK_MS).unwrap_or(200));
    let mut next_tick = Instant::now() + tick;
    let mut effects = app.start();
    loop {
        for effect in effects.drain(..) {
            match effect {
                Effect::Quit => {}
                Effect::Plan(target) => {
                    let _ = actions.send(ActionRequest::Plan(target));
                }
                Effect::Kill(plan) => {
                    let _ = actions.send(ActionRequest::Kill(plan));
                }
                Effect::Reclaim(target) => {
                    let _ = actions.send(ActionRequest::Reclaim(target));
                }
                Effect::MemoryOutcome { plan, freed_bytes } => {
                    let _ = actions.send(ActionRequest::MemoryOutcome { plan, freed_bytes });
                }
                Effect::Seek(seek) => {
                    if let Some(replay) = &replay {
                        let window_ms = app.charts.zoom.span_ms();
                        let _ = replay.send(ReplayRequest {
                            seek,
                            window_ms,
                            max_points: 512,
                        });
                    }
                }
                Effect::LoadHistory(request) => {
                    if let Some(history) = &history {
                        let _ = history.send(request);
                    }
                }
            }
        }
        if app.quit {
            break;
        }
        terminal
            .draw(|frame| view::render(&app, frame))
            .context("cannot draw on the terminal")?;
        let event = if app.wants_ticks() {
            match rx.recv_timeout(next_tick.saturating_duration_since(Instant::now())) {
                Ok(event) => event,
                Err(RecvTimeoutError::Timeout) => {
                    next_tick = Instant::now() + tick;
                    Event::Tick
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match rx.recv() {
                Ok(event) => {
                    next_tick = Instant::now() + tick;
                    event
                }
                Err(_) => break,
            }
        };
        effects = app.update(event);
        // Take in everything already queued before drawing again.
        while !app.quit {
            match rx.try_recv() {
                Ok(event) => effects.extend(app.update(event)),
                Err(_) => break,
            }
        }
    }
    drop(terminal);
    drop(guard);
    drop(sampler_thread);
    Ok(Exit::Ok)
}

/// A daemon's answer as a frame of `top`.
fn first_sample(reply: SampleReply) -> FirstSample {
    FirstSample {
        snapshot: reply.snapshot,
        driver_names: reply.driver_names,
        pid_view: reply.mapped.map_or(PidView::Same, PidView::Mapped),
    }
}

/// NVML for `top`, with per-process SM activity (the IDLE column; one more NVML call per
/// GPU per tick).
fn open_top_sampler(
    global: &GlobalArgs,
) -> anyhow::Result<vramctl_observe::live_loop::LiveSampler> {
    let mut sampler = open_sampler(global)?;
    sampler.backend_mut().set_read_process_activity(true);
    Ok(sampler)
}

fn need_terminal() -> anyhow::Result<()> {
    if !std::io::stdout().is_terminal() {
        bail!("vramctl top needs a terminal; for plain output use 'vramctl status --watch 1'");
    }
    Ok(())
}

/// UUIDs of the GPUs `--gpu` chose (checked against `devices`), or `None` for all.
fn gpu_selection(
    selectors: &[String],
    devices: impl FnOnce() -> anyhow::Result<Vec<Arc<DeviceInfo>>>,
) -> anyhow::Result<Option<BTreeSet<String>>> {
    if selectors.is_empty() {
        return Ok(None);
    }
    let devices = devices()?;
    let filter = GpuFilter::new(selectors, &devices)?;
    Ok(Some(
        devices
            .iter()
            .filter(|d| filter.matches(d))
            .map(|d| d.uuid.clone())
            .collect(),
    ))
}

/// The recorder's database for the charts' past, when there is one to read, and a line
/// for the help saying where the past comes from or why there is none.
fn recorded_history(global: &GlobalArgs) -> (Option<StoreSource>, String) {
    let path = match db_path(global) {
        Ok(path) => path,
        Err(err) => return (None, format!("no history database: {err:#}")),
    };
    match StoreSource::open(&path, procinfo::boot_id()) {
        Ok(source) => (
            Some(source),
            format!("before top started: the recorder's '{}'", path.display()),
        ),
        Err(StoreError::NotFound { .. }) => (
            None,
            format!(
                "only since top started: no recorder database at '{}' (vramctl record keeps one)",
                path.display()
            ),
        ),
        Err(err) => {
            tracing::warn!(error = %err, "Cannot read the history database; charts start with top.");
            (None, format!("only since top started: {err}"))
        }
    }
}
