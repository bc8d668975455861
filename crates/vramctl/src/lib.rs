//! The library under the `vramctl` binary: the parts of commands that tests and benchmarks
//! drive without the command line. What every frontend shares lives in lower crates;
//! ARCHITECTURE.md has the map.

pub mod doctor;
pub mod tui;
