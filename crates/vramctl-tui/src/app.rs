//! The state of `top`, changed only by [`App::update`].
//!
//! `App` is thin: it holds what every part shares (the observation on screen, the terminal
//! size, the footer line, the help overlay) and routes each [`Event`] to the parts of the
//! state it concerns, each in its own file with its own `update`, as gitui's components
//! handle their own events:
//!
//! - [`process_table`]: rows, sort, filter, tree, selection, scroll, the detail pane;
//! - [`charts`]: the zoom, `top`'s own series and the older past loaded for them;
//! - [`transport`] (replay): the cursor, play and pause, speed, seeks;
//! - [`history_paging`] (live): asking the store for the charts' past;
//! - [`kill_flow`]: the kill dialog, from the key to the memory released.
//!
//! A part answers with a [`Reply`] (effects for the loop, a footer line, or "not my key"),
//! never reaches into another, and knows nothing of drawing; where a part needs the
//! screen's geometry (a page of rows, a click), the App gives it from
//! [`layout`](super::layout), which the view draws with too.
//!
//! `update` takes one [`Event`] and returns the [`Effect`]s the loop must carry out (ask
//! the action worker for a kill, the replay thread for a frame, the history loader for
//! older points, or quit). It never does I/O and never reads a clock: time is the
//! observations' time, and replay ticks count as [`TICK_MS`] each. So every transition is
//! tested by feeding events.

pub mod charts;
pub mod effect;
pub mod history_paging;
pub mod kill_flow;
pub mod process_table;
pub mod reclaim_flow;
pub mod transport;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ratatui::crossterm::event::{
    KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::layout::{Position, Rect};

use self::charts::{Charts, ChartsEvent};
pub use self::effect::{Effect, Reply};
use self::history_paging::{HistoryPaging, PagingEvent};
use self::kill_flow::{KillEvent, KillFlow};
use self::process_table::{Hosts, ProcessTable, TableEvent, rows_of};
use self::reclaim_flow::{ReclaimEvent, ReclaimFlow};
pub use self::transport::{SPEEDS, TICK_MS};
use self::transport::{Transport, TransportEvent};
use super::event::Event;
use super::kill::KillTarget;
use super::layout::{self, Areas};
use super::memory_series::{Point, SeriesKey};
use super::reclaim::ReclaimTarget;
use super::replay::ReplayFrame;
use super::table::Row;
use super::theme::Theme;
use vramctl_observe::gpu_holdings::holdings;
use vramctl_observe::gpu_selection::GpuFilter;
use vramctl_observe::observation::Observation;
use vramctl_observe::owners::{OwnerKey, OwnerTotal, totals};

/// The facts of no process, for a table without an observation.
static NO_HOSTS: Hosts = Hosts::new();

/// How `top` was started.
#[derive(Debug, Clone)]
pub struct AppConfig {
    /// Live (with its sampling interval) or replay.
    pub live_interval: Option<Duration>,
    /// `--readonly`: no actions.
    pub readonly: bool,
    /// Colours on.
    pub color: bool,
    /// UUIDs of the GPUs to show (`--gpu`); `None`: all.
    pub devices: Option<BTreeSet<String>>,
    /// A history source is wired for the charts' older past (live mode).
    pub history_source: bool,
    /// Where the charts' older past comes from, or why there is none (for the help).
    pub history_note: Option<String>,
    /// A leak/idle analysis feeds verdicts.
    pub analysis: bool,
    /// The zone times are shown in (`--tz`, `TZ`, the system's).
    pub time_zone: jiff::tz::TimeZone,
    /// `--by`: start with memory per owner instead of one row per process.
    pub by: Option<OwnerKey>,
}

impl Default for AppConfig {
    fn default() -> Self {
        Self {
            live_interval: Some(Duration::from_secs(1)),
            readonly: false,
            color: false,
            devices: None,
            history_source: false,
            history_note: None,
            analysis: false,
            time_zone: jiff::tz::TimeZone::UTC,
            by: None,
        }
    }
}

/// Live or replay, with the part of the state only that mode has.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// Sampling the GPUs now.
    Live {
        /// Sampling interval.
        interval: Duration,
        /// The charts' past from the history store.
        paging: HistoryPaging,
    },
    /// Browsing a recording.
    Replay(Transport),
}

/// Everything `top` shows and remembers.
#[derive(Debug, Clone)]
pub struct App {
    /// The zone times are shown in.
    pub time_zone: jiff::tz::TimeZone,
    /// Styles.
    pub theme: Theme,
    /// Live or replay.
    pub mode: Mode,
    /// Terminal size.
    pub size: (u16, u16),
    /// The observation on screen.
    pub latest: Option<Arc<Observation>>,
    /// The process table.
    pub table: ProcessTable,
    /// The charts.
    pub charts: Charts,
    /// The kill flow.
    pub kill: KillFlow,
    /// The reclaim key's flow.
    pub reclaim: ReclaimFlow,
    /// The help overlay is open.
    pub help: bool,
    /// A one-line message for the footer.
    pub message: Option<String>,
    /// The sampler stopped (live mode).
    pub sampler_error: Option<String>,
    /// Only these GPUs (UUIDs).
    pub devices: Option<BTreeSet<String>>,
    /// Where the charts' older past comes from, or why there is none (shown in the help).
    pub history_note: Option<String>,
    /// Verdicts come from an analysis.
    pub analysis: bool,
    /// Memory per owner (`o` cycles: user, container, pod, job, then processes again):
    /// the table shows `ps --by`'s rows (`vramctl_observe::owners::totals`).
    pub by: Option<OwnerKey>,
    /// Set once the user asked to leave.
    pub quit: bool,
}

impl App {
    /// A fresh state.
    pub fn new(config: AppConfig) -> Self {
        let mode = match config.live_interval {
            Some(interval) => Mode::Live {
                interval,
                paging: HistoryPaging::new(config.history_source),
            },
            None => Mode::Replay(Transport::default()),
        };
        let replay = matches!(mode, Mode::Replay(_));
        Self {
            theme: Theme::new(config.color),
            mode,
            size: (80, 24),
            latest: None,
            table: ProcessTable::default(),
            charts: Charts::default(),
            kill: KillFlow::new(config.readonly, replay),
            reclaim: ReclaimFlow::new(config.readonly, replay),
            help: false,
            message: None,
            sampler_error: None,
            devices: config.devices,
            history_note: config.history_note,
            analysis: config.analysis,
            by: config.by,
            time_zone: config.time_zone,
            quit: false,
        }
    }

    /// What to do first: a replay starts at the recording's first sample.
    pub fn start(&mut self) -> Vec<Effect> {
        match &mut self.mode {
            Mode::Replay(transport) => {
                let reply = transport.update(TransportEvent::Start);
                self.apply(reply)
            }
            Mode::Live { .. } => Vec::new(),
        }
    }

    /// Whether the loop should send [`Event::Tick`]s (a replay is playing).
    pub fn wants_ticks(&self) -> bool {
        matches!(&self.mode, Mode::Replay(t) if t.playing)
    }

    /// The time on screen: the observation's.
    pub fn now_ms(&self) -> Option<i64> {
        self.latest.as_ref().map(|o| o.taken_at_unix_ms())
    }

    /// Whether the UI is showing a recording.
    pub fn is_replay(&self) -> bool {
        matches!(self.mode, Mode::Replay(_))
    }

    /// `--readonly`: no actions.
    pub fn readonly(&self) -> bool {
        self.kill.readonly()
    }

    /// Whether a history source is wired (live): the charts reach back before `top`
    /// started.
    pub fn history_source(&self) -> bool {
        matches!(&self.mode, Mode::Live { paging, .. } if paging.wired())
    }

    /// The selected row.
    pub fn selected_row(&self) -> Option<&Row> {
        self.table.selected_row()
    }

    /// Whether a GPU (by its UUID) is shown.
    pub fn shows_device(&self, uuid: &str) -> bool {
        shows(self.devices.as_ref(), uuid)
    }

    /// Points of `key` over the zoom window ending at the observation on screen.
    pub fn chart_points(&self, key: &SeriesKey) -> Vec<Point> {
        self.now_ms()
            .map(|now| self.charts.points(key, now))
            .unwrap_or_default()
    }

    /// The selected process as a kill target, with its memory on every GPU.
    pub fn kill_target(&self) -> Option<KillTarget> {
        Some(kill_flow::target_of(
            self.selected_row()?,
            self.latest.as_ref()?,
        ))
    }

    /// The selected GPU process, for the reclaim key (`None` for a parent row).
    pub fn reclaim_target(&self) -> Option<ReclaimTarget> {
        let row = self.selected_row().filter(|r| r.holds_gpu())?;
        let obs = self.latest.as_ref()?;
        Some(ReclaimTarget {
            pid: row.key.pid,
            start_time_ticks: obs.hosts.get(&row.key.pid).and_then(|h| h.start_time_ticks),
            command: row.command.clone(),
        })
    }

    /// The layout for the app's terminal size.
    pub fn layout(&self) -> Areas {
        self.layout_in(Rect::new(0, 0, self.size.0, self.size.1))
    }

    /// The layout inside `screen`.
    pub fn layout_in(&self, screen: Rect) -> Areas {
        let lines = layout::device_lines(self.latest.as_deref(), self.devices.as_ref()).len();
        layout::areas(screen, lines, self.table.detail_shown())
    }

    /// The kill and cancel buttons of the confirmation on screen, for mouse clicks.
    pub fn dialog_buttons(&self) -> Option<(Rect, Rect)> {
        if !self.kill.confirming() {
            return None;
        }
        layout::dialog_buttons(Rect::new(0, 0, self.size.0, self.size.1))
    }

    /// Handles one event; returns what the loop must do.
    pub fn update(&mut self, event: Event) -> Vec<Effect> {
        let effects = match event {
            Event::Key(key) => self.on_key(key),
            Event::Mouse(mouse) => self.on_mouse(mouse),
            Event::Resize(w, h) => {
                self.size = (w, h);
                Vec::new()
            }
            Event::Tick => match &mut self.mode {
                Mode::Replay(transport) => {
                    let reply = transport.update(TransportEvent::Tick);
                    self.apply(reply)
                }
                Mode::Live { .. } => Vec::new(),
            },
            Event::Sample(obs) => self.on_sample(obs),
            Event::Terminate(_) => {
                self.quit = true;
                vec![Effect::Quit]
            }
            Event::SamplerStopped(reason) => {
                self.sampler_error = Some(reason);
                Vec::new()
            }
            Event::History(chunk) => {
                if !self.is_replay() {
                    self.charts.update(ChartsEvent::Loaded(chunk));
                    self.rebuild_rows();
                }
                Vec::new()
            }
            Event::Replay(frame) => self.on_replay_frame(*frame),
            Event::ReplayFailed(reason) => match &mut self.mode {
                Mode::Replay(transport) => {
                    let reply = transport.update(TransportEvent::Failed(reason));
                    self.apply(reply)
                }
                Mode::Live { .. } => Vec::new(),
            },
            Event::KillPlanned(result) => {
                let reply = self.kill.update(KillEvent::Planned(result));
                self.apply(reply)
            }
            Event::ReclaimFinished { target, outcome } => {
                let reply = self
                    .reclaim
                    .update(ReclaimEvent::Finished { target, outcome });
                self.apply(reply)
            }
            Event::KillFinished { plan, outcome } => {
                let reply = self.kill.update(KillEvent::Finished {
                    plan,
                    outcome,
                    latest: self.latest.as_deref(),
                });
                self.apply(reply)
            }
        };
        let height = self.layout().table_body_rows();
        let _ = self.table.update(TableEvent::Fit { height });
        effects
    }

    /// Puts a part's footer line on screen; its effects go to the loop.
    fn apply(&mut self, reply: Reply) -> Vec<Effect> {
        if let Some(message) = reply.message {
            self.message = Some(message);
        }
        reply.effects
    }

    // ----- observations -------------------------------------------------------------

    fn on_sample(&mut self, obs: Arc<Observation>) -> Vec<Effect> {
        let Mode::Live { .. } = self.mode else {
            return Vec::new();
        };
        self.sampler_error = None;
        self.observe(obs, true);
        let Some(obs) = self.latest.as_deref() else {
            return Vec::new();
        };
        let mut effects = match &mut self.mode {
            Mode::Live { paging, .. } => {
                paging
                    .update(PagingEvent::Sampled {
                        obs,
                        span_ms: self.charts.zoom.span_ms(),
                    })
                    .effects
            }
            Mode::Replay(_) => Vec::new(),
        };
        let reply = self.kill.update(KillEvent::Observed(obs));
        effects.extend(self.apply(reply));
        effects
    }

    /// Takes in an observation. `contiguous`: it follows the previous one (live, or a
    /// replay stepping forward), so activity and series continue.
    fn observe(&mut self, obs: Arc<Observation>, contiguous: bool) {
        self.charts.update(ChartsEvent::Observed {
            obs: &obs,
            contiguous,
        });
        self.latest = Some(obs);
        self.rebuild_rows();
    }

    fn rebuild_rows(&mut self) {
        let Some(obs) = self.latest.as_deref() else {
            return;
        };
        let now = obs.taken_at_unix_ms();
        let (charts, devices) = (&self.charts, self.devices.as_ref());
        let rows = rows_of(
            obs,
            |uuid| shows(devices, uuid),
            |key| charts.change_per_minute(key, now),
        );
        let _ = self.table.update(TableEvent::Rows {
            rows,
            hosts: &obs.hosts,
        });
    }

    /// The chart window changed: load what it now covers (a replay reloads the frame).
    fn window_changed(&mut self) -> Vec<Effect> {
        let now_ms = self.now_ms();
        let span_ms = self.charts.zoom.span_ms();
        let reply = match &mut self.mode {
            Mode::Replay(transport) => transport.update(TransportEvent::Reload { now_ms }),
            Mode::Live { paging, .. } => paging.update(PagingEvent::Zoomed {
                latest: self.latest.as_deref(),
                span_ms,
            }),
        };
        self.apply(reply)
    }

    // ----- replay -------------------------------------------------------------------

    fn on_replay_frame(&mut self, frame: ReplayFrame) -> Vec<Effect> {
        let now_ms = self.now_ms();
        let Mode::Replay(transport) = &mut self.mode else {
            return Vec::new();
        };
        let frame_ms = frame.observation.as_ref().map(|o| o.taken_at_unix_ms());
        let reply = transport.update(TransportEvent::Frame {
            seek: frame.seek,
            range: frame.range,
            frame_ms,
            now_ms,
        });
        let contiguous = transport.continues(frame.seek);
        let effects = self.apply(reply);
        let Some(obs) = frame.observation else {
            return effects;
        };
        self.charts.update(ChartsEvent::Loaded(frame.history));
        if now_ms == frame_ms {
            // The same moment again (a zoom): only the chart window changed.
            self.rebuild_rows();
        } else {
            self.observe(obs, contiguous);
        }
        effects
    }

    // ----- keys and mouse -----------------------------------------------------------

    fn on_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        if key.kind == KeyEventKind::Release {
            return Vec::new();
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c') {
            self.quit = true;
            return vec![Effect::Quit];
        }
        self.message = None;
        if self.help {
            if matches!(
                key.code,
                KeyCode::Char('?' | 'q') | KeyCode::Esc | KeyCode::F(1) | KeyCode::Enter
            ) {
                self.help = false;
            }
            return Vec::new();
        }
        if self.kill.shown() {
            let reply = self.kill.update(KillEvent::Key(key));
            return self.apply(reply);
        }
        // While the filter is typed, every key is its text: the table takes it first.
        if !self.table.filter_editing {
            if let Mode::Replay(transport) = &mut self.mode {
                let now_ms = self.latest.as_ref().map(|o| o.taken_at_unix_ms());
                let reply = transport.update(TransportEvent::Key {
                    code: key.code,
                    now_ms,
                });
                if !reply.ignored {
                    return self.apply(reply);
                }
            }
        }
        let page = self.layout().table_body_rows();
        let hosts = self.latest.as_ref().map_or(&NO_HOSTS, |o| &o.hosts);
        let reply = self.table.update(TableEvent::Key { key, page, hosts });
        if !reply.ignored {
            return self.apply(reply);
        }
        match key.code {
            KeyCode::Char('q') => {
                self.quit = true;
                vec![Effect::Quit]
            }
            KeyCode::Char('?') | KeyCode::F(1) => {
                self.help = true;
                Vec::new()
            }
            KeyCode::Char('z') => {
                self.charts.update(ChartsEvent::ZoomIn);
                self.window_changed()
            }
            KeyCode::Char('Z') => {
                self.charts.update(ChartsEvent::ZoomOut);
                self.window_changed()
            }
            KeyCode::Char('o') => {
                self.by = next_grouping(self.by);
                self.message = Some(match self.by {
                    Some(key) => format!("memory per {} (o: next grouping)", key.as_str()),
                    None => "one row per process".to_owned(),
                });
                Vec::new()
            }
            // A grouped table shows no process: a kill or a reclaim would reach one the user
            // cannot see selected.
            KeyCode::Char('R' | 'K') | KeyCode::Delete | KeyCode::F(9) if self.by.is_some() => {
                self.message = Some(
                    "the table is grouped: press o until processes show, then pick one".to_owned(),
                );
                Vec::new()
            }
            // A host PID that nothing here maps may be any process's number in this PID
            // namespace: a signal or a reclaim request would reach that one.
            KeyCode::Char('R' | 'K') | KeyCode::Delete | KeyCode::F(9)
                if self.selected_row().is_some_and(|r| r.flags.host_pid) =>
            {
                self.message = Some(
                    "a host PID that cannot be mapped here: kill or reclaim it from the host"
                        .to_owned(),
                );
                Vec::new()
            }
            KeyCode::Char('R') => {
                let target = self.reclaim_target();
                let reply = self.reclaim.update(ReclaimEvent::Ask(target));
                self.apply(reply)
            }
            KeyCode::Char('K') | KeyCode::Delete | KeyCode::F(9) => {
                let target = self.kill_target();
                let reply = self.kill.update(KillEvent::Ask(target));
                self.apply(reply)
            }
            _ => Vec::new(),
        }
    }

    fn on_mouse(&mut self, mouse: MouseEvent) -> Vec<Effect> {
        let at = Position::new(mouse.column, mouse.row);
        let reply = match mouse.kind {
            MouseEventKind::ScrollDown if !self.kill.shown() && !self.help => {
                self.table.update(TableEvent::Wheel(1))
            }
            MouseEventKind::ScrollUp if !self.kill.shown() && !self.help => {
                self.table.update(TableEvent::Wheel(-1))
            }
            MouseEventKind::Down(MouseButton::Left) => {
                if self.help {
                    self.help = false;
                    return Vec::new();
                }
                if self.kill.shown() {
                    let buttons = self.dialog_buttons();
                    self.kill.update(KillEvent::Click { at, buttons })
                } else if let Some(area) = self.layout().table {
                    let hosts = self.latest.as_ref().map_or(&NO_HOSTS, |o| &o.hosts);
                    self.table.update(TableEvent::Click { area, at, hosts })
                } else {
                    Reply::done()
                }
            }
            _ => Reply::done(),
        };
        self.apply(reply)
    }
}

/// The grouping after `by` in the order `o` cycles: processes, then each key of
/// [`OwnerKey::ALL`].
pub fn next_grouping(by: Option<OwnerKey>) -> Option<OwnerKey> {
    match by {
        None => OwnerKey::ALL.first().copied(),
        Some(key) => OwnerKey::ALL
            .iter()
            .skip_while(|k| **k != key)
            .nth(1)
            .copied(),
    }
}

/// Each shown GPU's memory per owner under `key` in `observation`: the one grouping of
/// `ps --by` and `status --by` (`vramctl_observe::owners::totals`), on the GPUs `--gpu`
/// chose.
pub fn owner_totals(
    key: OwnerKey,
    observation: &Observation,
    devices: Option<&BTreeSet<String>>,
) -> Vec<OwnerTotal> {
    let held = holdings(&observation.snapshot, &GpuFilter::default());
    totals(key, &held, &observation.hosts)
        .into_iter()
        .filter(|t| shows(devices, &t.uuid))
        .collect()
}

/// Whether `devices` (the `--gpu` choice; `None`: all) shows the GPU `uuid`.
fn shows(devices: Option<&BTreeSet<String>>, uuid: &str) -> bool {
    devices.is_none_or(|d| d.contains(uuid))
}

#[cfg(test)]
mod tests {
    use ratatui::crossterm::event::{KeyEventState, MouseEvent};
    use vramctl_core::types::{DeviceState, ProcessActivity};
    use vramctl_leaks::analysis::IdleState;

    use super::kill_flow::{KillDialog, KillResult, VERIFY_SAMPLES};
    use super::*;
    use crate::fixtures::{GIB, MIB, T0_MS, gpu, host, obs};
    use crate::kill::{KillOutcome, Killer, READONLY_REASON};
    use crate::memory_series::{HistoryChunk, Zoom};
    use crate::replay::{MemoryReplay, Seek, seek_frame};
    use crate::table::{self, Column, Idle};
    use crate::view;
    use vramctl_observe::verdict::{ProcessVerdict, VerdictKind};

    fn key(code: KeyCode) -> Event {
        Event::Key(KeyEvent {
            code,
            modifiers: KeyModifiers::NONE,
            kind: KeyEventKind::Press,
            state: KeyEventState::NONE,
        })
    }

    fn chars(app: &mut App, text: &str) -> Vec<Effect> {
        text.chars()
            .flat_map(|c| app.update(key(KeyCode::Char(c))))
            .collect()
    }

    fn click(column: u16, row: u16) -> Event {
        Event::Mouse(MouseEvent {
            kind: MouseEventKind::Down(MouseButton::Left),
            column,
            row,
            modifiers: KeyModifiers::NONE,
        })
    }

    fn live() -> App {
        let mut app = App::new(AppConfig::default());
        app.update(Event::Resize(120, 40));
        app
    }

    /// Three processes on GPU 0: 101 (alice), 202 (bob), 303 (alice, child of 202).
    fn sample(t_s: i64, mem: [u64; 3]) -> Event {
        Event::Sample(obs(
            t_s,
            vec![gpu(
                0,
                140 * GIB,
                mem.iter().sum(),
                &[(101, mem[0]), (202, mem[1]), (303, mem[2])],
            )],
            vec![
                host(101, 1, "alice", "python train.py"),
                host(202, 1, "bob", "vllm serve"),
                host(303, 202, "alice", "vllm worker"),
            ],
        ))
    }

    fn order(app: &App) -> Vec<u32> {
        app.table.rows.iter().map(|r| r.key.pid).collect()
    }

    #[test]
    fn a_termination_signal_quits() {
        let mut app = live();
        assert_eq!(app.update(Event::Terminate(15)), [Effect::Quit]);
        assert!(app.quit);
    }

    #[test]
    fn rows_sorted_by_memory_and_selection_starts_at_the_top() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        assert_eq!(order(&app), [101, 202, 303]);
        assert_eq!(app.selected_row().map(|r| r.key.pid), Some(101));
    }

    #[test]
    fn selection_stays_on_the_same_pid_across_refreshes() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        app.update(key(KeyCode::Down));
        assert_eq!(app.selected_row().map(|r| r.key.pid), Some(202));
        // 202 grows to the top: the selection follows it.
        app.update(sample(1, [3 * GIB, 5 * GIB, GIB]));
        assert_eq!(order(&app), [202, 101, 303]);
        assert_eq!(app.selected_row().map(|r| r.key.pid), Some(202));
        // 202 exits: the selection stays at its place.
        let gone = obs(
            2,
            vec![gpu(0, 140 * GIB, 4 * GIB, &[(101, 3 * GIB), (303, GIB)])],
            vec![],
        );
        app.update(Event::Sample(gone));
        assert_eq!(app.selected_row().map(|r| r.key.pid), Some(101));
    }

    #[test]
    fn sort_keys_cycle_reverse_and_header_clicks() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        app.update(key(KeyCode::Char('s')));
        assert_eq!(app.table.view.sort, Column::Delta);
        app.update(key(KeyCode::Char('S')));
        app.update(key(KeyCode::Char('S')));
        assert_eq!(app.table.view.sort, Column::Gpu);
        app.update(key(KeyCode::Char('S')));
        app.update(key(KeyCode::Char('S')));
        assert_eq!(app.table.view.sort, Column::Pid);
        assert!(!app.table.view.descending);
        assert_eq!(order(&app), [101, 202, 303]);
        app.update(key(KeyCode::Char('r')));
        assert_eq!(order(&app), [303, 202, 101]);
        // A click on the USER header sorts by user; a second click reverses.
        let table = app.layout().table.unwrap();
        let (_, x, _) = table::column_spans(table.width, false)[1];
        app.update(click(table.x + x + 1, table.y));
        assert_eq!(app.table.view.sort, Column::User);
        assert_eq!(order(&app), [101, 303, 202]);
        app.update(click(table.x + x + 1, table.y));
        assert_eq!(order(&app), [202, 101, 303]);
    }

    #[test]
    fn clicking_a_row_selects_it_and_the_wheel_moves() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        let table = app.layout().table.unwrap();
        app.update(click(table.x + 3, table.y + 3));
        assert_eq!(app.selected_row().map(|r| r.key.pid), Some(303));
        app.update(Event::Mouse(MouseEvent {
            kind: MouseEventKind::ScrollUp,
            column: 0,
            row: 0,
            modifiers: KeyModifiers::NONE,
        }));
        assert_eq!(app.selected_row().map(|r| r.key.pid), Some(202));
        // Below the last row: nothing changes.
        app.update(click(table.x + 3, table.y + 10));
        assert_eq!(app.selected_row().map(|r| r.key.pid), Some(202));
    }

    #[test]
    fn filter_is_typed_applied_and_cleared() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        app.update(key(KeyCode::Char('/')));
        assert!(app.table.filter_editing);
        // While typing, letters are text, not commands ('q' does not quit).
        assert!(chars(&mut app, "vllq").is_empty());
        assert!(!app.quit);
        app.update(key(KeyCode::Backspace));
        assert_eq!(app.table.view.filter, "vll");
        assert_eq!(order(&app), [202, 303]);
        app.update(key(KeyCode::Enter));
        assert!(!app.table.filter_editing);
        assert_eq!(order(&app), [202, 303]);
        app.update(key(KeyCode::Esc));
        assert_eq!(order(&app), [101, 202, 303]);
    }

    #[test]
    fn tree_view_nests_children() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        app.update(key(KeyCode::Char('t')));
        let lines: Vec<String> = app
            .table
            .rows
            .iter()
            .map(|r| format!("{}{}", r.tree_prefix, r.key.pid))
            .collect();
        assert_eq!(lines, ["101", "202", "└─ 303"]);
    }

    #[test]
    fn zoom_changes_the_chart_window() {
        let mut app = live();
        assert_eq!(app.charts.zoom, Zoom::FiveMinutes);
        app.update(key(KeyCode::Char('z')));
        app.update(key(KeyCode::Char('z')));
        assert_eq!(app.charts.zoom, Zoom::Minute);
        for _ in 0..10 {
            app.update(key(KeyCode::Char('Z')));
        }
        assert_eq!(app.charts.zoom, Zoom::Day);
        // The window follows the zoom: a sample 2 minutes old is in 5m, not in 1m.
        app.update(sample(0, [GIB, GIB, GIB]));
        app.update(sample(120, [GIB, GIB, GIB]));
        let key0 = SeriesKey::Device(gpu(0, 1, 0, &[]).info.uuid.clone());
        // Day → 6h → 1h → 15m → 5m.
        for _ in 0..4 {
            app.update(key(KeyCode::Char('z')));
        }
        assert_eq!(app.charts.zoom, Zoom::FiveMinutes);
        assert_eq!(app.chart_points(&key0).len(), 2);
        app.update(key(KeyCode::Char('z')));
        assert_eq!(app.chart_points(&key0).len(), 1);
    }

    #[test]
    fn change_per_minute_comes_from_own_samples() {
        let mut app = live();
        for t in 0..=6 {
            let m = u64::try_from(t).unwrap() * 10 * MIB;
            app.update(sample(t * 10, [GIB + m, 2 * GIB, GIB]));
        }
        let row = app.table.rows.iter().find(|r| r.key.pid == 101).unwrap();
        assert_eq!(row.delta_per_min, Some(i64::try_from(60 * MIB).unwrap()));
        let row = app.table.rows.iter().find(|r| r.key.pid == 202).unwrap();
        assert_eq!(row.delta_per_min, Some(0));
    }

    #[test]
    fn idle_is_the_analysis_evidence_and_no_activity_report_is_not_idle() {
        use vramctl_observe::verdict::{AnalysisJudge, Judge};
        let mut app = live();
        let mut judge = AnalysisJudge::new(vramctl_leaks::analysis::LeakConfig::default()).unwrap();
        // Two processes on a shared, busy GPU; the driver's per-process list (as NVML's is
        // on an H200) names neither of them: that is no evidence that they are idle.
        let mut with_activity = |t: i64, active: &[u32]| {
            let mut device = gpu(0, 140 * GIB, 3 * GIB, &[(101, GIB), (202, GIB)]);
            if let DeviceState::Ok(r) = &mut device.state {
                r.utilization_gpu_percent = Some(80);
                r.process_activity = Some(
                    active
                        .iter()
                        .map(|&pid| ProcessActivity {
                            pid,
                            sm_percent: 50,
                            memory_percent: 10,
                        })
                        .collect(),
                );
            }
            let mut o = (*obs(t, vec![device], vec![])).clone();
            o.verdicts = judge.judge(&o);
            Event::Sample(Arc::new(o))
        };
        for t in 0..=90 {
            app.update(with_activity(t, if t <= 30 { &[101] } else { &[] }));
        }
        let idle = |app: &App, pid| {
            app.table
                .rows
                .iter()
                .find(|r| r.key.pid == pid)
                .unwrap()
                .idle
        };
        // 101 was active until 30 s, then the list stopped naming it: the old column said
        // "idle 60s"; nothing shows idleness, so nothing is claimed (the analysis's
        // activity ended 60 s ago, beyond its 60 s evidence gap).
        assert_eq!(idle(&app, 101), None);
        // 202 was never named: the old column said "≥1m".
        assert_eq!(idle(&app, 202), None);
        // Active while the list names it.
        app.update(with_activity(91, &[202]));
        app.update(with_activity(92, &[202]));
        assert_eq!(idle(&app, 202), Some(Idle::Active));
        // Evidence of idleness (per-process samples at 0 %) gives the time since activity.
        let verdict = |state| ProcessVerdict {
            kind: VerdictKind::Stable,
            summary: String::new(),
            numbers: vec![],
            idle: Some(state),
        };
        let mut o = (*obs(
            200,
            vec![gpu(0, 140 * GIB, 3 * GIB, &[(101, GIB), (202, GIB)])],
            vec![],
        ))
        .clone();
        let uuid = o.snapshot.devices[0].info.uuid.clone();
        let now = o.taken_at_unix_ms();
        o.verdicts.insert(
            101,
            &uuid,
            verdict(IdleState::Idle {
                since_unix_ms: now - 90_000,
                activity_seen: true,
            }),
        );
        o.verdicts.insert(
            202,
            &uuid,
            verdict(IdleState::Idle {
                since_unix_ms: now - 180_000,
                activity_seen: false,
            }),
        );
        app.update(Event::Sample(Arc::new(o)));
        assert_eq!(idle(&app, 101), Some(Idle::For(90_000)));
        assert_eq!(idle(&app, 202), Some(Idle::AtLeast(180_000)));
    }

    #[test]
    fn flags_show_only_what_is_known() {
        let mut app = live();
        let mut o = (*obs(
            0,
            vec![gpu(
                0,
                140 * GIB,
                3 * GIB,
                &[(101, GIB), (202, GIB), (303, GIB)],
            )],
            vec![host(101, 1, "alice", "a"), {
                let mut z = host(202, 1, "bob", "b");
                z.state = Some('Z');
                z
            }],
        ))
        .clone();
        o.driver_names.insert(303, "python hidden.py".into());
        app.update(Event::Sample(Arc::new(o)));
        let flags = |pid| {
            app.table
                .rows
                .iter()
                .find(|r| r.key.pid == pid)
                .unwrap()
                .flags
                .text()
        };
        assert_eq!(flags(101), "");
        assert_eq!(flags(202), "Z");
        assert_eq!(flags(303), "H");
        let hidden = app.table.rows.iter().find(|r| r.key.pid == 303).unwrap();
        assert_eq!(hidden.command, "python hidden.py");
        assert_eq!(hidden.user, None);
    }

    #[test]
    fn leak_flag_comes_from_the_verdict_seam() {
        let mut app = live();
        let mut o = (*obs(
            0,
            vec![gpu(0, 140 * GIB, 2 * GIB, &[(101, GIB), (202, GIB)])],
            vec![host(101, 1, "alice", "a"), host(202, 1, "bob", "b")],
        ))
        .clone();
        let uuid = o.snapshot.devices[0].info.uuid.clone();
        for (pid, kind) in [(101, VerdictKind::Leak), (202, VerdictKind::IdleHolder)] {
            o.verdicts.insert(
                pid,
                &uuid,
                ProcessVerdict {
                    kind,
                    summary: String::new(),
                    numbers: vec![],
                    idle: None,
                },
            );
        }
        app.update(Event::Sample(Arc::new(o)));
        let flags = |pid| {
            app.table
                .rows
                .iter()
                .find(|r| r.key.pid == pid)
                .unwrap()
                .flags
                .text()
        };
        assert_eq!(flags(101), "L");
        assert_eq!(flags(202), "I");
    }

    #[test]
    fn the_reclaim_key_asks_for_the_selected_process_and_the_footer_says_the_outcome() {
        use crate::reclaim::ReclaimOutcome;
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        let effects = app.update(key(KeyCode::Char('R')));
        let [Effect::Reclaim(target)] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        assert_eq!((target.pid, target.start_time_ticks), (101, Some(1010)));
        assert!(app.message.as_deref().unwrap().contains("reclaiming"));
        let target = target.clone();
        app.update(Event::ReclaimFinished {
            target,
            outcome: ReclaimOutcome::NoAgent("no agent answers".into()),
        });
        assert_eq!(
            app.message.as_deref(),
            Some("PID 101: cannot reclaim: no agent answers")
        );
    }

    #[test]
    fn kill_goes_plan_confirm_signal_verify_freed() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        let effects = app.update(key(KeyCode::Char('K')));
        let [Effect::Plan(target)] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        assert_eq!(target.pid, 101);
        assert_eq!(target.memory[0].used_bytes, Some(3 * GIB));
        assert_eq!(target.start_time_ticks, Some(1010));
        let plan = crate::kill::RecordingKiller::new(KillOutcome::AlreadyGone)
            .plan(target)
            .unwrap();
        app.update(Event::KillPlanned(Ok(plan.clone())));
        assert!(matches!(
            app.kill.dialog,
            Some(KillDialog::Confirm {
                kill_focused: false,
                ..
            })
        ));
        // Enter on the default button (cancel) does not kill.
        let mut cancelled = app.clone();
        assert!(cancelled.update(key(KeyCode::Enter)).is_empty());
        assert_eq!(cancelled.kill.dialog, None);
        assert_eq!(
            app.update(key(KeyCode::Char('y'))),
            [Effect::Kill(plan.clone())]
        );
        assert!(matches!(app.kill.dialog, Some(KillDialog::InProgress(_))));
        app.update(Event::KillFinished {
            plan,
            outcome: KillOutcome::Exited {
                escalated: false,
                after_ms: 120,
            },
        });
        assert!(matches!(
            app.kill.dialog,
            Some(KillDialog::Verifying { .. })
        ));
        // The driver still lists it for a sample, then not.
        app.update(sample(1, [3 * GIB, 2 * GIB, GIB]));
        assert!(matches!(
            app.kill.dialog,
            Some(KillDialog::Verifying { samples: 2, .. })
        ));
        let effects = app.update(Event::Sample(obs(
            2,
            vec![gpu(0, 140 * GIB, 3 * GIB, &[(202, 2 * GIB), (303, GIB)])],
            vec![],
        )));
        assert!(
            effects.iter().any(|e| matches!(
                e,
                Effect::MemoryOutcome {
                    freed_bytes: Some(b),
                    ..
                } if *b == 3 * GIB
            )),
            "{effects:?}"
        );
        let Some(KillDialog::Finished {
            result: KillResult::Freed { total_bytes, .. },
            ..
        }) = &app.kill.dialog
        else {
            panic!("{:?}", app.kill.dialog);
        };
        assert_eq!(*total_bytes, 3 * GIB);
        app.update(key(KeyCode::Char('x')));
        assert_eq!(app.kill.dialog, None);
    }

    #[test]
    fn kill_of_a_process_the_driver_keeps_listing() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        app.update(key(KeyCode::Char('K')));
        let plan = crate::kill::RecordingKiller::new(KillOutcome::AlreadyGone)
            .plan(&app.kill_target().unwrap())
            .unwrap();
        app.update(Event::KillPlanned(Ok(plan.clone())));
        app.update(key(KeyCode::Char('y')));
        app.update(Event::KillFinished {
            plan,
            outcome: KillOutcome::AlreadyGone,
        });
        for t in 1..=i64::from(VERIFY_SAMPLES) {
            app.update(sample(t, [3 * GIB, 2 * GIB, GIB]));
        }
        assert!(matches!(
            app.kill.dialog,
            Some(KillDialog::Finished {
                result: KillResult::StillListed,
                ..
            })
        ));
    }

    #[test]
    fn a_hidden_kill_reports_in_the_footer_and_blocks_another() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        app.update(key(KeyCode::Char('K')));
        let plan = crate::kill::RecordingKiller::new(KillOutcome::AlreadyGone)
            .plan(&app.kill_target().unwrap())
            .unwrap();
        app.update(Event::KillPlanned(Ok(plan.clone())));
        app.update(key(KeyCode::Char('y')));
        app.update(key(KeyCode::Esc));
        assert!(!app.kill.shown());
        // Keys work on the table again; a second kill waits for the first.
        app.update(key(KeyCode::Down));
        assert_eq!(app.selected_row().map(|r| r.key.pid), Some(202));
        assert!(app.update(key(KeyCode::Char('K'))).is_empty());
        assert!(
            app.message
                .as_deref()
                .unwrap()
                .contains("still in progress")
        );
        app.update(Event::KillFinished {
            plan,
            outcome: KillOutcome::Exited {
                escalated: true,
                after_ms: 10_000,
            },
        });
        let effects = app.update(Event::Sample(obs(
            1,
            vec![gpu(0, 140 * GIB, 3 * GIB, &[(202, 2 * GIB), (303, GIB)])],
            vec![],
        )));
        assert_eq!(effects.len(), 1, "{effects:?}");
        assert_eq!(app.kill.dialog, None);
        assert_eq!(
            app.message.as_deref(),
            Some("kill 101: exited (after SIGKILL); freed 3.0G (GPU 0 3.0G)")
        );
    }

    #[test]
    fn dialog_buttons_answer_clicks() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        app.update(key(KeyCode::Char('K')));
        let plan = crate::kill::RecordingKiller::new(KillOutcome::AlreadyGone)
            .plan(&app.kill_target().unwrap())
            .unwrap();
        app.update(Event::KillPlanned(Ok(plan.clone())));
        let (kill, cancel) = app.dialog_buttons().unwrap();
        let mut cancelled = app.clone();
        assert!(cancelled.update(click(cancel.x + 1, cancel.y)).is_empty());
        assert_eq!(cancelled.kill.dialog, None);
        // A click elsewhere does nothing; on the kill button it kills.
        assert!(app.update(click(0, 0)).is_empty());
        assert!(app.kill.shown());
        assert_eq!(app.update(click(kill.x + 1, kill.y)), [Effect::Kill(plan)]);
    }

    #[test]
    fn refusals_end_the_dialog_with_the_reason() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        app.update(key(KeyCode::Delete));
        app.update(Event::KillPlanned(Err("process 101 is not yours".into())));
        assert_eq!(
            app.kill.dialog.as_ref().map(|d| match d {
                KillDialog::Finished { result, .. } => result.text(),
                _ => String::new(),
            }),
            Some("refused: process 101 is not yours".to_owned())
        );
    }

    #[test]
    fn readonly_disables_kill_at_every_step() {
        let mut app = App::new(AppConfig {
            readonly: true,
            ..AppConfig::default()
        });
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        for code in [KeyCode::Char('K'), KeyCode::Delete, KeyCode::F(9)] {
            assert!(app.update(key(code)).is_empty());
            assert_eq!(app.kill.dialog, None);
            assert_eq!(app.message.as_deref(), Some(READONLY_REASON));
        }
        // A confirmation that somehow got there still does not produce a kill: the kill
        // flow's `a_confirmation_that_got_there_when_readonly_still_does_not_kill`.
    }

    #[test]
    fn history_is_asked_for_when_a_source_is_wired() {
        let mut app = App::new(AppConfig {
            history_source: true,
            ..AppConfig::default()
        });
        let effects = app.update(sample(600, [GIB, GIB, GIB]));
        let [Effect::LoadHistory(request)] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        // The window before top's first sample, for the GPU and its processes, each
        // process by identity.
        let first = T0_MS + 600_000;
        assert_eq!(request.to_ms, first);
        assert_eq!(request.from_ms, first - Zoom::FiveMinutes.span_ms());
        assert!(request.keys.len() >= 4, "GPU + 3 processes");
        assert_eq!(request.starts.get(&101), Some(&1010));
        // Not again as time passes: what top samples from then on is its own.
        assert!(app.update(sample(601, [GIB, GIB, GIB])).is_empty());
        assert!(app.update(sample(700, [GIB, GIB, GIB])).is_empty());
        // Zooming out reaches further back: asked once more, still up to the first sample.
        let effects = app.update(key(KeyCode::Char('Z')));
        let [Effect::LoadHistory(request)] = effects.as_slice() else {
            panic!("{effects:?}");
        };
        assert_eq!(request.to_ms, first);
        assert_eq!(
            request.from_ms,
            T0_MS + 700_000 - Zoom::FifteenMinutes.span_ms()
        );
        // Zooming back in needs nothing new.
        assert!(app.update(key(KeyCode::Char('z'))).is_empty());
        // A window that top's own samples cover needs nothing at all.
        let mut fresh = App::new(AppConfig {
            history_source: true,
            ..AppConfig::default()
        });
        fresh.update(key(KeyCode::Char('z')));
        assert_eq!(fresh.update(sample(0, [GIB, GIB, GIB])).len(), 1);
        assert!(fresh.update(sample(61, [GIB, GIB, GIB])).is_empty());
        // What the source sends fills the chart before top's own first sample.
        let key0 = SeriesKey::Device(gpu(0, 1, 0, &[]).info.uuid.clone());
        let mut chunk = HistoryChunk::default();
        chunk.series.insert(
            key0.clone(),
            vec![Point {
                t_ms: T0_MS + 500_000,
                bytes: 7,
            }],
        );
        app.update(Event::History(chunk));
        assert_eq!(app.chart_points(&key0).first().map(|p| p.bytes), Some(7));
        // Without a source: never.
        let mut plain = live();
        assert!(plain.update(sample(0, [GIB, GIB, GIB])).is_empty());
    }

    fn replay_app() -> (App, MemoryReplay) {
        let recording = MemoryReplay::new(
            (0..20)
                .map(|t| {
                    let m = u64::try_from(t).unwrap() * 100 * MIB;
                    let Event::Sample(o) = sample(t * 10, [GIB + m, GIB, GIB]) else {
                        unreachable!()
                    };
                    (*o).clone()
                })
                .collect(),
        );
        let mut app = App::new(AppConfig {
            live_interval: None,
            ..AppConfig::default()
        });
        app.update(Event::Resize(120, 40));
        (app, recording)
    }

    /// Carries out the app's seeks against `recording`, as the replay thread would.
    fn serve(app: &mut App, recording: &MemoryReplay, effects: Vec<Effect>) {
        for effect in effects {
            if let Effect::Seek(seek) = effect {
                let frame = seek_frame(recording, seek, app.charts.zoom.span_ms(), 100).unwrap();
                let more = app.update(Event::Replay(Box::new(frame)));
                serve(app, recording, more);
            }
        }
    }

    #[test]
    fn replay_steps_jumps_and_plays() {
        let (mut app, rec) = replay_app();
        let effects = app.start();
        assert_eq!(effects, [Effect::Seek(Seek::After(i64::MIN))]);
        serve(&mut app, &rec, effects);
        assert_eq!(app.now_ms(), Some(T0_MS));
        let e = app.update(key(KeyCode::Right));
        serve(&mut app, &rec, e);
        assert_eq!(app.now_ms(), Some(T0_MS + 10_000));
        let e = app.update(key(KeyCode::Char(']')));
        serve(&mut app, &rec, e);
        assert_eq!(app.now_ms(), Some(T0_MS + 70_000));
        let e = app.update(key(KeyCode::Left));
        serve(&mut app, &rec, e);
        assert_eq!(app.now_ms(), Some(T0_MS + 60_000));
        let e = app.update(key(KeyCode::Char('[')));
        serve(&mut app, &rec, e);
        assert_eq!(app.now_ms(), Some(T0_MS));
        // The charts carry the recording's past: 90 s in, the 5-minute window has 10 points.
        let e = app.update(key(KeyCode::Char('e')));
        serve(&mut app, &rec, e);
        assert_eq!(app.now_ms(), Some(T0_MS + 190_000));
        let key101 = SeriesKey::Process {
            uuid: gpu(0, 1, 0, &[]).info.uuid.clone(),
            pid: 101,
        };
        assert_eq!(app.chart_points(&key101).len(), 20);
        let row = app.table.rows.iter().find(|r| r.key.pid == 101).unwrap();
        assert_eq!(row.delta_per_min, Some(i64::try_from(600 * MIB).unwrap()));
        // Zooming out reloads the frame with the wider window.
        app.update(key(KeyCode::Char('z')));
        let e = app.update(key(KeyCode::Char('z')));
        assert_eq!(e, [Effect::Seek(Seek::AtOrBefore(T0_MS + 190_000))]);
        serve(&mut app, &rec, e);
        assert_eq!(
            app.chart_points(&key101).len(),
            7,
            "the last minute: 130..190 s"
        );
        let e = app.update(key(KeyCode::Char('Z')));
        serve(&mut app, &rec, e);
        let e = app.update(key(KeyCode::Char('Z')));
        serve(&mut app, &rec, e);
        assert_eq!(app.chart_points(&key101).len(), 20);
        // Past the end: a message, the frame stays.
        let e = app.update(key(KeyCode::Right));
        serve(&mut app, &rec, e);
        assert_eq!(app.message.as_deref(), Some("end of the recording"));
        assert_eq!(app.now_ms(), Some(T0_MS + 190_000));

        // Play at 10x from the start: each tick is 2 recorded seconds.
        let e = app.update(key(KeyCode::Char('b')));
        serve(&mut app, &rec, e);
        for _ in 0..3 {
            app.update(key(KeyCode::Char('+')));
        }
        let Mode::Replay(r) = &app.mode else { panic!() };
        assert_eq!(r.speed(), 10);
        app.update(key(KeyCode::Char(' ')));
        assert!(app.wants_ticks());
        for _ in 0..5 {
            let e = app.update(Event::Tick);
            serve(&mut app, &rec, e);
        }
        assert_eq!(app.now_ms(), Some(T0_MS + 10_000));
        for _ in 0..200 {
            let e = app.update(Event::Tick);
            serve(&mut app, &rec, e);
        }
        assert!(!app.wants_ticks(), "stops at the end");
        assert_eq!(app.now_ms(), Some(T0_MS + 190_000));
        // Live samples are ignored in replay, and so is kill.
        app.update(sample(5000, [GIB, GIB, GIB]));
        assert_eq!(app.now_ms(), Some(T0_MS + 190_000));
        assert!(app.update(key(KeyCode::Char('K'))).is_empty());
        assert!(app.message.as_deref().unwrap_or("").contains("replaying"));
    }

    #[test]
    fn no_key_panics_in_any_state() {
        let mut codes = vec![
            KeyCode::Backspace,
            KeyCode::Enter,
            KeyCode::Left,
            KeyCode::Right,
            KeyCode::Up,
            KeyCode::Down,
            KeyCode::Home,
            KeyCode::End,
            KeyCode::PageUp,
            KeyCode::PageDown,
            KeyCode::Tab,
            KeyCode::BackTab,
            KeyCode::Delete,
            KeyCode::Insert,
            KeyCode::Null,
            KeyCode::Esc,
        ];
        codes.extend((1..=12).map(KeyCode::F));
        codes.extend((' '..='~').map(KeyCode::Char));
        codes.extend(['é', 'Δ', '█'].map(KeyCode::Char));
        for (w, h) in [(120, 40), (80, 24), (40, 10), (0, 0)] {
            for replay in [false, true] {
                let (mut app, rec) = replay_app();
                if !replay {
                    app = live();
                    app.update(sample(0, [GIB, GIB, GIB]));
                } else {
                    let e = app.start();
                    serve(&mut app, &rec, e);
                }
                app.update(Event::Resize(w, h));
                for &first in &codes {
                    for &second in &[KeyCode::Char('K'), KeyCode::Char('/'), KeyCode::Char('?')] {
                        let mut a = app.clone();
                        for code in [second, first, KeyCode::Down, first] {
                            let e = a.update(key(code));
                            if replay {
                                serve(&mut a, &rec, e);
                            }
                        }
                        a.update(click(5, 5));
                        a.update(click(0, 0));
                        let mut buf = ratatui::buffer::Buffer::empty(Rect::new(0, 0, w, h));
                        view::draw(&a, buf.area, &mut buf);
                    }
                }
            }
        }
    }
}
