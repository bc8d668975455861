//! vramctl's vocabulary: the types every crate speaks ([`types`]: snapshots, devices,
//! processes; a value a device cannot report is `None`, never 0), time ([`clock`]: wall
//! and monotonic read together and injected, so nothing needs a wall clock in tests;
//! [`duration`] and [`wall_time`] as people type and read them), and text other users
//! control ([`untrusted`], [`command_line`]). [`sanity`] drops what a driver cannot mean;
//! [`topology`] is how GPUs connect (NVLinks, PCIe path, P2P).
//! No I/O beyond reading the clocks; every other vramctl crate depends on this one.
#![warn(missing_docs)]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod clock;
pub mod command_line;
pub mod duration;
pub mod sanity;
pub mod topology;
pub mod types;
pub mod untrusted;
pub mod wall_time;
