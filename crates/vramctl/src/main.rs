//! `vramctl`: parse the command line, run one command, map the outcome to an exit code.
//!
//! Module map: `cli` (flags as typed), `cmd/*` (one file per command), `output/*` (units,
//! tables, styles shared by the commands), `exit` (exit codes and error classes),
//! `recorder` (the history writer that `record` and `serve --record` share).

mod audit_sink;
mod cli;
mod cmd;
mod db_location;
mod exit;
mod logging;
mod output;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;
use crate::exit::Exit;
use vramctl_core::untrusted::Untrusted;

fn main() -> ExitCode {
    // The guard of a `run` job's cgroup (`vramctl_run::job::scope`): started by `run` itself,
    // never parsed as a command line (it has no options, logs nothing, prints nothing).
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(std::ffi::OsStr::new(vramctl_run::job::scope::GUARD_ARG))
        && let (Some(dir), None) = (args.next(), args.next())
    {
        return vramctl_run::job::scope::guard_main(std::path::Path::new(&dir));
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli.resolved(),
        Err(err) if !err.use_stderr() => {
            // --help and --version are "errors" that print to stdout and succeed.
            let _ = err.print();
            return Exit::Ok.into();
        }
        Err(err) => return usage_error(&err),
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

/// `vramctl: warning: <line>` on stderr (nothing when stderr is closed), escaped as
/// [`print_error`].
pub(crate) fn print_warning(line: &str) {
    use std::io::Write;
    let line = Untrusted(line);
    let _ = writeln!(std::io::stderr(), "vramctl: warning: {line}");
}

/// `vramctl: error: <line>` on stderr; nothing (and no panic, as `eprintln!` would) when
/// stderr is closed. The line is escaped (`vramctl_core::untrusted`): errors quote what
/// other users wrote (a name in a model file, a CSV cell, a string in a snapshot, a
/// command line), and one line stays one line.
pub(crate) fn print_error(line: &str) {
    use std::io::Write;
    let line = Untrusted(line);
    let _ = writeln!(std::io::stderr(), "vramctl: error: {line}");
}

/// A command line clap refused: `vramctl` alone gets the help (on stderr: it is a usage
/// error, exit 2); anything else one line, clap's first with its hints ("a similar
/// argument exists: '--json'") and a pointer to the help of the command being typed.
fn usage_error(err: &clap::Error) -> ExitCode {
    use clap::CommandFactory;
    use clap::error::ErrorKind;
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let command = typed_subcommand(&args);
    if command.is_none()
        && matches!(
            err.kind(),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand | ErrorKind::MissingSubcommand
        )
    {
        use std::io::Write;
        let help = Cli::command().render_help();
        let _ = write!(std::io::stderr(), "{help}");
        return Exit::Usage.into();
    }
    let line = match watch_given_a_duration(&args, command.as_deref(), err.kind()) {
        Some(line) => line,
        None => usage_error_line(err, command.as_deref()),
    };
    print_error(&line);
    Exit::Usage.into()
}

/// `leaks --watch 1s` (as `status --watch 1s` is written): `leaks --watch` takes no value,
/// so clap reads `1s` as a FILE and says `--watch` cannot be used with files, which sends
/// the user looking for a file they never named. Say what happened and what to type.
fn watch_given_a_duration(
    args: &[std::ffi::OsString],
    command: Option<&str>,
    kind: clap::error::ErrorKind,
) -> Option<String> {
    if command != Some("leaks") || kind != clap::error::ErrorKind::ArgumentConflict {
        return None;
    }
    let at = args.iter().position(|a| a == "--watch")?;
    let value = args.get(at + 1)?.to_str()?;
    cli::duration(value).ok()?;
    Some(format!(
        "'leaks --watch' takes no value: '{value}' was read as a FILE to analyse; the time \
         between samples is --interval (vramctl leaks --watch --interval {value}); see \
         'vramctl leaks --help'"
    ))
}

/// The subcommand named on the command line, if any (`status` in `vramctl --color never
/// status --jsno`).
fn typed_subcommand(args: &[std::ffi::OsString]) -> Option<String> {
    use clap::CommandFactory;
    let cli = Cli::command();
    args.iter()
        .skip(1)
        .filter_map(|arg| arg.to_str())
        .filter(|arg| *arg != "help")
        .find_map(|arg| cli.find_subcommand(arg).map(|c| c.get_name().to_owned()))
}

/// clap's message on one line: its first line, what it lists below it (missing
/// arguments), its tips, and where to read more, instead of its multi-line usage block.
fn usage_error_line(err: &clap::Error, command: Option<&str>) -> String {
    let text = err.to_string();
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"));
    let mut line = lines
        .next()
        .unwrap_or("invalid command line")
        .trim_start_matches("error: ")
        .to_owned();
    let (tips, items): (Vec<&str>, Vec<&str>) = lines.partition(|l| l.starts_with("tip: "));
    // "the following required arguments were not provided:" names them on the next lines.
    if let Some(stem) = line.strip_suffix(':') {
        line = format!("{stem}: {}", items.join(", "));
    }
    for tip in tips {
        line.push_str("; ");
        line.push_str(tip.trim_start_matches("tip: "));
    }
    let help = match command {
        Some(name) => format!("vramctl {name} --help"),
        None => "vramctl --help".to_owned(),
    };
    format!("{}; see '{help}'", line.trim())
}
