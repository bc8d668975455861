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
use vramctl_core::clock::{ClockTime, Timeline};
use vramctl_core::types::Snapshot;
use vramctl_gpu::{Backend, Sampler};

use super::kill::{Actions, KillOutcome, KillPlan, KillTarget};
use super::memory_series::{HistoryChunk, HistorySource, SeriesKey, Starts};
use super::reclaim::{ReclaimOutcome, ReclaimTarget};
use super::replay::{ReplayFrame, ReplaySource, Seek, seek_frame};
use vramctl_observe::observation::{Observation, Observer};
use vramctl_observe::pid_view::{LocalPids, PidView};
use vramctl_observe::verdict::{Judge, ReplayJudge};

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
    /// A reclaim was carried out.
    ReclaimFinished {
        /// The process.
        target: ReclaimTarget,
        /// What happened.
        outcome: ReclaimOutcome,
    },
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

/// Places a live snapshot on `top`'s time line: the wall clock at `top`'s first sample,
/// counted on by the monotonic clock. Everything `top` measures from its samples (the
/// charts' window, IDLE, Δ/min, the verdicts) then goes on across a wall-clock step instead
/// of freezing (a step back put every new sample before the chart's window) or jumping (a
/// step forward made processes idle for the length of the step); the header's clock is
/// this time line too, so it differs from `date` by the steps made while `top` runs.
pub fn on_top_timeline(timeline: &mut Timeline, mut snapshot: Snapshot) -> Snapshot {
    snapshot.taken_at_unix_ms = timeline.place(ClockTime {
        unix_ms: snapshot.taken_at_unix_ms,
        monotonic_ms: snapshot.monotonic_ms,
    });
    snapshot
}

/// Samples every `interval` on its own thread: one tick, placed on `top`'s time line
/// ([`on_top_timeline`]), joined with /proc, judged, sent as [`Event::Sample`]. The sampler
/// (and so the NVML session) lives and dies on this thread. Dropping the returned sender
/// stops it.
pub fn spawn_sampler<B: Backend + 'static>(
    sampler: Sampler<B>,
    interval: Duration,
    judge: Box<dyn Judge>,
    tx: Sender<Event>,
) -> std::io::Result<(Sender<()>, JoinHandle<()>)> {
    spawn_sampler_after(None, move || Ok(sampler), interval, judge, tx)
}

/// A first frame from elsewhere (a running daemon's answer): its snapshot, and the driver's
/// names of the processes /proc cannot see.
#[derive(Debug, Clone)]
pub struct FirstSample {
    /// The devices, read by the daemon when asked.
    pub snapshot: Snapshot,
    /// Names for the PIDs this /proc cannot see.
    pub driver_names: std::collections::BTreeMap<u32, String>,
    /// What the snapshot's PIDs are: the daemon's and ours alike, or mapped for our PID
    /// namespace by a host daemon (`vramctl_observe::pid_view`).
    pub pid_view: PidView,
}

/// Asks the daemon again for each frame; `None` once it does not answer (then NVML is
/// read here from that frame on).
pub type AskDaemon = Box<dyn FnMut() -> Option<FirstSample> + Send>;

/// As [`spawn_sampler`], with `first` (when given) observed and sent as the first
/// [`Event::Sample`] before the sampler is opened with `open` on this thread, so the first
/// frame does not wait for NVML to start; the sampler's first tick comes an `interval`
/// later. When `open` fails, [`Event::SamplerStopped`] says why.
pub fn spawn_sampler_after<B, F>(
    first: Option<FirstSample>,
    open: F,
    interval: Duration,
    judge: Box<dyn Judge>,
    tx: Sender<Event>,
) -> std::io::Result<(Sender<()>, JoinHandle<()>)>
where
    B: Backend + 'static,
    F: FnOnce() -> Result<Sampler<B>, String> + Send + 'static,
{
    spawn_frames(first, None, open, interval, judge, tx)
}

/// As [`spawn_sampler_after`], with every frame from `daemon` while it answers: `top` in a
/// container, whose host daemon maps each frame to the container's PIDs — NVML read here
/// would give host PIDs. When the daemon stops answering, NVML is opened with `open` and
/// its PIDs are taken for what they are here (`pid_view::LocalPids::view`: host PIDs
/// that cannot be mapped are never looked up in this /proc).
pub fn spawn_sampler_from_daemon<B, F>(
    first: FirstSample,
    daemon: AskDaemon,
    open: F,
    interval: Duration,
    judge: Box<dyn Judge>,
    tx: Sender<Event>,
) -> std::io::Result<(Sender<()>, JoinHandle<()>)>
where
    B: Backend + 'static,
    F: FnOnce() -> Result<Sampler<B>, String> + Send + 'static,
{
    spawn_frames(Some(first), Some(daemon), open, interval, judge, tx)
}

/// Joins one frame with this /proc (only when its PIDs are this /proc's), judges it.
fn observe_frame(
    hosts: &mut Observer,
    judge: &mut dyn Judge,
    snapshot: Snapshot,
    pid_view: PidView,
    name: impl FnMut(u32) -> Option<String>,
) -> Observation {
    let mut obs = if pid_view.pids_are_ours() {
        hosts.observe(snapshot, name)
    } else {
        // Host PIDs: a lookup here would name whichever process of ours has the number.
        Observation::bare(snapshot)
    };
    obs.pid_view = pid_view;
    obs.verdicts = judge.judge(&obs);
    obs
}

fn spawn_frames<B, F>(
    first: Option<FirstSample>,
    mut daemon: Option<AskDaemon>,
    open: F,
    interval: Duration,
    mut judge: Box<dyn Judge>,
    tx: Sender<Event>,
) -> std::io::Result<(Sender<()>, JoinHandle<()>)>
where
    B: Backend + 'static,
    F: FnOnce() -> Result<Sampler<B>, String> + Send + 'static,
{
    let (stop_tx, stop_rx) = channel::<()>();
    let handle = std::thread::Builder::new()
        .name("top-sampler".into())
        .spawn(move || {
            // Each frame's PIDs are decided here (a daemon's mapped answer, or NVML's checked
            // by `LocalPids::view`), and only frames whose PIDs are ours are observed.
            let mut hosts = Observer::builder().pids_decided_by_caller().build();
            let mut local = LocalPids::here();
            let mut timeline = Timeline::new();
            let mut next = first;
            let mut open = Some(open);
            let mut sampler: Option<Sampler<B>> = None;
            loop {
                let started = Instant::now();
                if next.is_none() && sampler.is_none() {
                    next = daemon.as_mut().and_then(|ask| ask());
                }
                let obs = if let Some(frame) = next.take() {
                    let snapshot = on_top_timeline(&mut timeline, frame.snapshot);
                    let names = frame.driver_names;
                    observe_frame(
                        &mut hosts,
                        judge.as_mut(),
                        snapshot,
                        frame.pid_view,
                        |pid| names.get(&pid).cloned(),
                    )
                } else {
                    if daemon.take().is_some() {
                        tracing::debug!("The daemon stopped answering; top reads NVML here.");
                    }
                    if sampler.is_none() {
                        let Some(open) = open.take() else { return };
                        match open() {
                            Ok(opened) => sampler = Some(opened),
                            Err(why) => {
                                let _ = tx.send(Event::SamplerStopped(why));
                                return;
                            }
                        }
                    }
                    let Some(sampler) = sampler.as_mut() else {
                        return;
                    };
                    let snapshot = on_top_timeline(&mut timeline, sampler.tick());
                    // Each frame: whether the driver's rows are this namespace's can change
                    // as processes come and go.
                    let view = local.view(&snapshot);
                    observe_frame(&mut hosts, judge.as_mut(), snapshot, view, |pid| {
                        sampler.backend_mut().process_name(pid)
                    })
                };
                tracing::trace!(
                    ms = started.elapsed().as_secs_f64() * 1e3,
                    "Sampled for top."
                );
                if tx.send(Event::Sample(Arc::new(obs))).is_err() {
                    return;
                }
                if daemon.is_none() && sampler.is_none() {
                    // The first frame was a daemon's in our own namespace: NVML opens here
                    // now, while that frame is on screen, and ticks an interval after it.
                    let Some(open) = open.take() else { return };
                    match open() {
                        Ok(opened) => sampler = Some(opened),
                        Err(why) => {
                            let _ = tx.send(Event::SamplerStopped(why));
                            return;
                        }
                    }
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
    /// Ask this process's agent to release its cache.
    Reclaim(ReclaimTarget),
    /// Report what became of the memory (no answer is sent).
    MemoryOutcome {
        /// The kill.
        plan: KillPlan,
        /// Bytes freed, or `None` when still listed.
        freed_bytes: Option<u64>,
    },
}

/// Runs kills and reclaims off the UI thread (a kill waits for the process to exit, a
/// reclaim for the agent).
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
                    ActionRequest::Reclaim(target) => {
                        let outcome = actions.reclaim(&target);
                        Event::ReclaimFinished { target, outcome }
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
    use crate::app::{App, AppConfig};
    use crate::fixtures::{GIB, T0_MS, gpu, host};
    use crate::kill::{KillerCall, RecordingKiller};
    use crate::table::Idle;
    use vramctl_core::types::{DeviceState, ProcessActivity};

    /// `top` fed samples 1 s apart while the wall clock steps `step_ms` after 30 s: PID 7
    /// holds memory at 0 % SM the whole time, so IDLE (the live analysis's idle evidence,
    /// through the same judge as `top` runs) counts up by one second a sample.
    fn idle_across_a_step(step_ms: i64) -> (Option<Idle>, usize) {
        use vramctl_observe::verdict::{AnalysisJudge, Judge};
        let mut judge =
            AnalysisJudge::new(vramctl_leaks::analysis::LeakConfig::default()).expect("judge");
        let mut app = App::new(AppConfig::default());
        app.update(Event::Resize(120, 40));
        let mut timeline = Timeline::new();
        for i in 0..60 {
            let mut device = gpu(0, 80 * GIB, 4 * GIB, &[(7, 4 * GIB)]);
            if let DeviceState::Ok(r) = &mut device.state {
                // Alone on an idle GPU: the device's utilization says idle too.
                r.utilization_gpu_percent = Some(0);
                r.process_activity = Some(vec![ProcessActivity {
                    pid: 7,
                    sm_percent: 0,
                    memory_percent: 0,
                }]);
            }
            let monotonic_ms = 5_000 + i * 1000;
            let snapshot = Snapshot {
                taken_at_unix_ms: T0_MS + i * 1000 + if i >= 30 { step_ms } else { 0 },
                monotonic_ms,
                driver: Arc::default(),
                devices: vec![device],
                unopened: Vec::new(),
            };
            let mut obs = Observation::bare(on_top_timeline(&mut timeline, snapshot));
            obs.hosts.insert(7, host(7, 1, "alice", "python idle.py"));
            obs.verdicts = judge.judge(&obs);
            app.update(Event::Sample(Arc::new(obs)));
        }
        let row = app.table.rows.iter().find(|r| r.key.pid == 7).cloned();
        let key = crate::memory_series::SeriesKey::Process {
            uuid: format!("GPU-{:08x}-0000-4000-8000-000000000000", 0),
            pid: 7,
        };
        (row.and_then(|r| r.idle), app.chart_points(&key).len())
    }

    #[test]
    fn a_wall_clock_step_neither_freezes_nor_jumps_tops_idle_and_charts() {
        for step_ms in [-3_600_000, 3_600_000] {
            let (idle, points) = idle_across_a_step(step_ms);
            assert_eq!(idle, Some(Idle::AtLeast(59_000)), "step {step_ms}");
            assert_eq!(points, 60, "step {step_ms}: the chart keeps every sample");
        }
    }

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
