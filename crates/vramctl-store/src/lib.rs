//! vramctl's history: GPU and per-process memory over time, in one SQLite file.
//!
//! # Model
//!
//! A **series** is one metric of one device (memory used/reserved/free/total, utilisation,
//! temperature, power), of one process on one device (memory, SM activity), or of one
//! process (CPU time). A **tick** ([`TickSample`]) is what the recorder saw at one instant;
//! the store keeps, per tick, one **frame**: the series whose value changed, compactly
//! encoded (`codec`: 3 to 4 bytes for a changed memory value), plus a full **key frame**
//! every minute so a reader never decodes more than a minute before its range. Values that
//! could not be read are **gaps** with a reason (`GPU lost`, `not supported`, `NVML did not
//! start: …`), never zeros. A **process** is identified by `(boot id, pid, start time)`,
//! so a reused PID is a new process; its user, command line, container id and Kubernetes
//! pod UID are stored once.
//!
//! Times only go forward: a writer places each tick with a [`HistoryClock`], which keeps
//! the spacing the monotonic clock measured when the wall clock steps back and records
//! every step as a gap whose reason starts with [`CLOCK_STEP`] (`docs/clock.md`).
//!
//! Old samples are downsampled ([`Retention`], e.g. `raw=24h,1m=30d`) into buckets that
//! keep min, max and last, so a spike between two kept points is not lost.
//!
//! # Durability
//!
//! WAL mode, one writer ([`OpenMode::Append`] holds an exclusive lock on `<db>.lock`), one
//! transaction per tick with `synchronous=NORMAL` (an application crash loses nothing
//! committed; a power cut may lose the last moments), and `synchronous=FULL` around the
//! audit log of signals ([`Store::append_audit`]). Opening checks that the file is ours
//! (`application_id`), not from a newer vramctl (schema version), and, for the writer,
//! whole (`PRAGMA quick_check`).
//!
//! # Writing
//!
//! ```no_run
//! # use vramctl_store::*;
//! # fn main() -> Result<(), StoreError> {
//! let mut store = Store::open("history.db".as_ref(), OpenMode::Append)?;
//! store.begin_session(&SessionInfo { source: "record".into(), ..Default::default() })?;
//! store.append(&TickSample { at_unix_ms: 1_764_000_000_000, ..Default::default() })?;
//! store.maintain(&Retention::default(), 1_764_000_000_000)?;
//! # Ok(()) }
//! ```
//!
//! # Query API (for analysis and the frontends)
//!
//! | call | gives |
//! | --- | --- |
//! | [`Store::devices`] | every device recorded ([`DeviceRecord`]: row id, UUID, index, name, PCI bus) |
//! | [`Store::time_bounds`] | oldest and newest stored time |
//! | [`Store::device_metric`] | one device metric over a [`TimeRange`] as [`Point`]s |
//! | [`Store::processes_in`] | processes holding memory in a range, with identity/metadata ([`ProcessRecord`]) and their devices |
//! | [`Store::all_processes`], [`Store::process`] | process rows by id, without decoding samples |
//! | [`Store::process_memory`] | a process's memory on a device: `(unix_ms, bytes)` points (`min`/`max`/`last`; equal for raw samples, a bucket's extremes when downsampled) |
//! | [`Store::process_cpu`] | a process's cumulative CPU time (clock ticks) |
//! | [`Store::gaps`] | [`Gap`]s overlapping a range, with reasons |
//! | [`Store::scan`] | every series at every stored time (what `history` and `export` use); [`Frame::changed`] says which series a frame changed, so aggregating readers touch only those |
//! | [`Store::append_audit`], [`Store::set_audit_outcome`], [`Store::audit_rows`] | the audit log of signals (`synchronous=FULL`) |
//! | [`Store::open_in_memory`] + [`format::import_files`] | analyse a log file without touching the disk |
//! | [`downsample`] | re-bucket points for display, keeping min/max/last |
//! | [`Store::moment_at_or_before`], [`replay::ReplayBackend`] | one recorded moment rebuilt (readings, gaps as missing values, who the processes were) and served as a `vramctl_gpu::Backend` |
//!
//! Points are dense: one per stored tick while the series is present (a value that did not
//! change is repeated), none while it is absent. A point with `span_ms > 0` is a bucket.
//!
//! # Formats
//!
//! [`mod@format`] reads nvidia-smi CSV logs, GPU-Z sensor logs and vramctl's NDJSON into ticks
//! (one transaction per import, every value through `vramctl_core::sanity`), and writes
//! NDJSON (lossless) and nvidia-smi-style CSV (one CSV writer, [`format::csv_writer`]).
//! Readers ([`OpenMode::ReadOnly`]) open with SQLite's `mode=ro`, falling back to
//! `immutable=1` where the `-shm` cannot be created or opened ([`Store::notice`] says when
//! that leaves a write-ahead log unread).
#![warn(missing_docs)]
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod audit_table;
mod codec;
mod db;
mod error;
pub mod format;
mod model;
mod query;
pub mod replay;
mod retention;
mod schema;
mod snapshot;
mod timebase;
mod write_state;
mod writer;

pub use audit_table::AuditRow;
pub use codec::Entry;
pub use db::{OpenMode, Store};
pub use error::StoreError;
pub use model::{
    AgentBytes, DeviceMeta, DeviceRecord, DeviceSample, DeviceSampleState, Gap, Metric, Observed,
    Point, ProcessKey, ProcessList, ProcessMeta, ProcessOnDevice, ProcessRecord, ProcessSample,
    SessionInfo, TickSample, TimeRange,
};
pub use query::{Frame, SeriesRef, downsample};
pub use retention::{Maintenance, Retention};
pub use schema::CURRENT as SCHEMA_VERSION;
pub use snapshot::{add_agent_figures, device_samples};
pub use timebase::{CLOCK_STEP, HistoryClock, Placement};
pub use writer::{DEFAULT_KEY_INTERVAL_MS, Unwritten, WRITE_FAILED};
