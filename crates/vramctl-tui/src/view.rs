//! Drawing: pure functions from `&App` into a ratatui buffer. No I/O, no clock, no NVML —
//! everything shown was put into the state by [`App::update`](super::app::App::update).
//!
//! Screen, top to bottom: a header line; one line per GPU and MIG instance (memory bar,
//! utilisation, temperature, power, a sparkline of memory); the memory chart of the focused
//! GPU (when there is room); the process table; the detail pane of the selected process
//! (`Enter`); a footer with keys or a message. Overlays: help (`?`) and the kill dialog.
//! Below 80×24 only a "terminal too small" message is drawn.

mod chart;
mod devices;
mod overlay;
mod processes;

use ratatui::Frame;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use vramctl_core::untrusted::escape;

use super::app::{App, Mode};
use super::format;
use super::layout::{MIN_HEIGHT, MIN_WIDTH};

/// Draws the whole screen.
pub fn render(app: &App, frame: &mut Frame<'_>) {
    let area = frame.area();
    draw(app, area, frame.buffer_mut());
}

/// Draws the whole screen into `buf` (what [`render`] does; benches call it directly).
pub fn draw(app: &App, area: Rect, buf: &mut Buffer) {
    let areas = app.layout_in(area);
    if areas.too_small {
        draw_too_small(area, buf);
        return;
    }
    draw_header(app, areas.header, buf);
    devices::draw(app, areas.devices, buf);
    if let Some(chart) = areas.chart {
        chart::draw_device_chart(app, chart, buf);
    }
    match (areas.table, app.by) {
        (Some(table), Some(key)) => processes::draw_owners(app, key, table, buf),
        (Some(table), None) => processes::draw_table(app, table, buf),
        (None, _) => {}
    }
    // A grouped table has no selected process to detail.
    if let (Some(detail), None) = (areas.detail, app.by) {
        processes::draw_detail(app, detail, buf);
    }
    draw_footer(app, areas.footer, buf);
    if app.help {
        overlay::draw_help(app, area, buf);
    }
    if app.kill.shown() {
        overlay::draw_dialog(app, area, buf);
    }
}

fn draw_too_small(area: Rect, buf: &mut Buffer) {
    let lines = [
        format!("terminal too small: {}×{}", area.width, area.height),
        format!("vramctl top needs at least {MIN_WIDTH}×{MIN_HEIGHT}"),
        "q quits".to_owned(),
    ];
    let top = area.y + area.height.saturating_sub(3) / 2;
    for (i, text) in lines.iter().enumerate() {
        let y = top + u16::try_from(i).unwrap_or(0);
        if y >= area.bottom() {
            break;
        }
        let width = u16::try_from(text.chars().count()).unwrap_or(u16::MAX);
        let x = area.x + area.width.saturating_sub(width) / 2;
        buf.set_stringn(x, y, text, usize::from(area.width), Style::new());
    }
}

/// Writes `segments` left to right from `(x, y)`, cut at `right`; returns the next x.
///
/// Each segment is escaped (`vramctl_core::untrusted`): ratatui drops control characters
/// and zero-width ones such as a bidi override without a trace, so `\x1b[2K` would show
/// as `[2K` and a command line would not read as what it is; escaped, it reads as in
/// `ps` and `status`.
pub(crate) fn put(buf: &mut Buffer, x: u16, y: u16, right: u16, segments: &[(&str, Style)]) -> u16 {
    let mut x = x;
    for (text, style) in segments {
        if x >= right {
            break;
        }
        let text = escape(text);
        let (next, _) = buf.set_stringn(x, y, &text, usize::from(right - x), *style);
        x = next;
    }
    x
}

fn draw_header(app: &App, area: Rect, buf: &mut Buffer) {
    let t = app.theme;
    let mut parts: Vec<(String, Style)> = vec![(" vramctl top ".to_owned(), t.header())];
    match &app.mode {
        Mode::Live { interval, .. } => {
            parts.push((
                format!(" LIVE every {} ", vramctl_core::duration::format(*interval)),
                t.good(),
            ));
            if let Some(now) = app.now_ms() {
                parts.push((
                    format!(
                        "{} {} ",
                        format::clock(&app.time_zone, now),
                        vramctl_core::wall_time::zone_label(&app.time_zone, now)
                    ),
                    t.text(),
                ));
            }
        }
        Mode::Replay(r) => {
            let state = if r.playing { "▶" } else { "⏸" };
            parts.push((format!(" REPLAY {state} {}× ", r.speed()), t.warn()));
            if let Some(now) = app.now_ms() {
                parts.push((
                    format!("{} ", format::datetime(&app.time_zone, now)),
                    t.text(),
                ));
            }
            if let Some((a, b)) = r.range {
                parts.push((
                    format!(
                        "[{} – {}] ",
                        format::clock(&app.time_zone, a),
                        format::clock(&app.time_zone, b)
                    ),
                    t.dim(),
                ));
            }
        }
    }
    if let Some(driver) = app
        .latest
        .as_ref()
        .and_then(|o| o.snapshot.driver.driver_version.clone())
    {
        parts.push((format!("driver {driver} "), t.dim()));
    }
    parts.push((format!("zoom {} ", app.charts.zoom.label()), t.dim()));
    if !app.is_replay() && !app.history_source() && app.history_note.is_some() {
        // The charts reach back only to when top started (`?` says why).
        parts.push(("no history db ".to_owned(), t.dim()));
    }
    if app.readonly() {
        parts.push(("read-only ".to_owned(), t.warn()));
    }
    let segments: Vec<(&str, Style)> = parts.iter().map(|(s, st)| (s.as_str(), *st)).collect();
    put(buf, area.x, area.y, area.right(), &segments);
}

fn draw_footer(app: &App, area: Rect, buf: &mut Buffer) {
    let t = app.theme;
    let (x, y, right) = (area.x, area.y, area.right());
    if app.table.filter_editing {
        put(
            buf,
            x,
            y,
            right,
            &[
                ("filter: ", t.key()),
                (&app.table.view.filter, t.text()),
                ("█", t.dim()),
                ("  Enter apply · Esc clear", t.dim()),
            ],
        );
        return;
    }
    if let Some(message) = &app.message {
        put(buf, x, y, right, &[(message, t.warn())]);
        return;
    }
    if let Some(error) = &app.sampler_error {
        put(
            buf,
            x,
            y,
            right,
            &[("sampling stopped: ", t.bad()), (error, t.bad())],
        );
        return;
    }
    let mut keys: Vec<(&str, &str)> = vec![("q", "quit"), ("?", "help")];
    if app.is_replay() {
        keys.extend([
            ("␣", "play"),
            ("←→", "step"),
            ("[]", "±1m"),
            ("+-", "speed"),
        ]);
    }
    keys.extend([
        ("/", "filter"),
        ("s", "sort"),
        ("t", "tree"),
        ("z/Z", "zoom"),
        ("⏎", "details"),
    ]);
    if !app.readonly() && !app.is_replay() {
        keys.push(("K", "kill"));
        // Only where there is something to reclaim through: a process with an agent.
        if crate::table::agent_columns(&app.table.rows) {
            keys.push(("R", "reclaim"));
        }
    }
    let mut segments: Vec<(&str, Style)> = Vec::new();
    for (key, what) in &keys {
        segments.push((key, t.key()));
        segments.push((" ", t.text()));
        segments.push((what, t.dim()));
        segments.push(("  ", t.text()));
    }
    let mut x = put(buf, x, y, right, &segments);
    if !app.table.view.filter.is_empty() {
        x = put(buf, x, y, right, &[("filter: ", t.key())]);
        put(buf, x, y, right, &[(&app.table.view.filter, t.warn())]);
    }
}

/// `text` cut into lines of at most `width` characters, at spaces where it can.
pub(crate) fn wrap(text: &str, width: usize) -> Vec<String> {
    // Escaped before it is measured, as `put` will show it.
    let text = escape(text);
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let mut word = word.to_owned();
        loop {
            let len = line.chars().count();
            let wlen = word.chars().count();
            let sep = usize::from(len > 0);
            if len + sep + wlen <= width {
                if sep == 1 {
                    line.push(' ');
                }
                line.push_str(&word);
                break;
            }
            if len > 0 {
                lines.push(std::mem::take(&mut line));
                continue;
            }
            // A word longer than the line: cut it.
            let head: String = word.chars().take(width).collect();
            word = word.chars().skip(width).collect();
            lines.push(head);
            if word.is_empty() {
                break;
            }
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_at_spaces_and_cut_long_words() {
        assert_eq!(
            wrap("sends SIGTERM then SIGKILL", 13),
            ["sends SIGTERM", "then SIGKILL"]
        );
        assert_eq!(wrap("abcdefghij", 4), ["abcd", "efgh", "ij"]);
        assert_eq!(wrap("", 4), [""]);
    }
}
