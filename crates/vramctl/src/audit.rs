//! Where everything that signals (`kill`, the kill key of `top`) writes its audit records:
//! [`open_sink`] is the one place that decides. Today that is an append-only JSON-lines
//! file, fsynced after every line (the durability `synchronous=FULL` gives the store's
//! audit table).
//!
//! The file is `$VRAMCTL_AUDIT_LOG`, else `$XDG_STATE_HOME/vramctl/audit.jsonl`, else
//! `~/.local/state/vramctl/audit.jsonl`. Each record is one line
//! `{"id": N, "record": {...}}` written before its signal; each outcome update is one more
//! line `{"id": N, "outcome": {...}}`, so a crash between the two leaves the record with
//! outcome `pending`: "a signal may have been sent". The store-backed sink replaces this
//! once the store is merged (same [`AuditSink`] seam).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;
use vramctl_core::audit::{AuditOutcome, AuditRecord};
use vramctl_core::signal::{AuditError, AuditId, AuditSink};

use crate::cli::GlobalArgs;

/// The audit sink of every command that signals: `kill` and `top`'s kill key call this, and
/// only this, so where audit records go is decided here once (the store-backed sink is to
/// replace the JSON-lines log behind this function). `Send`: `top` signals from its action
/// thread.
///
/// # Errors
/// When there is no place for the log, or it cannot be created or opened.
pub fn open_sink(global: &GlobalArgs) -> anyhow::Result<JsonlAuditLog> {
    // The history database (`global.db`) will hold the records once the sink is
    // store-backed; the JSON-lines log has its own place.
    let _ = global;
    JsonlAuditLog::open(&JsonlAuditLog::default_path()?)
}

/// The JSON-lines audit log.
#[derive(Debug)]
pub struct JsonlAuditLog {
    path: PathBuf,
    file: File,
    next_seq: i64,
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
    /// The default location (module docs).
    ///
    /// # Errors
    /// When neither `VRAMCTL_AUDIT_LOG`, `XDG_STATE_HOME` nor `HOME` is set.
    pub fn default_path() -> anyhow::Result<PathBuf> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        if let Some(path) = var("VRAMCTL_AUDIT_LOG") {
            return Ok(PathBuf::from(path));
        }
        if let Some(state) = var("XDG_STATE_HOME") {
            return Ok(Path::new(&state).join("vramctl/audit.jsonl"));
        }
        if let Some(home) = var("HOME") {
            return Ok(Path::new(&home).join(".local/state/vramctl/audit.jsonl"));
        }
        bail!(
            "no place for the audit log; set VRAMCTL_AUDIT_LOG, XDG_STATE_HOME or HOME (kill \
             writes every signal down before sending it)"
        )
    }

    /// Opens (creating it and its directory) the log at `path` for appending.
    ///
    /// # Errors
    /// When the directory or the file cannot be created or opened.
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| {
                format!("cannot create the audit log directory '{}'", dir.display())
            })?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open the audit log '{}'", path.display()))?;
        Ok(Self {
            path: path.to_owned(),
            file,
            next_seq: 0,
        })
    }

    /// Where it writes.
    pub fn path(&self) -> &Path {
        &self.path
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

impl AuditSink for JsonlAuditLog {
    fn before(&mut self, record: &AuditRecord) -> Result<AuditId, AuditError> {
        // Unique across concurrent vramctl processes without coordination: the time in ms,
        // our PID and a counter (ids only need to pair a record with its outcome lines).
        let id = record
            .at_unix_ms
            .saturating_mul(1_000_000)
            .saturating_add(i64::from(std::process::id() % 1000) * 1000)
            .saturating_add(self.next_seq % 1000);
        self.next_seq += 1;
        self.append(&RecordLine { id, record })?;
        Ok(AuditId(id))
    }

    fn after(&mut self, id: AuditId, outcome: &AuditOutcome) -> Result<(), AuditError> {
        self.append(&OutcomeLine { id: id.0, outcome })
    }
}

#[cfg(test)]
mod tests {
    use vramctl_core::procinfo::ProcessIdentity;

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

    #[test]
    fn records_and_outcomes_are_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deep/dir/audit.jsonl");
        let mut log = JsonlAuditLog::open(&path).unwrap();
        let id = log.before(&record()).unwrap();
        let second = log.before(&record()).unwrap();
        assert_ne!(id, second);
        log.after(id, &AuditOutcome::Sent).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["id"], id.0);
        assert_eq!(lines[0]["record"]["target"]["pid"], 42);
        assert_eq!(lines[0]["record"]["outcome"]["outcome"], "pending");
        assert_eq!(lines[2]["outcome"]["outcome"], "sent");
    }

    #[test]
    fn an_unwritable_place_is_an_error_up_front() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let err = JsonlAuditLog::open(&file.join("audit.jsonl")).unwrap_err();
        assert!(format!("{err:#}").contains("cannot create the audit log directory"));
    }
}
