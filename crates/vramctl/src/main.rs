//! `vramctl`: parse the command line, run one command, map the outcome to an exit code.
//!
//! Module map: `cli` (flags as typed), `cmd/*` (one file per command), `output/*` (units,
//! tables, styles shared by the commands), `exit` (exit codes and error classes),
//! `recorder` (the history writer that `record` and `serve --record` share).

mod audit;
mod cli;
mod cmd;
mod exit;
mod exporter;
mod logging;
mod output;
mod recorder;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;
use crate::exit::Exit;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => {
            // --help and --version are "errors" that print to stdout and succeed.
            let _ = err.print();
            return Exit::Ok.into();
        }
        Err(err) => {
            print_error(&usage_error_line(&err));
            return Exit::Usage.into();
        }
    };
    // The recorder is a daemon: it says what it does at info level, and may log to a file.
    let (default_level, log_file) = match &cli.command {
        cli::Command::Record(args) => ("info", args.log_file.as_deref()),
        _ => ("error", None),
    };
    let dropped = match logging::init(
        cli.global.verbose,
        default_level,
        log_file,
        cli.global.color,
    ) {
        Ok(dropped) => dropped,
        Err(err) => {
            print_error(&format!("{err:#}"));
            return Exit::Usage.into();
        }
    };
    let outcome = cmd::run(&cli);
    if dropped.count() > 0 {
        // Once, at exit: to the log file when there is one (it may work again); on a
        // closed stderr this line is dropped too, harmlessly.
        tracing::warn!(
            dropped_lines = dropped.count(),
            "Some log lines could not be written."
        );
    }
    match outcome {
        Ok(exit) => exit.into(),
        Err(err) => {
            let exit = exit::classify(&err);
            if exit != Exit::Ok {
                // One line, so scripts and logs keep the whole story together.
                match exit::hint(&err) {
                    Some(hint) => print_error(&format!("{err:#}; {hint}")),
                    None => print_error(&format!("{err:#}")),
                }
            }
            exit.into()
        }
    }
}

/// `vramctl: error: <line>` on stderr; nothing (and no panic, as `eprintln!` would) when
/// stderr is closed.
fn print_error(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "vramctl: error: {line}");
}

/// clap's first line (`unexpected argument '--foo' found`) with a pointer to `--help`,
/// instead of its multi-line usage block: errors are one line.
fn usage_error_line(err: &clap::Error) -> String {
    let text = err.to_string();
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let mut first = lines
        .next()
        .unwrap_or("invalid command line")
        .trim_start_matches("error: ")
        .to_owned();
    // "the following required arguments were not provided:" names them on the next line.
    if let Some(stem) = first.strip_suffix(':') {
        first = format!("{stem}: {}", lines.next().unwrap_or(""));
    }
    format!("{}; see 'vramctl --help'", first.trim())
}
