//! vramctl's processes: what /proc says about a process ([`procinfo`]), who a process is
//! across ticks — identity by boot, PID and start time, pidfds — and what is known of the
//! GPU's processes ([`process_catalog`]), and ending one safely ([`signal`]: refusals,
//! pidfd, identity re-check, escalation, with [`audit_record`] for the audit trail), and
//! which container a process runs in and what it is called ([`container`]).
#![warn(missing_docs)]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod audit_record;
pub mod container;
pub mod process_catalog;
pub mod procinfo;
pub mod signal;
