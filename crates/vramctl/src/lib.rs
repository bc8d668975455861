//! The parts of `vramctl` that are a library as well as a binary: the terminal UI of
//! `vramctl top`, so that its frames can be rendered by a benchmark
//! (`benches/top_frame.rs`) and by tests without a terminal; and what `top` shares with the
//! other commands that run the live analysis (`facts`: /proc facts for `FleetTracker`); the
//! daemon's fast path (`daemon_socket`: `record` and `serve` answer `status`, `ps` and
//! `top` on a local socket) and the source those commands read (`live_source`: a daemon's
//! answer, else NVML here).
//!
//! The binary (`main.rs`) holds the command line and every other command.

pub mod daemon_socket;
pub mod facts;
pub mod live_source;
pub mod tui;
