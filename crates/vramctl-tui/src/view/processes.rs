//! The process table and the detail pane of the selected process.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::Span;
use ratatui::widgets::{Block, Widget};

use vramctl_core::command_line::abbreviate;
use vramctl_core::untrusted::escape;

use super::{chart, put};
use crate::app::{App, owner_totals};
use crate::format;
use crate::memory_series::SeriesKey;
use crate::table::{Column, Idle, Row, column_spans_of};
use vramctl_observe::agent_ooms::{OomState, ProcessOoms};
use vramctl_observe::owners::OwnerKey;

/// The text of one cell in a column `width` characters wide.
fn cell(row: &Row, column: Column, width: u16) -> String {
    match column {
        Column::Pid if row.flags.host_pid => format!("host:{}", row.key.pid),
        Column::Pid => row.key.pid.to_string(),
        Column::User => row.user.clone().unwrap_or_else(|| "-".to_owned()),
        Column::Gpu => row.gpu.clone(),
        Column::Memory => {
            if row.holds_gpu() {
                format::opt_bytes(row.used_bytes)
            } else {
                String::new()
            }
        }
        // Blank without an agent: nothing known, not 0.
        Column::Allocated => row.allocated_bytes.map(format::bytes).unwrap_or_default(),
        Column::Cached => row.cached_bytes.map(format::bytes).unwrap_or_default(),
        Column::Delta => row
            .delta_per_min
            .map_or_else(|| "-".to_owned(), format::signed_bytes),
        Column::Cpu => row
            .cpu_percent
            .map_or_else(|| "-".to_owned(), |c| format!("{c:.0}")),
        Column::Idle => match row.idle {
            None => "-".to_owned(),
            Some(Idle::Active) => "0s".to_owned(),
            Some(Idle::For(ms)) => format::duration_ms(ms),
            Some(Idle::AtLeast(ms)) => format!("≥{}", format::duration_ms(ms)),
        },
        Column::Flags => row.flags.text(),
        Column::Command => {
            // Shortened as everywhere else (interpreter and script first), in the room the
            // tree prefix leaves.
            let room = usize::from(width).saturating_sub(row.tree_prefix.chars().count());
            format!("{}{}", row.tree_prefix, abbreviate(&row.command, room))
        }
    }
}

/// `text` fitted into `width`, escaped first (a user or container name is another
/// user's text; the command is escaped by `abbreviate`).
fn aligned(text: &str, width: u16, right: bool) -> String {
    let w = usize::from(width);
    let text = format::fit(&escape(text), w);
    if right {
        format!("{text:>w$}")
    } else {
        format!("{text:<w$}")
    }
}

/// The table grouped by owner (`o`, `top --by`): per GPU and owner the number of processes
/// and their memory, the rows of `ps --by` (`crate::app::owner_totals`), biggest first
/// within each GPU; the owner last, escaped and cut to the width.
pub fn draw_owners(app: &App, key: OwnerKey, area: Rect, buf: &mut Buffer) {
    let t = app.theme;
    buf.set_style(Rect::new(area.x, area.y, area.width, 1), t.header());
    let header = format!(
        "{:>3} {:>5} {:>10}  {}",
        "GPU",
        "PROCS",
        "MEMORY",
        key.as_str().to_ascii_uppercase()
    );
    put(buf, area.x, area.y, area.right(), &[(&header, t.header())]);
    let body = Rect::new(
        area.x,
        area.y + 1,
        area.width,
        area.height.saturating_sub(1),
    );
    let Some(observation) = &app.latest else {
        if body.height > 0 {
            put(
                buf,
                body.x + 1,
                body.y,
                body.right(),
                &[("waiting for the first sample…", t.dim())],
            );
        }
        return;
    };
    let rows = owner_totals(key, observation, app.devices.as_ref());
    if rows.is_empty() && body.height > 0 {
        put(
            buf,
            body.x + 1,
            body.y,
            body.right(),
            &[("no process holds GPU memory", t.dim())],
        );
    }
    for (i, total) in rows.iter().take(usize::from(body.height)).enumerate() {
        let y = body.y + u16::try_from(i).unwrap_or(0);
        let numbers = format!(
            "{:>3} {:>5} {:>10}  ",
            total.gpu,
            total.processes,
            format::opt_bytes(total.used_bytes)
        );
        let room = usize::from(body.width).saturating_sub(numbers.chars().count());
        let label = format::fit(&escape(total.display_label(key)), room);
        let style = if total.mapped { t.text() } else { t.dim() };
        put(
            buf,
            body.x,
            y,
            body.right(),
            &[(&numbers, t.text()), (&label, style)],
        );
    }
}

pub fn draw_table(app: &App, area: Rect, buf: &mut Buffer) {
    let t = app.theme;
    let spans = column_spans_of(area.width, &app.table.rows);
    // Header, with the sort column marked.
    buf.set_style(Rect::new(area.x, area.y, area.width, 1), t.header());
    for &(column, x, w) in &spans {
        let mut title = column.title().to_owned();
        if column == app.table.view.sort {
            title.push(if app.table.view.descending {
                '▼'
            } else {
                '▲'
            });
        }
        let text = aligned(&title, w, column.right_aligned());
        buf.set_stringn(area.x + x, area.y, &text, usize::from(w), t.header());
    }
    if app.table.view.tree {
        let mark = " tree ";
        let x = area.right().saturating_sub(6);
        buf.set_stringn(x, area.y, mark, 6, t.header());
    }

    let body = Rect::new(
        area.x,
        area.y + 1,
        area.width,
        area.height.saturating_sub(1),
    );
    if app.table.rows.is_empty() {
        let text = if app.latest.is_none() {
            "waiting for the first sample…".to_owned()
        } else if !app.table.view.filter.is_empty() {
            format!("no process matches '{}'", app.table.view.filter)
        } else {
            "no process holds GPU memory".to_owned()
        };
        if body.height > 0 {
            put(buf, body.x + 1, body.y, body.right(), &[(&text, t.dim())]);
        }
        return;
    }
    let selected = app.table.selected_index();
    for (i, row) in app
        .table
        .rows
        .iter()
        .enumerate()
        .skip(app.table.scroll)
        .take(usize::from(body.height))
    {
        let y = body.y + u16::try_from(i - app.table.scroll).unwrap_or(0);
        let base = if row.holds_gpu() { t.text() } else { t.dim() };
        for &(column, x, w) in &spans {
            let style = cell_style(app, row, column, base);
            let text = aligned(&cell(row, column, w), w, column.right_aligned());
            buf.set_stringn(area.x + x, y, &text, usize::from(w), style);
        }
        if selected == Some(i) {
            buf.set_style(Rect::new(area.x, y, area.width, 1), t.selected());
        }
    }
}

fn cell_style(app: &App, row: &Row, column: Column, base: Style) -> Style {
    let t = app.theme;
    match column {
        Column::Flags if row.flags.leak || row.flags.oom || row.flags.zombie => t.bad(),
        Column::Flags if row.flags.idle_holder => t.warn(),
        Column::Delta => match row.delta_per_min {
            Some(d) if d > 0 => t.warn(),
            Some(d) if d < 0 => t.good(),
            _ => base,
        },
        Column::Pid | Column::User | Column::Idle | Column::Cpu | Column::Gpu => {
            if row.holds_gpu() { base } else { t.dim() }
        }
        _ => base,
    }
}

pub fn draw_detail(app: &App, area: Rect, buf: &mut Buffer) {
    let t = app.theme;
    let Some(row) = app.selected_row() else {
        return;
    };
    let Some(obs) = &app.latest else {
        return;
    };
    let pid = row.key.pid;
    let host = obs.hosts.get(&pid);
    let chart_w = area.width * 11 / 20;
    let chart_area = Rect::new(area.x, area.y, chart_w, area.height);
    let text_area = Rect::new(area.x + chart_w, area.y, area.width - chart_w, area.height);

    match &row.key.uuid {
        Some(uuid) => {
            let key = SeriesKey::Process {
                uuid: uuid.clone(),
                pid,
            };
            let title = format!(
                " PID {pid} on GPU {} · last {} ",
                row.gpu,
                app.charts.zoom.label()
            );
            chart::draw_series(app, &title, &app.chart_points(&key), None, chart_area, buf);
        }
        None => {
            let block = Block::bordered()
                .border_style(t.dim())
                .title(Span::styled(format!(" PID {pid} "), t.heading()));
            let inner = block.inner(chart_area);
            block.render(chart_area, buf);
            put(
                buf,
                inner.x + 1,
                inner.y,
                inner.right(),
                &[("holds no GPU memory (a parent in the tree)", t.dim())],
            );
        }
    }

    let block = Block::bordered()
        .border_style(t.dim())
        .title(Span::styled(" process ", t.heading()));
    let inner = block.inner(text_area);
    block.render(text_area, buf);
    let mut lines: Vec<Vec<(String, Style)>> = Vec::new();
    let label = |s: &str| (format!("{s:<8} "), t.dim());
    lines.push(vec![label("command"), (row.command.clone(), t.text())]);
    lines.push(vec![
        label("user"),
        (row.user.clone().unwrap_or_else(|| "-".into()), t.text()),
    ]);
    match host {
        Some(h) => {
            let started = h
                .started_at_unix_ms
                .map_or_else(|| "-".to_owned(), |t| format::datetime(&app.time_zone, t));
            lines.push(vec![label("started"), (started, t.text())]);
            let state = h.state.map_or_else(|| "-".to_owned(), |c| c.to_string());
            let parent = h.ppid.map_or_else(|| "-".to_owned(), |p| p.to_string());
            lines.push(vec![
                label("state"),
                (format!("{state}  parent {parent}"), t.text()),
            ]);
            if let Some(cgroup) = &h.cgroup {
                // Any process may name its own sub-cgroups: escaped.
                lines.push(vec![
                    label("cgroup"),
                    (escape(cgroup).into_owned(), t.text()),
                ]);
            }
        }
        None => {
            let text = "not visible in this PID namespace: /proc has no such process";
            for line in super::wrap(text, usize::from(inner.width)) {
                lines.push(vec![(line, t.warn())]);
            }
        }
    }
    if row.holds_gpu() {
        let delta = row.delta_per_min.map_or_else(
            || "-".to_owned(),
            |d| format!("{}/min", format::signed_bytes(d)),
        );
        lines.push(vec![
            label("memory"),
            (
                format!(
                    "{} on GPU {}  Δ {delta}",
                    format::opt_bytes(row.used_bytes),
                    row.gpu
                ),
                t.text(),
            ),
        ]);
        if row.allocated_bytes.is_some() || row.cached_bytes.is_some() {
            lines.push(vec![
                label("agent"),
                (
                    format!(
                        "{} allocated  {} cached (reclaimable)",
                        format::opt_bytes(row.allocated_bytes),
                        format::opt_bytes(row.cached_bytes),
                    ),
                    t.text(),
                ),
            ]);
        }
        if let Some(oom) = obs.ooms.get(pid) {
            oom_lines(app, oom, usize::from(inner.width), &mut lines);
        }
        let verdict = row
            .key
            .uuid
            .as_deref()
            .and_then(|uuid| obs.verdicts.get(pid, uuid));
        match verdict {
            Some(v) => {
                let style = match v.kind {
                    vramctl_observe::verdict::VerdictKind::Leak => t.bad(),
                    vramctl_observe::verdict::VerdictKind::IdleHolder => t.warn(),
                    _ => t.text(),
                };
                lines.push(vec![label("verdict"), (v.kind.as_str().to_owned(), style)]);
                for line in super::wrap(&v.summary, usize::from(inner.width)) {
                    lines.push(vec![(line, t.text())]);
                }
                for (name, value) in &v.numbers {
                    lines.push(vec![
                        (format!("  {name:<14} "), t.dim()),
                        (value.clone(), t.text()),
                    ]);
                }
            }
            None if app.analysis => {
                lines.push(vec![label("verdict"), ("none yet".to_owned(), t.dim())]);
            }
            None => lines.push(vec![
                label("verdict"),
                ("none: the leak analysis is not running".to_owned(), t.dim()),
            ]),
        }
    }
    for (i, line) in lines.iter().take(usize::from(inner.height)).enumerate() {
        let y = inner.y + u16::try_from(i).unwrap_or(0);
        let segments: Vec<(&str, Style)> = line.iter().map(|(s, st)| (s.as_str(), *st)).collect();
        put(buf, inner.x, y, inner.right(), &segments);
    }
}

/// The detail pane's lines of a process's OOMs: how many, since when, the first one's
/// cause and fix (or that it is being classified, or why it cannot be), its reason.
fn oom_lines(app: &App, oom: &ProcessOoms, width: usize, lines: &mut Vec<Vec<(String, Style)>>) {
    let t = app.theme;
    let label = |s: &str| (format!("{s:<8} "), t.dim());
    let times = if oom.count == 1 {
        "1 OOM".to_owned()
    } else {
        format!("{} OOMs", oom.count)
    };
    let at = format::clock(
        &app.time_zone,
        oom.oom_at_unix_ms.unwrap_or(oom.seen_at_unix_ms),
    );
    let (cause, style) = match (oom.state, oom.cause.as_deref()) {
        (OomState::Classified, Some(cause)) => (cause.to_owned(), t.bad()),
        (OomState::Classifying, _) => ("classifying…".to_owned(), t.dim()),
        _ => ("cause unknown".to_owned(), t.warn()),
    };
    lines.push(vec![
        label("oom"),
        (format!("{times}, first at {at}: "), t.text()),
        (cause, style),
    ]);
    if oom.state == OomState::Classified {
        // The fix is the classifier's text, built from the process's own snapshot: `wrap`
        // escapes it.
        let fix = oom.fix.as_deref().map_or_else(
            || "none: nothing the process can set avoids it".to_owned(),
            str::to_owned,
        );
        let mut wrapped = super::wrap(&fix, width.saturating_sub(9)).into_iter();
        if let Some(first) = wrapped.next() {
            lines.push(vec![label("fix"), (first, t.text())]);
        }
        for line in wrapped {
            lines.push(vec![(format!("{:9}{line}", ""), t.text())]);
        }
    }
    if let Some(why) = &oom.why {
        for line in super::wrap(why, width) {
            lines.push(vec![(line, t.dim())]);
        }
    }
    if !oom.others_when_seen.is_empty() {
        let others: Vec<String> = oom
            .others_when_seen
            .iter()
            .map(|o| format!("PID {} {}", o.pid, format::bytes(o.used_bytes)))
            .collect();
        let text = format!("beside it then: {}", others.join(", "));
        for line in super::wrap(&text, width) {
            lines.push(vec![(line, t.dim())]);
        }
    }
}
