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
    /// Live terminal UI: GPUs, processes, memory trends; --replay browses a recording
    Top(TopArgs),
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
#[command(
    after_help = "Keys: ? in the UI lists them. Logs (-v) go to stderr: redirect it \
                        (2>top.log) to keep them off the screen."
)]
pub struct TopArgs {
    /// Seconds between samples (at least 0.1)
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub interval: f64,

    /// Only these devices (index or UUID; repeat or separate with commas)
    #[arg(long, value_delimiter = ',', value_name = "GPU")]
    pub gpu: Vec<String>,

    /// Disable every action (kill); for shared screens
    #[arg(long)]
    pub readonly: bool,

    /// Browse a recording (the history database) instead of sampling now
    #[arg(long, value_name = "DB")]
    pub replay: Option<PathBuf>,
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
