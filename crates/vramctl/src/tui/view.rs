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

use super::app::{App, KillResult, Mode};
use super::format;

pub use overlay::dialog_buttons;

/// The smallest terminal the screen is laid out for.
pub const MIN_WIDTH: u16 = 80;
/// See [`MIN_WIDTH`].
pub const MIN_HEIGHT: u16 = 24;

/// Where each part of the screen goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Areas {
    /// The whole screen.
    pub screen: Rect,
    /// Below the minimum size: nothing but a message.
    pub too_small: bool,
    /// The header line.
    pub header: Rect,
    /// One line per GPU / MIG instance.
    pub devices: Rect,
    /// The focused GPU's memory chart.
    pub chart: Option<Rect>,
    /// The process table, header line included.
    pub table: Option<Rect>,
    /// The selected process's pane.
    pub detail: Option<Rect>,
    /// The footer line.
    pub footer: Rect,
}

impl Areas {
    /// How many table rows fit below the table's header.
    pub fn table_body_rows(&self) -> usize {
        self.table
            .map_or(0, |t| usize::from(t.height.saturating_sub(1)))
    }
}

/// The layout for the app's terminal size.
pub fn layout(app: &App) -> Areas {
    layout_in(Rect::new(0, 0, app.size.0, app.size.1), app)
}

/// The layout inside `screen`.
pub fn layout_in(screen: Rect, app: &App) -> Areas {
    let line = |y: u16, height: u16| Rect::new(screen.x, y, screen.width, height);
    if screen.width < MIN_WIDTH || screen.height < MIN_HEIGHT {
        return Areas {
            screen,
            too_small: true,
            header: line(screen.y, 0),
            devices: line(screen.y, 0),
            chart: None,
            table: None,
            detail: None,
            footer: line(screen.y, 0),
        };
    }
    let header = line(screen.y, 1);
    let footer = line(screen.bottom() - 1, 1);
    let body = screen.height - 2;
    let wanted = u16::try_from(devices::line_count(app))
        .unwrap_or(u16::MAX)
        .max(1);
    let device_rows = wanted.min(body / 2);
    let devices = line(screen.y + 1, device_rows);
    let mut rest = body - device_rows;
    let mut y = devices.bottom();

    let mut chart = None;
    let mut detail = None;
    if app.detail && app.selected.is_some() {
        let h = (rest / 2).clamp(7, 14);
        detail = Some(line(y + rest - h, h));
        rest -= h;
    } else if rest >= 19 {
        let h = (rest / 3).clamp(7, 12);
        chart = Some(line(y, h));
        y += h;
        rest -= h;
    }
    let table = Some(line(y, rest));
    Areas {
        screen,
        too_small: false,
        header,
        devices,
        chart,
        table,
        detail,
        footer,
    }
}

/// Draws the whole screen.
pub fn render(app: &App, frame: &mut Frame<'_>) {
    let area = frame.area();
    draw(app, area, frame.buffer_mut());
}

/// Draws the whole screen into `buf` (what [`render`] does; benches call it directly).
pub fn draw(app: &App, area: Rect, buf: &mut Buffer) {
    let areas = layout_in(area, app);
    if areas.too_small {
        draw_too_small(area, buf);
        return;
    }
    draw_header(app, areas.header, buf);
    devices::draw(app, areas.devices, buf);
    if let Some(chart) = areas.chart {
        chart::draw_device_chart(app, chart, buf);
    }
    if let Some(table) = areas.table {
        processes::draw_table(app, table, buf);
    }
    if let Some(detail) = areas.detail {
        processes::draw_detail(app, detail, buf);
    }
    draw_footer(app, areas.footer, buf);
    if app.help {
        overlay::draw_help(app, area, buf);
    }
    if app.dialog_shown() {
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
pub(crate) fn put(buf: &mut Buffer, x: u16, y: u16, right: u16, segments: &[(&str, Style)]) -> u16 {
    let mut x = x;
    for (text, style) in segments {
        if x >= right {
            break;
        }
        let (next, _) = buf.set_stringn(x, y, text, usize::from(right - x), *style);
        x = next;
    }
    x
}

fn draw_header(app: &App, area: Rect, buf: &mut Buffer) {
    let t = app.theme;
    let mut parts: Vec<(String, Style)> = vec![(" vramctl top ".to_owned(), t.header())];
    match &app.mode {
        Mode::Live { interval } => {
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
    parts.push((format!("zoom {} ", app.zoom.label()), t.dim()));
    if !app.is_replay() && !app.history_source && app.history_note.is_some() {
        // The charts reach back only to when top started (`?` says why).
        parts.push(("no history db ".to_owned(), t.dim()));
    }
    if app.readonly {
        parts.push(("read-only ".to_owned(), t.warn()));
    }
    let segments: Vec<(&str, Style)> = parts.iter().map(|(s, st)| (s.as_str(), *st)).collect();
    put(buf, area.x, area.y, area.right(), &segments);
}

fn draw_footer(app: &App, area: Rect, buf: &mut Buffer) {
    let t = app.theme;
    let (x, y, right) = (area.x, area.y, area.right());
    if app.filter_editing {
        put(
            buf,
            x,
            y,
            right,
            &[
                ("filter: ", t.key()),
                (&app.view.filter, t.text()),
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
    if !app.readonly && !app.is_replay() {
        keys.push(("K", "kill"));
    }
    let mut segments: Vec<(&str, Style)> = Vec::new();
    for (key, what) in &keys {
        segments.push((key, t.key()));
        segments.push((" ", t.text()));
        segments.push((what, t.dim()));
        segments.push(("  ", t.text()));
    }
    let mut x = put(buf, x, y, right, &segments);
    if !app.view.filter.is_empty() {
        x = put(buf, x, y, right, &[("filter: ", t.key())]);
        put(buf, x, y, right, &[(&app.view.filter, t.warn())]);
    }
}

/// `text` cut into lines of at most `width` characters, at spaces where it can.
pub(crate) fn wrap(text: &str, width: usize) -> Vec<String> {
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

/// One line for the result of a kill.
pub fn kill_result_text(result: &KillResult) -> String {
    match result {
        KillResult::Freed {
            per_gpu,
            total_bytes,
            escalated,
        } => {
            let how = if *escalated { " (after SIGKILL)" } else { "" };
            let parts: Vec<String> = per_gpu
                .iter()
                .map(|m| format!("{} {}", m.label, format::opt_bytes(m.used_bytes)))
                .collect();
            if parts.is_empty() {
                format!("exited{how}; the driver no longer lists it")
            } else {
                format!(
                    "exited{how}; freed {} ({})",
                    format::bytes(*total_bytes),
                    parts.join(", ")
                )
            }
        }
        KillResult::StillListed => {
            "exited, but the driver still lists its memory (it may be released late)".to_owned()
        }
        KillResult::StillRunning { escalated, state } => {
            let sent = if *escalated { "SIGKILL" } else { "SIGTERM" };
            match state {
                Some('D') => format!(
                    "still running after {sent}: in uninterruptible sleep (D), likely inside the driver"
                ),
                Some(s) => format!("still running after {sent} (state {s})"),
                None => format!("still running after {sent}"),
            }
        }
        KillResult::Refused(reason) => format!("refused: {reason}"),
        KillResult::Failed(reason) => format!("failed: {reason}"),
    }
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
