//! Where `kill`, `reap` and `top`'s kill action write their audit records: the history
//! database's `audit` table ([`AuditLog`], opened with [`open_sink`]), and, when
//! `VRAMCTL_AUDIT_LOG` names a file, a JSON-lines copy of every record ([`JsonlAuditLog`]).
//!
//! The store writes each row with `synchronous=FULL` (`Store::append_audit`), so a record
//! acknowledged before a signal survives a power cut; its outcome is updated afterwards
//! (`Store::set_audit_outcome`). The database is opened with `OpenMode::ReadWrite`, which a
//! running recorder does not block (it holds only the lock of the one writer of samples).
//!
//! Fail closed: if the database cannot be opened for writing, [`open_sink`] fails and the
//! caller sends nothing; if a record cannot be written (to the store, or to the JSON-lines
//! copy when one is configured), [`AuditSink::before`] fails and `signal::execute` does not
//! send that signal.
//!
//! The JSON-lines copy is for shipping the log elsewhere (a log collector tailing a file):
//! each record is one line `{"id": N, "record": {...}}` written before its signal, each
//! outcome update one more line `{"id": N, "outcome": {...}}`, `N` being the store's row id;
//! the file is fsynced after every line.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;
use vramctl_procs::audit_record::{AuditOutcome, AuditRecord};
use vramctl_procs::signal::{AuditError, AuditId, AuditSink};
use vramctl_store::{OpenMode, Store};

use crate::cli::GlobalArgs;

/// The variable naming the optional JSON-lines copy.
pub const JSONL_ENV: &str = "VRAMCTL_AUDIT_LOG";

/// The audit sink of every command that signals: `kill`, `reap` and `top`'s kill key call
/// this (or [`open_log`], the same log with its concrete type), so where audit records go
/// is decided here once: the history database (`--db` / `VRAMCTL_DB` / the default, as
/// `db_location::db_path`), created if missing, plus the JSON-lines copy when `VRAMCTL_AUDIT_LOG`
/// is set. `Send`: `top` signals from its action thread.
///
/// # Errors
/// When the database cannot be opened for writing (not ours, newer schema, permissions, a
/// file where its directory should be) or the JSON-lines file cannot be opened: then
/// nothing may be signalled.
pub fn open_sink(global: &GlobalArgs) -> anyhow::Result<Box<dyn AuditSink + Send>> {
    Ok(Box::new(open_log(global)?))
}

/// [`open_sink`], as an [`AuditLog`] (for [`AuditLog::describe`]).
///
/// # Errors
/// As [`open_sink`].
pub fn open_log(global: &GlobalArgs) -> anyhow::Result<AuditLog> {
    let db = crate::db_location::db_path(global)?;
    let jsonl = std::env::var_os(JSONL_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    AuditLog::open(&db, jsonl.as_deref())
}

/// The audit log: rows in the history store, and optionally a JSON-lines copy.
///
/// `Send`, so a frontend may move it to the thread that signals.
#[derive(Debug)]
pub struct AuditLog {
    store: Store,
    jsonl: Option<JsonlAuditLog>,
}

impl AuditLog {
    /// Opens the store at `db` (`OpenMode::ReadWrite`: not blocked by a recorder) and the
    /// JSON-lines copy at `jsonl`, if any.
    ///
    /// # Errors
    /// As [`open_sink`].
    pub fn open(db: &Path, jsonl: Option<&Path>) -> anyhow::Result<Self> {
        let store = Store::open(db, OpenMode::ReadWrite)
            .context("cannot open the audit log (nothing is signalled without it)")?;
        let jsonl = jsonl.map(JsonlAuditLog::open).transpose()?;
        Ok(Self { store, jsonl })
    }

    /// Where the records go, for the user: `'DB' (table audit)` and the copy, if any.
    pub fn describe(&self) -> String {
        let mut text = format!("'{}' (table audit)", self.store.path().display());
        if let Some(copy) = &self.jsonl {
            text.push_str(&format!(" and '{}'", copy.path().display()));
        }
        text
    }

    /// The history database holding the rows.
    pub fn database(&self) -> &Path {
        self.store.path()
    }
}

impl AuditSink for AuditLog {
    fn before(&mut self, record: &AuditRecord) -> Result<AuditId, AuditError> {
        let id = self
            .store
            .append_audit(record)
            .map_err(|e| AuditError(format!("cannot write the audit row: {e}")))?;
        if let Some(copy) = &mut self.jsonl {
            if let Err(err) = copy.record(id, record) {
                // The row says no signal followed, as none will.
                let _ = self
                    .store
                    .set_audit_outcome(id, &AuditOutcome::Failed(format!("not sent: {err}")));
                return Err(err);
            }
        }
        Ok(AuditId(id))
    }

    fn after(&mut self, id: AuditId, outcome: &AuditOutcome) -> Result<(), AuditError> {
        let stored = self
            .store
            .set_audit_outcome(id.0, outcome)
            .map_err(|e| AuditError(format!("cannot update audit row {}: {e}", id.0)));
        let copied = match &mut self.jsonl {
            Some(copy) => copy.outcome(id.0, outcome),
            None => Ok(()),
        };
        stored.and(copied)
    }

    /// The history database's path (the copy, if any, is in [`AuditLog::describe`]).
    fn location(&self) -> Option<String> {
        Some(self.store.path().display().to_string())
    }
}

/// The JSON-lines copy of the audit log: appended, fsynced after every line.
#[derive(Debug)]
pub struct JsonlAuditLog {
    path: PathBuf,
    file: File,
}

#[derive(Serialize)]
struct RecordLine<'a> {
    id: i64,
    record: &'a AuditRecord,
}

#[derive(Serialize)]
struct OutcomeLine<'a> {
    id: i64,
    outcome: &'a AuditOutcome,
}

impl JsonlAuditLog {
    /// Opens (creating it and its directory) the file at `path` for appending.
    ///
    /// # Errors
    /// When the directory or the file cannot be created or opened.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| {
                format!(
                    "cannot create the directory of the audit log copy ({JSONL_ENV}) '{}'",
                    dir.display()
                )
            })?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| {
                format!(
                    "cannot open the audit log copy ({JSONL_ENV}) '{}'",
                    path.display()
                )
            })?;
        Ok(Self {
            path: path.to_owned(),
            file,
        })
    }

    /// Where it writes.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends the record with the store's row id.
    ///
    /// # Errors
    /// When the line cannot be written and synced.
    pub fn record(&mut self, id: i64, record: &AuditRecord) -> Result<(), AuditError> {
        self.append(&RecordLine { id, record })
    }

    /// Appends an outcome update of row `id`.
    ///
    /// # Errors
    /// When the line cannot be written and synced.
    pub fn outcome(&mut self, id: i64, outcome: &AuditOutcome) -> Result<(), AuditError> {
        self.append(&OutcomeLine { id, outcome })
    }

    fn append(&mut self, line: &impl Serialize) -> Result<(), AuditError> {
        let mut text = serde_json::to_string(line).map_err(|e| AuditError(e.to_string()))?;
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.sync_data())
            .map_err(|e| AuditError(format!("cannot write '{}': {e}", self.path.display())))
    }
}

#[cfg(test)]
mod tests {
    use vramctl_procs::procinfo::ProcessIdentity;
    use vramctl_store::TimeRange;

    use super::*;

    fn record() -> AuditRecord {
        AuditRecord {
            at_unix_ms: 1_700_000_000_000,
            actor_uid: 1000,
            actor_user: Some("alice".into()),
            action: "kill".into(),
            target: ProcessIdentity {
                boot_id: "b".into(),
                pid: 42,
                start_time_ticks: 7,
            },
            target_command: "python train.py".into(),
            target_user: Some("alice".into()),
            signal: "SIGTERM+SIGCONT".into(),
            reason: "vramctl kill 42".into(),
            outcome: AuditOutcome::Pending,
        }
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn rows_go_to_the_store_and_lines_to_the_copy_with_the_same_ids() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("state/history.db");
        let copy = dir.path().join("deep/dir/audit.jsonl");
        let mut log = AuditLog::open(&db, Some(&copy)).unwrap();
        assert!(log.describe().contains("history.db' (table audit) and '"));
        let id = log.before(&record()).unwrap();
        let second = log.before(&record()).unwrap();
        assert_ne!(id, second);
        log.after(id, &AuditOutcome::Sent).unwrap();
        drop(log);

        let store = Store::open(&db, OpenMode::ReadOnly).unwrap();
        let rows = store.audit_rows(TimeRange::ALL).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].id, id.0);
        assert_eq!(rows[0].record.outcome, AuditOutcome::Sent);
        assert_eq!(rows[1].record.outcome, AuditOutcome::Pending);

        let lines = lines(&copy);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["id"], id.0);
        assert_eq!(lines[0]["record"]["target"]["pid"], 42);
        assert_eq!(lines[0]["record"]["outcome"]["outcome"], "pending");
        assert_eq!(lines[2]["id"], id.0);
        assert_eq!(lines[2]["outcome"]["outcome"], "sent");
    }

    #[test]
    fn without_a_copy_only_the_store_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("history.db");
        let mut log = AuditLog::open(&db, None).unwrap();
        assert_eq!(log.describe(), format!("'{}' (table audit)", db.display()));
        let id = log.before(&record()).unwrap();
        log.after(
            id,
            &AuditOutcome::Exited {
                freed_bytes: 5 << 30,
                after_ms: 120,
            },
        )
        .unwrap();
        assert!(log.after(AuditId(id.0 + 7), &AuditOutcome::Sent).is_err());
        let rows = Store::open(&db, OpenMode::ReadOnly)
            .unwrap()
            .audit_rows(TimeRange::ALL)
            .unwrap();
        assert_eq!(rows.len(), 1);
    }

    #[test]
    fn a_database_that_cannot_be_written_is_an_error_up_front() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let err = AuditLog::open(&file.join("history.db"), None).unwrap_err();
        let text = format!("{err:#}");
        assert!(text.starts_with("cannot open the audit log"), "{text}");
        // Not ours: refused, untouched.
        let other = dir.path().join("notes.txt");
        std::fs::write(&other, "not a database").unwrap();
        assert!(AuditLog::open(&other, None).is_err());
        assert_eq!(std::fs::read_to_string(&other).unwrap(), "not a database");
    }

    #[test]
    fn a_copy_that_cannot_be_written_fails_the_record_and_the_row_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("history.db");
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let err = AuditLog::open(&db, Some(&file.join("audit.jsonl"))).unwrap_err();
        assert!(
            format!("{err:#}").contains("cannot create the directory of the audit log copy"),
            "{err:#}"
        );
        // A copy that fails after opening (here: a read-only handle).
        let copy = dir.path().join("audit.jsonl");
        std::fs::write(&copy, "").unwrap();
        let mut log = AuditLog::open(&db, None).unwrap();
        log.jsonl = Some(JsonlAuditLog {
            path: copy.clone(),
            file: File::open(&copy).unwrap(),
        });
        assert!(log.before(&record()).is_err());
        drop(log);
        let rows = Store::open(&db, OpenMode::ReadOnly)
            .unwrap()
            .audit_rows(TimeRange::ALL)
            .unwrap();
        assert!(
            matches!(&rows[0].record.outcome, AuditOutcome::Failed(m) if m.starts_with("not sent")),
            "{:?}",
            rows[0].record.outcome
        );
    }
}
