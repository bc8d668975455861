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
            eprintln!("vramctl: error: {}", usage_error_line(&err));
            return Exit::Usage.into();
        }
    };
    // The recorder is a daemon: it says what it does at info level, and may log to a file.
    let (default_level, log_file) = match &cli.command {
        cli::Command::Record(args) => ("info", args.log_file.as_deref()),
        _ => ("error", None),
    };
    if let Err(err) = init_logging(cli.global.verbose, default_level, log_file) {
        eprintln!("vramctl: error: {err:#}");
        return Exit::Usage.into();
    }
    match cmd::run(&cli) {
        Ok(exit) => exit.into(),
        Err(err) => {
            let exit = exit::classify(&err);
            if exit != Exit::Ok {
                // One line, so scripts and logs keep the whole story together.
                match exit::hint(&err) {
                    Some(hint) => eprintln!("vramctl: error: {err:#}; {hint}"),
                    None => eprintln!("vramctl: error: {err:#}"),
                }
            }
            exit.into()
        }
    }
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

fn init_logging(
    verbose: u8,
    default_level: &str,
    log_file: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let default = match verbose {
        0 => default_level,
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("VRAMCTL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match log_file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .with_context(|| format!("cannot open the log file '{}'", path.display()))?;
            builder
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .init();
        }
        None => builder.with_writer(std::io::stderr).init(),
    }
    Ok(())
}
