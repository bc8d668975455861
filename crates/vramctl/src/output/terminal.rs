//! How wide the output may be.

use std::io::IsTerminal;

/// The width to fit human output into: `COLUMNS` when it is set to a number (as `ls` and
/// `ps` honour it; tests and scripts use it to pick a width), else the terminal's width when
/// stdout is one. `None` for a pipe or a file: nothing is cut there, so `grep` and scripts
/// see whole command lines.
pub fn width() -> Option<usize> {
    width_from(
        std::env::var("COLUMNS").ok().as_deref(),
        std::io::stdout().is_terminal(),
        || {
            ratatui::crossterm::terminal::size()
                .ok()
                .map(|(cols, _)| usize::from(cols))
        },
    )
}

/// `text` cut to `width` characters (`…` last) when a width is known.
pub fn fit_line(text: &str, width: Option<usize>) -> String {
    match width {
        Some(w) if text.chars().count() > w => {
            let mut out: String = text.chars().take(w.saturating_sub(1)).collect();
            if w > 0 {
                out.push(vramctl_core::command_line::ELLIPSIS);
            }
            out
        }
        _ => text.to_owned(),
    }
}

/// `text` split at spaces into lines of at most `width` characters, each after `indent`
/// (a word longer than the room is cut).
pub fn wrap(text: &str, indent: &str, width: Option<usize>) -> Vec<String> {
    let Some(width) = width else {
        return vec![format!("{indent}{text}")];
    };
    let room = width.saturating_sub(indent.chars().count()).max(1);
    let mut out = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let word = fit_line(word, Some(room));
        let needed = line.chars().count() + usize::from(!line.is_empty()) + word.chars().count();
        if !line.is_empty() && needed > room {
            out.push(format!("{indent}{line}"));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&word);
    }
    if !line.is_empty() {
        out.push(format!("{indent}{line}"));
    }
    out
}

fn width_from(
    columns: Option<&str>,
    is_terminal: bool,
    terminal: impl FnOnce() -> Option<usize>,
) -> Option<usize> {
    if let Some(n) = columns.and_then(|c| c.trim().parse::<usize>().ok()) {
        if n > 0 {
            return Some(n);
        }
    }
    if is_terminal {
        terminal().filter(|&w| w > 0)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_or_wrapped_to_the_width() {
        assert_eq!(fit_line("abcdef", Some(4)), "abc…");
        assert_eq!(fit_line("abcdef", None), "abcdef");
        assert_eq!(
            wrap(
                "not reported: power (not supported), temperature",
                "  ",
                Some(24)
            ),
            [
                "  not reported: power",
                "  (not supported),",
                "  temperature"
            ]
        );
        assert_eq!(wrap("a b", "  ", None), ["  a b"]);
    }

    #[test]
    fn columns_wins_then_the_terminal_then_nothing() {
        assert_eq!(width_from(Some("80"), false, || Some(200)), Some(80));
        assert_eq!(width_from(Some("80"), true, || Some(200)), Some(80));
        assert_eq!(width_from(Some("wide"), true, || Some(200)), Some(200));
        assert_eq!(width_from(Some("0"), true, || Some(120)), Some(120));
        assert_eq!(width_from(None, true, || None), None);
        assert_eq!(
            width_from(None, false, || Some(200)),
            None,
            "a pipe is not cut"
        );
    }
}
