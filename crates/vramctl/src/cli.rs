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
#[derive(Debug, Clone, Args)]
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

    /// History database [default: $XDG_STATE_HOME/vramctl/history.db]
    #[arg(long, global = true, env = "VRAMCTL_DB", value_name = "PATH")]
    pub db: Option<PathBuf>,
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
    /// Reclaim memory from idle holders by policy: a dry-run plan by default, --apply to end
    /// them on kill's safe path
    #[command(after_help = REAP_HELP)]
    Reap(ReapArgs),
    /// Prometheus exporter: /metrics (per-device and per-process memory) and /healthz
    Serve(ServeArgs),
    /// Live terminal UI: GPUs, processes, memory trends; --replay browses a recording
    Top(TopArgs),
    /// Sample every GPU and process on an interval into the history database
    Record(RecordArgs),
    /// Show recorded samples per device and per process
    History(HistoryArgs),
    /// Write the history out as NDJSON (lossless) or nvidia-smi-style CSV
    Export(ExportArgs),
    /// Read nvidia-smi CSV logs, GPU-Z sensor logs or vramctl NDJSON into the history
    Import(ImportArgs),
    /// Leak and idle-holder verdicts per process, from the history, log files, or live
    #[command(after_help = LEAKS_HELP)]
    Leaks(LeaksArgs),
    /// Draw memory over time per GPU and process as a PNG or SVG chart
    Plot(PlotArgs),
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON (schema in docs/json.md); with --watch, one object per line (NDJSON)
    #[arg(long)]
    pub json: bool,

    /// Refresh every SECS seconds until interrupted
    #[arg(long, short = 'l', visible_alias = "loop", value_name = "SECS")]
    pub watch: Option<f64>,

    /// With --watch: stop after N refreshes
    #[arg(long, value_name = "N", requires = "watch")]
    pub count: Option<u64>,

    /// Only these devices (index or UUID; repeat or separate with commas)
    #[arg(
        long,
        short = 'i',
        visible_alias = "id",
        value_delimiter = ',',
        value_name = "GPU"
    )]
    pub gpu: Vec<String>,

    /// One line per GPU (index, name, temperature, utilization, memory, and the holders
    /// as user:command(memory)), as gpustat prints them
    #[arg(long, conflicts_with = "json")]
    pub compact: bool,
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

    /// Also record history, as `vramctl record` does, into DB (default: --db, VRAMCTL_DB or
    /// $XDG_STATE_HOME/vramctl/history.db)
    #[arg(long, value_name = "DB", num_args = 0..=1)]
    pub record: Option<Option<PathBuf>>,

    /// With --record: how long to keep raw samples and downsampled buckets [default:
    /// raw=24h,1m=30d]
    #[arg(long, value_name = "SPEC")]
    pub retain: Option<String>,

    /// Thresholds of the leak and idle analysis behind vramctl_process_leak and
    /// vramctl_process_idle_holder (as for `vramctl leaks`)
    #[command(flatten)]
    pub analysis: AnalysisArgs,

    /// Test only: time starts at this Unix time in ms and moves by --interval per sample,
    /// without waiting (needs --ticks)
    #[arg(long, hide = true, value_name = "UNIX_MS", requires = "ticks")]
    pub simulated_clock: Option<i64>,

    /// Test only: stop sampling after N samples and keep serving the last one
    #[arg(long, hide = true, value_name = "N")]
    pub ticks: Option<u64>,
}

#[derive(Debug, Args)]
pub struct RecordArgs {
    /// Time between samples (e.g. 1s, 500ms; at least 50ms)
    #[arg(long, default_value = "1s", value_name = "DURATION")]
    pub interval: String,

    /// Stop after this long (e.g. 10m); default: until SIGINT or SIGTERM
    #[arg(long, value_name = "DURATION")]
    pub duration: Option<String>,

    /// How long to keep raw samples and downsampled buckets (e.g. raw=24h,1m=30d,1h=forever)
    #[arg(long, default_value = "raw=24h,1m=30d", value_name = "SPEC")]
    pub retain: String,

    /// Append logs to this file instead of stderr
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,

    /// Test only: stop after N samples
    #[arg(long, hide = true, value_name = "N")]
    pub ticks: Option<u64>,

    /// Test only: time starts at this Unix time in ms and moves by --interval per sample,
    /// without waiting
    #[arg(long, hide = true, value_name = "UNIX_MS")]
    pub simulated_clock: Option<i64>,

    /// Test only: limit the database to N pages (PRAGMA max_page_count), to reach a "disk
    /// full" without a small filesystem
    #[arg(long, hide = true, value_name = "N")]
    pub max_db_pages: Option<u64>,
}

/// Output formats of `history`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HistoryFormat {
    /// Aligned tables
    Table,
    /// One CSV row per device or process and time
    Csv,
    /// One JSON document (schema in docs/json.md)
    Json,
}

#[derive(Debug, Args)]
pub struct HistoryArgs {
    /// Start: a duration back from now (10m, 24h), 'all', or a time (RFC 3339 or
    /// 'YYYY-MM-DD HH:MM[:SS]' local) [default: 1h; with --audit: all]
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,

    /// End (same forms as --since); default: now
    #[arg(long, value_name = "WHEN")]
    pub until: Option<String>,

    /// Only these devices (index or UUID; repeat or separate with commas)
    #[arg(long, value_delimiter = ',', value_name = "GPU")]
    pub gpu: Vec<String>,

    /// Only these processes (PIDs; repeat or separate with commas); hides device rows
    #[arg(long, value_delimiter = ',', value_name = "PID")]
    pub pid: Vec<u32>,

    /// Bucket length (e.g. 10s, 1m), or 'raw' for every sample; default: raw for csv and
    /// json, and for the table about 30 rows per series
    #[arg(long, value_name = "DURATION")]
    pub step: Option<String>,

    /// Output format
    #[arg(long, value_enum, default_value_t = HistoryFormat::Table)]
    pub format: HistoryFormat,

    /// Time zone for the table's times (e.g. UTC, Europe/Paris); default: the system's
    #[arg(long, value_name = "TZ")]
    pub tz: Option<String>,

    /// Show the audit log instead: every signal kill, reap and top sent or refused, with
    /// its target, reason and outcome (--pid selects targets)
    #[arg(long, conflicts_with_all = ["gpu", "step"])]
    pub audit: bool,
}

/// Formats `export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// vramctl's NDJSON: every value, losslessly (re-import gives the same history)
    Ndjson,
    /// Like `nvidia-smi --query-gpu=... --format=csv`
    SmiGpu,
    /// Like `nvidia-smi --query-compute-apps=... --format=csv`
    SmiApps,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Output format
    #[arg(long, value_enum, default_value_t = ExportFormat::Ndjson)]
    pub format: ExportFormat,

    /// Start (as for history); default: the beginning
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,

    /// End (as for history); default: now
    #[arg(long, value_name = "WHEN")]
    pub until: Option<String>,

    /// Write here instead of stdout
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// CSV columns, as for nvidia-smi --query-gpu / --query-compute-apps
    #[arg(long, value_name = "LIST")]
    pub query: Option<String>,

    /// CSV variant, as for nvidia-smi --format (csv, csv,noheader, csv,nounits, ...)
    #[arg(long, default_value = "csv", value_name = "FORMAT")]
    pub csv_format: String,

    /// Time zone of CSV timestamps (nvidia-smi writes local time); default: the system's
    #[arg(long, value_name = "TZ")]
    pub tz: Option<String>,
}

/// Formats `import` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ImportFormat {
    /// Guess from the content
    Auto,
    /// nvidia-smi --query-gpu=... --format=csv
    SmiGpu,
    /// nvidia-smi --query-compute-apps=... --format=csv
    SmiApps,
    /// GPU-Z's sensor log
    Gpuz,
    /// vramctl export, or vramctl status --json --watch
    Ndjson,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Files to read (merged by time)
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// Format of the files
    #[arg(long, value_enum, default_value_t = ImportFormat::Auto)]
    pub format: ImportFormat,

    /// Reject the whole import at the first bad row instead of skipping it
    #[arg(long)]
    pub strict: bool,

    /// Time zone of timestamps without one (nvidia-smi, GPU-Z write local time); default: the system's
    #[arg(long, value_name = "TZ")]
    pub tz: Option<String>,

    /// Column names of a CSV written with 'noheader' (the --query-gpu / --query-compute-apps list)
    #[arg(long, value_name = "LIST")]
    pub columns: Option<String>,
}

const LEAKS_HELP: &str = "\
Sources: the history database (default, --db), log files given as arguments (nvidia-smi
--query-gpu / --query-compute-apps CSV, vramctl NDJSON; analysed in memory, nothing is
imported), or the GPUs now (--watch). Method and thresholds: docs/leaks.md.

Exit codes:
  0  analysed (leaks or not, unless --fail-on-leak)
  1  --fail-on-leak and a process leaks (with --watch: at the first leak verdict)
  2  usage or input error (bad flag, malformed file with its file:line, unreadable database)
  3  --watch without a usable NVIDIA driver";

/// Thresholds of the leak and idle analysis, shared by `leaks` and `plot`.
#[derive(Debug, Args)]
pub struct AnalysisArgs {
    /// Idle holder: least memory held (e.g. 1GiB, 512MiB)
    #[arg(long, value_name = "SIZE", default_value = "1GiB")]
    pub min_idle_mem: String,

    /// Idle holder: least time without GPU activity (e.g. 30m, 2h)
    #[arg(long, value_name = "DURATION", default_value = "30m")]
    pub idle_for: String,

    /// Growth within this time of a process's start is warm-up, never a leak (e.g. 5m)
    #[arg(long, value_name = "DURATION", default_value = "0s")]
    pub warmup: String,
}

/// Where the samples of `leaks` and `plot` come from, besides the history database.
#[derive(Debug, Args)]
pub struct SourceArgs {
    /// Log files to analyse instead of the history (nvidia-smi CSV, vramctl NDJSON; merged
    /// by time, nothing is imported)
    #[arg(value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// Format of the files
    #[arg(long, value_enum, default_value_t = ImportFormat::Auto)]
    pub format: ImportFormat,

    /// Column names of a CSV written with 'noheader'
    #[arg(long, value_name = "LIST")]
    pub columns: Option<String>,

    /// Skip malformed rows of the files (each is listed on stderr) instead of stopping at
    /// the first
    #[arg(long)]
    pub skip_bad_rows: bool,

    /// Start: a duration back from now (10m), 'all', RFC 3339 or 'YYYY-MM-DD HH:MM[:SS]'
    /// local; default: for the history, the 24 hours before its last sample; for files,
    /// everything
    #[arg(long, value_name = "WHEN")]
    pub since: Option<String>,

    /// End (same forms as --since); default: the last sample
    #[arg(long, value_name = "WHEN")]
    pub until: Option<String>,

    /// Only these devices (index or UUID; repeat or separate with commas)
    #[arg(long, value_delimiter = ',', value_name = "GPU")]
    pub gpu: Vec<String>,

    /// Only these processes (PIDs; repeat or separate with commas)
    #[arg(long, value_delimiter = ',', value_name = "PID")]
    pub pid: Vec<u32>,

    /// Time zone of times shown, and of log timestamps without one (nvidia-smi writes
    /// local time); default: the system's
    #[arg(long, value_name = "TZ")]
    pub tz: Option<String>,
}

#[derive(Debug, Args)]
pub struct LeaksArgs {
    #[command(flatten)]
    pub source: SourceArgs,

    #[command(flatten)]
    pub analysis: AnalysisArgs,

    /// Print JSON (schema in docs/json.md); with --watch, one object per change (NDJSON)
    #[arg(long)]
    pub json: bool,

    /// Exit 1 when a process leaks (for CI jobs that guard against leaks)
    #[arg(long)]
    pub fail_on_leak: bool,

    /// Watch the GPUs now and print a line whenever a verdict changes
    #[arg(long, conflicts_with_all = ["files", "since", "until"])]
    pub watch: bool,

    /// With --watch: time between samples (e.g. 1s, 500ms; at least 50ms)
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "1s",
        requires = "watch"
    )]
    pub interval: String,

    /// With --watch: stop after N samples
    #[arg(long, value_name = "N", requires = "watch")]
    pub count: Option<u64>,

    /// Test only: with --watch, time starts at this Unix time in ms and moves by --interval
    /// per sample, without waiting
    #[arg(long, hide = true, value_name = "UNIX_MS", requires = "watch")]
    pub simulated_clock: Option<i64>,
}

#[derive(Debug, Args)]
pub struct PlotArgs {
    #[command(flatten)]
    pub source: SourceArgs,

    #[command(flatten)]
    pub analysis: AnalysisArgs,

    /// The chart file; .png or .svg
    #[arg(short, long, value_name = "FILE", default_value = "vramctl-memory.png")]
    pub output: PathBuf,

    /// Do not run the leak analysis (no leak onsets or idle periods on the chart)
    #[arg(long)]
    pub no_analysis: bool,
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

    /// Browse a recording (a history database: vramctl record, serve --record, import)
    /// instead of sampling now; live, the charts' past comes from --db when it exists
    #[arg(long, value_name = "DB")]
    pub replay: Option<PathBuf>,

    /// Thresholds of the leak and idle analysis behind the L and I flags (as for
    /// `vramctl leaks`)
    #[command(flatten)]
    pub analysis: AnalysisArgs,
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

const REAP_HELP: &str = "\
Candidates are processes idle on every GPU they hold memory on for --idle-for, by the idle
evidence of `vramctl leaks` (SM activity, device utilization, CPU time) from the recorded
history (`vramctl record` or `serve --record`), or, with --every, watched live. Policies
come from the flags or from a TOML file (--config, --policy). Method: docs/reap.md.

Exit codes:
  0  nothing to reap, or (--apply) every candidate ended and its memory was released
  1  dry run: candidates found; --apply: a candidate was refused at signal time, still
     running, or its memory still held after --timeout
  2  usage or input error (bad flag, malformed policy file with its file:line, unknown
     policy, audit log not writable with --apply)
  3  no usable NVIDIA driver
With --every the loop exits 0 when stopped by SIGINT or SIGTERM.";

#[derive(Debug, Args)]
pub struct ReapArgs {
    /// Act: end the candidates (default: print the plan and change nothing)
    #[arg(long)]
    pub apply: bool,

    /// Policy file (TOML, format in docs/reap.md) [default: $XDG_CONFIG_HOME/vramctl/reap.toml
    /// when it exists and no filter flag is given]
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Run only these policies of the file (repeat or separate with commas)
    #[arg(long, value_delimiter = ',', value_name = "NAME")]
    pub policy: Vec<String>,

    /// Candidates: idle at least this long on every GPU they use (e.g. 30m, 2h) [default:
    /// 30m]
    #[arg(long, value_name = "DURATION")]
    pub idle_for: Option<String>,

    /// Candidates: holding at least this much GPU memory over all GPUs (e.g. 4GiB)
    /// [default: 1GiB]
    #[arg(long, value_name = "SIZE")]
    pub min_mem: Option<String>,

    /// Only processes of these users (name or uid; repeat or separate with commas)
    #[arg(long, value_delimiter = ',', value_name = "USER")]
    pub user: Vec<String>,

    /// Only processes whose command line matches this regular expression
    #[arg(long = "match", value_name = "REGEX")]
    pub pattern: Option<String>,

    /// Never processes whose command line matches this regular expression (repeatable)
    #[arg(long, value_name = "REGEX")]
    pub exclude: Vec<String>,

    /// Only processes holding memory on these devices (index or UUID)
    #[arg(long, value_delimiter = ',', value_name = "GPU")]
    pub gpu: Vec<String>,

    /// End at most N processes per run (per round with --every), most memory first
    #[arg(long, value_name = "N")]
    pub max_kills: Option<usize>,

    /// Signal to send first (TERM, INT, HUP, QUIT, USR1, USR2, KILL or a number)
    #[arg(short, long, value_name = "SIG", default_value = "TERM",
          value_parser = clap::builder::ValueParser::new(parse_signal))]
    pub signal: vramctl_core::signal::Signal,

    /// Seconds to wait for a process to exit before sending SIGKILL
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub grace: f64,

    /// Seconds to wait, after the processes ended, for NVML to show their memory released
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub timeout: f64,

    /// Run a round every DURATION (e.g. 5m) until SIGINT/SIGTERM, watching the GPUs live
    /// between rounds
    #[arg(long, value_name = "DURATION")]
    pub every: Option<String>,

    /// With --every: time between live samples (at least 50ms)
    #[arg(
        long,
        value_name = "DURATION",
        default_value = "5s",
        requires = "every"
    )]
    pub interval: String,

    /// Time zone of the times shown (e.g. UTC); default: the system's
    #[arg(long, value_name = "TZ")]
    pub tz: Option<String>,

    /// Print JSON (schema in docs/json.md); with --every, one document per round (NDJSON)
    #[arg(long)]
    pub json: bool,

    /// Test only: with --every, stop after N rounds
    #[arg(long, hide = true, value_name = "N", requires = "every")]
    pub rounds: Option<u64>,

    /// Test only: time starts at this Unix time in ms and moves by --interval per live
    /// sample, without waiting
    #[arg(long, hide = true, value_name = "UNIX_MS")]
    pub simulated_clock: Option<i64>,
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
