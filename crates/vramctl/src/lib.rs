//! The library under the `vramctl` binary: the parts of commands that tests and benchmarks
//! drive without the command line. What every frontend shares lives in lower crates:
//! `vramctl-observe` (one observation of the machine, the live loop) and `vramctl-history`
//! (recording and reading history), `vramctl-free` (reap's engine, freeing memory safely); ARCHITECTURE.md has the map.

pub mod doctor;
pub mod fit_search;
pub mod supervised_run;
pub mod tui;
