//! The process table as data: columns, rows, sorting, the text filter and the tree view.
//! Pure functions, so the order the user sees is tested without a terminal.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use vramctl_observe::observation::HostProcess;

/// A column of the process table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Column {
    /// Process id.
    Pid,
    /// Owner.
    User,
    /// GPU index (and MIG instance).
    Gpu,
    /// GPU memory held.
    Memory,
    /// Bytes in live tensors, as the process's agent says (shown only when some process
    /// has an agent).
    Allocated,
    /// The framework's cache (reserved − allocated), what a reclaim can return (shown
    /// only when some process has an agent).
    Cached,
    /// Change of that memory per minute, from `top`'s own samples.
    Delta,
    /// CPU use, percent of one core.
    Cpu,
    /// Time since the process last used the GPU.
    Idle,
    /// Leak, idle holder, zombie, not visible here.
    Flags,
    /// Command line.
    Command,
}

impl Column {
    /// Every column, left to right.
    pub const ALL: [Self; 11] = [
        Self::Pid,
        Self::User,
        Self::Gpu,
        Self::Memory,
        Self::Allocated,
        Self::Cached,
        Self::Delta,
        Self::Cpu,
        Self::Idle,
        Self::Flags,
        Self::Command,
    ];

    /// The header text.
    pub fn title(self) -> &'static str {
        match self {
            Self::Pid => "PID",
            Self::User => "USER",
            Self::Gpu => "GPU",
            Self::Memory => "MEM",
            Self::Allocated => "ALLOC",
            Self::Cached => "CACHED",
            Self::Delta => "Δ/MIN",
            Self::Cpu => "CPU%",
            Self::Idle => "IDLE",
            Self::Flags => "FLAGS",
            Self::Command => "COMMAND",
        }
    }

    /// Width in cells; the command takes what is left.
    pub fn width(self) -> Option<u16> {
        match self {
            Self::Pid => Some(7),
            Self::User => Some(9),
            Self::Gpu => Some(5),
            Self::Memory | Self::Allocated => Some(6),
            Self::Cached => Some(7),
            Self::Delta => Some(7),
            Self::Cpu => Some(5),
            Self::Idle => Some(6),
            Self::Flags => Some(5),
            Self::Command => None,
        }
    }

    /// Numbers are right-aligned.
    pub fn right_aligned(self) -> bool {
        matches!(
            self,
            Self::Pid
                | Self::Memory
                | Self::Allocated
                | Self::Cached
                | Self::Delta
                | Self::Cpu
                | Self::Idle
        )
    }

    /// Whether sorting on this column starts with the largest value.
    pub fn descending_first(self) -> bool {
        matches!(
            self,
            Self::Memory
                | Self::Allocated
                | Self::Cached
                | Self::Delta
                | Self::Cpu
                | Self::Idle
                | Self::Flags
        )
    }

    /// Whether the column shows an agent's figure (shown only when some row has one).
    pub fn from_agent(self) -> bool {
        matches!(self, Self::Allocated | Self::Cached)
    }

    /// The columns shown: all, or without the agent's when `agents` is false.
    pub fn shown(agents: bool) -> impl Iterator<Item = Self> {
        Self::ALL
            .into_iter()
            .filter(move |c| agents || !c.from_agent())
    }

    /// The shown column after this one (wraps); `agents`: whether the agent's are shown.
    #[must_use]
    pub fn next(self, agents: bool) -> Self {
        let shown: Vec<Self> = Self::shown(agents).collect();
        let i = shown.iter().position(|&c| c == self).unwrap_or(0);
        shown[(i + 1) % shown.len()]
    }

    /// The shown column before this one (wraps).
    #[must_use]
    pub fn prev(self, agents: bool) -> Self {
        let shown: Vec<Self> = Self::shown(agents).collect();
        let i = shown.iter().position(|&c| c == self).unwrap_or(0);
        shown[(i + shown.len() - 1) % shown.len()]
    }
}

/// Whether the agent's columns are shown: when some row has a figure from an agent (as
/// `ps` and `status` show theirs), so a machine without agents keeps the table it had.
pub fn agent_columns(rows: &[Row]) -> bool {
    rows.iter()
        .any(|r| r.allocated_bytes.is_some() || r.cached_bytes.is_some())
}

/// `(x offset, width)` of each shown column in a table `width` cells wide (`agents`: with
/// the agent's columns); one space between columns, the command gets the rest.
pub fn column_spans(width: u16, agents: bool) -> Vec<(Column, u16, u16)> {
    spans(width, agents, false)
}

/// The columns of `rows` laid out in `width`: the agent's when a row has a figure, and a
/// PID column wide enough for `host:PID` when a row's PID is an unmapped host PID.
pub fn column_spans_of(width: u16, rows: &[Row]) -> Vec<(Column, u16, u16)> {
    spans(
        width,
        agent_columns(rows),
        rows.iter().any(|r| r.flags.host_pid),
    )
}

fn spans(width: u16, agents: bool, host_pids: bool) -> Vec<(Column, u16, u16)> {
    let mut x = 0u16;
    let mut out = Vec::with_capacity(Column::ALL.len());
    for column in Column::shown(agents) {
        let own = match column {
            // `host:` and seven digits (Linux's largest PID, 4194304).
            Column::Pid if host_pids => Some(12),
            _ => column.width(),
        };
        let w = own.unwrap_or_else(|| width.saturating_sub(x));
        let w = w.min(width.saturating_sub(x));
        out.push((column, x, w));
        x = x.saturating_add(w).saturating_add(1);
    }
    out
}

/// How long a process has not used the GPU, as far as `top` saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// It used the GPU in the last sample.
    Active,
    /// Idle for this long (it was seen active before).
    For(i64),
    /// Idle for at least this long: idle in every sample since `top` first saw it.
    AtLeast(i64),
}

impl Idle {
    fn ms(self) -> i64 {
        match self {
            Self::Active => 0,
            Self::For(ms) | Self::AtLeast(ms) => ms,
        }
    }
}

/// What the flags column says about a row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags {
    /// The analysis calls it a leak.
    pub leak: bool,
    /// Its agent reported a CUDA out-of-memory error (the detail pane says its cause).
    pub oom: bool,
    /// The analysis calls it an idle holder.
    pub idle_holder: bool,
    /// A zombie (exited, not reaped).
    pub zombie: bool,
    /// Not visible in this PID namespace.
    pub hidden: bool,
    /// Its PID is the host's (NVML's) and nothing here maps it to this PID namespace: shown
    /// as `host:PID`, and neither killed nor reclaimed from here (the number may be any
    /// process's here).
    pub host_pid: bool,
}

impl Flags {
    /// `L` leak, `O` out of memory, `I` idle holder, `Z` zombie, `H` hidden (not
    /// visible here).
    pub fn text(self) -> String {
        let mut s = String::new();
        for (on, c) in [
            (self.leak, 'L'),
            (self.oom, 'O'),
            (self.idle_holder, 'I'),
            (self.zombie, 'Z'),
            (self.hidden, 'H'),
        ] {
            if on {
                s.push(c);
            }
        }
        s
    }

    fn weight(self) -> u8 {
        u8::from(self.oom) * 16
            + u8::from(self.leak) * 8
            + u8::from(self.idle_holder) * 4
            + u8::from(self.zombie) * 2
            + u8::from(self.hidden)
    }
}

/// Which row: a process on one GPU, or a process shown only as a parent in the tree.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RowKey {
    /// The process.
    pub pid: u32,
    /// The GPU's UUID; `None` for a parent that holds no GPU memory.
    pub uuid: Option<String>,
}

/// One line of the process table.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Identity of the row (selection follows it across refreshes).
    pub key: RowKey,
    /// `0`, `1`, `0/g1` for a MIG instance; empty for a parent row.
    pub gpu: String,
    /// The GPU's index, for sorting.
    pub gpu_index: Option<u32>,
    /// Owner.
    pub user: Option<String>,
    /// GPU memory held.
    pub used_bytes: Option<u64>,
    /// Bytes in live tensors, as its agent says; `None` without an agent.
    pub allocated_bytes: Option<u64>,
    /// The framework's cache, as its agent says; `None` without an agent.
    pub cached_bytes: Option<u64>,
    /// Change per minute.
    pub delta_per_min: Option<i64>,
    /// CPU percent.
    pub cpu_percent: Option<f32>,
    /// Idle time.
    pub idle: Option<Idle>,
    /// Flags.
    pub flags: Flags,
    /// Command line or the driver's name.
    pub command: String,
    /// Tree drawing before the command (`├─ `), empty in the flat view.
    pub tree_prefix: String,
}

impl Row {
    /// A row for a process that holds no GPU memory (a parent in the tree).
    pub fn parent(host: &HostProcess) -> Self {
        Self {
            key: RowKey {
                pid: host.pid,
                uuid: None,
            },
            gpu: String::new(),
            gpu_index: None,
            user: host.user.clone(),
            used_bytes: None,
            allocated_bytes: None,
            cached_bytes: None,
            delta_per_min: None,
            cpu_percent: host.cpu_percent,
            idle: None,
            flags: Flags {
                zombie: host.is_zombie(),
                ..Flags::default()
            },
            command: host.command.clone(),
            tree_prefix: String::new(),
        }
    }

    /// Whether the row is a GPU process (not only a parent in the tree).
    pub fn holds_gpu(&self) -> bool {
        self.key.uuid.is_some()
    }

    fn matches(&self, needle: &str) -> bool {
        needle.is_empty()
            || self.key.pid.to_string().contains(needle)
            || self
                .user
                .as_deref()
                .is_some_and(|u| u.to_lowercase().contains(needle))
            || self.command.to_lowercase().contains(needle)
            || (!self.gpu.is_empty() && format!("gpu {}", self.gpu).contains(needle))
    }
}

/// How the table is ordered and filtered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableView {
    /// Sort column.
    pub sort: Column,
    /// Largest first.
    pub descending: bool,
    /// Case-insensitive text that a row's PID, user, command or `gpu N` must contain.
    pub filter: String,
    /// Parents and children instead of a flat list.
    pub tree: bool,
}

impl Default for TableView {
    fn default() -> Self {
        Self {
            sort: Column::Memory,
            descending: true,
            filter: String::new(),
            tree: false,
        }
    }
}

impl TableView {
    /// Sorts on `column`; on the current column, reverses the order.
    pub fn sort_by(&mut self, column: Column) {
        if self.sort == column {
            self.descending = !self.descending;
        } else {
            self.sort = column;
            self.descending = column.descending_first();
        }
    }
}

fn cmp_some<T: PartialOrd>(a: Option<T>, b: Option<T>) -> Option<Ordering> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.partial_cmp(&b).unwrap_or(Ordering::Equal)),
        _ => None,
    }
}

/// The order of two rows on `view`'s column; unknown values last either way, ties by PID
/// and GPU.
pub fn compare(a: &Row, b: &Row, view: &TableView) -> Ordering {
    let known = match view.sort {
        Column::Pid => Some(a.key.pid.cmp(&b.key.pid)),
        Column::User => cmp_some(a.user.as_deref(), b.user.as_deref()),
        Column::Gpu => cmp_some(a.gpu_index, b.gpu_index).map(|o| o.then(a.gpu.cmp(&b.gpu))),
        Column::Memory => cmp_some(a.used_bytes, b.used_bytes),
        Column::Allocated => cmp_some(a.allocated_bytes, b.allocated_bytes),
        Column::Cached => cmp_some(a.cached_bytes, b.cached_bytes),
        Column::Delta => cmp_some(a.delta_per_min, b.delta_per_min),
        Column::Cpu => cmp_some(a.cpu_percent, b.cpu_percent),
        Column::Idle => cmp_some(a.idle.map(Idle::ms), b.idle.map(Idle::ms)),
        Column::Flags => Some(a.flags.weight().cmp(&b.flags.weight())),
        Column::Command => Some(a.command.cmp(&b.command)),
    };
    let primary = match known {
        Some(o) if view.descending => o.reverse(),
        Some(o) => o,
        None => {
            let a_known = !is_unknown(a, view.sort);
            let b_known = !is_unknown(b, view.sort);
            b_known.cmp(&a_known)
        }
    };
    primary
        .then(a.key.pid.cmp(&b.key.pid))
        .then(a.gpu_index.cmp(&b.gpu_index))
        .then(a.key.uuid.cmp(&b.key.uuid))
}

fn is_unknown(row: &Row, column: Column) -> bool {
    match column {
        Column::User => row.user.is_none(),
        Column::Gpu => row.gpu_index.is_none(),
        Column::Memory => row.used_bytes.is_none(),
        Column::Allocated => row.allocated_bytes.is_none(),
        Column::Cached => row.cached_bytes.is_none(),
        Column::Delta => row.delta_per_min.is_none(),
        Column::Cpu => row.cpu_percent.is_none(),
        Column::Idle => row.idle.is_none(),
        Column::Pid | Column::Flags | Column::Command => false,
    }
}

/// The rows to show, in order: `gpu_rows` (one per process per GPU) filtered and sorted,
/// or, in the tree view, arranged under their parents (taken from `hosts`; a parent that
/// holds no GPU memory gets a row of its own).
pub fn arrange(
    gpu_rows: Vec<Row>,
    hosts: &BTreeMap<u32, HostProcess>,
    view: &TableView,
) -> Vec<Row> {
    let needle = view.filter.to_lowercase();
    let mut rows: Vec<Row> = gpu_rows
        .into_iter()
        .filter(|r| r.matches(&needle))
        .collect();
    rows.sort_by(|a, b| compare(a, b, view));
    if !view.tree {
        return rows;
    }

    // Nodes: the PIDs of the rows and their ancestors.
    let mut by_pid: BTreeMap<u32, Vec<Row>> = BTreeMap::new();
    let mut order: Vec<u32> = Vec::new();
    for row in rows {
        let pid = row.key.pid;
        if !by_pid.contains_key(&pid) {
            order.push(pid);
        }
        by_pid.entry(pid).or_default().push(row);
    }
    let mut nodes: BTreeSet<u32> = by_pid.keys().copied().collect();
    for &pid in by_pid.keys() {
        let mut cur = hosts.get(&pid).and_then(|h| h.ppid);
        for _ in 0..64 {
            let Some(p) = cur.filter(|p| hosts.contains_key(p)) else {
                break;
            };
            if !nodes.insert(p) {
                break;
            }
            cur = hosts[&p].ppid;
        }
    }
    // Parents that hold no GPU memory sort after the GPU rows (by PID).
    for &pid in &nodes {
        if let std::collections::btree_map::Entry::Vacant(e) = by_pid.entry(pid) {
            if let Some(host) = hosts.get(&pid) {
                e.insert(vec![Row::parent(host)]);
                order.push(pid);
            }
        }
    }
    // A parent ranks with its best-placed descendant, so the subtree holding the top row
    // comes first.
    let mut rank: HashMap<u32, usize> = order.iter().enumerate().map(|(i, &p)| (p, i)).collect();
    let parent_of = |pid: u32| -> Option<u32> {
        hosts
            .get(&pid)
            .and_then(|h| h.ppid)
            .filter(|p| nodes.contains(p) && *p != pid)
    };
    for (i, &pid) in order.iter().enumerate() {
        let mut cur = parent_of(pid);
        for _ in 0..64 {
            let Some(p) = cur else { break };
            let r = rank.entry(p).or_insert(i);
            *r = (*r).min(i);
            cur = parent_of(p);
        }
    }
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let mut roots = Vec::new();
    for &pid in &nodes {
        match parent_of(pid) {
            Some(parent) => children.entry(parent).or_default().push(pid),
            None => roots.push(pid),
        }
    }
    let by_rank = |list: &mut Vec<u32>| list.sort_by_key(|p| (rank.get(p).copied(), *p));
    by_rank(&mut roots);
    for list in children.values_mut() {
        by_rank(list);
    }
    // Nodes in a parent cycle have no root; they start trees of their own at the end.
    let mut starts = roots;
    let mut rest: Vec<u32> = nodes.iter().copied().collect();
    by_rank(&mut rest);
    starts.extend(rest);

    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for start in starts {
        let mut stack: Vec<(u32, String, String)> = vec![(start, String::new(), String::new())];
        while let Some((pid, prefix, child_indent)) = stack.pop() {
            if !seen.insert(pid) {
                continue;
            }
            for mut row in by_pid.remove(&pid).unwrap_or_default() {
                row.tree_prefix.clone_from(&prefix);
                out.push(row);
            }
            let kids: Vec<u32> = children
                .get(&pid)
                .map(|k| k.iter().copied().filter(|k| !seen.contains(k)).collect())
                .unwrap_or_default();
            for (i, &kid) in kids.iter().enumerate().rev() {
                let last = i + 1 == kids.len();
                let branch = if last { "└─ " } else { "├─ " };
                let more = if last { "   " } else { "│  " };
                stack.push((
                    kid,
                    format!("{child_indent}{branch}"),
                    format!("{child_indent}{more}"),
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: u32, gpu: u32, mem: Option<u64>, command: &str) -> Row {
        Row {
            key: RowKey {
                pid,
                uuid: Some(format!("GPU-{gpu}")),
            },
            gpu: gpu.to_string(),
            gpu_index: Some(gpu),
            user: Some(if pid % 2 == 0 { "alice" } else { "bob" }.into()),
            used_bytes: mem,
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

    fn host(pid: u32, ppid: u32, command: &str) -> (u32, HostProcess) {
        (
            pid,
            HostProcess {
                pid,
                ppid: Some(ppid),
                user: Some("alice".into()),
                command: command.into(),
                state: Some('S'),
                start_time_ticks: Some(1),
                started_at_unix_ms: None,
                cpu_percent: None,
                cpu_time_ms: None,
                ..HostProcess::default()
            },
        )
    }

    fn pids(rows: &[Row]) -> Vec<u32> {
        rows.iter().map(|r| r.key.pid).collect()
    }

    #[test]
    fn sorts_by_memory_then_reverses_and_unknowns_stay_last() {
        let rows = vec![
            row(1, 0, Some(10), "a"),
            row(2, 0, None, "b"),
            row(3, 0, Some(30), "c"),
        ];
        let mut view = TableView::default();
        assert_eq!(
            pids(&arrange(rows.clone(), &BTreeMap::new(), &view)),
            [3, 1, 2]
        );
        view.sort_by(Column::Memory);
        assert!(!view.descending);
        assert_eq!(
            pids(&arrange(rows.clone(), &BTreeMap::new(), &view)),
            [1, 3, 2]
        );
        view.sort_by(Column::Command);
        assert!(!view.descending, "text sorts A to Z first");
        assert_eq!(pids(&arrange(rows, &BTreeMap::new(), &view)), [1, 2, 3]);
    }

    #[test]
    fn filter_matches_pid_user_command_and_gpu() {
        let rows = vec![
            row(101, 0, Some(1), "python train.py"),
            row(202, 1, Some(1), "vllm serve"),
        ];
        let arranged = |f: &str| {
            let view = TableView {
                filter: f.into(),
                ..TableView::default()
            };
            pids(&arrange(rows.clone(), &BTreeMap::new(), &view))
        };
        assert_eq!(arranged("TRAIN"), [101]);
        assert_eq!(arranged("202"), [202]);
        assert_eq!(arranged("bob"), [101]);
        assert_eq!(arranged("gpu 1"), [202]);
        assert_eq!(arranged("nothing"), Vec::<u32>::new());
    }

    #[test]
    fn tree_puts_children_under_parents_with_non_gpu_ancestors() {
        // bash(10) -> torchrun(11) -> workers 12, 13 on GPUs; 14 is alone under init.
        let hosts: BTreeMap<u32, HostProcess> = [
            host(10, 1, "bash"),
            host(11, 10, "torchrun"),
            host(12, 11, "worker 0"),
            host(13, 11, "worker 1"),
            host(14, 1, "other"),
        ]
        .into_iter()
        .collect();
        let rows = vec![
            row(12, 0, Some(5), "worker 0"),
            row(13, 1, Some(9), "worker 1"),
            row(14, 0, Some(7), "other"),
        ];
        let view = TableView {
            tree: true,
            ..TableView::default()
        };
        let out = arrange(rows, &hosts, &view);
        let lines: Vec<String> = out
            .iter()
            .map(|r| format!("{}{} {}", r.tree_prefix, r.key.pid, r.command))
            .collect();
        assert_eq!(
            lines,
            [
                "10 bash",
                "└─ 11 torchrun",
                "   ├─ 13 worker 1",
                "   └─ 12 worker 0",
                "14 other",
            ]
        );
        assert!(!out[1].holds_gpu());
        assert!(out[3].holds_gpu());
    }

    #[test]
    fn tree_survives_a_parent_cycle() {
        let hosts: BTreeMap<u32, HostProcess> =
            [host(20, 21, "a"), host(21, 20, "b")].into_iter().collect();
        let view = TableView {
            tree: true,
            ..TableView::default()
        };
        let out = arrange(vec![row(20, 0, Some(1), "a")], &hosts, &view);
        // Neither is a root in a cycle; nothing is lost and nothing loops.
        assert_eq!(pids(&out), [20, 21]);
        assert!(out[0].holds_gpu());
    }

    #[test]
    fn column_spans_fill_the_width() {
        let spans = column_spans(80, false);
        let (col, x, w) = *spans.last().unwrap();
        assert_eq!(col, Column::Command);
        assert_eq!(x + w, 80);
        assert!(w >= 20);
        assert_eq!(Column::Pid.next(false), Column::User);
        assert_eq!(Column::Pid.prev(false), Column::Command);
    }

    #[test]
    fn flags_text() {
        let f = Flags {
            leak: true,
            hidden: true,
            ..Flags::default()
        };
        assert_eq!(f.text(), "LH");
        assert_eq!(Flags::default().text(), "");
    }
}
