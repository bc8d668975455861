//! Logging (tracing) that can never stop a command, least of all a daemon.
//!
//! `vramctl record 2>&1 | head -1` closes the recorder's stderr after one line. tracing's
//! own writer reports a failed write with `eprintln!`, which panics when stderr is gone, and
//! the recorder died with exit 101 and no frames. Here every log line goes through
//! [`LogSink`]: a line that cannot be written (a closed pipe, a full disk under the log
//! file, anything) is dropped and counted, never reported on the stream that just failed;
//! `main` reports the count once at exit.
//!
//! Colour follows `--color` for the stream the lines go to: on a terminal with `auto` (and
//! `NO_COLOR` unset), never in a log file, never when stderr is a file or a pipe (the
//! systemd journal, `2>record.log`).

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use tracing_subscriber::fmt::MakeWriter;

use crate::cli::ColorChoice;

/// Lines dropped because their stream failed, shared with the sink.
#[derive(Debug, Clone, Default)]
pub struct DroppedLines(Arc<AtomicU64>);

impl DroppedLines {
    /// How many log lines could not be written so far.
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    fn add(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Where log lines go.
#[derive(Debug)]
enum Stream {
    Stderr,
    File(Mutex<File>),
}

/// A tracing writer that drops (and counts) a line it cannot write instead of failing.
#[derive(Debug)]
pub struct LogSink {
    stream: Stream,
    dropped: DroppedLines,
}

impl LogSink {
    fn write_line(&self, line: &[u8]) {
        let written = match &self.stream {
            Stream::Stderr => std::io::stderr().lock().write_all(line),
            Stream::File(file) => match file.lock() {
                Ok(mut file) => file.write_all(line),
                // A thread panicked while logging; the file itself is still usable.
                Err(poisoned) => poisoned.into_inner().write_all(line),
            },
        };
        if written.is_err() {
            self.dropped.add();
        }
    }
}

/// One event's line, written whole when tracing is done formatting it.
pub struct LineWriter<'a> {
    sink: &'a LogSink,
    line: Vec<u8>,
}

impl Write for LineWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter<'_> {
    fn drop(&mut self) {
        if !self.line.is_empty() {
            self.sink.write_line(&self.line);
        }
    }
}

impl<'a> MakeWriter<'a> for LogSink {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter {
            sink: self,
            line: Vec::new(),
        }
    }
}

/// Installs the global subscriber: `VRAMCTL_LOG`, else the level from `-v`, else
/// `default_level`; lines to `log_file` when given, else stderr.
///
/// # Errors
/// The log file cannot be opened for appending.
pub fn init(
    verbose: u8,
    default_level: &str,
    log_file: Option<&Path>,
    color: ColorChoice,
) -> anyhow::Result<DroppedLines> {
    let default = match verbose {
        0 => default_level,
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("VRAMCTL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let dropped = DroppedLines::default();
    let (stream, ansi) = match log_file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open the log file '{}'", path.display()))?;
            (Stream::File(Mutex::new(file)), false)
        }
        None => (
            Stream::Stderr,
            color.enabled(std::io::stderr().is_terminal()),
        ),
    };
    let sink = LogSink {
        stream,
        dropped: dropped.clone(),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(sink)
        .init();
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_that_cannot_be_written_is_counted_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, "").unwrap();
        // Opened read-only: every write fails, as on a full disk or a closed pipe.
        let file = File::open(&path).unwrap();
        let sink = LogSink {
            stream: Stream::File(Mutex::new(file)),
            dropped: DroppedLines::default(),
        };
        for _ in 0..3 {
            let mut writer = sink.make_writer();
            writer.write_all(b"a line\n").unwrap();
        }
        assert_eq!(sink.dropped.count(), 3);
    }

    #[test]
    fn a_line_is_written_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let file = File::create(&path).unwrap();
        let sink = LogSink {
            stream: Stream::File(Mutex::new(file)),
            dropped: DroppedLines::default(),
        };
        {
            let mut writer = sink.make_writer();
            writer.write_all(b"first ").unwrap();
            writer.write_all(b"half\n").unwrap();
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "first half\n");
        assert_eq!(sink.dropped.count(), 0);
    }
}
