//! `vramctl top`: the live terminal UI (and `--replay` of a recording).
//!
//! This file wires the pieces of [`vramctl::tui`] together: it checks the flags, opens the
//! sampler (one NVML session, moved onto the sampler thread), starts the input and action
//! threads, takes the terminal, and runs the loop: wait for an event, update the state,
//! carry out the effects, draw. Drawing happens once per batch of queued events.

use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::sync::mpsc::{RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use vramctl::tui::app::{App, AppConfig, Effect, TICK_MS};
use vramctl::tui::event::{
    ActionRequest, Event, HistoryRequest, ReplayRequest, spawn_actions, spawn_input, spawn_sampler,
    spawn_signals,
};
use vramctl::tui::kill::{Actions, UnwiredKiller};
use vramctl::tui::terminal::TerminalGuard;
use vramctl::tui::verdict::NoJudge;
use vramctl::tui::view;

use super::{GpuFilter, open_sampler};
use crate::cli::{ColorChoice, GlobalArgs, TopArgs};
use crate::exit::Exit;

/// Runs `top`.
pub fn run(global: &GlobalArgs, args: &TopArgs) -> anyhow::Result<Exit> {
    let interval = match args.interval {
        s if s.is_finite() && (0.1..=3600.0).contains(&s) => Duration::from_secs_f64(s),
        s => bail!("--interval '{s}' is not a number of seconds between 0.1 and 3600"),
    };
    if let Some(db) = &args.replay {
        // The ReplaySource over the history store plugs in here once the store is merged.
        bail!(
            "cannot replay '{}': this build has no history store yet; \
             watch live with 'vramctl top' instead",
            db.display()
        );
    }
    let color = match global.color {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
    };

    let mut sampler = open_sampler(global)?;
    // Per-process SM activity gives the IDLE column; one more NVML call per GPU per tick.
    sampler.backend_mut().set_read_process_activity(true);
    let devices = if args.gpu.is_empty() {
        None
    } else {
        let filter = GpuFilter::new(&args.gpu, sampler.devices())?;
        Some(
            sampler
                .devices()
                .iter()
                .filter(|d| filter.matches(d))
                .map(|d| d.uuid.clone())
                .collect::<BTreeSet<String>>(),
        )
    };

    if !std::io::stdout().is_terminal() {
        bail!("vramctl top needs a terminal; for plain output use 'vramctl status --watch 1'");
    }

    let mut app = App::new(AppConfig {
        live_interval: Some(interval),
        readonly: args.readonly,
        color,
        devices,
        history_source: false,
        analysis: false,
    });

    let (tx, rx) = channel::<Event>();
    // The analysis plugs in here (a `Judge` over `vramctl_core::analysis`) once merged.
    let (_stop_sampler, _sampler) = spawn_sampler(sampler, interval, Box::new(NoJudge), tx.clone())
        .context("cannot start the sampler thread")?;
    // The safe kill path plugs in here (a `Killer` over `vramctl_core::signal`) once merged.
    let (actions, _actions) = spawn_actions(
        Actions::new(args.readonly, Box::new(UnwiredKiller::default())),
        tx.clone(),
    )
    .context("cannot start the action thread")?;
    let replay: Option<Sender<ReplayRequest>> = None;
    let history: Option<Sender<HistoryRequest>> = None;

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
                Effect::MemoryOutcome { plan, freed_bytes } => {
                    let _ = actions.send(ActionRequest::MemoryOutcome { plan, freed_bytes });
                }
                Effect::Seek(seek) => {
                    if let Some(replay) = &replay {
                        let window_ms = app.zoom.span_ms();
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
    Ok(Exit::Ok)
}
