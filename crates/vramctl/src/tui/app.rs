//! The state of `top`, changed only by [`App::update`].
//!
//! `update` takes one [`Event`] and returns the [`Effect`]s the loop must carry out (ask the
//! action worker for a kill, the replay thread for a frame, the history loader for older
//! points, or quit). It never does I/O and never reads a clock: time is the observations'
//! time, and replay ticks count as [`TICK_MS`] each. So every transition is tested by
//! feeding events.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ratatui::crossterm::event::{
    KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::layout::{Position, Rect};
use vramctl_core::analysis::IdleState;

use super::event::{Event, HistoryRequest};
use super::kill::{GpuMemory, KillOutcome, KillPlan, KillTarget, READONLY_REASON};
use super::memory_series::{
    HistoryChunk, Point, SeriesKey, SeriesSet, Starts, Zoom, change_per_minute, joined,
};
use super::observe::Observation;
use super::replay::{ReplayFrame, Seek};
use super::table::{self, Column, Flags, Idle, Row, RowKey, TableView};
use super::theme::Theme;
use super::verdict::{ProcessVerdict, VerdictKind};
use super::view;

/// Time a [`Event::Tick`] stands for while a replay plays.
pub const TICK_MS: i64 = 200;
/// Replay speeds, in recorded seconds per second.
pub const SPEEDS: [u32; 8] = [1, 2, 5, 10, 30, 60, 300, 600];
/// Samples to wait, after a process exited, for the driver to stop listing it.
pub const VERIFY_SAMPLES: u32 = 5;

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
        }
    }
}

/// Something the loop must do for the state.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Leave.
    Quit,
    /// Check this kill target (action worker).
    Plan(KillTarget),
    /// Carry out this kill (action worker).
    Kill(KillPlan),
    /// Tell the killer (for its audit record) whether the memory was released:
    /// `Some(bytes)` freed, `None` still listed by the driver (action worker).
    MemoryOutcome {
        /// The kill.
        plan: KillPlan,
        /// Bytes the process held that the driver no longer lists.
        freed_bytes: Option<u64>,
    },
    /// Move the replay cursor (replay thread).
    Seek(Seek),
    /// Load older history (history loader).
    LoadHistory(HistoryRequest),
}

/// The replay cursor and player.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayState {
    /// The recording's first and last sample times.
    pub range: Option<(i64, i64)>,
    /// Playing forward.
    pub playing: bool,
    /// Index into [`SPEEDS`].
    pub speed: usize,
    /// Where the player is (between samples).
    pub play_ms: Option<i64>,
    /// A seek is outstanding.
    pub waiting: bool,
}

impl ReplayState {
    /// Recorded seconds per second.
    pub fn speed(&self) -> u32 {
        SPEEDS[self.speed.min(SPEEDS.len() - 1)]
    }
}

/// Live or replay.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// Sampling the GPUs now.
    Live {
        /// Sampling interval.
        interval: Duration,
    },
    /// Browsing a recording.
    Replay(ReplayState),
}

/// What became of a kill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillResult {
    /// It exited and the driver no longer lists it: this memory was released.
    Freed {
        /// Per GPU, as held just before.
        per_gpu: Vec<GpuMemory>,
        /// Sum of what is known.
        total_bytes: u64,
        /// Whether it took `SIGKILL`.
        escalated: bool,
    },
    /// It exited, but the driver still lists it after [`VERIFY_SAMPLES`] samples.
    StillListed,
    /// Still running.
    StillRunning {
        /// Whether `SIGKILL` was sent.
        escalated: bool,
        /// Its state letter.
        state: Option<char>,
    },
    /// Refused, with the reason.
    Refused(String),
    /// The signal could not be sent.
    Failed(String),
}

/// The kill dialog, from the key press to the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillDialog {
    /// The worker checks the target.
    Planning(KillTarget),
    /// Waiting for the user to confirm.
    Confirm {
        /// What will be done.
        plan: KillPlan,
        /// The focus is on the kill button (the cancel button is the default).
        kill_focused: bool,
    },
    /// Signalled, waiting for it to exit.
    InProgress(KillPlan),
    /// Exited; waiting for the driver to stop listing it.
    Verifying {
        /// The plan.
        plan: KillPlan,
        /// Whether it took `SIGKILL`.
        escalated: bool,
        /// Samples seen since.
        samples: u32,
    },
    /// Done.
    Finished {
        /// The target.
        target: KillTarget,
        /// What happened.
        result: KillResult,
    },
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
    /// No actions.
    pub readonly: bool,
    /// Terminal size.
    pub size: (u16, u16),
    /// The observation on screen.
    pub latest: Option<Arc<Observation>>,
    /// What `top` sampled itself.
    pub series: SeriesSet,
    /// Older history (store or recording).
    pub loaded: Option<HistoryChunk>,
    /// Who each PID on screen is (start time), to match loaded history by identity.
    starts: Starts,
    base_rows: Vec<Row>,
    /// The rows shown, in order.
    pub rows: Vec<Row>,
    /// Sort, filter, tree.
    pub view: TableView,
    /// The filter text is being typed.
    pub filter_editing: bool,
    /// The selected row.
    pub selected: Option<RowKey>,
    selected_pos: usize,
    /// First row shown.
    pub scroll: usize,
    /// Chart span.
    pub zoom: Zoom,
    /// The detail pane of the selected process is open.
    pub detail: bool,
    /// The help overlay is open.
    pub help: bool,
    /// The kill dialog.
    pub dialog: Option<KillDialog>,
    /// The dialog of a kill in flight was put away (`Esc`); its result goes to the footer.
    pub dialog_hidden: bool,
    /// A one-line message for the footer.
    pub message: Option<String>,
    /// The sampler stopped (live mode).
    pub sampler_error: Option<String>,
    /// Only these GPUs (UUIDs).
    pub devices: Option<BTreeSet<String>>,
    /// The history store is wired (live): the charts reach back before `top` started.
    pub history_source: bool,
    /// Where the charts' older past comes from, or why there is none (shown in the help).
    pub history_note: Option<String>,
    /// Verdicts come from an analysis.
    pub analysis: bool,
    /// Time of the first sample `top` took (live): older history is asked for up to it.
    first_sample_ms: Option<i64>,
    /// How far back the history asked for reaches (live).
    history_from_ms: Option<i64>,
    /// Set once the user asked to leave.
    pub quit: bool,
}

impl App {
    /// A fresh state.
    pub fn new(config: AppConfig) -> Self {
        let mode = match config.live_interval {
            Some(interval) => Mode::Live { interval },
            None => Mode::Replay(ReplayState {
                range: None,
                playing: false,
                speed: 0,
                play_ms: None,
                waiting: false,
            }),
        };
        Self {
            theme: Theme::new(config.color),
            mode,
            readonly: config.readonly,
            size: (80, 24),
            latest: None,
            series: SeriesSet::default(),
            loaded: None,
            starts: Starts::new(),
            base_rows: Vec::new(),
            rows: Vec::new(),
            view: TableView::default(),
            filter_editing: false,
            selected: None,
            selected_pos: 0,
            scroll: 0,
            zoom: Zoom::FiveMinutes,
            detail: false,
            help: false,
            dialog: None,
            dialog_hidden: false,
            message: None,
            sampler_error: None,
            devices: config.devices,
            history_source: config.history_source,
            history_note: config.history_note,
            analysis: config.analysis,
            time_zone: config.time_zone,
            first_sample_ms: None,
            history_from_ms: None,
            quit: false,
        }
    }

    /// What to do first: a replay starts at the recording's first sample.
    pub fn start(&mut self) -> Vec<Effect> {
        match &mut self.mode {
            Mode::Replay(r) => {
                r.waiting = true;
                vec![Effect::Seek(Seek::After(i64::MIN))]
            }
            Mode::Live { .. } => Vec::new(),
        }
    }

    /// Whether the loop should send [`Event::Tick`]s (a replay is playing).
    pub fn wants_ticks(&self) -> bool {
        matches!(&self.mode, Mode::Replay(r) if r.playing)
    }

    /// The time on screen: the observation's.
    pub fn now_ms(&self) -> Option<i64> {
        self.latest.as_ref().map(|o| o.taken_at_unix_ms())
    }

    /// Whether the UI is showing a recording.
    pub fn is_replay(&self) -> bool {
        matches!(self.mode, Mode::Replay(_))
    }

    /// Index of the selected row in [`App::rows`].
    pub fn selected_index(&self) -> Option<usize> {
        let key = self.selected.as_ref()?;
        self.rows.iter().position(|r| &r.key == key)
    }

    /// The selected row.
    pub fn selected_row(&self) -> Option<&Row> {
        self.selected_index().map(|i| &self.rows[i])
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
            Event::Tick => self.on_tick(),
            Event::Sample(obs) => {
                if self.is_replay() {
                    Vec::new()
                } else {
                    self.sampler_error = None;
                    self.first_sample_ms.get_or_insert(obs.taken_at_unix_ms());
                    self.observe(obs, true);
                    let mut effects = self.history_effects();
                    effects.extend(self.verify_kill());
                    effects
                }
            }
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
                    self.loaded = Some(chunk);
                    self.rebuild_rows();
                }
                Vec::new()
            }
            Event::Replay(frame) => self.on_replay_frame(*frame),
            Event::ReplayFailed(reason) => {
                if let Mode::Replay(r) = &mut self.mode {
                    r.waiting = false;
                    r.playing = false;
                }
                self.message = Some(format!("cannot read the recording: {reason}"));
                Vec::new()
            }
            Event::KillPlanned(result) => {
                self.on_kill_planned(result);
                Vec::new()
            }
            Event::KillFinished { plan, outcome } => self.on_kill_finished(plan, outcome),
        };
        self.keep_selection_visible();
        effects
    }

    // ----- observations -------------------------------------------------------------

    /// Takes in an observation. `contiguous`: it follows the previous one (live, or a
    /// replay stepping forward), so activity and series continue.
    fn observe(&mut self, obs: Arc<Observation>, contiguous: bool) {
        if !contiguous {
            self.series.clear();
        }
        self.series.record(&obs);
        self.starts = obs.starts();
        self.latest = Some(obs);
        self.rebuild_rows();
    }

    /// The IDLE column: what the analysis's idle evidence says (`IdleReport::state`, the
    /// reading `leaks`, `serve` and `reap` share). Without a verdict, or without evidence,
    /// nothing: a process NVML lists without per-process activity is not thereby idle.
    fn idle_of(verdict: Option<&ProcessVerdict>, now: i64) -> Option<Idle> {
        match verdict?.idle? {
            IdleState::Active => Some(Idle::Active),
            IdleState::Idle {
                since_unix_ms,
                activity_seen: true,
            } => Some(Idle::For(now.saturating_sub(since_unix_ms))),
            IdleState::Idle {
                since_unix_ms,
                activity_seen: false,
            } => Some(Idle::AtLeast(now.saturating_sub(since_unix_ms))),
            IdleState::NoEvidence | IdleState::Unknown => None,
        }
    }

    /// Points of `key` over the zoom window ending at the observation on screen.
    pub fn chart_points(&self, key: &SeriesKey) -> Vec<Point> {
        let Some(now) = self.now_ms() else {
            return Vec::new();
        };
        joined(
            self.series.get(key),
            self.loaded.as_ref(),
            &self.starts,
            key,
            now - self.zoom.span_ms(),
            now,
        )
    }

    /// Whether a GPU (by its UUID) is shown.
    pub fn shows_device(&self, uuid: &str) -> bool {
        self.devices.as_ref().is_none_or(|d| d.contains(uuid))
    }

    fn rebuild_rows(&mut self) {
        let Some(obs) = self.latest.clone() else {
            return;
        };
        let now = obs.taken_at_unix_ms();
        let mut rows = Vec::new();
        for device in &obs.snapshot.devices {
            let uuid = &device.info.uuid;
            if !self.shows_device(uuid) {
                continue;
            }
            let Some(reading) = device.reading() else {
                continue;
            };
            for p in reading.processes.iter().flatten() {
                let host = obs.hosts.get(&p.pid);
                let verdict = obs.verdicts.get(p.pid, uuid);
                let key = SeriesKey::Process {
                    uuid: uuid.clone(),
                    pid: p.pid,
                };
                let points = joined(
                    self.series.get(&key),
                    self.loaded.as_ref(),
                    &self.starts,
                    &key,
                    now - 60_000,
                    now,
                );
                let command = host.map(|h| h.command.clone()).unwrap_or_else(|| {
                    obs.driver_names
                        .get(&p.pid)
                        .cloned()
                        .unwrap_or_else(|| "(not visible in this PID namespace)".to_owned())
                });
                let gpu = match p.gpu_instance_id {
                    Some(gi) => format!("{}/g{gi}", device.info.index),
                    None => device.info.index.to_string(),
                };
                rows.push(Row {
                    key: RowKey {
                        pid: p.pid,
                        uuid: Some(uuid.clone()),
                    },
                    gpu,
                    gpu_index: Some(device.info.index),
                    user: host.and_then(|h| h.user.clone()),
                    used_bytes: p.used_bytes,
                    delta_per_min: change_per_minute(&points),
                    cpu_percent: host.and_then(|h| h.cpu_percent),
                    idle: Self::idle_of(verdict, now),
                    flags: Flags {
                        leak: verdict.is_some_and(|v| v.kind == VerdictKind::Leak),
                        idle_holder: verdict.is_some_and(|v| v.kind == VerdictKind::IdleHolder),
                        zombie: host.is_some_and(super::observe::HostProcess::is_zombie),
                        hidden: host.is_none(),
                    },
                    command,
                    tree_prefix: String::new(),
                });
            }
        }
        self.base_rows = rows;
        self.arrange();
    }

    /// Re-sorts and re-filters; the selection stays on its row, or its PID, or its place.
    fn arrange(&mut self) {
        let hosts = self
            .latest
            .as_ref()
            .map(|o| o.hosts.clone())
            .unwrap_or_default();
        self.rows = table::arrange(self.base_rows.clone(), &hosts, &self.view);
        let found = self.selected.as_ref().and_then(|key| {
            self.rows
                .iter()
                .position(|r| &r.key == key)
                .or_else(|| self.rows.iter().position(|r| r.key.pid == key.pid))
        });
        let index = match found {
            Some(i) => Some(i),
            None if self.rows.is_empty() => None,
            None => Some(self.selected_pos.min(self.rows.len() - 1)),
        };
        self.select_index(index);
    }

    fn select_index(&mut self, index: Option<usize>) {
        match index.and_then(|i| self.rows.get(i)) {
            Some(row) => {
                self.selected = Some(row.key.clone());
                self.selected_pos = index.unwrap_or(0);
            }
            None => self.selected = None,
        }
    }

    fn move_selection(&mut self, delta: isize) {
        if self.rows.is_empty() {
            return;
        }
        let current = self.selected_index().unwrap_or(0);
        let last = self.rows.len() - 1;
        let next = current.saturating_add_signed(delta).min(last);
        self.select_index(Some(next));
    }

    fn keep_selection_visible(&mut self) {
        let height = view::layout(self).table_body_rows();
        let Some(i) = self.selected_index() else {
            self.scroll = 0;
            return;
        };
        if height == 0 {
            return;
        }
        if i < self.scroll {
            self.scroll = i;
        } else if i >= self.scroll + height {
            self.scroll = i + 1 - height;
        }
        let max_scroll = self.rows.len().saturating_sub(height);
        self.scroll = self.scroll.min(max_scroll);
    }

    /// The chart window changed: load what it now covers (a replay reloads the frame).
    fn zoom_effects(&mut self) -> Vec<Effect> {
        let now = self.now_ms();
        match (&mut self.mode, now) {
            (Mode::Replay(r), Some(now)) => {
                r.waiting = true;
                vec![Effect::Seek(Seek::AtOrBefore(now))]
            }
            (Mode::Replay(_), None) => Vec::new(),
            (Mode::Live { .. }, _) => self.history_effects(),
        }
    }

    /// Asks the history source for what the chart window needs from before `top`'s first
    /// sample, once: again only when a zoom reaches further back (what `top` samples from
    /// then on is its own).
    fn history_effects(&mut self) -> Vec<Effect> {
        if !self.history_source {
            return Vec::new();
        }
        let (Some(obs), Some(first)) = (&self.latest, self.first_sample_ms) else {
            return Vec::new();
        };
        let from = obs.taken_at_unix_ms() - self.zoom.span_ms();
        if from >= first || self.history_from_ms.is_some_and(|f| f <= from) {
            return Vec::new();
        }
        self.history_from_ms = Some(from);
        vec![Effect::LoadHistory(HistoryRequest {
            keys: super::replay::keys_of(obs),
            starts: obs.starts(),
            from_ms: from,
            to_ms: first,
            max_points: 512,
        })]
    }

    // ----- replay -------------------------------------------------------------------

    fn on_replay_frame(&mut self, frame: ReplayFrame) -> Vec<Effect> {
        let now = self.now_ms();
        let had_frame = self.latest.is_some();
        let Mode::Replay(r) = &mut self.mode else {
            return Vec::new();
        };
        r.waiting = false;
        r.range = frame.range;
        let Some(obs) = frame.observation else {
            r.playing = false;
            self.message = Some(match frame.seek {
                Seek::After(_) if had_frame => "end of the recording".to_owned(),
                Seek::Before(_) | Seek::AtOrBefore(_) if had_frame => {
                    "start of the recording".to_owned()
                }
                _ => "the recording is empty".to_owned(),
            });
            return Vec::new();
        };
        let t = obs.taken_at_unix_ms();
        if now == Some(t) {
            // The same moment again (a zoom): only the chart window changed.
            self.loaded = Some(frame.history);
            self.rebuild_rows();
            return Vec::new();
        }
        let contiguous = matches!(frame.seek, Seek::After(_)) || r.playing;
        if !r.playing {
            r.play_ms = Some(t);
        }
        self.loaded = Some(frame.history);
        self.observe(obs, contiguous);
        Vec::new()
    }

    fn on_tick(&mut self) -> Vec<Effect> {
        let Mode::Replay(r) = &mut self.mode else {
            return Vec::new();
        };
        if !r.playing {
            return Vec::new();
        }
        let speed = i64::from(r.speed());
        let play = r
            .play_ms
            .unwrap_or(i64::MIN)
            .saturating_add(TICK_MS * speed);
        r.play_ms = Some(play);
        if let Some((_, end)) = r.range {
            if play > end {
                r.playing = false;
                r.play_ms = Some(end);
                self.message = Some("end of the recording".to_owned());
                return Vec::new();
            }
        }
        if r.waiting {
            return Vec::new();
        }
        r.waiting = true;
        vec![Effect::Seek(Seek::AtOrBefore(play))]
    }

    fn replay_key(&mut self, key: &KeyEvent) -> Option<Vec<Effect>> {
        let now = self.now_ms();
        let Mode::Replay(r) = &mut self.mode else {
            return None;
        };
        let cursor = now.or(r.range.map(|(a, _)| a)).unwrap_or(0);
        let seek = match key.code {
            KeyCode::Char(' ') => {
                r.playing = !r.playing;
                r.play_ms = Some(cursor);
                return Some(Vec::new());
            }
            KeyCode::Char('+' | '=') => {
                r.speed = (r.speed + 1).min(SPEEDS.len() - 1);
                return Some(Vec::new());
            }
            KeyCode::Char('-' | '_') => {
                r.speed = r.speed.saturating_sub(1);
                return Some(Vec::new());
            }
            KeyCode::Right => Seek::After(cursor),
            KeyCode::Left => Seek::Before(cursor),
            KeyCode::Char(']') => Seek::AtOrBefore(cursor.saturating_add(60_000)),
            KeyCode::Char('[') => Seek::Before(cursor.saturating_sub(60_000).saturating_add(1)),
            KeyCode::Char('}') => Seek::AtOrBefore(cursor.saturating_add(600_000)),
            KeyCode::Char('{') => Seek::Before(cursor.saturating_sub(600_000).saturating_add(1)),
            KeyCode::Char('b') => Seek::After(i64::MIN),
            KeyCode::Char('e') => Seek::AtOrBefore(i64::MAX),
            _ => return None,
        };
        r.playing = false;
        r.waiting = true;
        Some(vec![Effect::Seek(seek)])
    }

    // ----- keys ---------------------------------------------------------------------

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
        if self.dialog.is_some() && !self.dialog_hidden {
            return self.dialog_key(&key);
        }
        if self.filter_editing {
            self.filter_key(&key);
            return Vec::new();
        }
        if let Some(effects) = self.replay_key(&key) {
            return effects;
        }
        let page = view::layout(self).table_body_rows().max(1);
        let page = isize::try_from(page).unwrap_or(isize::MAX);
        match key.code {
            KeyCode::Char('q') => {
                self.quit = true;
                return vec![Effect::Quit];
            }
            KeyCode::Esc => {
                if self.detail {
                    self.detail = false;
                } else if !self.view.filter.is_empty() {
                    self.view.filter.clear();
                    self.arrange();
                }
            }
            KeyCode::Char('?') | KeyCode::F(1) => self.help = true,
            KeyCode::Up | KeyCode::Char('k') => self.move_selection(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_selection(1),
            KeyCode::PageUp => self.move_selection(-page),
            KeyCode::PageDown => self.move_selection(page),
            KeyCode::Home | KeyCode::Char('g') => self.select_index(Some(0)),
            KeyCode::End | KeyCode::Char('G') => {
                let last = self.rows.len().checked_sub(1);
                self.select_index(last);
            }
            KeyCode::Enter => self.detail = !self.detail && self.selected.is_some(),
            KeyCode::Char('/') => self.filter_editing = true,
            KeyCode::Char('s') => self.sort_on(self.view.sort.next()),
            KeyCode::Char('S') => self.sort_on(self.view.sort.prev()),
            KeyCode::Char('r') => {
                self.view.descending = !self.view.descending;
                self.arrange();
            }
            KeyCode::Char('t') => {
                self.view.tree = !self.view.tree;
                self.arrange();
            }
            KeyCode::Char('z') => {
                self.zoom = self.zoom.zoom_in();
                return self.zoom_effects();
            }
            KeyCode::Char('Z') => {
                self.zoom = self.zoom.zoom_out();
                return self.zoom_effects();
            }
            KeyCode::Char('K') | KeyCode::Delete | KeyCode::F(9) => return self.ask_kill(),
            _ => {}
        }
        Vec::new()
    }

    fn sort_on(&mut self, column: Column) {
        self.view.sort = column;
        self.view.descending = column.descending_first();
        self.arrange();
    }

    fn filter_key(&mut self, key: &KeyEvent) {
        match key.code {
            KeyCode::Enter => self.filter_editing = false,
            KeyCode::Esc => {
                self.filter_editing = false;
                self.view.filter.clear();
            }
            KeyCode::Backspace => {
                self.view.filter.pop();
            }
            KeyCode::Char('u') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                self.view.filter.clear();
            }
            KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => {
                // Bounded: a filter longer than any command line is a stuck key.
                if self.view.filter.chars().count() < 200 {
                    self.view.filter.push(c);
                }
            }
            _ => return,
        }
        let before = self.selected.clone();
        self.arrange();
        // The selected process was filtered out: start from the best match, not from
        // wherever its old place lands.
        if before.is_some_and(|k| !self.rows.iter().any(|r| r.key.pid == k.pid)) {
            self.select_index(Some(0));
            self.scroll = 0;
        }
    }

    // ----- mouse --------------------------------------------------------------------

    fn on_mouse(&mut self, mouse: MouseEvent) -> Vec<Effect> {
        let at = Position::new(mouse.column, mouse.row);
        let areas = view::layout(self);
        match mouse.kind {
            MouseEventKind::ScrollDown if !self.dialog_shown() && !self.help => {
                self.move_selection(1);
            }
            MouseEventKind::ScrollUp if !self.dialog_shown() && !self.help => {
                self.move_selection(-1);
            }
            MouseEventKind::Down(MouseButton::Left) => {
                if self.help {
                    self.help = false;
                    return Vec::new();
                }
                if self.dialog.is_some() && !self.dialog_hidden {
                    return self.dialog_click(at);
                }
                if let Some(table) = areas.table {
                    return self.table_click(table, at);
                }
            }
            _ => {}
        }
        Vec::new()
    }

    fn table_click(&mut self, table: Rect, at: Position) -> Vec<Effect> {
        if !table.contains(at) {
            return Vec::new();
        }
        if at.y == table.y {
            let x = at.x - table.x;
            if let Some((column, _, _)) = table::column_spans(table.width)
                .into_iter()
                .find(|&(_, start, w)| x >= start && x < start + w.max(1) + 1)
            {
                self.view.sort_by(column);
                self.arrange();
            }
            return Vec::new();
        }
        let index = self.scroll + usize::from(at.y - table.y - 1);
        if index < self.rows.len() {
            self.select_index(Some(index));
        }
        Vec::new()
    }

    // ----- kill ---------------------------------------------------------------------

    fn ask_kill(&mut self) -> Vec<Effect> {
        if self.is_replay() {
            self.message = Some("actions are disabled while replaying a recording".into());
            return Vec::new();
        }
        if self.readonly {
            self.message = Some(READONLY_REASON.to_owned());
            return Vec::new();
        }
        if self.dialog.is_some() {
            self.message = Some("a kill is still in progress; wait for its result".into());
            return Vec::new();
        }
        let Some(target) = self.kill_target() else {
            self.message = Some("select a process first".into());
            return Vec::new();
        };
        self.dialog = Some(KillDialog::Planning(target.clone()));
        vec![Effect::Plan(target)]
    }

    /// The selected process as a kill target, with its memory on every GPU.
    pub fn kill_target(&self) -> Option<KillTarget> {
        let row = self.selected_row()?;
        let obs = self.latest.as_ref()?;
        let pid = row.key.pid;
        let host = obs.hosts.get(&pid);
        let mut memory = Vec::new();
        for device in &obs.snapshot.devices {
            for p in device
                .reading()
                .and_then(|r| r.processes.as_ref())
                .into_iter()
                .flatten()
                .filter(|p| p.pid == pid)
            {
                let mut label = format!("GPU {}", device.info.index);
                if let Some(gi) = p.gpu_instance_id {
                    label.push_str(&format!(" MIG GI {gi}"));
                }
                memory.push(GpuMemory {
                    label,
                    uuid: device.info.uuid.clone(),
                    used_bytes: p.used_bytes,
                });
            }
        }
        Some(KillTarget {
            pid,
            start_time_ticks: host.and_then(|h| h.start_time_ticks),
            started_at_unix_ms: host.and_then(|h| h.started_at_unix_ms),
            user: row.user.clone(),
            command: row.command.clone(),
            memory,
        })
    }

    fn dialog_key(&mut self, key: &KeyEvent) -> Vec<Effect> {
        let Some(dialog) = &mut self.dialog else {
            return Vec::new();
        };
        match dialog {
            KillDialog::Confirm { plan, kill_focused } => match key.code {
                KeyCode::Char('y' | 'Y') => return self.confirm_kill(),
                KeyCode::Enter if *kill_focused => return self.confirm_kill(),
                KeyCode::Tab | KeyCode::BackTab | KeyCode::Left | KeyCode::Right => {
                    *kill_focused = !*kill_focused;
                }
                KeyCode::Enter | KeyCode::Esc | KeyCode::Char('n' | 'N' | 'q') => {
                    let pid = plan.target.pid;
                    self.dialog = None;
                    self.message = Some(format!("process {pid} was not signalled"));
                }
                _ => {}
            },
            KillDialog::Finished { .. } => self.dialog = None,
            KillDialog::Planning(_) => {
                if matches!(key.code, KeyCode::Esc | KeyCode::Char('q' | 'n')) {
                    // Nothing was sent; the plan's answer is dropped when it comes.
                    self.dialog = None;
                }
            }
            KillDialog::InProgress(_) | KillDialog::Verifying { .. } => {
                if matches!(key.code, KeyCode::Esc | KeyCode::Char('q')) {
                    // The kill goes on; its result lands in the footer.
                    self.dialog_hidden = true;
                }
            }
        }
        Vec::new()
    }

    fn dialog_click(&mut self, at: Position) -> Vec<Effect> {
        let buttons = view::dialog_buttons(self);
        match (&self.dialog, buttons) {
            (Some(KillDialog::Confirm { .. }), Some((kill, cancel))) => {
                if kill.contains(at) {
                    return self.confirm_kill();
                }
                if cancel.contains(at) {
                    self.dialog = None;
                }
            }
            (Some(KillDialog::Finished { .. }), _) => self.dialog = None,
            _ => {}
        }
        Vec::new()
    }

    fn confirm_kill(&mut self) -> Vec<Effect> {
        let Some(KillDialog::Confirm { plan, .. }) = self.dialog.take() else {
            return Vec::new();
        };
        if self.readonly {
            // Not reachable through the keys; checked here too, and again by the worker.
            self.message = Some(READONLY_REASON.to_owned());
            return Vec::new();
        }
        self.dialog = Some(KillDialog::InProgress(plan.clone()));
        vec![Effect::Kill(plan)]
    }

    fn on_kill_planned(&mut self, result: Result<KillPlan, String>) {
        let Some(KillDialog::Planning(target)) = &self.dialog else {
            return;
        };
        self.dialog = Some(match result {
            Ok(plan) if plan.target.pid == target.pid => KillDialog::Confirm {
                plan,
                kill_focused: false,
            },
            Ok(plan) => KillDialog::Finished {
                target: target.clone(),
                result: KillResult::Refused(format!(
                    "the plan named process {} instead of {}",
                    plan.target.pid, target.pid
                )),
            },
            Err(reason) => KillDialog::Finished {
                target: target.clone(),
                result: KillResult::Refused(reason),
            },
        });
    }

    fn on_kill_finished(&mut self, plan: KillPlan, outcome: KillOutcome) -> Vec<Effect> {
        let pid = plan.target.pid;
        let ours = matches!(&self.dialog, Some(KillDialog::InProgress(p)) if p.target.pid == pid);
        if !ours {
            return Vec::new();
        }
        let next = match outcome {
            KillOutcome::Exited { escalated, .. } => KillDialog::Verifying {
                plan,
                escalated,
                samples: 0,
            },
            KillOutcome::AlreadyGone => KillDialog::Verifying {
                plan,
                escalated: false,
                samples: 0,
            },
            KillOutcome::StillRunning { escalated, state } => KillDialog::Finished {
                target: plan.target,
                result: KillResult::StillRunning { escalated, state },
            },
            KillOutcome::Refused { reason } => KillDialog::Finished {
                target: plan.target,
                result: KillResult::Refused(reason),
            },
            KillOutcome::Failed { reason } => KillDialog::Finished {
                target: plan.target,
                result: KillResult::Failed(reason),
            },
        };
        self.dialog = Some(next);
        let effects: Vec<Effect> = self.verify_kill().into_iter().collect();
        self.footer_if_hidden();
        effects
    }

    /// Whether the kill dialog is on screen.
    pub fn dialog_shown(&self) -> bool {
        self.dialog.is_some() && !self.dialog_hidden
    }

    /// A finished kill whose dialog was put away: its result goes to the footer.
    fn footer_if_hidden(&mut self) {
        if !self.dialog_hidden {
            return;
        }
        if let Some(KillDialog::Finished { target, result }) = &self.dialog {
            self.message = Some(format!(
                "kill {}: {}",
                target.pid,
                view::kill_result_text(result)
            ));
            self.dialog = None;
            self.dialog_hidden = false;
        }
    }

    /// After the process exited: once the driver no longer lists it, its memory is free.
    /// Returns the outcome for the killer's audit record once it is known.
    fn verify_kill(&mut self) -> Option<Effect> {
        let Some(KillDialog::Verifying {
            plan,
            escalated,
            samples,
        }) = &mut self.dialog
        else {
            return None;
        };
        let pid = plan.target.pid;
        let listed = self.latest.as_ref().is_some_and(|obs| {
            obs.snapshot.devices.iter().any(|d| {
                d.reading()
                    .and_then(|r| r.processes.as_ref())
                    .is_some_and(|ps| ps.iter().any(|p| p.pid == pid))
            })
        });
        let plan = plan.clone();
        let effect = if !listed {
            let per_gpu = plan.target.memory.clone();
            let total_bytes = per_gpu.iter().filter_map(|m| m.used_bytes).sum();
            self.dialog = Some(KillDialog::Finished {
                target: plan.target.clone(),
                result: KillResult::Freed {
                    per_gpu,
                    total_bytes,
                    escalated: *escalated,
                },
            });
            Some(Effect::MemoryOutcome {
                plan,
                freed_bytes: Some(total_bytes),
            })
        } else if *samples >= VERIFY_SAMPLES {
            self.dialog = Some(KillDialog::Finished {
                target: plan.target.clone(),
                result: KillResult::StillListed,
            });
            Some(Effect::MemoryOutcome {
                plan,
                freed_bytes: None,
            })
        } else {
            *samples += 1;
            None
        };
        self.footer_if_hidden();
        effect
    }
}

#[cfg(test)]
mod tests {
    use ratatui::crossterm::event::{KeyEventState, MouseEvent};
    use vramctl_core::types::{DeviceState, ProcessActivity};

    use super::*;
    use crate::tui::fixtures::{GIB, MIB, T0_MS, gpu, host, obs};
    use crate::tui::kill::{KillOutcome, Killer};
    use crate::tui::replay::{MemoryReplay, seek_frame};

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
        app.rows.iter().map(|r| r.key.pid).collect()
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
        assert_eq!(app.view.sort, Column::Delta);
        app.update(key(KeyCode::Char('S')));
        app.update(key(KeyCode::Char('S')));
        assert_eq!(app.view.sort, Column::Gpu);
        app.update(key(KeyCode::Char('S')));
        app.update(key(KeyCode::Char('S')));
        assert_eq!(app.view.sort, Column::Pid);
        assert!(!app.view.descending);
        assert_eq!(order(&app), [101, 202, 303]);
        app.update(key(KeyCode::Char('r')));
        assert_eq!(order(&app), [303, 202, 101]);
        // A click on the USER header sorts by user; a second click reverses.
        let table = view::layout(&app).table.unwrap();
        let (_, x, _) = table::column_spans(table.width)[1];
        app.update(click(table.x + x + 1, table.y));
        assert_eq!(app.view.sort, Column::User);
        assert_eq!(order(&app), [101, 303, 202]);
        app.update(click(table.x + x + 1, table.y));
        assert_eq!(order(&app), [202, 101, 303]);
    }

    #[test]
    fn clicking_a_row_selects_it_and_the_wheel_moves() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        let table = view::layout(&app).table.unwrap();
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
        assert!(app.filter_editing);
        // While typing, letters are text, not commands ('q' does not quit).
        assert!(chars(&mut app, "vllq").is_empty());
        assert!(!app.quit);
        app.update(key(KeyCode::Backspace));
        assert_eq!(app.view.filter, "vll");
        assert_eq!(order(&app), [202, 303]);
        app.update(key(KeyCode::Enter));
        assert!(!app.filter_editing);
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
            .rows
            .iter()
            .map(|r| format!("{}{}", r.tree_prefix, r.key.pid))
            .collect();
        assert_eq!(lines, ["101", "202", "└─ 303"]);
    }

    #[test]
    fn zoom_changes_the_chart_window() {
        let mut app = live();
        assert_eq!(app.zoom, Zoom::FiveMinutes);
        app.update(key(KeyCode::Char('z')));
        app.update(key(KeyCode::Char('z')));
        assert_eq!(app.zoom, Zoom::Minute);
        for _ in 0..10 {
            app.update(key(KeyCode::Char('Z')));
        }
        assert_eq!(app.zoom, Zoom::Day);
        // The window follows the zoom: a sample 2 minutes old is in 5m, not in 1m.
        app.update(sample(0, [GIB, GIB, GIB]));
        app.update(sample(120, [GIB, GIB, GIB]));
        let key0 = SeriesKey::Device(gpu(0, 1, 0, &[]).info.uuid.clone());
        app.zoom = Zoom::FiveMinutes;
        assert_eq!(app.chart_points(&key0).len(), 2);
        app.zoom = Zoom::Minute;
        assert_eq!(app.chart_points(&key0).len(), 1);
    }

    #[test]
    fn change_per_minute_comes_from_own_samples() {
        let mut app = live();
        for t in 0..=6 {
            let m = u64::try_from(t).unwrap() * 10 * MIB;
            app.update(sample(t * 10, [GIB + m, 2 * GIB, GIB]));
        }
        let row = app.rows.iter().find(|r| r.key.pid == 101).unwrap();
        assert_eq!(row.delta_per_min, Some(i64::try_from(60 * MIB).unwrap()));
        let row = app.rows.iter().find(|r| r.key.pid == 202).unwrap();
        assert_eq!(row.delta_per_min, Some(0));
    }

    #[test]
    fn idle_is_the_analysis_evidence_and_no_activity_report_is_not_idle() {
        use crate::tui::verdict::{AnalysisJudge, Judge};
        let mut app = live();
        let mut judge = AnalysisJudge::new(vramctl_core::analysis::LeakConfig::default()).unwrap();
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
        let idle = |app: &App, pid| app.rows.iter().find(|r| r.key.pid == pid).unwrap().idle;
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
            app.rows
                .iter()
                .find(|r| r.key.pid == pid)
                .unwrap()
                .flags
                .text()
        };
        assert_eq!(flags(101), "");
        assert_eq!(flags(202), "Z");
        assert_eq!(flags(303), "H");
        let hidden = app.rows.iter().find(|r| r.key.pid == 303).unwrap();
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
            app.rows
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
        let plan = crate::tui::kill::RecordingKiller::new(KillOutcome::AlreadyGone)
            .plan(target)
            .unwrap();
        app.update(Event::KillPlanned(Ok(plan.clone())));
        assert!(matches!(
            app.dialog,
            Some(KillDialog::Confirm {
                kill_focused: false,
                ..
            })
        ));
        // Enter on the default button (cancel) does not kill.
        let mut cancelled = app.clone();
        assert!(cancelled.update(key(KeyCode::Enter)).is_empty());
        assert_eq!(cancelled.dialog, None);
        assert_eq!(
            app.update(key(KeyCode::Char('y'))),
            [Effect::Kill(plan.clone())]
        );
        assert!(matches!(app.dialog, Some(KillDialog::InProgress(_))));
        app.update(Event::KillFinished {
            plan,
            outcome: KillOutcome::Exited {
                escalated: false,
                after_ms: 120,
            },
        });
        assert!(matches!(app.dialog, Some(KillDialog::Verifying { .. })));
        // The driver still lists it for a sample, then not.
        app.update(sample(1, [3 * GIB, 2 * GIB, GIB]));
        assert!(matches!(
            app.dialog,
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
        }) = &app.dialog
        else {
            panic!("{:?}", app.dialog);
        };
        assert_eq!(*total_bytes, 3 * GIB);
        app.update(key(KeyCode::Char('x')));
        assert_eq!(app.dialog, None);
    }

    #[test]
    fn kill_of_a_process_the_driver_keeps_listing() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        app.update(key(KeyCode::Char('K')));
        let plan = crate::tui::kill::RecordingKiller::new(KillOutcome::AlreadyGone)
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
            app.dialog,
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
        let plan = crate::tui::kill::RecordingKiller::new(KillOutcome::AlreadyGone)
            .plan(&app.kill_target().unwrap())
            .unwrap();
        app.update(Event::KillPlanned(Ok(plan.clone())));
        app.update(key(KeyCode::Char('y')));
        app.update(key(KeyCode::Esc));
        assert!(!app.dialog_shown());
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
        assert_eq!(app.dialog, None);
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
        let plan = crate::tui::kill::RecordingKiller::new(KillOutcome::AlreadyGone)
            .plan(&app.kill_target().unwrap())
            .unwrap();
        app.update(Event::KillPlanned(Ok(plan.clone())));
        let (kill, cancel) = view::dialog_buttons(&app).unwrap();
        let mut cancelled = app.clone();
        assert!(cancelled.update(click(cancel.x + 1, cancel.y)).is_empty());
        assert_eq!(cancelled.dialog, None);
        // A click elsewhere does nothing; on the kill button it kills.
        assert!(app.update(click(0, 0)).is_empty());
        assert!(app.dialog_shown());
        assert_eq!(app.update(click(kill.x + 1, kill.y)), [Effect::Kill(plan)]);
    }

    #[test]
    fn refusals_end_the_dialog_with_the_reason() {
        let mut app = live();
        app.update(sample(0, [3 * GIB, 2 * GIB, GIB]));
        app.update(key(KeyCode::Delete));
        app.update(Event::KillPlanned(Err("process 101 is not yours".into())));
        assert_eq!(
            app.dialog.as_ref().map(|d| match d {
                KillDialog::Finished { result, .. } => view::kill_result_text(result),
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
            assert_eq!(app.dialog, None);
            assert_eq!(app.message.as_deref(), Some(READONLY_REASON));
        }
        // A dialog that somehow got there still does not produce a kill.
        let plan = crate::tui::kill::RecordingKiller::new(KillOutcome::AlreadyGone)
            .plan(&App::kill_target(&app).unwrap())
            .unwrap();
        app.dialog = Some(KillDialog::Confirm {
            plan,
            kill_focused: true,
        });
        assert!(app.update(key(KeyCode::Char('y'))).is_empty());
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
                let frame = seek_frame(recording, seek, app.zoom.span_ms(), 100).unwrap();
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
        let row = app.rows.iter().find(|r| r.key.pid == 101).unwrap();
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
