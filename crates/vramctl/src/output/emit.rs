//! The one way a command prints its report: `--json` as a serde document, or lines for a
//! person, with the escaping of untrusted text (process names, command lines, file names:
//! [`Untrusted`]) applied here rather than at each command's `writeln!`.

use std::fmt::Display;
use std::io::Write;

use anyhow::Context;
use serde::Serialize;
use vramctl_core::untrusted::Untrusted;

/// How a report is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Lines for a person.
    Text,
    /// One JSON document on one line (what a stream of reports or a pipe reads best).
    JsonLine,
    /// One JSON document, indented (the commands whose documents people read).
    JsonPretty,
}

impl Format {
    /// `--json` given or not; `layout` is the command's JSON layout.
    pub fn from_json_flag(json: bool, layout: Self) -> Self {
        if json { layout } else { Self::Text }
    }
}

/// Lines of a report for a person, and whether they may hold untrusted text.
pub enum Lines<L> {
    /// Lines that quote what processes and files chose (names, command lines): escaped,
    /// so that they cannot move the cursor or retitle the terminal.
    Untrusted(Vec<L>),
    /// Lines styled here (colour codes of ours), with any untrusted part already escaped
    /// where it was formatted; written as they are.
    Styled(Vec<L>),
}

/// Prints a report to `out` in `format`: the document `document()` gives as JSON, or the
/// lines `lines()` gives, one per line. Only the one asked for is built.
///
/// # Errors
/// A write to `out` fails (a closed pipe is told apart by the caller's exit mapping).
pub fn emit<D: Serialize, L: Display>(
    out: &mut impl Write,
    format: Format,
    document: impl FnOnce() -> D,
    lines: impl FnOnce() -> Lines<L>,
) -> anyhow::Result<()> {
    const IO: &str = "cannot write to stdout";
    match format {
        Format::JsonLine => {
            serde_json::to_writer(&mut *out, &document()).context("cannot write JSON")?;
            writeln!(out).context(IO)?;
        }
        Format::JsonPretty => {
            serde_json::to_writer_pretty(&mut *out, &document()).context("cannot write JSON")?;
            writeln!(out).context(IO)?;
        }
        Format::Text => match lines() {
            Lines::Untrusted(lines) => {
                for line in lines {
                    writeln!(out, "{}", Untrusted(&line.to_string())).context(IO)?;
                }
            }
            Lines::Styled(lines) => {
                for line in lines {
                    writeln!(out, "{line}").context(IO)?;
                }
            }
        },
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn printed(format: Format, lines: Lines<&str>) -> String {
        let mut out = Vec::new();
        emit(
            &mut out,
            format,
            || serde_json::json!({"schema": 1, "name": "a\u{1b}]0;x\u{7}"}),
            || lines,
        )
        .expect("writes to memory");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn untrusted_lines_are_escaped_and_styled_ones_kept() {
        let evil = "python \u{1b}]0;owned\u{7}";
        let text = printed(Format::Text, Lines::Untrusted(vec![evil]));
        assert!(!text.contains('\u{1b}'), "{text:?}");
        assert_eq!(text, format!("{}\n", Untrusted(evil)));
        let styled = "\u{1b}[1mGPU 0\u{1b}[0m";
        assert_eq!(
            printed(Format::Text, Lines::Styled(vec![styled])),
            format!("{styled}\n")
        );
    }

    #[test]
    fn json_is_the_document_whatever_the_lines() {
        let line = printed(Format::JsonLine, Lines::Untrusted(vec!["unused"]));
        assert_eq!(line, "{\"name\":\"a\\u001b]0;x\\u0007\",\"schema\":1}\n");
        let pretty = printed(Format::JsonPretty, Lines::Untrusted(vec!["unused"]));
        assert!(pretty.starts_with("{\n  \"name\""), "{pretty}");
        assert_eq!(
            Format::from_json_flag(false, Format::JsonPretty),
            Format::Text
        );
    }
}
