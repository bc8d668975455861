//! Regular expressions as people give them (`ps --match`, `reap --match`, a reap policy's
//! `match` and `exclude`), compiled with an error on one line that names where it came from.

use regex::Regex;

/// `text` as a regular expression; the error names `flag` and fits on one line.
///
/// # Errors
/// When `text` is not a valid regular expression.
pub fn compile_regex(flag: &str, text: &str) -> anyhow::Result<Regex> {
    Regex::new(text).map_err(|e| {
        // regex's syntax errors draw a caret under the pattern over several lines;
        // errors here are one line, so keep its last ("unclosed group").
        let why = e.to_string();
        let why = why
            .lines()
            .last()
            .unwrap_or_default()
            .trim_start_matches("error: ")
            .to_owned();
        anyhow::anyhow!("{flag} '{text}' is not a valid regular expression: {why}")
    })
}
