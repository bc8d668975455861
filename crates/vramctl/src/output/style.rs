//! Colours, off unless wanted: `--color`, `NO_COLOR` and whether stdout is a terminal.

use std::io::IsTerminal;

use anstyle::{AnsiColor, Style};

use crate::cli::ColorChoice;

/// The styles a command uses; all plain when colour is off.
#[derive(Debug, Clone, Copy)]
pub struct Styles {
    /// Headings and device names.
    pub heading: Style,
    /// Dim secondary text.
    pub dim: Style,
    /// Something wrong (a lost GPU).
    pub bad: Style,
    /// Something to look at (near full, dropped entries).
    pub warn: Style,
}

impl Styles {
    /// Styles for stdout under `choice`.
    pub fn for_stdout(choice: ColorChoice) -> Self {
        if choice.enabled(std::io::stdout().is_terminal()) {
            Self::colored()
        } else {
            Self::plain()
        }
    }

    /// No styling at all.
    pub fn plain() -> Self {
        Self {
            heading: Style::new(),
            dim: Style::new(),
            bad: Style::new(),
            warn: Style::new(),
        }
    }

    fn colored() -> Self {
        Self {
            heading: Style::new().bold(),
            dim: Style::new().dimmed(),
            bad: AnsiColor::Red.on_default().bold(),
            warn: AnsiColor::Yellow.on_default(),
        }
    }
}

/// `text` wrapped in `style` (nothing added when the style is plain).
pub fn paint(style: Style, text: &str) -> String {
    if style == Style::new() {
        text.to_owned()
    } else {
        format!("{style}{text}{style:#}")
    }
}
