//! An import's files, read as bounded lines: regular files only, each line (and each CSV
//! record, which may span lines inside quotes) at most [`MAX_LINE_BYTES`], each record at
//! most [`MAX_COLUMNS`] fields, a file read up to the size it had when it was opened. So an
//! import's memory is bounded by one line whatever the file, and it ends on any input.
//!
//! Refused before anything is read: a FIFO, a character or block device (`/dev/zero`), a
//! socket, a directory. A FIFO cannot be bounded in time (its writer decides when it ends)
//! and a device need not end at all; an import reads files, and a pipe's output can be saved
//! to one first. The file is opened with `O_NONBLOCK`, so opening a FIFO nobody writes does
//! not hang, and checked on the opened descriptor, so it cannot be swapped between the check
//! and the reading.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Take};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{BadRow, ImportError};

/// The longest line (or quoted CSV record) an import reads: far above any log line (an
/// nvidia-smi row is about 200 bytes, a vramctl NDJSON frame of 100 processes a few KB) and
/// above the longest command line Linux passes to a program (`MAX_ARG_STRLEN`, 128 KiB per
/// argument, 2 MiB for all of them by default).
pub const MAX_LINE_BYTES: usize = 4 << 20;

/// The most fields a CSV record may have: nvidia-smi has about 250 query fields, GPU-Z logs
/// about 60 sensors.
pub const MAX_COLUMNS: usize = 4096;

/// An open input file, read line by line.
pub(crate) struct Input {
    path: PathBuf,
    reader: BufReader<Take<File>>,
    /// 1-based number of the last line read.
    line_no: usize,
    buf: Vec<u8>,
}

/// What kind of file it is, for the error.
fn kind(file_type: std::fs::FileType) -> &'static str {
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_fifo() {
        "a FIFO (a pipe)"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

impl Input {
    /// Opens `path` for reading, refusing anything but a regular file.
    ///
    /// # Errors
    /// [`ImportError::Read`] when it cannot be opened, [`ImportError::NotAFile`] when it is
    /// not a regular file.
    pub fn open(path: &Path) -> Result<Self, ImportError> {
        let read_error = |cause| ImportError::Read {
            path: path.to_path_buf(),
            cause,
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(path)
            .map_err(read_error)?;
        let meta = file.metadata().map_err(read_error)?;
        if !meta.file_type().is_file() {
            return Err(ImportError::NotAFile {
                path: path.to_path_buf(),
                kind: kind(meta.file_type()),
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            reader: BufReader::with_capacity(1 << 16, file.take(meta.len())),
            line_no: 0,
            buf: Vec::new(),
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn too_long(&self, line: usize, what: &str) -> ImportError {
        ImportError::Limit(BadRow {
            file: self.path.clone(),
            line,
            message: format!(
                "{what} is longer than {} MiB, the longest vramctl reads; is this a log?",
                MAX_LINE_BYTES >> 20
            ),
        })
    }

    /// The next line (without its `\n` or `\r\n`) and its 1-based number; `None` at the
    /// end. Text that is not UTF-8 is read as Latin-1 (GPU-Z writes Windows-1252: `°C` as
    /// one byte), line by line; a byte-order mark on the first line is left out.
    ///
    /// # Errors
    /// A line longer than [`MAX_LINE_BYTES`] (one line, the file and line number), or a
    /// read error.
    pub fn next_line(&mut self) -> Result<Option<(usize, Cow<'_, str>)>, ImportError> {
        self.buf.clear();
        let mut any = false;
        loop {
            let path = &self.path;
            let chunk = self.reader.fill_buf().map_err(|cause| ImportError::Read {
                path: path.clone(),
                cause,
            })?;
            if chunk.is_empty() {
                break;
            }
            any = true;
            let (taken, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            // `\r\n` may follow a line of exactly the limit.
            let over = self.buf.len() + taken > MAX_LINE_BYTES + 2;
            if !over {
                self.buf.extend_from_slice(&chunk[..taken]);
            }
            self.reader.consume(taken);
            if over {
                return Err(self.too_long(self.line_no + 1, "the line"));
            }
            if done {
                break;
            }
        }
        if !any {
            return Ok(None);
        }
        self.line_no += 1;
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
            if self.buf.last() == Some(&b'\r') {
                self.buf.pop();
            }
        }
        if self.buf.len() > MAX_LINE_BYTES {
            return Err(self.too_long(self.line_no, "the line"));
        }
        let bytes: &[u8] = if self.line_no == 1 {
            self.buf
                .strip_prefix("\u{feff}".as_bytes())
                .unwrap_or(&self.buf)
        } else {
            &self.buf
        };
        let text = match std::str::from_utf8(bytes) {
            Ok(s) => Cow::Borrowed(s),
            Err(_) => Cow::Owned(bytes.iter().map(|&b| char::from(b)).collect()),
        };
        Ok(Some((self.line_no, text)))
    }

    /// The first line that is not blank, for telling the format; `None` when there is none.
    ///
    /// # Errors
    /// As [`Input::next_line`].
    pub fn first_line(path: &Path) -> Result<Option<String>, ImportError> {
        let mut input = Self::open(path)?;
        while let Some((_, line)) = input.next_line()? {
            let line = line.trim();
            if !line.is_empty() {
                return Ok(Some(line.to_owned()));
            }
        }
        Ok(None)
    }

    /// The next CSV record that is not blank, with the line it starts on (see
    /// [`split_record`]). A quoted field may hold newlines; the record is then read on from
    /// the following lines, up to [`MAX_LINE_BYTES`] in all.
    ///
    /// # Errors
    /// A record longer than [`MAX_LINE_BYTES`], a read error.
    pub fn next_record(&mut self) -> Result<Option<Record>, ImportError> {
        loop {
            let Some((line, text)) = self.next_line()? else {
                return Ok(None);
            };
            if !text.contains('"') {
                // Most lines (all of nvidia-smi's own) quote nothing: split them directly.
                let fields: Vec<String> = text
                    .split(',')
                    .take(MAX_COLUMNS + 1)
                    .map(|f| f.trim().to_owned())
                    .collect();
                if fields.iter().all(String::is_empty) {
                    continue;
                }
                return Ok(Some(Record {
                    line,
                    fields,
                    problem: None,
                }));
            }
            let mut splitter = Splitter::default();
            let mut open = splitter.feed(&text);
            let mut length = text.len();
            while open {
                let over = match self.next_line()? {
                    None => break,
                    Some((_, more)) => {
                        length += more.len() + 1;
                        if length <= MAX_LINE_BYTES {
                            splitter.newline();
                            open = splitter.feed(&more);
                        }
                        length > MAX_LINE_BYTES
                    }
                };
                if over {
                    return Err(self.too_long(line, "the record starting here"));
                }
            }
            let record = splitter.finish(line, open);
            if record.fields.iter().all(String::is_empty) && record.problem.is_none() {
                continue;
            }
            return Ok(Some(record));
        }
    }
}

/// A CSV record with the line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// 1-based line number of its first line.
    pub line: usize,
    /// Its fields, trimmed; at most [`MAX_COLUMNS`] + 1 are kept (more is a bad row).
    pub fields: Vec<String>,
    /// What is wrong with its quoting, if anything.
    pub problem: Option<String>,
}

/// Splits CSV as nvidia-smi and other tools write it: fields separated by `,`, the spaces
/// around each trimmed (nvidia-smi writes `, `), a field whose first non-space character is
/// `"` quoted — it may hold commas, newlines and `""` for a quote, and spaces before the
/// opening quote (`, "a, b"`) are allowed. A quote inside an unquoted field is a character.
#[derive(Debug, Default)]
struct Splitter {
    fields: Vec<String>,
    field: String,
    /// Inside a quoted field.
    quoted: bool,
    /// The current field was quoted (text after its closing quote is kept, as the `csv`
    /// crate does).
    was_quoted: bool,
    /// A quote just seen inside a quoted field: the end of it, or the first of `""`.
    quote_pending: bool,
    overflow: bool,
}

impl Splitter {
    /// Feeds one line; returns whether a quoted field is still open at its end.
    fn feed(&mut self, line: &str) -> bool {
        for c in line.chars() {
            if self.quoted {
                if self.quote_pending {
                    self.quote_pending = false;
                    if c == '"' {
                        self.field.push('"');
                        continue;
                    }
                    self.quoted = false;
                } else if c == '"' {
                    self.quote_pending = true;
                    continue;
                } else {
                    self.field.push(c);
                    continue;
                }
            }
            match c {
                ',' => self.end_field(),
                '"' if !self.was_quoted && self.field.trim_start().is_empty() => {
                    self.field.clear();
                    self.quoted = true;
                    self.was_quoted = true;
                }
                _ => self.field.push(c),
            }
        }
        if self.quote_pending {
            // A quote at the end of the line closes the field.
            self.quote_pending = false;
            self.quoted = false;
        }
        self.quoted
    }

    /// A newline inside a quoted field.
    fn newline(&mut self) {
        self.field.push('\n');
    }

    fn end_field(&mut self) {
        let field = std::mem::take(&mut self.field);
        if self.fields.len() <= MAX_COLUMNS {
            self.fields.push(field.trim().to_owned());
        } else {
            self.overflow = true;
        }
        self.was_quoted = false;
    }

    fn finish(mut self, line: usize, open: bool) -> Record {
        self.end_field();
        let problem = if open {
            Some("a quoted field is not closed before the end of the file".to_owned())
        } else {
            None
        };
        Record {
            line,
            fields: self.fields,
            problem,
        }
    }
}

/// One line split as CSV (a quoted field left open at its end is closed there).
#[cfg(test)]
pub(crate) fn split_record(line: &str) -> Vec<String> {
    let mut s = Splitter::default();
    s.feed(line);
    s.finish(1, false).fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoted_fields_after_nvidia_smis_spaces_are_read_whole() {
        assert_eq!(
            split_record(r#"2026/11/29 20:49:29.366, GPU-1, 838, "python a,b", 32 MiB"#),
            vec![
                "2026/11/29 20:49:29.366",
                "GPU-1",
                "838",
                "python a,b",
                "32 MiB"
            ]
        );
        assert_eq!(
            split_record(r#"a, " say ""hi"", b ", c"#),
            vec!["a", r#"say "hi", b"#, "c"]
        );
        // A quote inside an unquoted field is a character.
        assert_eq!(split_record(r#"a, py "x, y"#), vec!["a", r#"py "x"#, "y"]);
        assert_eq!(split_record(",,"), vec!["", "", ""]);
    }

    #[test]
    fn a_record_may_span_lines_inside_quotes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.csv");
        std::fs::write(&path, "h1, h2\n\n1, \"bash -c 'a\nb'\"\n2, x\r\n").unwrap();
        let mut input = Input::open(&path).unwrap();
        let r = input.next_record().unwrap().unwrap();
        assert_eq!((r.line, r.fields), (1, vec!["h1".into(), "h2".into()]));
        let r = input.next_record().unwrap().unwrap();
        assert_eq!(
            (r.line, r.fields),
            (3, vec!["1".into(), "bash -c 'a\nb'".into()])
        );
        let r = input.next_record().unwrap().unwrap();
        assert_eq!((r.line, r.fields), (5, vec!["2".into(), "x".into()]));
        assert!(input.next_record().unwrap().is_none());
    }

    #[test]
    fn devices_fifos_and_directories_are_refused_before_reading() {
        for path in ["/dev/zero", "/dev/null", "/"] {
            let err = Input::open(Path::new(path)).err().unwrap();
            assert!(matches!(err, ImportError::NotAFile { .. }), "{path}: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let err = Input::open(&fifo).err().unwrap();
        assert!(err.to_string().contains("a FIFO"), "{err}");
    }

    #[test]
    fn a_line_longer_than_the_limit_is_one_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("long.csv");
        let mut text = "timestamp, pid\n".to_owned();
        text.push_str(&"x".repeat(MAX_LINE_BYTES + 10));
        std::fs::write(&path, &text).unwrap();
        let mut input = Input::open(&path).unwrap();
        assert!(input.next_line().unwrap().is_some());
        let err = input.next_line().err().unwrap().to_string();
        assert!(err.contains(":2: the line is longer than 4 MiB"), "{err}");
        assert_eq!(err.lines().count(), 1);
    }
}
