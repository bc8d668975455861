//! Text that other users control, made safe to print on root's terminal.
//!
//! vramctl runs as root beside hostile users, and much of what it prints comes from them:
//! command lines and process names from /proc, user and container names, names read from
//! model files, CSV cells of an imported log, strings in an allocator snapshot. Printed
//! raw, an ESC there is a terminal escape sequence in root's terminal (`\x1b[2K\r` erases
//! the line and rewrites it: a forged line just before `kill`'s `[y/N]`), a CR or LF forges
//! a line of output, and a bidi override (U+202E) shows a command line backwards.
//!
//! [`escape`] is the one convention every human output uses (as `ps` and `systemctl` do,
//! in Rust's notation, `char::escape_default`, which the import's messages used first):
//! `\t`, `\n` and `\r` by their names; every other C0 control, DEL, every C1 control
//! (U+0080–U+009F), and the characters that reorder or break text — the bidi marks,
//! embeddings, overrides and isolates (U+061C, U+200E, U+200F, U+202A–U+202E,
//! U+2066–U+2069) and the line and paragraph separators (U+2028, U+2029) — as `\u{H}`
//! (ESC is `\u{1b}`). Everything else, non-ASCII letters included, is left as it is, and
//! a backslash is not doubled (as in `ps`), so ordinary text reads the same and an escaped
//! string never needs escaping again. [`Untrusted`] is the same as a `Display` type.
//!
//! What is stored and what JSON and Prometheus carry stays raw: escaping happens when a
//! person is shown the text. [`from_bytes`] turns bytes that need not be UTF-8 (a command
//! line in /proc) into text, each byte that is not UTF-8 as `\xHH` (a byte, not a
//! character: `\xff` is the byte, `ÿ` the character U+00FF).

use std::borrow::Cow;
use std::fmt::{self, Write};

/// Whether `c` is shown escaped (see the module docs).
pub fn needs_escape(c: char) -> bool {
    c.is_control() // C0, DEL, C1
        || matches!(
            c,
            '\u{061C}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{202A}'..='\u{202E}'
                | '\u{2066}'..='\u{2069}'
                | '\u{2028}'
                | '\u{2029}'
        )
}

/// `text` with every character that could act on a terminal or reorder what it shows
/// escaped (see the module docs); borrowed, untouched, when there is none.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        push_escaped(&mut out, c);
    }
    Cow::Owned(out)
}

fn push_escaped(out: &mut String, c: char) {
    if needs_escape(c) {
        // `\t`, `\n`, `\r`, else `\u{1b}`: none of these characters is a quote or a
        // backslash, the only others `escape_default` names.
        out.extend(c.escape_default());
    } else {
        out.push(c);
    }
}

/// Bytes that need not be UTF-8 as text: valid UTF-8 as it is (escaped only when shown),
/// each byte that is not as `\xHH`. Not a decoder to round-trip through: it names bytes
/// for people.
pub fn from_bytes(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            // Writing to a String cannot fail.
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// A string another user controls, shown escaped by [`escape`]: `format!("{}",
/// Untrusted(&command))`. Width and alignment (`{:<20}`) apply to the escaped text.
#[derive(Debug, Clone, Copy)]
pub struct Untrusted<'a>(pub &'a str);

impl fmt::Display for Untrusted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&escape(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_text_is_unchanged_and_borrowed() {
        for text in [
            "",
            "/usr/bin/python3 train.py --lr 3e-4",
            "python3 Überprüfung.py --name=José --out=データ/結果 ½ € 🤷",
            "C:\\path\\with\\backslashes and \\e and \\x1b as written",
            "[kworker/u256:3-events_unbound]",
            "naïve café – “quotes” …",
        ] {
            assert!(matches!(escape(text), Cow::Borrowed(_)), "{text:?}");
            assert_eq!(Untrusted(text).to_string(), text);
        }
    }

    #[test]
    fn c0_controls_and_del_are_escaped() {
        assert_eq!(
            escape("\x1b[2K\rKill 0 processes? [y/N]\n"),
            "\\u{1b}[2K\\rKill 0 processes? [y/N]\\n"
        );
        assert_eq!(
            escape("a\tb\x07c\x08d\x00e\x7f"),
            "a\\tb\\u{7}c\\u{8}d\\u{0}e\\u{7f}"
        );
        for b in 0u8..0x20 {
            let got = escape(&char::from(b).to_string()).into_owned();
            assert!(got.starts_with('\\'), "{b:#x}: {got:?}");
            assert!(!got.chars().any(needs_escape), "{b:#x}: {got:?}");
        }
    }

    #[test]
    fn c1_controls_are_escaped() {
        // U+009B is CSI on a terminal that reads C1 controls: ESC [ in one character.
        assert_eq!(escape("a\u{9b}2Jb"), "a\\u{9b}2Jb");
        assert_eq!(escape("\u{80}\u{85}\u{9f}"), "\\u{80}\\u{85}\\u{9f}");
        // The first character after C1 is ordinary.
        assert_eq!(escape("\u{a0}é"), "\u{a0}é");
    }

    #[test]
    fn bidi_controls_are_escaped() {
        assert_eq!(
            escape("python \u{202e}yp.niart"),
            "python \\u{202e}yp.niart"
        );
        for c in ('\u{202a}'..='\u{202e}').chain('\u{2066}'..='\u{2069}') {
            let got = escape(&format!("x{c}y")).into_owned();
            assert_eq!(got, format!("x\\u{{{:x}}}y", u32::from(c)));
        }
        assert_eq!(
            escape("\u{200e}\u{200f}\u{61c}"),
            "\\u{200e}\\u{200f}\\u{61c}"
        );
        assert_eq!(escape("a\u{2028}b\u{2029}"), "a\\u{2028}b\\u{2029}");
    }

    #[test]
    fn escaping_twice_changes_nothing() {
        let once = escape("\x1b]0;owned\x07 \u{202e} \u{9b}").into_owned();
        assert_eq!(escape(&once), once.as_str());
    }

    #[test]
    fn bytes_that_are_not_utf8_are_named_not_passed_on() {
        // A /proc/PID/cmdline: NUL-separated, a lone 0x9b (an 8-bit CSI) and a cut
        // UTF-8 sequence among valid text.
        let cmdline = b"python3\0tr\xc3\xa4in.py\0\x9b2J\0\xe2\x82";
        let text = from_bytes(cmdline);
        assert_eq!(text, "python3\0träin.py\0\\x9b2J\0\\xe2\\x82");
        assert_eq!(
            escape(&text),
            "python3\\u{0}träin.py\\u{0}\\x9b2J\\u{0}\\xe2\\x82"
        );
        assert_eq!(from_bytes("ok ü".as_bytes()), "ok ü");
    }

    #[test]
    fn width_applies_to_the_escaped_text() {
        assert_eq!(format!("[{:<6}]", Untrusted("a\nb")), "[a\\nb  ]");
    }
}
