//! The command line as the user types it (clap derive). Validation into the values the
//! commands use happens in each command's `run`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

const EXIT_CODES: &str = "\
Exit codes:
  0  success (a broken pipe also exits 0)
  1  a condition you asked about holds (e.g. `leaks --fail-on-leak` found a leak)
  2  usage, input or runtime error (bad flag, malformed file, unreadable database)
  3  no usable NVIDIA driver (NVML could not be loaded or started)";

/// GPU memory (VRAM) manager for NVIDIA GPUs: who holds memory now, how it changed, and
/// what can be freed.
#[derive(Debug, Parser)]
#[command(name = "vramctl", version, after_help = EXIT_CODES, max_term_width = 100)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,

    #[command(subcommand)]
    pub command: Command,
}

/// Options every command accepts.
#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// NVML library to load instead of libnvidia-ml.so.1
    #[arg(long, global = true, env = "VRAMCTL_NVML_LIB", value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,

    /// When to colour output
    #[arg(long, global = true, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,

    /// Log more to stderr (-v info, -vv debug, -vvv trace); VRAMCTL_LOG overrides
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

/// When to colour output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ColorChoice {
    /// Colour when stdout is a terminal and NO_COLOR is unset
    Auto,
    /// Always colour
    Always,
    /// Never colour
    Never,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Devices and the processes holding their memory, now
    Status(StatusArgs),
    /// Hardware diagnostics per device (memory bus and bandwidth, PCIe, ECC, versions)
    Info(InfoArgs),
    /// Processes holding GPU memory, with user, command, age, CPU, RSS and container
    Ps(PsArgs),
    /// End processes safely (pidfd, identity re-check, audit) and verify their GPU memory
    /// was released
    #[command(after_help = KILL_EXIT_CODES)]
    Kill(KillArgs),
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON (schema in docs/json.md); with --watch, one object per line (NDJSON)
    #[arg(long)]
    pub json: bool,

    /// Refresh every SECS seconds until interrupted
    #[arg(long, value_name = "SECS")]
    pub watch: Option<f64>,

    /// With --watch: stop after N refreshes
    #[arg(long, value_name = "N", requires = "watch")]
    pub count: Option<u64>,

    /// Only these devices (index or UUID; repeat or separate with commas)
    #[arg(long, value_delimiter = ',', value_name = "GPU")]
    pub gpu: Vec<String>,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Print JSON (schema in docs/json.md)
    #[arg(long)]
    pub json: bool,

    /// Only these devices (index or UUID; repeat or separate with commas)
    #[arg(long, value_delimiter = ',', value_name = "GPU")]
    pub gpu: Vec<String>,
}

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Print JSON (schema in docs/json.md)
    #[arg(long)]
    pub json: bool,

    /// Group children under their parents (data-loader workers under their trainer), with
    /// their descendants that hold no GPU memory
    #[arg(long)]
    pub tree: bool,

    /// Order of the rows (with --tree: of the roots and of each set of siblings)
    #[arg(long, value_enum, default_value_t = PsSort::Mem)]
    pub sort: PsSort,

    /// Only processes of these users (name or uid; repeat or separate with commas)
    #[arg(long, value_delimiter = ',', value_name = "USER")]
    pub user: Vec<String>,

    /// Only these devices (index or UUID; repeat or separate with commas)
    #[arg(long, value_delimiter = ',', value_name = "GPU")]
    pub gpu: Vec<String>,

    /// Only processes whose command line matches this regular expression
    #[arg(long = "match", value_name = "REGEX")]
    pub pattern: Option<String>,

    /// Only processes holding at least this much GPU memory (e.g. 1GiB, 500MB)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub min_mem: Option<u64>,

    /// Measure CPU % over this many seconds; 0 averages over each process's lifetime
    #[arg(long, value_name = "SECS", default_value_t = 0.2)]
    pub cpu_interval: f64,
}

/// `ps --sort`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PsSort {
    /// Most GPU memory first
    Mem,
    /// Lowest PID first
    Pid,
    /// Oldest first
    Age,
    /// Busiest first
    Cpu,
    /// By user name, then most memory
    User,
}

const KILL_EXIT_CODES: &str = "\
Exit codes:
  0  every target ended and its GPU memory was released
  1  a target was refused, not confirmed, still running, or its memory still held after --timeout
  2  usage, input or runtime error (bad PID, no confirmation possible, audit log not writable)
  3  no usable NVIDIA driver (kill needs NVML to verify the memory was released)";

#[derive(Debug, Args)]
pub struct KillArgs {
    /// Processes to end: PID, or PID@START to insist on the process that started at that
    /// clock tick (`ps --json` prints start_time_ticks)
    #[arg(required = true, value_name = "PID")]
    pub targets: Vec<String>,

    /// Signal to send first (TERM, INT, HUP, QUIT, USR1, USR2, KILL or a number)
    #[arg(short, long, value_name = "SIG", default_value = "TERM",
          value_parser = clap::builder::ValueParser::new(parse_signal))]
    pub signal: vramctl_core::signal::Signal,

    /// Seconds to wait for the process to exit before sending SIGKILL
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub grace: f64,

    /// Never send SIGKILL; report processes still running after --grace
    #[arg(long)]
    pub no_escalate: bool,

    /// Also end every descendant (each pinned and checked on its own)
    #[arg(long)]
    pub tree: bool,

    /// Do not ask for confirmation
    #[arg(short, long)]
    pub yes: bool,

    /// Show what would be signalled, and what would be refused, then stop
    #[arg(long)]
    pub dry_run: bool,

    /// Seconds to wait, after the processes ended, for NVML to show their memory released
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub timeout: f64,

    /// Print JSON (schema in docs/json.md)
    #[arg(long)]
    pub json: bool,
}

fn parse_size(text: &str) -> Result<u64, String> {
    crate::output::units::parse_bytes(text)
}

fn parse_signal(text: &str) -> Result<vramctl_core::signal::Signal, String> {
    text.parse()
        .map_err(|e: vramctl_core::signal::UnknownSignal| e.to_string())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn verify_cli() {
        Cli::command().debug_assert();
    }
}
