//! The library under the `vramctl` binary: what more than one command uses, so that a
//! command module (`cmd/<command>.rs`) only parses its arguments, calls these and prints.
//! The terminal UI of `vramctl top` is here too, so that its frames can be rendered by a
//! benchmark (`benches/top_frame.rs`) and by tests without a terminal.
//!
//! The daemon's fast path (`daemon_socket`: `record` and `serve` answer `status`, `ps` and
//! `top` on a local socket) and the source those commands read (`live_source`: a daemon's
//! answer, else NVML here) live here too.
//!
//! The binary (`main.rs`) holds the command line (`cli`), the commands (`cmd/*`), their
//! output helpers (`output/*`), the exporter (`exporter/*`) and the audit sink.

pub mod csv_record;
pub mod daemon_socket;
pub mod doctor;
pub mod fit_search;
pub mod gpu_holdings;
pub mod gpu_selection;
pub mod history_chart;
pub mod import_notes;
pub mod leak_scan;
pub mod live_loop;
pub mod live_source;
pub mod memory_release;
pub mod pattern;
pub mod recorder;
pub mod sample_source;
pub mod supervised_run;
pub mod tui;
pub mod units;
