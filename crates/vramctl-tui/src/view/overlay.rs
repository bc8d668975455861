//! Overlays: the help (`?`) and the kill dialog.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::text::Span;
use ratatui::widgets::{Block, Clear, Widget};

use super::{put, wrap};
use crate::app::App;
use crate::app::kill_flow::{KillDialog, KillResult};
use crate::format;
use crate::kill::{GpuMemory, KillPlan, KillTarget};
use crate::layout::{centered, dialog_area};

const HELP: &[(&str, &str)] = &[
    ("↑ ↓  j k", "select a process (PgUp PgDn Home End g G)"),
    (
        "⏎",
        "details of the selected process: its memory chart, verdict",
    ),
    ("/", "filter by PID, user, command or 'gpu N' (Esc clears)"),
    (
        "s  S",
        "sort by the next / previous column; click a header too",
    ),
    ("r", "reverse the order"),
    ("t", "tree view: processes under their parents"),
    ("o", "memory per user, container, pod, Slurm job; processes"),
    ("z  Z", "zoom the charts in / out (1m 5m 15m 1h 6h 24h)"),
    ("K  Del  F9", "kill the selected process (asks first)"),
    (
        "R",
        "reclaim: the selected process's agent releases its cache",
    ),
    ("?  F1", "this help"),
    ("q  Ctrl-C", "quit"),
    ("", ""),
    ("replay:", ""),
    ("␣", "play / pause"),
    ("← →", "previous / next sample"),
    ("[  ]", "back / forward one minute ({ } ten minutes)"),
    ("b  e", "beginning / end of the recording"),
    ("+  -", "faster / slower"),
    ("", ""),
    (
        "flags:",
        "L leak  O OOM  I idle holder  Z zombie  H not visible here",
    ),
    (
        "Δ/MIN:",
        "memory now minus a minute ago (or since top first saw it)",
    ),
    (
        "IDLE:",
        "time since it last used the GPU (≥: since top saw it)",
    ),
];

pub fn draw_help(app: &App, screen: Rect, buf: &mut Buffer) {
    let t = app.theme;
    let mut lines: Vec<(&str, String)> = HELP.iter().map(|&(k, w)| (k, w.to_owned())).collect();
    if let Some(note) = &app.history_note {
        // Under the descriptions: 76 wide, less the border and the key column.
        for (i, line) in wrap(note, 76 - 2 - 13).into_iter().enumerate() {
            lines.push((if i == 0 { "history:" } else { "" }, line));
        }
    }
    let height = u16::try_from(lines.len()).unwrap_or(u16::MAX) + 2;
    let area = centered(screen, 76, height);
    Clear.render(area, buf);
    let block = Block::bordered().border_style(t.key()).title(Span::styled(
        " vramctl top · keys (any key closes) ",
        t.heading(),
    ));
    let inner = block.inner(area);
    block.render(area, buf);
    for (i, (keys, what)) in lines.iter().take(usize::from(inner.height)).enumerate() {
        let y = inner.y + u16::try_from(i).unwrap_or(0);
        let keys = format!(" {keys:<11} ");
        put(
            buf,
            inner.x,
            y,
            inner.right(),
            &[(&keys, t.key()), (what.as_str(), t.text())],
        );
    }
}

fn memory_line(memory: &[GpuMemory]) -> String {
    if memory.is_empty() {
        return "none listed".to_owned();
    }
    let total: u64 = memory.iter().filter_map(|m| m.used_bytes).sum();
    let parts: Vec<String> = memory
        .iter()
        .map(|m| format!("{} {}", m.label, format::opt_bytes(m.used_bytes)))
        .collect();
    if memory.len() == 1 {
        parts.join("")
    } else {
        format!("{} (total {})", parts.join(", "), format::bytes(total))
    }
}

fn identity_lines(
    plan: Option<&KillPlan>,
    target: &KillTarget,
    tz: &jiff::tz::TimeZone,
) -> Vec<(String, String)> {
    let mut lines = vec![("PID".to_owned(), target.pid.to_string())];
    match plan {
        Some(p) => {
            let started = p
                .started_at_unix_ms
                .map_or_else(|| "-".to_owned(), |t| format::datetime(tz, t));
            lines.push((
                "started".to_owned(),
                format!("{started} (start time {} ticks)", p.start_time_ticks),
            ));
            lines.push((
                "user".to_owned(),
                p.user.clone().unwrap_or_else(|| "-".to_owned()),
            ));
            lines.push(("command".to_owned(), p.command.clone()));
        }
        None => {
            lines.push((
                "user".to_owned(),
                target.user.clone().unwrap_or_else(|| "-".to_owned()),
            ));
            lines.push(("command".to_owned(), target.command.clone()));
        }
    }
    lines.push(("memory".to_owned(), memory_line(&target.memory)));
    lines
}

pub fn draw_dialog(app: &App, screen: Rect, buf: &mut Buffer) {
    let t = app.theme;
    let Some(dialog) = &app.kill.dialog else {
        return;
    };
    let area = dialog_area(screen);
    Clear.render(area, buf);
    let (title, border) = match dialog {
        KillDialog::Planning(_) => (" kill: checking the process ", t.key()),
        KillDialog::Confirm { .. } => (" kill this process? ", t.bad()),
        KillDialog::InProgress(_) => (" kill: signalling ", t.key()),
        KillDialog::Verifying { .. } => (" kill: waiting for the memory ", t.key()),
        KillDialog::Finished {
            result: KillResult::Freed { .. },
            ..
        } => (" kill: done ", t.good()),
        KillDialog::Finished { .. } => (" kill: not done ", t.bad()),
    };
    let block = Block::bordered()
        .border_style(border)
        .title(Span::styled(title, t.heading()));
    let inner = block.inner(area);
    block.render(area, buf);

    let (plan, target) = match dialog {
        KillDialog::Planning(target) | KillDialog::Finished { target, .. } => (None, target),
        KillDialog::Confirm { plan, .. }
        | KillDialog::InProgress(plan)
        | KillDialog::Verifying { plan, .. } => (Some(plan), &plan.target),
    };
    let mut y = inner.y;
    for (name, value) in identity_lines(plan, target, &app.time_zone) {
        if y >= inner.bottom() {
            break;
        }
        let name = format!(" {name:<8} ");
        put(
            buf,
            inner.x,
            y,
            inner.right(),
            &[(&name, t.dim()), (&value, t.text())],
        );
        y += 1;
    }
    y += 1;
    let status: Vec<(String, Style)> = match dialog {
        KillDialog::Planning(target) => vec![(
            format!(
                " checking that process {} is still the one shown…",
                target.pid
            ),
            t.dim(),
        )],
        KillDialog::Confirm { plan, .. } => {
            let mut how = format!(" sends {}", plan.signal);
            if let Some(e) = &plan.escalation {
                how.push_str(&format!(", then {e}"));
            }
            how.push_str("; then checks the memory is released");
            vec![(how, t.text())]
        }
        KillDialog::InProgress(plan) => vec![(
            format!(
                " sent {}; waiting for process {} to exit…",
                plan.signal, plan.target.pid
            ),
            t.dim(),
        )],
        KillDialog::Verifying { samples, .. } => vec![(
            format!(" exited; waiting for the driver to release its memory ({samples} samples)"),
            t.dim(),
        )],
        KillDialog::Finished { result, .. } => {
            let style = if matches!(result, KillResult::Freed { .. }) {
                t.good()
            } else {
                t.bad()
            };
            vec![(format!(" {}", result.text()), style)]
        }
    };
    for (text, style) in &status {
        for line in super::wrap(
            text.trim_start(),
            usize::from(inner.width.saturating_sub(2)),
        ) {
            if y + 1 < inner.bottom() {
                put(buf, inner.x + 1, y, inner.right(), &[(&line, *style)]);
                y += 1;
            }
        }
    }
    let footer_y = area.bottom().saturating_sub(2);
    match dialog {
        KillDialog::Confirm { kill_focused, .. } => {
            if let Some((kill, cancel)) = app.dialog_buttons() {
                let (ks, cs) = if *kill_focused {
                    (t.selected().patch(t.bad()), t.text())
                } else {
                    (t.bad(), t.selected())
                };
                buf.set_stringn(kill.x, kill.y, "[ y  kill ]", usize::from(kill.width), ks);
                buf.set_stringn(
                    cancel.x,
                    cancel.y,
                    "[ n cancel ]",
                    usize::from(cancel.width),
                    cs,
                );
            }
        }
        KillDialog::Finished { .. } => {
            put(
                buf,
                inner.x,
                footer_y,
                inner.right(),
                &[(" any key closes", t.dim())],
            );
        }
        _ => {
            put(
                buf,
                inner.x,
                footer_y,
                inner.right(),
                &[(" Esc hides this (the kill goes on)", t.dim())],
            );
        }
    }
}
