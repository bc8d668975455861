//! Everything the UI reacts to, as one [`Event`] enum over one channel, and the threads
//! that produce the events: terminal input, the sampler (the only owner of the NVML
//! backend), the action worker (kills), the replay reader and the history loader.
//!
//! Each thread ends by itself when the UI drops the receiving end (its next `send`
//! fails) or its request channel.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self as term, KeyEvent, MouseEvent};
use vramctl_core::{Backend, Sampler};

use super::history::{HistoryChunk, HistorySource, SeriesKey, Starts};
use super::kill::{Actions, KillOutcome, KillPlan, KillTarget};
use super::observe::{HostReader, Observation};
use super::replay::{ReplayFrame, ReplaySource, Seek, seek_frame};
use super::verdict::{Judge, ReplayJudge};

/// Something the UI reacts to.
#[derive(Debug, Clone)]
pub enum Event {
    /// A key was pressed.
    Key(KeyEvent),
    /// The mouse was clicked, scrolled or moved.
    Mouse(MouseEvent),
    /// The terminal now has this many columns and rows.
    Resize(u16, u16),
    /// Time passed (only while a replay plays).
    Tick,
    /// The sampler's newest observation.
    Sample(Arc<Observation>),
    /// The sampler thread stopped, and why.
    SamplerStopped(String),
    /// Older history for the charts, loaded from a [`HistorySource`].
    History(HistoryChunk),
    /// A replay seek was carried out.
    Replay(Box<ReplayFrame>),
    /// A replay seek failed.
    ReplayFailed(String),
    /// The kill target was checked: the plan to confirm, or why not.
    KillPlanned(Result<KillPlan, String>),
    /// A signal asked the program to end (SIGTERM, SIGHUP, SIGQUIT).
    Terminate(i32),
    /// The kill was carried out.
    KillFinished {
        /// What was planned.
        plan: KillPlan,
        /// What happened.
        outcome: KillOutcome,
    },
}

/// Reads terminal input and forwards it. Blocks in the terminal read, so it is never
/// joined: it ends with the process.
pub fn spawn_input(tx: Sender<Event>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("top-input".into())
        .spawn(move || {
            loop {
                let event = match term::read() {
                    Ok(term::Event::Key(key)) => Event::Key(key),
                    // Motion is not used; forwarding it would redraw on every move.
                    Ok(term::Event::Mouse(mouse))
                        if !matches!(
                            mouse.kind,
                            term::MouseEventKind::Moved | term::MouseEventKind::Drag(_)
                        ) =>
                    {
                        Event::Mouse(mouse)
                    }
                    Ok(term::Event::Resize(w, h)) => Event::Resize(w, h),
                    Ok(_) => continue,
                    Err(err) => {
                        tracing::warn!(error = %err, "Cannot read the terminal.");
                        return;
                    }
                };
                if tx.send(event).is_err() {
                    return;
                }
            }
        })
}

/// Turns SIGTERM, SIGHUP and SIGQUIT into [`Event::Terminate`], so that the loop ends and
/// gives the terminal back instead of the process dying in raw mode.
pub fn spawn_signals(tx: Sender<Event>) -> std::io::Result<JoinHandle<()>> {
    use signal_hook::consts::{SIGHUP, SIGQUIT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGHUP, SIGQUIT])?;
    std::thread::Builder::new()
        .name("top-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                if tx.send(Event::Terminate(signal)).is_err() {
                    return;
                }
            }
        })
}

/// Samples every `interval` on its own thread: one tick, joined with /proc, judged, sent as
/// [`Event::Sample`]. The sampler (and so the NVML session) lives and dies on this thread.
/// Dropping the returned sender stops it.
pub fn spawn_sampler<B: Backend + 'static>(
    mut sampler: Sampler<B>,
    interval: Duration,
    mut judge: Box<dyn Judge>,
    tx: Sender<Event>,
) -> std::io::Result<(Sender<()>, JoinHandle<()>)> {
    let (stop_tx, stop_rx) = channel::<()>();
    let handle = std::thread::Builder::new()
        .name("top-sampler".into())
        .spawn(move || {
            let mut hosts = HostReader::new();
            loop {
                let started = Instant::now();
                let snapshot = sampler.tick();
                let mut obs =
                    hosts.observe(snapshot, |pid| sampler.backend_mut().process_name(pid));
                obs.verdicts = judge.judge(&obs);
                tracing::trace!(
                    ms = started.elapsed().as_secs_f64() * 1e3,
                    "Sampled for top."
                );
                if tx.send(Event::Sample(Arc::new(obs))).is_err() {
                    return;
                }
                match stop_rx.recv_timeout(interval.saturating_sub(started.elapsed())) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        })?;
    Ok((stop_tx, handle))
}

/// A request to the action worker.
#[derive(Debug, Clone)]
pub enum ActionRequest {
    /// Check this target.
    Plan(KillTarget),
    /// Carry out this plan.
    Kill(KillPlan),
    /// Report what became of the memory (no answer is sent).
    MemoryOutcome {
        /// The kill.
        plan: KillPlan,
        /// Bytes freed, or `None` when still listed.
        freed_bytes: Option<u64>,
    },
}

/// Runs kills off the UI thread (a kill waits for the process to exit).
pub fn spawn_actions(
    mut actions: Actions,
    tx: Sender<Event>,
) -> std::io::Result<(Sender<ActionRequest>, JoinHandle<()>)> {
    let (req_tx, req_rx) = channel::<ActionRequest>();
    let handle = std::thread::Builder::new()
        .name("top-actions".into())
        .spawn(move || {
            for request in req_rx {
                let event = match request {
                    ActionRequest::Plan(target) => Event::KillPlanned(actions.plan(&target)),
                    ActionRequest::Kill(plan) => {
                        let outcome = actions.kill(&plan);
                        Event::KillFinished { plan, outcome }
                    }
                    ActionRequest::MemoryOutcome { plan, freed_bytes } => {
                        actions.memory_outcome(&plan, freed_bytes);
                        continue;
                    }
                };
                if tx.send(event).is_err() {
                    return;
                }
            }
        })?;
    Ok((req_tx, handle))
}

/// A seek for the replay thread.
#[derive(Debug, Clone, Copy)]
pub struct ReplayRequest {
    /// Where to go.
    pub seek: Seek,
    /// How much history the charts want before the cursor.
    pub window_ms: i64,
    /// At most this many points per series.
    pub max_points: usize,
}

/// Reads a recording on its own thread, and with a `judge`, adds the verdicts at each
/// moment it sends. Requests that queue up while one is served are skipped but for the
/// last (playing fast must not fall behind).
pub fn spawn_replay(
    source: Box<dyn ReplaySource>,
    mut judge: Option<Box<dyn ReplayJudge>>,
    tx: Sender<Event>,
) -> std::io::Result<(Sender<ReplayRequest>, JoinHandle<()>)> {
    let (req_tx, req_rx) = channel::<ReplayRequest>();
    let handle = std::thread::Builder::new()
        .name("top-replay".into())
        .spawn(move || {
            while let Some(request) = latest(&req_rx) {
                let event = match seek_frame(
                    source.as_ref(),
                    request.seek,
                    request.window_ms,
                    request.max_points,
                ) {
                    Ok(mut frame) => {
                        if let (Some(judge), Some(obs)) =
                            (judge.as_mut(), frame.observation.as_mut())
                        {
                            let verdicts = judge.judge_at(obs);
                            Arc::make_mut(obs).verdicts = verdicts;
                        }
                        Event::Replay(Box::new(frame))
                    }
                    Err(reason) => Event::ReplayFailed(reason),
                };
                if tx.send(event).is_err() {
                    return;
                }
            }
        })?;
    Ok((req_tx, handle))
}

/// A request for older history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRequest {
    /// The series.
    pub keys: Vec<SeriesKey>,
    /// Who each PID is (start time), so a reused PID's earlier process is not loaded.
    pub starts: Starts,
    /// Window start.
    pub from_ms: i64,
    /// Window end.
    pub to_ms: i64,
    /// At most this many points per series.
    pub max_points: usize,
}

/// Loads history from `source` on its own thread (it may read a database).
pub fn spawn_history(
    source: Box<dyn HistorySource>,
    tx: Sender<Event>,
) -> std::io::Result<(Sender<HistoryRequest>, JoinHandle<()>)> {
    let (req_tx, req_rx) = channel::<HistoryRequest>();
    let handle = std::thread::Builder::new()
        .name("top-history".into())
        .spawn(move || {
            while let Some(r) = latest(&req_rx) {
                let chunk = source.load(&r.keys, &r.starts, r.from_ms, r.to_ms, r.max_points);
                if tx.send(Event::History(chunk)).is_err() {
                    return;
                }
            }
        })?;
    Ok((req_tx, handle))
}

/// The next request, skipping to the newest of those already queued; `None` once the
/// sender is gone.
fn latest<T>(rx: &Receiver<T>) -> Option<T> {
    let mut request = rx.recv().ok()?;
    while let Ok(newer) = rx.try_recv() {
        request = newer;
    }
    Some(request)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::kill::{KillerCall, RecordingKiller};

    #[test]
    fn latest_skips_to_the_newest_request() {
        let (tx, rx) = channel();
        for i in 0..5 {
            tx.send(i).unwrap();
        }
        assert_eq!(latest(&rx), Some(4));
        drop(tx);
        assert_eq!(latest(&rx), None);
    }

    #[test]
    fn the_action_worker_answers_with_events() {
        let killer = RecordingKiller::new(KillOutcome::AlreadyGone);
        let calls = Arc::clone(&killer.calls);
        let (tx, rx) = channel();
        let (req, handle) = spawn_actions(Actions::new(false, Box::new(killer)), tx).unwrap();
        let target = KillTarget {
            pid: 5,
            start_time_ticks: Some(3),
            started_at_unix_ms: None,
            user: None,
            command: "x".into(),
            memory: vec![],
        };
        req.send(ActionRequest::Plan(target)).unwrap();
        let Ok(Event::KillPlanned(Ok(plan))) = rx.recv() else {
            panic!("expected a plan");
        };
        req.send(ActionRequest::Kill(plan.clone())).unwrap();
        let Ok(Event::KillFinished { outcome, .. }) = rx.recv() else {
            panic!("expected a result");
        };
        assert_eq!(outcome, KillOutcome::AlreadyGone);
        req.send(ActionRequest::MemoryOutcome {
            plan,
            freed_bytes: Some(1),
        })
        .unwrap();
        drop(req);
        handle.join().unwrap();
        assert!(rx.try_recv().is_err(), "a memory outcome has no answer");
        assert_eq!(
            *calls.lock().unwrap(),
            [
                KillerCall::Plan(5),
                KillerCall::Kill(5),
                KillerCall::MemoryOutcome(5, Some(1)),
            ]
        );
    }
}
