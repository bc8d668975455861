//! The library under the `vramctl` binary: the parts of commands that tests and benchmarks
//! drive without the command line. What every frontend shares lives in lower crates:
//! `vramctl-observe` (one observation of the machine, the live loop) and `vramctl-history`
//! (recording and reading history); ARCHITECTURE.md has the map.

pub mod fit_search;
pub mod memory_release;
pub mod supervised_run;
