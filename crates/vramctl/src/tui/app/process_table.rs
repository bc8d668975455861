//! The process table's state: its rows, the sort, the text filter (and whether it is being
//! typed), the tree view, the selection, the scroll position and the detail pane.
//!
//! The rows come from each observation ([`rows_of`]); [`crate::tui::table`] holds the
//! pure parts (columns, sorting, filtering, the tree). The selection follows its row
//! across refreshes: the same row, else the same PID, else the same place.

use std::collections::BTreeMap;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::{Position, Rect};
use vramctl_core::analysis::IdleState;

use super::effect::Reply;
use crate::tui::history::SeriesKey;
use crate::tui::observe::{HostProcess, Observation};
use crate::tui::table::{self, Column, Flags, Idle, Row, RowKey, TableView};
use crate::tui::verdict::{ProcessVerdict, VerdictKind};

/// Longest filter text: one longer than any command line is a stuck key.
const MAX_FILTER_CHARS: usize = 200;

/// The /proc facts of the observation on screen, by PID (the tree view's parents).
pub type Hosts = BTreeMap<u32, HostProcess>;

/// What the process table reacts to. `hosts`: the /proc facts of the observation on
/// screen, for the tree view.
#[derive(Debug, Clone, PartialEq)]
pub enum TableEvent<'a> {
    /// New rows (from [`rows_of`]).
    Rows {
        /// One per process per GPU, in no order.
        rows: Vec<Row>,
        /// The facts.
        hosts: &'a Hosts,
    },
    /// A key; `page`: how many rows a page is.
    Key {
        /// The key.
        key: KeyEvent,
        /// Rows on a page.
        page: usize,
        /// The facts.
        hosts: &'a Hosts,
    },
    /// The mouse wheel: rows to move the selection by.
    Wheel(isize),
    /// A left click at `at`; `area`: where the table is (its header line first).
    Click {
        /// Where the table is drawn.
        area: Rect,
        /// Where the click was.
        at: Position,
        /// The facts.
        hosts: &'a Hosts,
    },
    /// The table shows `height` rows: scroll so the selection is among them.
    Fit {
        /// Rows shown.
        height: usize,
    },
}

/// The process table.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessTable {
    /// The rows of the observation, before sorting and filtering.
    base_rows: Vec<Row>,
    /// The rows shown, in order.
    pub rows: Vec<Row>,
    /// Sort, filter, tree.
    pub view: TableView,
    /// The filter text is being typed.
    pub filter_editing: bool,
    /// The selected row.
    pub selected: Option<RowKey>,
    /// Where the selection was, for when its row goes away.
    selected_pos: usize,
    /// First row shown.
    pub scroll: usize,
    /// The detail pane of the selected process is open.
    pub detail: bool,
}

impl ProcessTable {
    /// Index of the selected row in [`ProcessTable::rows`].
    pub fn selected_index(&self) -> Option<usize> {
        let key = self.selected.as_ref()?;
        self.rows.iter().position(|r| &r.key == key)
    }

    /// The selected row.
    pub fn selected_row(&self) -> Option<&Row> {
        self.selected_index().map(|i| &self.rows[i])
    }

    /// Whether the detail pane is on screen (open, with a process to show).
    pub fn detail_shown(&self) -> bool {
        self.detail && self.selected.is_some()
    }

    /// Takes in one event. Keys that are not the table's are [`Reply::ignored`]; while
    /// the filter is typed, every key is its text.
    pub fn update(&mut self, event: TableEvent<'_>) -> Reply {
        match event {
            TableEvent::Rows { rows, hosts } => {
                self.base_rows = rows;
                self.arrange(hosts);
            }
            TableEvent::Key { key, page, hosts } => return self.key(&key, page, hosts),
            TableEvent::Wheel(delta) => self.move_selection(delta),
            TableEvent::Click { area, at, hosts } => self.click(area, at, hosts),
            TableEvent::Fit { height } => self.fit(height),
        }
        Reply::done()
    }

    /// Re-sorts and re-filters; the selection stays on its row, or its PID, or its place.
    fn arrange(&mut self, hosts: &Hosts) {
        self.rows = table::arrange(self.base_rows.clone(), hosts, &self.view);
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

    fn fit(&mut self, height: usize) {
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

    fn key(&mut self, key: &KeyEvent, page: usize, hosts: &Hosts) -> Reply {
        if self.filter_editing {
            self.filter_key(key, hosts);
            return Reply::done();
        }
        let page = isize::try_from(page.max(1)).unwrap_or(isize::MAX);
        match key.code {
            KeyCode::Esc => {
                if self.detail {
                    self.detail = false;
                } else if !self.view.filter.is_empty() {
                    self.view.filter.clear();
                    self.arrange(hosts);
                }
            }
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
            KeyCode::Char('s') => self.sort_on(self.view.sort.next(), hosts),
            KeyCode::Char('S') => self.sort_on(self.view.sort.prev(), hosts),
            KeyCode::Char('r') => {
                self.view.descending = !self.view.descending;
                self.arrange(hosts);
            }
            KeyCode::Char('t') => {
                self.view.tree = !self.view.tree;
                self.arrange(hosts);
            }
            _ => return Reply::ignored(),
        }
        Reply::done()
    }

    fn sort_on(&mut self, column: Column, hosts: &Hosts) {
        self.view.sort = column;
        self.view.descending = column.descending_first();
        self.arrange(hosts);
    }

    fn filter_key(&mut self, key: &KeyEvent, hosts: &Hosts) {
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
                if self.view.filter.chars().count() < MAX_FILTER_CHARS {
                    self.view.filter.push(c);
                }
            }
            _ => return,
        }
        let before = self.selected.clone();
        self.arrange(hosts);
        // The selected process was filtered out: start from the best match, not from
        // wherever its old place lands.
        if before.is_some_and(|k| !self.rows.iter().any(|r| r.key.pid == k.pid)) {
            self.select_index(Some(0));
            self.scroll = 0;
        }
    }

    fn click(&mut self, area: Rect, at: Position, hosts: &Hosts) {
        if !area.contains(at) {
            return;
        }
        if at.y == area.y {
            let x = at.x - area.x;
            if let Some((column, _, _)) = table::column_spans(area.width)
                .into_iter()
                .find(|&(_, start, w)| x >= start && x < start + w.max(1) + 1)
            {
                self.view.sort_by(column);
                self.arrange(hosts);
            }
            return;
        }
        let index = self.scroll + usize::from(at.y - area.y - 1);
        if index < self.rows.len() {
            self.select_index(Some(index));
        }
    }
}

/// The table's rows for `obs`: one per process per GPU that `shows` (a GPU's UUID) lets
/// through; `delta`: the change per minute of a process's series (the Δ/MIN column).
pub fn rows_of(
    obs: &Observation,
    shows: impl Fn(&str) -> bool,
    delta: impl Fn(&SeriesKey) -> Option<i64>,
) -> Vec<Row> {
    let now = obs.taken_at_unix_ms();
    let mut rows = Vec::new();
    for device in &obs.snapshot.devices {
        let uuid = &device.info.uuid;
        if !shows(uuid) {
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
                delta_per_min: delta(&key),
                cpu_percent: host.and_then(|h| h.cpu_percent),
                idle: idle_of(verdict, now),
                flags: Flags {
                    leak: verdict.is_some_and(|v| v.kind == VerdictKind::Leak),
                    idle_holder: verdict.is_some_and(|v| v.kind == VerdictKind::IdleHolder),
                    zombie: host.is_some_and(HostProcess::is_zombie),
                    hidden: host.is_none(),
                },
                command,
                tree_prefix: String::new(),
            });
        }
    }
    rows
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
