//! The audit log of signals: written with `synchronous=FULL`, so a row acknowledged to
//! `kill`/`reap` survives a power cut, not only a crash.

use rusqlite::params;
use vramctl_procs::audit_record::{AuditOutcome, AuditRecord};
use vramctl_procs::procinfo::ProcessIdentity;

use crate::db::{OpenMode, Store};
use crate::error::StoreError;
use crate::model::TimeRange;
use crate::writer::to_i64;

/// An audit row and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    /// Row id (what [`Store::set_audit_outcome`] takes).
    pub id: i64,
    /// The record, with its latest outcome.
    pub record: AuditRecord,
    /// When the outcome was last changed, ms since the Unix epoch.
    pub updated_ms: Option<i64>,
}

impl Store {
    /// Writes `record` durably (WAL synced before this returns) and returns its id. Call it
    /// *before* sending the signal, with [`AuditOutcome::Pending`].
    ///
    /// # Errors
    /// When the store is read-only or the write fails; then do not send the signal.
    pub fn append_audit(&mut self, record: &AuditRecord) -> Result<i64, StoreError> {
        let outcome = outcome_json(&record.outcome);
        self.durably(|conn| {
            conn.execute(
                "INSERT INTO audit (at_ms, actor_uid, actor_user, action, boot_id, pid, \
                 start_time_ticks, target_command, target_user, signal, reason, outcome) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                params![
                    record.at_unix_ms,
                    record.actor_uid,
                    record.actor_user,
                    record.action,
                    record.target.boot_id,
                    record.target.pid,
                    to_i64(record.target.start_time_ticks),
                    record.target_command,
                    record.target_user,
                    record.signal,
                    record.reason,
                    outcome
                ],
            )?;
            Ok(conn.last_insert_rowid())
        })
    }

    /// Records what happened to an audited signal (durably).
    ///
    /// # Errors
    /// When the store is read-only, the row does not exist, or the write fails.
    pub fn set_audit_outcome(&mut self, id: i64, outcome: &AuditOutcome) -> Result<(), StoreError> {
        let json = outcome_json(outcome);
        let now = jiff::Timestamp::now().as_millisecond();
        let changed = self.durably(|conn| {
            conn.execute(
                "UPDATE audit SET outcome = ?1, updated_ms = ?2 WHERE id = ?3",
                params![json, now, id],
            )
        })?;
        if changed == 0 {
            return Err(StoreError::Sqlite {
                path: self.path.clone(),
                what: "cannot update the audit log",
                cause: rusqlite::Error::QueryReturnedNoRows,
            });
        }
        Ok(())
    }

    /// Audit rows in `range` (by decision time), oldest first.
    ///
    /// # Errors
    /// When SQLite fails or a row is unreadable.
    pub fn audit_rows(&self, range: TimeRange) -> Result<Vec<AuditRow>, StoreError> {
        let err = self.err("cannot read the audit log");
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id, at_ms, actor_uid, actor_user, action, boot_id, pid, start_time_ticks, \
                 target_command, target_user, signal, reason, outcome, updated_ms FROM audit \
                 WHERE at_ms >= ?1 AND at_ms <= ?2 ORDER BY at_ms, id",
            )
            .map_err(&err)?;
        let rows = stmt
            .query_map([range.from_ms, range.to_ms], |r| {
                let outcome: String = r.get(12)?;
                Ok(AuditRow {
                    id: r.get(0)?,
                    record: AuditRecord {
                        at_unix_ms: r.get(1)?,
                        actor_uid: r.get(2)?,
                        actor_user: r.get(3)?,
                        action: r.get(4)?,
                        target: ProcessIdentity {
                            boot_id: r.get(5)?,
                            pid: r.get(6)?,
                            start_time_ticks: u64::try_from(r.get::<_, i64>(7)?).unwrap_or(0),
                        },
                        target_command: r.get(8)?,
                        target_user: r.get(9)?,
                        signal: r.get(10)?,
                        reason: r.get(11)?,
                        outcome: serde_json::from_str(&outcome).map_err(|e| {
                            rusqlite::Error::FromSqlConversionFailure(
                                12,
                                rusqlite::types::Type::Text,
                                Box::new(e),
                            )
                        })?,
                    },
                    updated_ms: r.get(13)?,
                })
            })
            .map_err(&err)?;
        rows.collect::<Result<_, _>>().map_err(&err)
    }

    /// Runs `write` in a transaction with `synchronous=FULL` (the WAL is synced at commit),
    /// then returns to `NORMAL` for samples.
    fn durably<T>(
        &mut self,
        write: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        if self.mode == OpenMode::ReadOnly {
            return Err(StoreError::Unwritable {
                path: self.path.clone(),
                detail: "opened read-only".into(),
            });
        }
        let path = self.path.clone();
        let err = move |e| StoreError::sqlite(&path, "cannot write the audit log", e);
        self.conn
            .execute_batch("PRAGMA synchronous = FULL")
            .map_err(err.clone())?;
        let result = (|| {
            let tx = self.conn.unchecked_transaction()?;
            let value = write(&tx)?;
            tx.commit()?;
            Ok(value)
        })();
        if result.is_err() {
            self.end_failed_transaction();
        }
        let restored = self.conn.execute_batch("PRAGMA synchronous = NORMAL");
        let value = result.map_err(err.clone())?;
        restored.map_err(err)?;
        Ok(value)
    }
}

fn outcome_json(outcome: &AuditOutcome) -> String {
    // Serialising a plain enum of strings and integers cannot fail.
    serde_json::to_string(outcome).unwrap_or_else(|_| "{\"outcome\":\"pending\"}".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> AuditRecord {
        AuditRecord {
            at_unix_ms: 1_764_441_091_000,
            actor_uid: 0,
            actor_user: Some("root".into()),
            action: "kill".into(),
            target: ProcessIdentity {
                boot_id: "b0".into(),
                pid: 4242,
                start_time_ticks: 987_654,
            },
            target_command: "python leak.py".into(),
            target_user: Some("alice".into()),
            signal: "SIGTERM".into(),
            reason: "vramctl kill 4242".into(),
            outcome: AuditOutcome::Pending,
        }
    }

    #[test]
    fn pending_then_outcome_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        let mut store = Store::open(&path, OpenMode::ReadWrite).unwrap();
        let id = store.append_audit(&record()).unwrap();
        drop(store);
        let mut store = Store::open(&path, OpenMode::ReadWrite).unwrap();
        let rows = store.audit_rows(TimeRange::ALL).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].record, record());
        let exited = AuditOutcome::Exited {
            freed_bytes: 6 << 30,
            after_ms: 120,
        };
        store.set_audit_outcome(id, &exited).unwrap();
        let rows = store.audit_rows(TimeRange::ALL).unwrap();
        assert_eq!(rows[0].record.outcome, exited);
        assert!(rows[0].updated_ms.is_some());
        assert!(store.set_audit_outcome(id + 1, &exited).is_err());
        let sync: i64 = store
            .conn
            .query_row("PRAGMA synchronous", [], |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 1, "back to NORMAL for samples");
    }

    #[test]
    fn read_only_refuses_audit_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.db");
        Store::open(&path, OpenMode::ReadWrite).unwrap();
        let mut store = Store::open(&path, OpenMode::ReadOnly).unwrap();
        assert!(store.append_audit(&record()).is_err());
    }
}
