//! vramctl's leak and idle-holder analysis: pure functions over memory series
//! ([`analysis`]: batch over a recording, fed sample by sample, and live over every process
//! on every GPU with `analysis::live::FleetTracker`). No I/O; `docs/leaks.md`.
#![warn(missing_docs)]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod analysis;
