//! The library under the `vramctl` binary: the parts of commands that tests and benchmarks
//! drive without the command line. What every frontend shares lives in lower crates:
//! `vramctl-observe` (one observation of the machine, the live loop), `vramctl-history`
//! (recording and reading history) and `vramctl-run` (`run`'s supervised job, `fit`'s
//! search and trial loop); ARCHITECTURE.md has the map.

pub mod doctor;
pub mod memory_release;
pub mod tui;
