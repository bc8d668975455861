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
    /// Prometheus exporter: /metrics (per-device and per-process memory) and /healthz
    Serve(ServeArgs),
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
pub struct ServeArgs {
    /// Address to listen on (use 0.0.0.0:9835 to be scraped from other hosts)
    #[arg(
        long,
        visible_alias = "web.listen-address",
        value_name = "ADDR",
        default_value = "127.0.0.1:9835"
    )]
    pub listen: String,

    /// Seconds between samples of the GPUs (a scrape serves the latest sample)
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub interval: f64,

    /// Per-process series per GPU, biggest holders first; the rest are counted in
    /// vramctl_device_process_series_dropped
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub max_process_series: usize,

    /// Where process labels come from: proc (user, command, container, pod), nvml (the
    /// driver's process name only), none (PID only)
    #[arg(long, value_enum, value_name = "SOURCE", default_value_t = crate::exporter::metadata::DetailsSource::Proc)]
    pub process_details: crate::exporter::metadata::DetailsSource,

    /// Seconds over which vramctl_device_memory_used_max_bytes keeps the peak (at least
    /// the scrape interval, so no spike falls between scrapes)
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub peak_window: f64,

    /// TLS and basic auth settings, in Prometheus exporter-toolkit's web config format
    #[arg(long = "web.config.file", value_name = "PATH")]
    pub web_config_file: Option<PathBuf>,

    /// Requests served at once; more get 503
    #[arg(long = "web.max-requests", value_name = "N", default_value_t = 40)]
    pub max_requests: usize,
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
