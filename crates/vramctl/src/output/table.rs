//! Aligned text columns, measured in characters so that `°C` and `█` line up.
//!
//! Every cell is escaped as it goes in ([`vramctl_core::untrusted::escape`]): cells hold
//! command lines, user and container names that other users choose, and a table is what
//! root reads before it acts, so no command can print one raw.

use vramctl_core::untrusted::escape;

/// Where a column's text sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text and names.
    Left,
    /// Numbers.
    Right,
}

/// A table of text cells. The last column is never padded (commands can be long).
#[derive(Debug, Clone)]
pub struct Table {
    headers: Vec<String>,
    aligns: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns.
    pub fn new(columns: &[(&str, Align)]) -> Self {
        Self {
            headers: columns.iter().map(|(h, _)| (*h).to_owned()).collect(),
            aligns: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    /// Appends a row, each cell escaped; missing cells are empty.
    pub fn push(&mut self, row: Vec<String>) {
        self.rows.push(row.into_iter().map(escaped).collect());
    }

    fn widths(&self) -> Vec<usize> {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(columns) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        widths
    }

    /// Characters a rendered line takes before the last column starts (every other
    /// column with its two-space gap), without the indent: what is left of a terminal's
    /// width is the last column's room.
    pub fn width_before_last(&self) -> usize {
        let widths = self.widths();
        let n = widths.len().saturating_sub(1);
        widths.iter().take(n).map(|w| w + 2).sum()
    }

    /// Rewrites every row's last cell with `f(row index, cell)`: fitting it into the room
    /// the other columns leave (`width_before_last`).
    pub fn fit_last(&mut self, mut f: impl FnMut(usize, &str) -> String) {
        let last = self.headers.len().saturating_sub(1);
        for (i, row) in self.rows.iter_mut().enumerate() {
            if let Some(cell) = row.get_mut(last) {
                *cell = escaped(f(i, cell));
            }
        }
    }

    /// The table as lines, each prefixed with `indent`.
    pub fn render(&self, indent: &str) -> Vec<String> {
        let columns = self.headers.len();
        let widths = self.widths();
        let line = |cells: &[String]| -> String {
            let mut out = String::from(indent);
            for (i, (width, align)) in widths.iter().zip(&self.aligns).enumerate() {
                let cell = cells.get(i).map_or("", String::as_str);
                let pad = width.saturating_sub(cell.chars().count());
                let last = i + 1 == columns;
                match align {
                    Align::Right => {
                        out.push_str(&" ".repeat(pad));
                        out.push_str(cell);
                    }
                    Align::Left => {
                        out.push_str(cell);
                        if !last {
                            out.push_str(&" ".repeat(pad));
                        }
                    }
                }
                if !last {
                    out.push_str("  ");
                }
            }
            out.trim_end().to_owned()
        };
        let mut lines = vec![line(&self.headers)];
        lines.extend(self.rows.iter().map(|r| line(r)));
        lines
    }
}

/// `cell` escaped, reusing it when nothing needed escaping.
fn escaped(cell: String) -> String {
    match escape(&cell) {
        std::borrow::Cow::Borrowed(_) => cell,
        std::borrow::Cow::Owned(e) => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align() {
        let mut t = Table::new(&[
            ("PID", Align::Right),
            ("USER", Align::Left),
            ("COMMAND", Align::Left),
        ]);
        t.push(vec!["7".into(), "alice".into(), "python train.py".into()]);
        t.push(vec!["31001".into(), "bob".into(), "x".into()]);
        assert_eq!(
            t.render("  "),
            vec![
                "    PID  USER   COMMAND",
                "      7  alice  python train.py",
                "  31001  bob    x",
            ]
        );
    }

    #[test]
    fn a_table_never_prints_a_cell_raw() {
        let mut t = Table::new(&[("USER", Align::Left), ("COMMAND", Align::Left)]);
        t.push(vec![
            "eve\u{202e}".into(),
            "sleep 1 \x1b[2K\rKill 0 processes? [y/N]".into(),
        ]);
        t.fit_last(|_, _| "\x1b]0;title\x07\nforged".to_owned());
        let text = t.render("").join("\n");
        assert_eq!(
            text,
            "USER         COMMAND\neve\\u{202e}  \\u{1b}]0;title\\u{7}\\nforged"
        );
    }
}
