//! Colours, or none: with `NO_COLOR` set or `--color never` every style is plain text
//! attributes (bold, reverse), so the screen still reads on a monochrome terminal.

use ratatui::style::{Color, Modifier, Style};

/// The styles the view uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Theme {
    color: bool,
}

impl Theme {
    /// Colours on or off.
    pub fn new(color: bool) -> Self {
        Self { color }
    }

    /// Whether colours are used.
    pub fn has_color(self) -> bool {
        self.color
    }

    fn pick(self, colored: Style, plain: Style) -> Style {
        if self.color { colored } else { plain }
    }

    /// Plain text.
    pub fn text(self) -> Style {
        Style::new()
    }

    /// Titles and headings.
    pub fn heading(self) -> Style {
        Style::new().add_modifier(Modifier::BOLD)
    }

    /// Secondary text.
    pub fn dim(self) -> Style {
        self.pick(Style::new().fg(Color::DarkGray), Style::new())
    }

    /// Something wrong: a lost GPU, a leak, a refusal.
    pub fn bad(self) -> Style {
        self.pick(
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
            Style::new().add_modifier(Modifier::BOLD),
        )
    }

    /// Something to look at: nearly full, idle holder.
    pub fn warn(self) -> Style {
        self.pick(Style::new().fg(Color::Yellow), Style::new())
    }

    /// Something that went well.
    pub fn good(self) -> Style {
        self.pick(Style::new().fg(Color::Green), Style::new())
    }

    /// The used part of a memory bar.
    pub fn used(self) -> Style {
        self.pick(Style::new().fg(Color::Cyan), Style::new())
    }

    /// The reserved part of a memory bar.
    pub fn reserved(self) -> Style {
        self.pick(Style::new().fg(Color::Magenta), Style::new())
    }

    /// The free part of a memory bar.
    pub fn free(self) -> Style {
        self.dim()
    }

    /// Chart lines.
    pub fn chart(self) -> Style {
        self.pick(Style::new().fg(Color::Cyan), Style::new())
    }

    /// The selected row.
    pub fn selected(self) -> Style {
        Style::new().add_modifier(Modifier::REVERSED)
    }

    /// The table header.
    pub fn header(self) -> Style {
        self.pick(
            Style::new()
                .fg(Color::Black)
                .bg(Color::Cyan)
                .add_modifier(Modifier::BOLD),
            Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED),
        )
    }

    /// Keys in the footer and help.
    pub fn key(self) -> Style {
        self.pick(
            Style::new().fg(Color::Cyan).add_modifier(Modifier::BOLD),
            Style::new().add_modifier(Modifier::BOLD),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_color_means_no_colours() {
        let t = Theme::new(false);
        for style in [
            t.text(),
            t.heading(),
            t.dim(),
            t.bad(),
            t.warn(),
            t.good(),
            t.used(),
            t.reserved(),
            t.free(),
            t.chart(),
            t.selected(),
            t.header(),
            t.key(),
        ] {
            assert_eq!(style.fg, None, "{style:?}");
            assert_eq!(style.bg, None, "{style:?}");
        }
        assert_eq!(Theme::new(true).bad().fg, Some(Color::Red));
    }
}
