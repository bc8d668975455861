//! Opening a history database: checks that it is ours, current and whole; the pragmas; the
//! lock that keeps a second writer of samples out.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use crate::error::StoreError;
use crate::model::{DeviceMeta, Metric};
use crate::schema;
use crate::write_state::Writer;

/// How a database is opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Queries only; the file must exist. No integrity check (it would read the whole
    /// file on every `history`), only the identity and version checks.
    ReadOnly,
    /// Queries and audit rows (`kill`, `reap`); creates the file. Samples cannot be
    /// appended, so this does not conflict with a running recorder.
    ReadWrite,
    /// The one writer of samples (`record`, `import`): creates the file, runs
    /// `PRAGMA quick_check`, and holds an exclusive lock on `<db>.lock` until dropped.
    Append,
}

/// A series: one metric of a device, of a process on a device, or of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct SeriesKey {
    pub metric: Metric,
    pub device: Option<i64>,
    pub process: Option<i64>,
}

/// Devices and series by id, loaded from the database and extended as they are created.
#[derive(Debug, Default)]
pub(crate) struct Catalog {
    /// Index = series id (ids start at 1; slot 0 is unused).
    pub series: Vec<Option<SeriesKey>>,
    pub series_ids: HashMap<SeriesKey, u32>,
    pub device_ids: HashMap<String, i64>,
    pub devices: HashMap<i64, DeviceMeta>,
}

impl Catalog {
    pub fn series(&self, id: u32) -> Option<SeriesKey> {
        self.series
            .get(usize::try_from(id).ok()?)
            .copied()
            .flatten()
    }
}

/// A vramctl history database. See the crate docs for the model and the API.
pub struct Store {
    pub(crate) conn: Connection,
    pub(crate) path: PathBuf,
    pub(crate) mode: OpenMode,
    pub(crate) catalog: Catalog,
    pub(crate) writer: Option<Writer>,
    /// Held while open in [`OpenMode::Append`]; the OS releases it if we die.
    _lock: Option<nix::fcntl::Flock<File>>,
    /// What opening created, removed again by [`Store::discard_if_created`].
    created: Created,
    /// See [`Store::notice`].
    notice: Option<String>,
    /// An import's transaction is open (`writer.rs`).
    pub(crate) import_tx: bool,
    /// Ticks [`Store::append`] could not write since the last it did (`writer.rs`).
    pub(crate) unwritten: Option<crate::write_state::Unwritten>,
    /// What [`Store::set_max_page_count`] set, applied again if the connection is reopened.
    max_page_count: Option<u64>,
    /// The `process` table has `slurm_job_id` (schema 3+; a reader of an older file, which
    /// it may not upgrade, reads NULL instead).
    pub(crate) slurm_column: bool,
}

/// Files and directories an open created.
#[derive(Debug, Clone, Default)]
struct Created {
    db: bool,
    lock: bool,
    /// Deepest first.
    dirs: Vec<PathBuf>,
}

impl Created {
    fn remove(&self, db: &Path) {
        self.remove_files(db);
        self.remove_dirs();
    }

    fn remove_files(&self, db: &Path) {
        if self.db {
            for suffix in ["", "-wal", "-shm", "-journal"] {
                let _ = std::fs::remove_file(sidecar(db, suffix));
            }
        }
        if self.lock {
            let _ = std::fs::remove_file(lock_path(db));
        }
    }

    fn remove_dirs(&self) {
        // `remove_dir` removes only empty directories: anything else put there stays.
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The directories `create_dir_all(dir)` would create, deepest first.
fn missing_dirs(dir: &Path) -> Vec<PathBuf> {
    dir.ancestors()
        .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
        .map(Path::to_path_buf)
        .collect()
}

/// `<db><suffix>`: SQLite's `-wal`, `-shm`, `-journal` beside the database.
fn sidecar(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn lock_path(db: &Path) -> PathBuf {
    sidecar(db, ".lock")
}

/// A SQLite URI for `path` with `query` (`file:` + the path with `%`, `?` and `#` escaped,
/// the only characters SQLite's URI parser treats specially in a path).
fn sqlite_uri(path: &Path, query: &str) -> PathBuf {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let mut uri = b"file:".to_vec();
    for &b in path.as_os_str().as_bytes() {
        match b {
            b'%' => uri.extend_from_slice(b"%25"),
            b'?' => uri.extend_from_slice(b"%3f"),
            b'#' => uri.extend_from_slice(b"%23"),
            _ => uri.push(b),
        }
    }
    uri.push(b'?');
    uri.extend_from_slice(query.as_bytes());
    PathBuf::from(std::ffi::OsString::from_vec(uri))
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or, unless read-only, creates) the history at `path`.
    ///
    /// # Errors
    /// [`StoreError::NotFound`] (read-only, no file), [`StoreError::NotOurs`] (another
    /// kind of file), [`StoreError::NewerSchema`], [`StoreError::Corrupt`] (quick check
    /// failed), [`StoreError::Unwritable`] (permissions, read-only filesystem), and for
    /// [`OpenMode::Append`] an [`StoreError::Io`] naming the recorder that holds the lock.
    pub fn open(path: &Path, mode: OpenMode) -> Result<Self, StoreError> {
        let exists = match std::fs::metadata(path) {
            Ok(meta) if meta.is_dir() => {
                return Err(StoreError::IsDirectory {
                    path: path.to_path_buf(),
                });
            }
            Ok(_) => true,
            // A directory on the way that the reader may not enter: not "no history".
            Err(e) if mode == OpenMode::ReadOnly && e.kind() != std::io::ErrorKind::NotFound => {
                return Err(StoreError::Unreadable {
                    path: path.to_path_buf(),
                    detail: e.to_string(),
                });
            }
            Err(_) => false,
        };
        if mode == OpenMode::ReadOnly {
            if !exists {
                return Err(StoreError::NotFound {
                    path: path.to_path_buf(),
                });
            }
            return Self::open_reader(path);
        }
        // What this call creates, it removes again if the open fails: a failed command
        // leaves no empty database, directory or lock file behind.
        let mut created = Created::default();
        if !exists {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                created.dirs = missing_dirs(dir);
                std::fs::create_dir_all(dir).map_err(|cause| StoreError::Io {
                    path: dir.to_path_buf(),
                    what: "cannot create the directory",
                    cause,
                })?;
            }
        }
        let result = Self::open_writer(path, mode, exists, &mut created);
        if result.is_err() {
            created.remove(path);
        }
        result
    }

    fn open_writer(
        path: &Path,
        mode: OpenMode,
        exists: bool,
        created: &mut Created,
    ) -> Result<Self, StoreError> {
        let lock = if mode == OpenMode::Append {
            let lock_path = lock_path(path);
            created.lock = !lock_path.exists();
            Some(lock(path)?)
        } else {
            None
        };
        created.db = !exists;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(path, flags)
            .map_err(|e| StoreError::sqlite(path, "cannot open", e))?;
        let mut store = Self {
            conn,
            path: path.to_path_buf(),
            mode,
            catalog: Catalog::default(),
            writer: None,
            _lock: lock,
            created: created.clone(),
            notice: None,
            import_tx: false,
            unwritten: None,
            max_page_count: None,
            slurm_column: false,
        };
        store.prepare()?;
        Ok(store)
    }

    /// Opens an existing history for reading only, whoever owns it and wherever it lies.
    ///
    /// SQLite's `mode=ro` first: it reads the write-ahead log through the `-shm` index,
    /// creating it if it may, opening it read-only if it exists (a running recorder's,
    /// root's). Where the `-shm` can neither be created nor opened (a directory the reader
    /// cannot write, a read-only mount, a file copied without it), `immutable=1`: SQLite
    /// then reads the database file alone, without locks, and a log not yet checkpointed
    /// into it is not seen (said in [`Store::notice`]).
    fn open_reader(path: &Path) -> Result<Self, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let open = |query: &str| {
            Connection::open_with_flags(sqlite_uri(path, query), flags)
                .map_err(|e| StoreError::sqlite(path, "cannot open", e).when_reading())
        };
        let mut conn = open("mode=ro")?;
        let mut notice = None;
        // The first read opens the -wal and -shm files: probe it before believing the open.
        if let Err(e) = conn.query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(())) {
            use rusqlite::ErrorCode;
            match e.sqlite_error_code() {
                Some(ErrorCode::CannotOpen | ErrorCode::ReadOnly | ErrorCode::PermissionDenied) => {
                    conn = open("mode=ro&immutable=1")?;
                    let wal_bytes = std::fs::metadata(sidecar(path, "-wal")).map_or(0, |m| m.len());
                    tracing::debug!(path = %path.display(), cause = %e, wal_bytes, "Opened the history as immutable.");
                    if wal_bytes > 0 {
                        notice = Some(format!(
                            "'{}' is read without its write-ahead log ({wal_bytes} bytes, the \
                             newest samples): its '-shm' index cannot be created or opened here",
                            path.display()
                        ));
                    }
                }
                _ => return Err(StoreError::sqlite(path, "cannot open", e).when_reading()),
            }
        }
        let mut store = Self {
            conn,
            path: path.to_path_buf(),
            mode: OpenMode::ReadOnly,
            catalog: Catalog::default(),
            writer: None,
            _lock: None,
            created: Created::default(),
            notice,
            import_tx: false,
            unwritten: None,
            max_page_count: None,
            slurm_column: false,
        };
        store.prepare()?;
        Ok(store)
    }

    /// Something a reader should tell the user about this open (a history read without
    /// the newest samples of its write-ahead log), if any.
    pub fn notice(&self) -> Option<&str> {
        self.notice.as_deref()
    }

    /// Closes the store and removes the files this open created (the database, its `-wal`,
    /// `-shm` and `.lock` files, the directories made for them): for a command that fails
    /// after opening a history that did not exist, so it leaves nothing behind. A history
    /// that existed before is left as it is.
    pub fn discard_if_created(self) {
        let created = self.created.clone();
        let path = self.path.clone();
        // Close the connection (and release the lock) before removing the files.
        let Self { conn, _lock, .. } = self;
        drop(conn);
        if created.db || created.lock {
            created.remove_files(&path);
        }
        drop(_lock);
        created.remove_dirs();
    }

    /// A store that lives in memory only (for analysing an imported file without touching
    /// the disk). It accepts samples like [`OpenMode::Append`].
    ///
    /// # Errors
    /// Only if SQLite cannot allocate it.
    pub fn open_in_memory() -> Result<Self, StoreError> {
        let path = PathBuf::from(":memory:");
        let conn = Connection::open_in_memory()
            .map_err(|e| StoreError::sqlite(&path, "cannot open", e))?;
        let mut store = Self {
            conn,
            path,
            mode: OpenMode::Append,
            catalog: Catalog::default(),
            writer: None,
            _lock: None,
            created: Created::default(),
            notice: None,
            import_tx: false,
            unwritten: None,
            max_page_count: None,
            slurm_column: false,
        };
        store.prepare()?;
        Ok(store)
    }

    /// The file this store reads (`:memory:` for an in-memory one).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Classifies a SQLite error of this store; a reader's never speaks of writing.
    pub(crate) fn err(&self, what: &'static str) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        move |e| {
            let err = StoreError::sqlite(&self.path, what, e);
            if self.mode == OpenMode::ReadOnly {
                err.when_reading()
            } else {
                err
            }
        }
    }

    fn prepare(&mut self) -> Result<(), StoreError> {
        let path = self.path.clone();
        let reading = self.mode == OpenMode::ReadOnly;
        let sql = |what: &'static str| {
            let path = path.clone();
            move |e| {
                let err = StoreError::sqlite(&path, what, e);
                if reading { err.when_reading() } else { err }
            }
        };
        let conn = &self.conn;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(sql("cannot configure"))?;
        let writable = self.mode != OpenMode::ReadOnly;
        if writable && conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(false) {
            // SQLite quietly falls back to read-only when the file is write-protected.
            return Err(StoreError::Unwritable {
                path: self.path.clone(),
                detail: "the file is read-only".into(),
            });
        }
        let app_id: i32 = conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(sql("cannot read the header"))?;
        let tables: i64 = conn
            .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
            .map_err(sql("cannot read the schema"))?;
        let fresh = app_id == 0 && tables == 0;
        if !fresh && app_id != schema::APPLICATION_ID {
            return Err(StoreError::NotOurs {
                path: self.path.clone(),
                detail: if app_id == 0 {
                    format!("a SQLite database with {tables} other objects")
                } else {
                    format!("a SQLite database with application id {app_id:#x}")
                },
            });
        }
        if fresh && !writable {
            return Err(StoreError::NotOurs {
                path: self.path.clone(),
                detail: "an empty file".into(),
            });
        }
        if writable {
            if fresh {
                // Must precede the first table to take effect.
                conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL;")
                    .map_err(sql("cannot configure"))?;
            }
            let journal: String = conn
                .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
                .map_err(sql("cannot switch to WAL"))?;
            if journal != "wal" && journal != "memory" {
                return Err(StoreError::Unwritable {
                    path: self.path.clone(),
                    detail: format!("SQLite could not use WAL mode (it answered '{journal}')"),
                });
            }
            conn.execute_batch(
                "PRAGMA synchronous = NORMAL;
                 PRAGMA foreign_keys = ON;
                 PRAGMA journal_size_limit = 67108864;",
            )
            .map_err(sql("cannot configure"))?;
        }
        if self.mode == OpenMode::Append && !fresh {
            let check: String = conn
                .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
                .map_err(sql("cannot check"))?;
            if check != "ok" {
                return Err(StoreError::Corrupt {
                    path: Some(self.path.clone()),
                    detail: check,
                });
            }
        }
        let version: i64 = if fresh {
            0
        } else {
            conn.query_row("SELECT max(version) FROM schema_version", [], |r| {
                r.get::<_, Option<i64>>(0)
            })
            .optional()
            .map_err(sql("cannot read the schema version"))?
            .flatten()
            .unwrap_or(0)
        };
        if version > schema::CURRENT {
            return Err(StoreError::NewerSchema {
                path: self.path.clone(),
                found: version,
                supported: schema::CURRENT,
            });
        }
        if version < schema::CURRENT {
            // A reader reads an older history as it is where every migration since only
            // added what readers do not need (it cannot write the upgrade).
            if !writable && version >= schema::READABLE_FROM {
                self.slurm_column = version >= schema::SLURM_JOB_FROM;
                return self.load_catalog();
            }
            if !writable {
                return Err(StoreError::OlderSchema {
                    path: self.path.clone(),
                    found: version,
                    current: schema::CURRENT,
                });
            }
            self.migrate(version)?;
        }
        self.slurm_column = true;
        self.load_catalog()
    }

    fn migrate(&mut self, from: i64) -> Result<(), StoreError> {
        let path = self.path.clone();
        let sql = |what: &'static str| {
            let path = path.clone();
            move |e| StoreError::sqlite(&path, what, e)
        };
        let now = jiff::Timestamp::now().as_millisecond();
        let mut applied = from;
        for version in from..schema::CURRENT {
            let tx = self.conn.transaction().map_err(sql("cannot migrate"))?;
            let step = usize::try_from(version).unwrap_or(usize::MAX);
            let Some(ddl) = schema::MIGRATIONS.get(step) else {
                break;
            };
            tx.execute_batch(ddl).map_err(sql("cannot migrate"))?;
            tx.execute(
                "INSERT INTO schema_version (version, applied_at_ms) VALUES (?1, ?2)",
                (version + 1, now),
            )
            .map_err(sql("cannot migrate"))?;
            if version == 0 {
                tx.execute_batch(&format!(
                    "PRAGMA application_id = {};",
                    schema::APPLICATION_ID
                ))
                .map_err(sql("cannot migrate"))?;
            }
            tx.commit().map_err(sql("cannot migrate"))?;
            applied = version + 1;
        }
        // Version 0 is a file with no schema: one this open has just created.
        if from == 0 {
            tracing::info!(version = applied, path = %self.path.display(), "Created the history.");
        } else if applied > from {
            tracing::info!(from, version = applied, path = %self.path.display(), "Upgraded the history schema.");
        }
        Ok(())
    }

    /// (Re)reads devices and series, which another process may have added since.
    pub(crate) fn load_catalog(&mut self) -> Result<(), StoreError> {
        let mut catalog = Catalog::default();
        let err = |e| StoreError::sqlite(&self.path, "cannot read the catalog", e);
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, uuid, idx, name, pci_bus_id, parent_uuid FROM device ORDER BY id",
            )
            .map_err(err)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    DeviceMeta {
                        uuid: r.get(1)?,
                        index: r.get(2)?,
                        name: r.get(3)?,
                        pci_bus_id: r.get(4)?,
                        parent_uuid: r.get(5)?,
                    },
                ))
            })
            .map_err(err)?;
        for row in rows {
            let (id, meta) = row.map_err(err)?;
            catalog.device_ids.insert(meta.uuid.clone(), id);
            catalog.devices.insert(id, meta);
        }
        drop(stmt);
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id, metric, device_id, process_id FROM series ORDER BY id")
            .map_err(err)?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                ))
            })
            .map_err(err)?;
        for row in rows {
            let (id, metric, device, process) = row.map_err(err)?;
            let (Ok(id), Some(metric)) = (u32::try_from(id), Metric::from_code(metric)) else {
                // A metric from a newer build of the same schema version: skip it.
                continue;
            };
            let key = SeriesKey {
                metric,
                device,
                process,
            };
            let slot = usize::try_from(id).unwrap_or(0);
            if catalog.series.len() <= slot {
                catalog.series.resize(slot + 1, None);
            }
            catalog.series[slot] = Some(key);
            catalog.series_ids.insert(key, id);
        }
        drop(stmt);
        self.catalog = catalog;
        Ok(())
    }

    /// `PRAGMA integrity_check`: the full check (reads every page), for tests and on demand.
    ///
    /// # Errors
    /// When the check cannot run.
    pub fn integrity_check(&self) -> Result<Vec<String>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("PRAGMA integrity_check")
            .map_err(self.err("cannot check"))?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(self.err("cannot check"))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(self.err("cannot check"))
    }

    /// Bytes the database occupies (pages × page size; the WAL not included).
    ///
    /// # Errors
    /// When SQLite cannot be asked.
    pub fn size_bytes(&self) -> Result<u64, StoreError> {
        let pages: i64 = self
            .conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .map_err(self.err("cannot measure"))?;
        let size: i64 = self
            .conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .map_err(self.err("cannot measure"))?;
        Ok(u64::try_from(pages * size).unwrap_or(0))
    }

    /// Limits the database to `pages` pages (`PRAGMA max_page_count`): past it, writes fail
    /// as on a full disk. For tests of the disk-full path where no small filesystem can be
    /// mounted.
    ///
    /// # Errors
    /// When SQLite cannot be asked.
    pub fn set_max_page_count(&mut self, pages: u64) -> Result<(), StoreError> {
        self.conn
            .query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))
            .map_err(self.err("cannot configure"))?;
        self.max_page_count = Some(pages);
        Ok(())
    }

    /// After a failed write: leaves no transaction open. An open transaction holds the
    /// database's write lock, so every other writer (`kill`'s audit row, an import) would
    /// fail with "database is locked" for as long as this connection lives, and the
    /// recorder's next ticks would go into it and never be committed. SQLite may or may not
    /// have rolled the transaction back itself (on `SQLITE_FULL` it depends on where the
    /// write failed; a failed `COMMIT` leaves it open): it is rolled back here if it is
    /// still open, and if even that fails, the connection is closed (which rolls back) and
    /// opened again. An import's own transaction is left to the import, which abandons it
    /// as a whole (`Store::rollback_import`).
    pub(crate) fn end_failed_transaction(&mut self) {
        if self.import_tx || self.conn.is_autocommit() {
            return;
        }
        if let Err(err) = self.conn.execute_batch("ROLLBACK") {
            tracing::warn!(path = %self.path.display(), error = %err, "Could not roll back after a failed write.");
        }
        if self.conn.is_autocommit() {
            return;
        }
        if let Err(err) = self.reopen() {
            tracing::error!(path = %self.path.display(), error = %err, "Could not reopen the history after a failed write; its transaction stays open.");
        }
    }

    /// Replaces the connection by a new one on the same file, configured as
    /// [`Store::open`] left it (the schema checks are not repeated: the file is the one
    /// this store checked). Dropping the old connection rolls back what it had open. An
    /// in-memory store cannot be reopened (its data lives in the connection).
    pub(crate) fn reopen(&mut self) -> Result<(), StoreError> {
        if self.mode == OpenMode::ReadOnly || self.path == Path::new(":memory:") {
            return Err(StoreError::Unwritable {
                path: self.path.clone(),
                detail: "this connection cannot be reopened".into(),
            });
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&self.path, flags)
            .map_err(|e| StoreError::sqlite(&self.path, "cannot reopen", e))?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(|e| StoreError::sqlite(&self.path, "cannot configure", e))?;
        conn.execute_batch(
            "PRAGMA synchronous = NORMAL;
             PRAGMA foreign_keys = ON;
             PRAGMA journal_size_limit = 67108864;",
        )
        .map_err(|e| StoreError::sqlite(&self.path, "cannot configure", e))?;
        if let Some(pages) = self.max_page_count {
            conn.query_row(&format!("PRAGMA max_page_count = {pages}"), [], |_| Ok(()))
                .map_err(|e| StoreError::sqlite(&self.path, "cannot configure", e))?;
        }
        drop(std::mem::replace(&mut self.conn, conn));
        tracing::info!(path = %self.path.display(), "Reopened the history.");
        Ok(())
    }

    /// Checkpoints the WAL into the database and truncates it, and runs `PRAGMA optimize`.
    /// The recorder calls it when it stops.
    ///
    /// # Errors
    /// When SQLite fails.
    pub fn close(self) -> Result<(), StoreError> {
        if self.mode != OpenMode::ReadOnly {
            self.conn
                .execute_batch("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA optimize;")
                .map_err(self.err("cannot checkpoint"))?;
        }
        Ok(())
    }
}

/// Takes the writer lock `<db>.lock` (flock, released by the OS if we die) and writes our
/// PID into it so the next one can say who holds it.
fn lock(db: &Path) -> Result<nix::fcntl::Flock<File>, StoreError> {
    use std::io::{Read, Seek, Write};
    let path = lock_path(db);
    let io = |what: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |cause| StoreError::Io {
            path: path.clone(),
            what,
            cause,
        }
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|cause| match cause.kind() {
            // The lock file lives beside the database: a directory we cannot write is an
            // unwritable database (SQLite needs it for the -wal and -shm files too).
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                StoreError::Unwritable {
                    path: db.to_path_buf(),
                    detail: format!("cannot create '{}': {cause}", path.display()),
                }
            }
            _ => StoreError::Io {
                path: path.clone(),
                what: "cannot open the lock file",
                cause,
            },
        })?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(mut locked) => {
            locked.set_len(0).map_err(io("cannot write", &path))?;
            locked
                .seek(std::io::SeekFrom::Start(0))
                .map_err(io("cannot write", &path))?;
            write!(locked, "{}", std::process::id()).map_err(io("cannot write", &path))?;
            Ok(locked)
        }
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            Err(StoreError::Io {
                path: db.to_path_buf(),
                what: "another vramctl is already recording into",
                cause: std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    if holder.is_empty() {
                        format!("it holds '{}'; stop it first", path.display())
                    } else {
                        format!(
                            "PID {holder} holds '{}'; stop it first or use another --db",
                            path.display()
                        )
                    },
                ),
            })
        }
        Err((_, errno)) => Err(StoreError::Io {
            path,
            what: "cannot lock",
            cause: std::io::Error::from(errno),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SessionInfo;
    use crate::writer::tests::{GIB, T0, tick};

    fn temp() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/history.db");
        (dir, path)
    }

    #[test]
    fn created_reopened_and_read_only() {
        let (_dir, path) = temp();
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        store.append(&tick(T0, GIB, &[(7, GIB)])).unwrap();
        store.close().unwrap();
        let mut reader = Store::open(&path, OpenMode::ReadOnly).unwrap();
        assert_eq!(reader.devices().unwrap().len(), 1);
        assert_eq!(reader.integrity_check().unwrap(), vec!["ok".to_owned()]);
        let again = Store::open(&path, OpenMode::Append).unwrap();
        drop(again);
    }

    #[test]
    fn missing_file_read_only_is_not_found() {
        let (_dir, path) = temp();
        let err = Store::open(&path, OpenMode::ReadOnly).unwrap_err();
        assert!(matches!(err, StoreError::NotFound { .. }), "{err}");
        assert!(err.hint().unwrap().contains("vramctl record"));
    }

    #[test]
    fn a_text_file_is_not_ours() {
        let (dir, _) = temp();
        let path = dir.path().join("notes.txt");
        std::fs::write(
            &path,
            "hello, this is not a database at all, not even close\n".repeat(100),
        )
        .unwrap();
        for mode in [OpenMode::ReadOnly, OpenMode::Append] {
            let err = Store::open(&path, mode).unwrap_err();
            assert!(matches!(err, StoreError::NotOurs { .. }), "{err}");
            assert!(
                err.to_string().contains("is not a vramctl history"),
                "{err}"
            );
        }
        assert!(
            std::fs::read_to_string(&path).unwrap().starts_with("hello"),
            "left untouched"
        );
    }

    #[test]
    fn another_sqlite_database_is_not_ours() {
        let (dir, _) = temp();
        let path = dir.path().join("other.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE t (x)").unwrap();
        drop(conn);
        let err = Store::open(&path, OpenMode::Append).unwrap_err();
        assert!(matches!(err, StoreError::NotOurs { .. }), "{err}");
    }

    #[test]
    fn a_newer_schema_is_refused_untouched() {
        let (_dir, path) = temp();
        Store::open(&path, OpenMode::Append).unwrap();
        let conn = Connection::open(&path).unwrap();
        conn.execute("INSERT INTO schema_version VALUES (99, 0)", [])
            .unwrap();
        drop(conn);
        for mode in [OpenMode::ReadOnly, OpenMode::ReadWrite, OpenMode::Append] {
            let err = Store::open(&path, mode).unwrap_err();
            assert!(
                matches!(
                    err,
                    StoreError::NewerSchema {
                        found: 99,
                        supported: schema::CURRENT,
                        ..
                    }
                ),
                "{err}"
            );
        }
    }

    #[test]
    fn a_version_1_history_is_read_as_it_is_and_upgraded_by_a_writer() {
        let (_dir, path) = temp();
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        store.append(&tick(T0, GIB, &[(7, GIB)])).unwrap();
        store.close().unwrap();
        // Version 1's tables are version 3's without `metric` and the process's job: make
        // the file version 1.
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(
            "DROP TABLE metric; DROP INDEX process_slurm_job; \
             ALTER TABLE process DROP COLUMN slurm_job_id; \
             DELETE FROM schema_version WHERE version >= 2;",
        )
        .unwrap();
        drop(conn);
        // A reader reads it as it is (it may not be allowed to write the upgrade: root's
        // recorder's history, the shipped example), and leaves it version 1.
        let mut reader = Store::open(&path, OpenMode::ReadOnly).unwrap();
        let d = reader.devices().unwrap()[0].id;
        let used = reader
            .device_metric(d, Metric::UsedBytes, crate::TimeRange::ALL)
            .unwrap();
        assert_eq!(used.len(), 1);
        // Its processes are read without a job (the column is not there).
        let processes = reader.all_processes().unwrap();
        assert_eq!(processes.len(), 1);
        assert!(processes.values().all(|p| p.meta.slurm_job_id.is_none()));
        assert_eq!(reader.job_peaks(1).unwrap(), []);
        drop(reader);
        let conn = Connection::open(&path).unwrap();
        let version: i64 = conn
            .query_row("SELECT max(version) FROM schema_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, 1, "a reader changes nothing");
        drop(conn);
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        store.append(&tick(T0 + 1000, GIB, &[(7, GIB)])).unwrap();
        store.close().unwrap();
        let conn = Connection::open(&path).unwrap();
        let version: i64 = conn
            .query_row("SELECT max(version) FROM schema_version", [], |r| r.get(0))
            .unwrap();
        let name: String = conn
            .query_row("SELECT name FROM metric WHERE code = 18", [], |r| r.get(0))
            .unwrap();
        assert_eq!(
            (version, name.as_str()),
            (schema::CURRENT, "process_allocated_bytes")
        );
        drop(conn);
        let mut store = Store::open(&path, OpenMode::ReadOnly).unwrap();
        let d = store.devices().unwrap()[0].id;
        let used = store
            .device_metric(d, Metric::UsedBytes, crate::TimeRange::ALL)
            .unwrap();
        assert_eq!(used.len(), 2, "the version 1 sample is kept");
    }

    #[test]
    fn the_metric_table_names_every_metric() {
        let (_dir, path) = temp();
        Store::open(&path, OpenMode::Append)
            .unwrap()
            .close()
            .unwrap();
        let conn = Connection::open(&path).unwrap();
        for metric in Metric::ALL {
            let name: String = conn
                .query_row(
                    "SELECT name FROM metric WHERE code = ?1",
                    [metric.code()],
                    |r| r.get(0),
                )
                .unwrap();
            assert_eq!(name, metric.name());
        }
    }

    #[test]
    fn a_damaged_file_is_corrupt() {
        let (_dir, path) = temp();
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        for i in 0..200 {
            store
                .append(&tick(T0 + i * 1000, GIB * (i as u64 % 7), &[(7, GIB)]))
                .unwrap();
        }
        store.close().unwrap();
        // Overwrite the middle of the file (past the header and schema) with garbage.
        let mut bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() > 3 * 4096, "{}", bytes.len());
        for b in &mut bytes[2 * 4096..3 * 4096] {
            *b = 0xA5;
        }
        std::fs::write(&path, bytes).unwrap();
        let err = Store::open(&path, OpenMode::Append).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    }

    #[test]
    fn a_second_writer_is_refused_with_the_holder() {
        let (_dir, path) = temp();
        let _first = Store::open(&path, OpenMode::Append).unwrap();
        let err = Store::open(&path, OpenMode::Append).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("already recording"), "{text}");
        assert!(
            text.contains(&format!("PID {}", std::process::id())),
            "{text}"
        );
        // Readers and the audit log are not blocked.
        Store::open(&path, OpenMode::ReadOnly).unwrap();
        Store::open(&path, OpenMode::ReadWrite).unwrap();
    }

    #[test]
    fn disk_full_loses_nothing_written_and_recovers() {
        let (_dir, path) = temp();
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        store.append(&tick(T0, GIB, &[(7, GIB)])).unwrap();
        let pages = store.size_bytes().unwrap() / 4096;
        store.set_max_page_count(pages).unwrap();
        let mut t = T0;
        let err = loop {
            t += 1000;
            let pids: Vec<(u32, u64)> = (0..50)
                .map(|p| (1000 + p + (t / 1000 % 1000) as u32 * 50, GIB))
                .collect();
            match store.append(&tick(t, GIB, &pids)) {
                Ok(()) => continue,
                Err(e) => break e,
            }
        };
        assert!(matches!(err, StoreError::DiskFull { .. }), "{err}");
        assert!(err.is_transient_write_failure());
        let written = store.tick_count(crate::model::TimeRange::ALL).unwrap();
        assert_eq!(
            written,
            u64::try_from((t - T0) / 1000).unwrap(),
            "every tick before the failure is there"
        );
        store.set_max_page_count(1 << 30).unwrap();
        store.append(&tick(t, GIB, &[(7, GIB)])).unwrap();
        assert_eq!(
            store.tick_count(crate::model::TimeRange::ALL).unwrap(),
            written + 1
        );
        assert!(
            write_failed_gaps(&store).is_empty(),
            "the failed tick was written when retried: nothing was lost"
        );
        assert_eq!(store.unwritten(), None);
        assert_eq!(store.integrity_check().unwrap(), vec!["ok".to_owned()]);
    }

    fn write_failed_gaps(store: &Store) -> Vec<crate::model::Gap> {
        store
            .gaps(crate::model::TimeRange::ALL)
            .unwrap()
            .into_iter()
            .filter(|g| g.reason.starts_with(crate::writer::WRITE_FAILED))
            .collect()
    }

    fn used_points(store: &mut Store, range: crate::model::TimeRange) -> Vec<(i64, u64)> {
        let d = store.devices().unwrap()[0].id;
        store
            .device_metric(d, Metric::UsedBytes, range)
            .unwrap()
            .iter()
            .map(|p| (p.unix_ms - T0, p.last / GIB))
            .collect()
    }

    /// Whether another connection can take the write lock at once (what `kill`'s audit row
    /// needs): a transaction left open by the writer holds it.
    fn write_lock_is_free(path: &Path) -> Result<(), rusqlite::Error> {
        let other = Connection::open(path)?;
        other.busy_timeout(std::time::Duration::ZERO)?;
        other.execute_batch("BEGIN IMMEDIATE; ROLLBACK;")
    }

    /// A failed COMMIT used to leave its transaction open: the recorder's later ticks went
    /// into it and were never committed, and every other writer got "database is locked".
    #[test]
    fn a_failed_commit_leaves_no_transaction_open_nor_the_write_lock_held() {
        let (_dir, path) = temp();
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        store.append(&tick(T0, GIB, &[(7, GIB)])).unwrap();
        // A COMMIT that fails and leaves the transaction open, as SQLite does for a
        // deferred constraint and may do for a disk that fills while the WAL is written:
        // every frame written breaks a deferred foreign key.
        store
            .conn
            .execute_batch(
                "CREATE TEMP TABLE parent (id INTEGER PRIMARY KEY);
                 CREATE TEMP TABLE child (
                     p INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);
                 CREATE TEMP TRIGGER break_commit AFTER INSERT ON frame
                 BEGIN INSERT INTO child VALUES (1); END;",
            )
            .unwrap();
        let err = store
            .append(&tick(T0 + 1000, 2 * GIB, &[(7, GIB)]))
            .unwrap_err();
        assert!(
            store.conn.is_autocommit(),
            "no transaction is left open after: {err}"
        );
        write_lock_is_free(&path).expect("another writer is not locked out");
        // Retention starts its own transaction: it used to fail with "cannot start a
        // transaction within a transaction" for as long as the recorder ran.
        store
            .maintain(&crate::retention::Retention::default(), T0 + 60_000)
            .expect("retention runs after a failed tick");
        store
            .conn
            .execute_batch("DROP TRIGGER break_commit")
            .unwrap();
        store
            .append(&tick(T0 + 2000, 3 * GIB, &[(7, GIB)]))
            .unwrap();
        // Committed: another connection reads it, and the failed tick is a gap.
        let mut reader = Store::open(&path, OpenMode::ReadOnly).unwrap();
        assert_eq!(
            used_points(&mut reader, crate::model::TimeRange::ALL),
            [(0, 1), (2000, 3)]
        );
        let gaps = write_failed_gaps(&reader);
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        assert_eq!((gaps[0].from_ms, gaps[0].to_ms), (T0 + 1000, T0 + 1000));
        assert!(
            gaps[0].reason.ends_with("; 1 sample not written"),
            "{}",
            gaps[0].reason
        );
        assert_eq!(gaps[0].device_uuid, None);
        assert_eq!(reader.integrity_check().unwrap(), vec!["ok".to_owned()]);
    }

    #[test]
    fn disk_full_ticks_become_one_gap_and_the_tick_after_them_is_a_key_frame() {
        let (_dir, path) = temp();
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        // No key frame is due by time in this test: one after the gap is the failure's.
        store.begin_session(&SessionInfo::default()).unwrap();
        store.set_key_interval_ms(3_600_000);
        for i in 0..3u64 {
            let t = T0 + 1000 * i as i64;
            store.append(&tick(t, (i + 1) * GIB, &[(7, GIB)])).unwrap();
        }
        store
            .set_max_page_count(store.size_bytes().unwrap() / 4096)
            .unwrap();
        // Ticks naming hundreds of new processes need new pages: each fails.
        for i in 3..6u32 {
            let many: Vec<(u32, u64)> = (0..300).map(|p| (1000 + i * 300 + p, GIB)).collect();
            let err = store
                .append(&tick(T0 + 1000 * i64::from(i), 4 * GIB, &many))
                .unwrap_err();
            assert!(matches!(err, StoreError::DiskFull { .. }), "{err}");
            assert!(store.conn.is_autocommit(), "rolled back: {err}");
            // kill's audit row can be written meanwhile (its connection has no page cap).
            write_lock_is_free(&path).expect("the write lock is free while writes fail");
        }
        assert_eq!(
            store.unwritten(),
            Some(&crate::writer::Unwritten {
                from_ms: T0 + 3000,
                to_ms: T0 + 5000,
                ticks: 3,
                cause: "disk full".into()
            })
        );
        // Space again.
        store.set_max_page_count(1 << 30).unwrap();
        store
            .append(&tick(T0 + 6000, 7 * GIB, &[(7, GIB)]))
            .unwrap();
        store
            .append(&tick(T0 + 7000, 8 * GIB, &[(7, GIB)]))
            .unwrap();
        assert_eq!(store.unwritten(), None);
        let key = |t: i64| -> bool {
            store
                .conn
                .query_row("SELECT key FROM frame WHERE t_ms = ?1", [t], |r| r.get(0))
                .unwrap()
        };
        assert!(
            key(T0 + 6000),
            "the first frame after a failure is a key frame"
        );
        assert!(!key(T0 + 7000), "then deltas again");
        let mut reader = Store::open(&path, OpenMode::ReadOnly).unwrap();
        assert_eq!(
            used_points(&mut reader, crate::model::TimeRange::ALL),
            [(0, 1), (1000, 2), (2000, 3), (6000, 7), (7000, 8)]
        );
        // A reader starting after the gap decodes from the key frame written after it.
        let after = crate::model::TimeRange {
            from_ms: T0 + 6500,
            to_ms: T0 + 9000,
        };
        assert_eq!(used_points(&mut reader, after), [(7000, 8)]);
        let gaps = write_failed_gaps(&reader);
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        assert_eq!(
            (gaps[0].from_ms, gaps[0].to_ms, gaps[0].open),
            (T0 + 3000, T0 + 5000, false),
            "exactly the ticks not written"
        );
        assert_eq!(
            gaps[0].reason,
            "write-failed: disk full; 3 samples not written"
        );
        let pids: Vec<u32> = reader
            .processes_in(crate::model::TimeRange::ALL)
            .unwrap()
            .iter()
            .map(|(p, _)| p.meta.key.pid)
            .collect();
        assert_eq!(pids, [7], "nothing of the failed ticks is kept");
        assert_eq!(reader.integrity_check().unwrap(), vec!["ok".to_owned()]);
    }

    #[test]
    fn a_writer_stopping_while_writes_fail_records_their_gap_once_it_can() {
        let (_dir, path) = temp();
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        store.append(&tick(T0, GIB, &[(7, GIB)])).unwrap();
        store
            .set_max_page_count(store.size_bytes().unwrap() / 4096)
            .unwrap();
        let many: Vec<(u32, u64)> = (1000..1400).map(|p| (p, GIB)).collect();
        assert!(store.append(&tick(T0 + 1000, GIB, &many)).is_err());
        assert!(store.append(&tick(T0 + 2000, GIB, &many)).is_err());
        store.set_max_page_count(1 << 30).unwrap();
        let gap = store.record_unwritten_gap().unwrap().expect("a gap");
        assert_eq!((gap.from_ms, gap.to_ms), (T0 + 1000, T0 + 2000));
        assert_eq!(store.unwritten(), None);
        assert_eq!(store.record_unwritten_gap().unwrap(), None);
        store.close().unwrap();
        let reader = Store::open(&path, OpenMode::ReadOnly).unwrap();
        let gaps = write_failed_gaps(&reader);
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        assert_eq!(
            gaps[0].reason,
            "write-failed: disk full; 2 samples not written"
        );
    }

    /// The last resort when even `ROLLBACK` fails: a new connection, the old one's
    /// transaction rolled back with it.
    #[test]
    fn reopening_ends_a_transaction_left_open() {
        let (_dir, path) = temp();
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        store.append(&tick(T0, GIB, &[(7, GIB)])).unwrap();
        store.set_max_page_count(5000).unwrap();
        store
            .conn
            .execute_batch(
                "BEGIN IMMEDIATE; INSERT INTO gap (from_ms, to_ms, open, reason) \
                 VALUES (0, 0, 0, 'uncommitted');",
            )
            .unwrap();
        assert!(write_lock_is_free(&path).is_err(), "held before");
        store.reopen().unwrap();
        write_lock_is_free(&path).expect("released by the reopen");
        let pages: i64 = store
            .conn
            .query_row("PRAGMA max_page_count", [], |r| r.get(0))
            .unwrap();
        assert_eq!(pages, 5000, "configured as before");
        store.append(&tick(T0 + 1000, GIB, &[(7, GIB)])).unwrap();
        let gaps = store.gaps(crate::model::TimeRange::ALL).unwrap();
        assert!(gaps.iter().all(|g| g.reason != "uncommitted"), "{gaps:?}");
        assert_eq!(store.tick_count(crate::model::TimeRange::ALL).unwrap(), 2);
    }

    #[test]
    fn a_failed_tick_keeps_the_processes_known_before_it() {
        let (_dir, path) = temp();
        let mut store = Store::open(&path, OpenMode::Append).unwrap();
        store.append(&tick(T0, GIB, &[(7, GIB)])).unwrap();
        let rows = store
            .processes_in(crate::model::TimeRange::ALL)
            .unwrap()
            .len();
        // Full: a tick with new processes fails and rolls back.
        store
            .set_max_page_count(store.size_bytes().unwrap() / 4096)
            .unwrap();
        let many: Vec<(u32, u64)> = (1000..1400).map(|p| (p, GIB)).collect();
        assert!(store.append(&tick(T0 + 1000, GIB, &many)).is_err());
        store.set_max_page_count(1 << 30).unwrap();
        // The next tick lists PID 7 without naming it, as the recorder does between names.
        let mut next = tick(T0 + 2000, GIB, &[(7, GIB)]);
        next.processes.clear();
        store.append(&next).unwrap();
        assert_eq!(
            store
                .processes_in(crate::model::TimeRange::ALL)
                .unwrap()
                .len(),
            rows,
            "PID 7 is still the process it was, not a new bare row"
        );
    }
}
