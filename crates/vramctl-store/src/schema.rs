//! The schema and its migrations.
//!
//! A history file is recognised by SQLite's `application_id` (the four bytes `VRMC`) and its
//! schema version by the `schema_version` table. Each migration moves the schema one version
//! up inside one transaction; a file with a version newer than [`CURRENT`] is refused, never
//! touched.

/// `PRAGMA application_id` of a vramctl history: `VRMC`.
pub const APPLICATION_ID: i32 = 0x5652_4D43;

/// The schema version this build writes.
pub const CURRENT: i64 = 3;

/// The oldest version a reader (`OpenMode::ReadOnly`) reads without upgrading it: every
/// migration after it only adds what readers do not use (V2: the `metric` table; its new
/// metric codes a v1 file simply has no series of; V3: a column a reader of an older file
/// reads as NULL). A reader of an older file says to
/// upgrade it with a writer. Raise it when a migration changes what readers read.
pub const READABLE_FROM: i64 = 1;

/// Migration `i` moves version `i` to `i + 1` (version 0 is the empty file).
pub const MIGRATIONS: [&str; 3] = [V1, V2, V3];

/// The first version whose `process` table has `slurm_job_id`: a reader of an older file
/// (which it may not upgrade) reads every process as of no known job.
pub const SLURM_JOB_FROM: i64 = 3;

/// Version 3 (issue 31): each process's Slurm job id, read from its cgroup path or
/// environment when it was first seen (`vramctl_procs::slurm`), so that a job's memory peak
/// can be read back after the job ended (the epilog's report). NULL: not a job's process,
/// or not known (an import, a process outside our PID namespace, an older recorder).
const V3: &str = "
ALTER TABLE process ADD COLUMN slurm_job_id INTEGER;
CREATE INDEX process_slurm_job ON process (slurm_job_id);
";

/// Version 2 (issue 14): series of the in-process agent's figures
/// (`process_allocated_bytes` 18, `process_reserved_bytes` 19). The tables are unchanged;
/// the version moves so that a build of version 1, which would read such a history as if
/// those processes had no agent (it skips series of metrics it does not know), refuses it
/// and says to upgrade instead. The `metric` table names every code in the file, so a
/// history explains its own series to `sqlite3` and to later builds.
const V2: &str = "
CREATE TABLE metric (
    code INTEGER PRIMARY KEY,
    name TEXT NOT NULL
) STRICT;
INSERT INTO metric (code, name) VALUES
    (1, 'used_bytes'), (2, 'reserved_bytes'), (3, 'free_bytes'), (4, 'total_bytes'),
    (5, 'utilization_gpu_percent'), (6, 'utilization_memory_percent'),
    (7, 'temperature_c'), (8, 'power_mw'),
    (16, 'process_used_bytes'), (17, 'process_sm_percent'),
    (18, 'process_allocated_bytes'), (19, 'process_reserved_bytes'),
    (32, 'process_cpu_ticks');
";

const V1: &str = "
CREATE TABLE schema_version (
    version INTEGER NOT NULL,
    applied_at_ms INTEGER NOT NULL
) STRICT;

-- One row per recorder run or import: where the data came from.
CREATE TABLE session (
    id INTEGER PRIMARY KEY,
    started_ms INTEGER NOT NULL,
    source TEXT NOT NULL,
    host TEXT,
    boot_id TEXT,
    interval_ms INTEGER,
    vramctl_version TEXT NOT NULL,
    driver_version TEXT,
    cuda_version TEXT
) STRICT;

CREATE TABLE device (
    id INTEGER PRIMARY KEY,
    uuid TEXT NOT NULL UNIQUE,
    idx INTEGER,
    name TEXT,
    pci_bus_id TEXT,
    parent_uuid TEXT,
    first_seen_ms INTEGER NOT NULL
) STRICT;

-- Identity (boot_id, pid, start_time_ticks): a reused PID is a new row. Imports know only
-- the PID, so boot_id and start_time_ticks may be NULL.
CREATE TABLE process (
    id INTEGER PRIMARY KEY,
    boot_id TEXT,
    pid INTEGER NOT NULL,
    start_time_ticks INTEGER,
    uid INTEGER,
    user TEXT,
    command TEXT,
    container_id TEXT,
    pod_uid TEXT,
    first_seen_ms INTEGER NOT NULL,
    last_seen_ms INTEGER NOT NULL
) STRICT;
CREATE INDEX process_pid ON process (pid);

-- A series is one metric of one device, of one process on one device, or of one process.
CREATE TABLE series (
    id INTEGER PRIMARY KEY,
    metric INTEGER NOT NULL,
    device_id INTEGER REFERENCES device (id),
    process_id INTEGER REFERENCES process (id)
) STRICT;

-- Raw samples: one row per tick, the changed values encoded compactly (codec.rs). `key`
-- frames hold every value; a reader starts from the last key frame at or before its range.
-- `observed` is NULL when the tick looked at every device (the recorder); an import that
-- saw only some devices lists them (varints: device_id << 2 | metrics << 1 | processes).
CREATE TABLE frame (
    t_ms INTEGER PRIMARY KEY,
    key INTEGER NOT NULL,
    data BLOB NOT NULL,
    observed BLOB
) STRICT;

-- Downsampled buckets (min/max/last per series) of resolution res_ms, same encoding.
CREATE TABLE rollup (
    res_ms INTEGER NOT NULL,
    t_ms INTEGER NOT NULL,
    key INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (res_ms, t_ms)
) STRICT, WITHOUT ROWID;

-- How far each resolution has been rolled up.
CREATE TABLE rollup_state (
    res_ms INTEGER PRIMARY KEY,
    done_until_ms INTEGER NOT NULL
) STRICT;

-- Stretches without data and why. device_id NULL: every device; metric NULL: the whole
-- device. to_ms moves forward every tick while open.
CREATE TABLE gap (
    id INTEGER PRIMARY KEY,
    device_id INTEGER REFERENCES device (id),
    metric INTEGER,
    from_ms INTEGER NOT NULL,
    to_ms INTEGER NOT NULL,
    open INTEGER NOT NULL,
    reason TEXT NOT NULL
) STRICT;
CREATE INDEX gap_to ON gap (to_ms);

-- Every signal kill/reap decided to send, written (synchronous=FULL) before it is sent.
CREATE TABLE audit (
    id INTEGER PRIMARY KEY,
    at_ms INTEGER NOT NULL,
    actor_uid INTEGER NOT NULL,
    actor_user TEXT,
    action TEXT NOT NULL,
    boot_id TEXT NOT NULL,
    pid INTEGER NOT NULL,
    start_time_ticks INTEGER NOT NULL,
    target_command TEXT NOT NULL,
    target_user TEXT,
    signal TEXT NOT NULL,
    reason TEXT NOT NULL,
    outcome TEXT NOT NULL,
    updated_ms INTEGER
) STRICT;
CREATE INDEX audit_at ON audit (at_ms);
";
