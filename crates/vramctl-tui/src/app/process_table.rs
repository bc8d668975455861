//! The process table's state: its rows, the sort, the text filter (and whether it is being
//! typed), the tree view, the selection, the scroll position and the detail pane.
//!
//! The rows come from each observation ([`rows_of`]); [`crate::table`] holds the
//! pure parts (columns, sorting, filtering, the tree). The selection follows its row
//! across refreshes: the same row, else the same PID, else the same place.

use std::collections::BTreeMap;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::{Position, Rect};
use vramctl_leaks::analysis::IdleState;

use super::effect::Reply;
use crate::memory_series::SeriesKey;
use crate::table::{self, Column, Flags, Idle, Row, RowKey, TableView};
use vramctl_observe::observation::{HostProcess, Observation};
use vramctl_observe::verdict::{ProcessVerdict, VerdictKind};

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
            KeyCode::Char('s') => {
                self.sort_on(self.view.sort.next(table::agent_columns(&self.rows)), hosts)
            }
            KeyCode::Char('S') => {
                self.sort_on(self.view.sort.prev(table::agent_columns(&self.rows)), hosts)
            }
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
            if let Some((column, _, _)) = table::column_spans_of(area.width, &self.rows)
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
            let agent = obs.agents.get(p.pid, uuid);
            let key = SeriesKey::Process {
                uuid: uuid.clone(),
                pid: p.pid,
            };
            let command = host.map(|h| h.command.clone()).unwrap_or_else(|| {
                obs.driver_names.get(&p.pid).cloned().unwrap_or_else(|| {
                    if obs.pid_view.pids_are_ours() {
                        "(not visible in this PID namespace)".to_owned()
                    } else {
                        "(host PID: cannot map to this PID namespace)".to_owned()
                    }
                })
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
                allocated_bytes: agent.and_then(|a| a.allocated_bytes),
                cached_bytes: agent.and_then(|a| a.cached_bytes),
                delta_per_min: delta(&key),
                cpu_percent: host.and_then(|h| h.cpu_percent),
                idle: idle_of(verdict, now),
                flags: Flags {
                    leak: verdict.is_some_and(|v| v.kind == VerdictKind::Leak),
                    oom: obs.ooms.get(p.pid).is_some(),
                    idle_holder: verdict.is_some_and(|v| v.kind == VerdictKind::IdleHolder),
                    zombie: host.is_some_and(HostProcess::is_zombie),
                    hidden: host.is_none(),
                    host_pid: !obs.pid_view.pids_are_ours(),
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

#[cfg(test)]
mod tests {
    use ratatui::crossterm::event::{KeyEventKind, KeyEventState};

    use super::*;
    use crate::fixtures::{GIB, gpu, host, obs};

    fn row(pid: u32, mem: u64, user: &str, command: &str) -> Row {
        Row {
            key: RowKey {
                pid,
                uuid: Some("GPU-0".into()),
            },
            gpu: "0".into(),
            gpu_index: Some(0),
            user: Some(user.into()),
            used_bytes: Some(mem),
            allocated_bytes: None,
            cached_bytes: None,
            delta_per_min: None,
            cpu_percent: None,
            idle: None,
            flags: Flags::default(),
            command: command.into(),
            tree_prefix: String::new(),
        }
    }

    /// 101 (alice, 3 GiB), 202 (bob, 2 GiB), 303 (alice, 1 GiB, child of 202).
    fn three() -> Vec<Row> {
        vec![
            row(303, GIB, "alice", "vllm worker"),
            row(101, 3 * GIB, "alice", "python train.py"),
            row(202, 2 * GIB, "bob", "vllm serve"),
        ]
    }

    fn hosts() -> Hosts {
        [
            host(101, 1, "alice", "python train.py"),
            host(202, 1, "bob", "vllm serve"),
            host(303, 202, "alice", "vllm worker"),
        ]
        .into_iter()
        .map(|h| (h.pid, h))
        .collect()
    }

    fn table(rows: Vec<Row>) -> ProcessTable {
        let mut t = ProcessTable::default();
        let _ = t.update(TableEvent::Rows {
            rows,
            hosts: &hosts(),
        });
        t
    }

    fn press(t: &mut ProcessTable, code: KeyCode) -> Reply {
        press_with(t, code, KeyModifiers::NONE)
    }

    fn press_with(t: &mut ProcessTable, code: KeyCode, modifiers: KeyModifiers) -> Reply {
        let key = KeyEvent {
            code,
            modifiers,
            kind: KeyEventKind::Press,
            state: KeyEventState::NONE,
        };
        t.update(TableEvent::Key {
            key,
            page: 2,
            hosts: &hosts(),
        })
    }

    fn order(t: &ProcessTable) -> Vec<u32> {
        t.rows.iter().map(|r| r.key.pid).collect()
    }

    fn selected(t: &ProcessTable) -> Option<u32> {
        t.selected_row().map(|r| r.key.pid)
    }

    #[test]
    fn rows_are_sorted_by_memory_and_the_selection_starts_at_the_top() {
        let t = table(three());
        assert_eq!(order(&t), [101, 202, 303]);
        assert_eq!(selected(&t), Some(101));
        assert_eq!(ProcessTable::default().selected_row(), None);
    }

    #[test]
    fn the_selection_follows_its_row_then_its_pid_then_its_place() {
        let mut t = table(three());
        let _ = press(&mut t, KeyCode::Down);
        assert_eq!(selected(&t), Some(202));
        // 202 grows to the top: the selection follows it.
        let mut grown = three();
        grown[2].used_bytes = Some(5 * GIB);
        let _ = t.update(TableEvent::Rows {
            rows: grown,
            hosts: &hosts(),
        });
        assert_eq!(order(&t), [202, 101, 303]);
        assert_eq!(selected(&t), Some(202));
        // 202 moves to another GPU: the same PID is still selected.
        let mut moved = three();
        moved[2].key.uuid = Some("GPU-1".into());
        moved[2].used_bytes = Some(5 * GIB);
        let _ = t.update(TableEvent::Rows {
            rows: moved,
            hosts: &hosts(),
        });
        assert_eq!(selected(&t), Some(202));
        // 202 exits: the selection stays at its place (the first row).
        let _ = t.update(TableEvent::Rows {
            rows: vec![row(101, 3 * GIB, "a", "x"), row(303, GIB, "b", "y")],
            hosts: &hosts(),
        });
        assert_eq!(selected(&t), Some(101));
        // Nothing left: nothing selected.
        let _ = t.update(TableEvent::Rows {
            rows: vec![],
            hosts: &hosts(),
        });
        assert_eq!(t.selected, None);
    }

    #[test]
    fn keys_move_the_selection_and_stop_at_either_end() {
        let mut t = table(three());
        for (code, want) in [
            (KeyCode::Char('j'), 202),
            (KeyCode::Down, 303),
            (KeyCode::Down, 303),
            (KeyCode::Char('k'), 202),
            (KeyCode::Up, 101),
            (KeyCode::Up, 101),
            (KeyCode::PageDown, 303),
            (KeyCode::PageUp, 101),
            (KeyCode::End, 303),
            (KeyCode::Home, 101),
            (KeyCode::Char('G'), 303),
            (KeyCode::Char('g'), 101),
        ] {
            assert_eq!(press(&mut t, code), Reply::done(), "{code:?}");
            assert_eq!(selected(&t), Some(want), "{code:?}");
        }
        let _ = t.update(TableEvent::Wheel(1));
        assert_eq!(selected(&t), Some(202));
        let _ = t.update(TableEvent::Wheel(-5));
        assert_eq!(selected(&t), Some(101));
    }

    #[test]
    fn sort_keys_cycle_reverse_and_start_each_column_its_own_way() {
        let mut t = table(three());
        let _ = press(&mut t, KeyCode::Char('s'));
        assert_eq!(t.view.sort, Column::Delta);
        assert!(t.view.descending, "numbers: largest first");
        for _ in 0..4 {
            let _ = press(&mut t, KeyCode::Char('S'));
        }
        assert_eq!(t.view.sort, Column::Pid);
        assert!(!t.view.descending);
        assert_eq!(order(&t), [101, 202, 303]);
        let _ = press(&mut t, KeyCode::Char('r'));
        assert_eq!(order(&t), [303, 202, 101]);
    }

    #[test]
    fn the_tree_view_nests_children_under_their_parents() {
        let mut t = table(three());
        let _ = press(&mut t, KeyCode::Char('t'));
        assert!(t.view.tree);
        let lines: Vec<String> = t
            .rows
            .iter()
            .map(|r| format!("{}{}", r.tree_prefix, r.key.pid))
            .collect();
        assert_eq!(lines, ["101", "202", "└─ 303"]);
    }

    #[test]
    fn a_header_click_sorts_a_second_reverses_and_a_row_click_selects() {
        let mut t = table(three());
        let area = Rect::new(0, 10, 120, 20);
        let hosts = hosts();
        let click = |t: &mut ProcessTable, x: u16, y: u16| {
            let _ = t.update(TableEvent::Click {
                area,
                at: Position::new(x, y),
                hosts: &hosts,
            });
        };
        let (_, user_x, _) = table::column_spans(area.width, false)[1];
        click(&mut t, user_x + 1, 10);
        assert_eq!(t.view.sort, Column::User);
        assert_eq!(order(&t), [101, 303, 202]);
        click(&mut t, user_x + 1, 10);
        assert_eq!(order(&t), [202, 101, 303]);
        // The third row, below the header line.
        click(&mut t, 3, 13);
        assert_eq!(selected(&t), Some(303));
        // Below the last row, or outside the table: nothing changes.
        click(&mut t, 3, 20);
        click(&mut t, 3, 5);
        assert_eq!(selected(&t), Some(303));
        assert_eq!(order(&t), [202, 101, 303]);
    }

    #[test]
    fn while_the_filter_is_typed_every_key_is_text() {
        let mut t = table(three());
        let _ = press(&mut t, KeyCode::Char('/'));
        assert!(t.filter_editing);
        for c in "vllq".chars() {
            assert_eq!(press(&mut t, KeyCode::Char(c)), Reply::done());
        }
        assert_eq!(t.view.filter, "vllq");
        assert!(t.rows.is_empty());
        let _ = press(&mut t, KeyCode::Backspace);
        assert_eq!(order(&t), [202, 303]);
        // Even keys that are not the table's are taken while typing.
        assert_eq!(press(&mut t, KeyCode::F(9)), Reply::done());
        let _ = press(&mut t, KeyCode::Enter);
        assert!(!t.filter_editing);
        assert_eq!(order(&t), [202, 303]);
        // Ctrl-U clears what was typed; Esc while typing clears and stops.
        let _ = press(&mut t, KeyCode::Char('/'));
        let _ = press_with(&mut t, KeyCode::Char('u'), KeyModifiers::CONTROL);
        assert_eq!(t.view.filter, "");
        let _ = press(&mut t, KeyCode::Char('x'));
        let _ = press(&mut t, KeyCode::Esc);
        assert!(!t.filter_editing);
        assert_eq!(order(&t), [101, 202, 303]);
    }

    #[test]
    fn a_filter_longer_than_any_command_line_stops_growing() {
        let mut t = table(three());
        let _ = press(&mut t, KeyCode::Char('/'));
        for _ in 0..MAX_FILTER_CHARS + 50 {
            let _ = press(&mut t, KeyCode::Char('a'));
        }
        assert_eq!(t.view.filter.chars().count(), MAX_FILTER_CHARS);
    }

    #[test]
    fn a_filtered_out_selection_starts_again_from_the_best_match() {
        let mut t = table(vec![
            row(101, 3 * GIB, "alice", "serve a"),
            row(202, 2 * GIB, "bob", "serve b"),
            row(303, GIB, "alice", "worker"),
        ]);
        let _ = press(&mut t, KeyCode::End);
        assert_eq!(selected(&t), Some(303));
        t.scroll = 2;
        let _ = press(&mut t, KeyCode::Char('/'));
        for c in "serve".chars() {
            let _ = press(&mut t, KeyCode::Char(c));
        }
        // Its old place would be the last row left (202); the best match is the first.
        assert_eq!(order(&t), [101, 202]);
        assert_eq!((selected(&t), t.scroll), (Some(101), 0));
    }

    #[test]
    fn esc_closes_the_detail_pane_before_it_clears_the_filter() {
        let mut t = table(three());
        let _ = press(&mut t, KeyCode::Char('/'));
        let _ = press(&mut t, KeyCode::Char('v'));
        let _ = press(&mut t, KeyCode::Enter);
        let _ = press(&mut t, KeyCode::Enter);
        assert!(t.detail_shown());
        let _ = press(&mut t, KeyCode::Esc);
        assert!(!t.detail);
        assert_eq!(t.view.filter, "v");
        let _ = press(&mut t, KeyCode::Esc);
        assert_eq!(t.view.filter, "");
        assert_eq!(order(&t), [101, 202, 303]);
        // Without a selection the pane does not open.
        let mut empty = ProcessTable::default();
        let _ = press(&mut empty, KeyCode::Enter);
        assert!(!empty.detail);
    }

    #[test]
    fn keys_that_are_not_the_tables_are_offered_on() {
        let mut t = table(three());
        for code in [
            KeyCode::Char('q'),
            KeyCode::Char('z'),
            KeyCode::Char('K'),
            KeyCode::Char(' '),
            KeyCode::Right,
            KeyCode::F(1),
        ] {
            assert!(press(&mut t, code).ignored, "{code:?}");
        }
    }

    #[test]
    fn fit_scrolls_just_enough_to_show_the_selection() {
        let rows = (1..=10)
            .map(|pid| row(pid, u64::from(pid), "u", "c"))
            .collect();
        let mut t = table(rows);
        let _ = press(&mut t, KeyCode::End);
        let _ = t.update(TableEvent::Fit { height: 4 });
        assert_eq!(t.scroll, 6);
        let _ = press(&mut t, KeyCode::Home);
        let _ = t.update(TableEvent::Fit { height: 4 });
        assert_eq!(t.scroll, 0);
        // A taller table never scrolls past its last row.
        t.scroll = 8;
        let _ = t.update(TableEvent::Fit { height: 20 });
        assert_eq!(t.scroll, 0);
        // Nothing to show: back to the top.
        let _ = t.update(TableEvent::Rows {
            rows: vec![],
            hosts: &hosts(),
        });
        t.scroll = 3;
        let _ = t.update(TableEvent::Fit { height: 4 });
        assert_eq!(t.scroll, 0);
    }

    #[test]
    fn rows_of_follows_the_gpu_choice_and_names_hidden_processes_by_the_driver() {
        let mut o = (*obs(
            0,
            vec![
                gpu(0, 140 * GIB, 2 * GIB, &[(101, GIB), (303, GIB)]),
                gpu(1, 140 * GIB, GIB, &[(202, GIB)]),
            ],
            vec![host(101, 1, "alice", "python train.py")],
        ))
        .clone();
        o.driver_names.insert(303, "python hidden.py".into());
        let second = o.snapshot.devices[1].info.uuid.clone();
        let rows = rows_of(&o, |uuid| uuid != second, |_| Some(7));
        let pids: Vec<u32> = rows.iter().map(|r| r.key.pid).collect();
        assert_eq!(pids, [101, 303]);
        assert_eq!(rows[0].user.as_deref(), Some("alice"));
        assert_eq!(rows[0].delta_per_min, Some(7));
        assert_eq!(
            (rows[1].command.as_str(), rows[1].flags.text()),
            ("python hidden.py", "H".to_owned())
        );
        let all = rows_of(&o, |_| true, |_| None);
        let unnamed = all.iter().find(|r| r.key.pid == 202).unwrap();
        assert_eq!(unnamed.command, "(not visible in this PID namespace)");
        assert_eq!(unnamed.gpu, "1");
    }
}
