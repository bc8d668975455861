//! What can go wrong with a history database, each with what the user can do about it.

use std::path::{Path, PathBuf};

/// A store error. Messages follow the project's style: lowercase, the path in quotes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A read-only open of a database that does not exist.
    #[error("no history database at '{}'", path.display())]
    NotFound {
        /// The path tried.
        path: PathBuf,
    },
    /// The file exists but is not a vramctl history (another SQLite database, or not SQLite).
    #[error("'{}' is not a vramctl history database ({detail})", path.display())]
    NotOurs {
        /// The file.
        path: PathBuf,
        /// What it looked like.
        detail: String,
    },
    /// Written by a newer vramctl with a schema this one does not know.
    #[error(
        "'{}' has history schema {found}, newer than the {supported} this vramctl understands",
        path.display()
    )]
    NewerSchema {
        /// The file.
        path: PathBuf,
        /// Its schema version.
        found: i64,
        /// The newest this build knows.
        supported: i64,
    },
    /// SQLite found damage.
    #[error("the history database{} is damaged: {detail}", display_path(path.as_deref()))]
    Corrupt {
        /// The file, when known.
        path: Option<PathBuf>,
        /// What the check said.
        detail: String,
    },
    /// The database (or its directory, where SQLite keeps `-wal` and `-shm`) cannot be written.
    #[error("cannot write the history database '{}': {detail}", path.display())]
    Unwritable {
        /// The file.
        path: PathBuf,
        /// The system's reason.
        detail: String,
    },
    /// A reader could not open or read the database (permissions, a directory it cannot
    /// enter). Never says "write": a reader writes nothing.
    #[error("cannot read the history database '{}': {detail}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The system's reason.
        detail: String,
    },
    /// `--db` names a directory.
    #[error("'{}' is a directory, not a history database", path.display())]
    IsDirectory {
        /// The directory.
        path: PathBuf,
    },
    /// Written by an older vramctl; a reader cannot upgrade it.
    #[error(
        "'{}' has history schema {found}, older than the {current} this vramctl reads",
        path.display()
    )]
    OlderSchema {
        /// The file.
        path: PathBuf,
        /// Its schema version.
        found: i64,
        /// The version this build uses.
        current: i64,
    },
    /// The disk (or the database's size limit) is full.
    #[error("the disk holding '{}' is full", path.display())]
    DiskFull {
        /// The file.
        path: PathBuf,
    },
    /// Samples must be appended in time order.
    #[error("a sample at {at_ms} ms is not after the last stored one at {last_ms} ms")]
    OutOfOrder {
        /// The rejected sample's time.
        at_ms: i64,
        /// The newest stored time.
        last_ms: i64,
    },
    /// A `--retain` value that does not parse or does not make sense.
    #[error("invalid retention '{spec}': {why}")]
    Retention {
        /// The text given.
        spec: String,
        /// What is wrong with it.
        why: String,
    },
    /// Any other SQLite failure.
    // The cause is in the message, not in the error chain, so `{:#}` does not say it twice.
    #[error("{what} in '{}': {cause}", path.display())]
    Sqlite {
        /// The database (`:memory:` for an in-memory one).
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// SQLite's error.
        cause: rusqlite::Error,
    },
    /// A filesystem error outside SQLite (creating the directory, the lock file).
    #[error("{what} '{}': {cause}", path.display())]
    Io {
        /// The path involved.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The system's error.
        cause: std::io::Error,
    },
}

fn display_path(path: Option<&Path>) -> String {
    path.map(|p| format!(" '{}'", p.display()))
        .unwrap_or_default()
}

impl StoreError {
    /// One line saying what to do about it, when there is something to do.
    pub fn hint(&self) -> Option<&'static str> {
        Some(match self {
            Self::NotFound { .. } => {
                "record some history first with 'vramctl record', or point --db / VRAMCTL_DB at one"
            }
            Self::NotOurs { .. } => "point --db / VRAMCTL_DB at a vramctl history file",
            Self::NewerSchema { .. } => "upgrade vramctl, or use another --db",
            Self::Corrupt { .. } => {
                "move the file aside (with its -wal and -shm files) and start a new one; \
                 'sqlite3 FILE .recover' may save what is left"
            }
            Self::Unwritable { .. } => {
                "check the permissions of the file and of its directory, or choose another --db"
            }
            Self::DiskFull { .. } => "free some space, or shorten the retention with --retain",
            Self::Unreadable { .. } => {
                "check that you may read the file and enter its directory, or choose another --db"
            }
            Self::IsDirectory { .. } => {
                "point --db / VRAMCTL_DB at a file, e.g. a 'history.db' inside that directory"
            }
            Self::OlderSchema { .. } => {
                "run 'vramctl record' (or 'vramctl import') on it once as its owner to upgrade it"
            }
            _ => return None,
        })
    }

    /// The same error as a reader sees it: a permission or open failure is "cannot read".
    pub(crate) fn when_reading(self) -> Self {
        match self {
            Self::Unwritable { path, detail } => Self::Unreadable { path, detail },
            other => other,
        }
    }

    /// Classifies a SQLite error raised while working on `path`.
    pub(crate) fn sqlite(path: &Path, what: &'static str, err: rusqlite::Error) -> Self {
        use rusqlite::ErrorCode;
        let path = path.to_path_buf();
        match err.sqlite_error_code() {
            Some(ErrorCode::DatabaseCorrupt) => Self::Corrupt {
                path: Some(path),
                detail: err.to_string(),
            },
            Some(ErrorCode::NotADatabase) => Self::NotOurs {
                path,
                detail: "not a SQLite database".into(),
            },
            Some(ErrorCode::DiskFull) => Self::DiskFull { path },
            Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied | ErrorCode::CannotOpen) => {
                Self::Unwritable {
                    path,
                    detail: err.to_string(),
                }
            }
            _ => Self::Sqlite {
                path,
                what,
                cause: err,
            },
        }
    }

    /// Whether writing may work again later without the user changing anything vramctl
    /// controls (disk full, file made read-only, a lock held by another writer): the
    /// recorder keeps sampling and retries.
    pub fn is_transient_write_failure(&self) -> bool {
        match self {
            Self::DiskFull { .. } | Self::Unwritable { .. } => true,
            Self::Sqlite { cause, .. } => matches!(
                cause.sqlite_error_code(),
                Some(
                    rusqlite::ErrorCode::DatabaseBusy
                        | rusqlite::ErrorCode::DatabaseLocked
                        | rusqlite::ErrorCode::SystemIoFailure
                        | rusqlite::ErrorCode::OutOfMemory
                )
            ),
            _ => false,
        }
    }
}
