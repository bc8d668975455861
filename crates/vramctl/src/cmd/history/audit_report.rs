//! `vramctl history --audit`: the audit log read back — every signal `kill`, `reap` and
//! `top` sent (or refused to send), with its target's identity, the reason and the outcome,
//! as the store keeps them (`Store::audit_rows`, oldest first).
//!
//! A record still `pending` was written before its signal and never updated: vramctl
//! stopped between the two, so the signal may or may not have been sent.

use std::io::Write;

use anyhow::Context;
use jiff::tz::TimeZone;
use serde::Serialize;
use vramctl_procs::audit_record::AuditOutcome;
use vramctl_procs::procinfo::ProcessIdentity;
use vramctl_store::format::rfc3339;
use vramctl_store::{AuditRow, TimeRange};

use crate::cli::{HistoryArgs, HistoryFormat};
use crate::exit::Exit;
use crate::output::table::{Align, Table};
use vramctl_core::untrusted::Untrusted;
use vramctl_core::wall_time::{clock, zone_label};
use vramctl_history::csv_record::{CsvRecord, write_csv_record};
use vramctl_observe::units;

/// Version of the JSON below.
pub const SCHEMA: u32 = 1;

/// The CSV header.
const CSV_COLUMNS: &str = "id,time,actor_uid,actor_user,action,signal,pid,start_time_ticks,\
                           boot_id,target_user,outcome,freed_bytes,after_ms,detail,updated,\
                           command,reason";

/// `--format json`.
#[derive(Debug, Serialize)]
struct Document<'a> {
    schema: u32,
    database: String,
    records: Vec<RecordJson<'a>>,
}

#[derive(Debug, Serialize)]
struct RecordJson<'a> {
    id: i64,
    at: String,
    actor_uid: u32,
    actor_user: Option<&'a str>,
    action: &'a str,
    target: &'a ProcessIdentity,
    target_command: &'a str,
    target_user: Option<&'a str>,
    signal: &'a str,
    reason: &'a str,
    outcome: &'a AuditOutcome,
    updated: Option<String>,
}

impl<'a> RecordJson<'a> {
    fn new(row: &'a AuditRow) -> Self {
        let r = &row.record;
        Self {
            id: row.id,
            at: rfc3339(r.at_unix_ms),
            actor_uid: r.actor_uid,
            actor_user: r.actor_user.as_deref(),
            action: &r.action,
            target: &r.target,
            target_command: &r.target_command,
            target_user: r.target_user.as_deref(),
            signal: &r.signal,
            reason: &r.reason,
            outcome: &r.outcome,
            updated: row.updated_ms.map(rfc3339),
        }
    }
}

/// The outcome's name and, for the table, a few words.
fn outcome(o: &AuditOutcome) -> (&'static str, String) {
    match o {
        AuditOutcome::Pending => (
            "pending",
            "pending (vramctl stopped before recording the outcome; the signal may have been \
             sent)"
                .to_owned(),
        ),
        AuditOutcome::Sent => ("sent", "sent".to_owned()),
        AuditOutcome::Refused(why) => ("refused", format!("refused: {why}")),
        AuditOutcome::Failed(why) => ("failed", format!("failed: {why}")),
        AuditOutcome::Exited {
            freed_bytes,
            after_ms,
        } => (
            "exited",
            format!(
                "exited, freed {} after {}",
                units::bytes(*freed_bytes),
                units::seconds(*after_ms as f64 / 1000.0)
            ),
        ),
        AuditOutcome::Reclaimed { released_bytes } => (
            "reclaimed",
            format!(
                "reclaimed, the framework released {}",
                units::bytes(*released_bytes)
            ),
        ),
        _ => (
            "other",
            "unknown outcome (written by a newer vramctl)".to_owned(),
        ),
    }
}

/// Prints the audit records of `db` in `range` (only targets in `--pid` when given).
///
/// # Errors
/// A database that cannot be read; stdout closed.
pub fn run(
    db: &std::path::Path,
    args: &HistoryArgs,
    range: TimeRange,
    tz: &TimeZone,
) -> anyhow::Result<Exit> {
    let store = crate::cmd::open_history(db)?;
    let rows: Vec<AuditRow> = store
        .audit_rows(range)?
        .into_iter()
        .filter(|r| args.pid.is_empty() || args.pid.contains(&r.record.target.pid))
        .collect();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    write(&mut out, args.format, &rows, &db.display().to_string(), tz)?;
    out.flush().context("cannot write to stdout")?;
    Ok(Exit::Ok)
}

fn write(
    out: &mut impl Write,
    format: HistoryFormat,
    rows: &[AuditRow],
    database: &str,
    tz: &TimeZone,
) -> anyhow::Result<()> {
    let io = "cannot write to stdout";
    match format {
        HistoryFormat::Json => {
            let doc = Document {
                schema: SCHEMA,
                database: database.to_owned(),
                records: rows.iter().map(RecordJson::new).collect(),
            };
            serde_json::to_writer(&mut *out, &doc).context(io)?;
            writeln!(out).context(io)?;
        }
        HistoryFormat::Csv => {
            let mut record = CsvRecord::new();
            write_csv_record(&mut record, out, CSV_COLUMNS.split(','))?;
            for row in rows {
                let r = &row.record;
                let (name, _) = outcome(&r.outcome);
                let (freed, after, detail) = match &r.outcome {
                    AuditOutcome::Exited {
                        freed_bytes,
                        after_ms,
                    } => (freed_bytes.to_string(), after_ms.to_string(), String::new()),
                    AuditOutcome::Refused(why) | AuditOutcome::Failed(why) => {
                        (String::new(), String::new(), why.clone())
                    }
                    _ => (String::new(), String::new(), String::new()),
                };
                let fields = [
                    row.id.to_string(),
                    rfc3339(r.at_unix_ms),
                    r.actor_uid.to_string(),
                    r.actor_user.clone().unwrap_or_default(),
                    r.action.clone(),
                    r.signal.clone(),
                    r.target.pid.to_string(),
                    r.target.start_time_ticks.to_string(),
                    r.target.boot_id.clone(),
                    r.target_user.clone().unwrap_or_default(),
                    name.to_owned(),
                    freed,
                    after,
                    detail,
                    row.updated_ms.map(rfc3339).unwrap_or_default(),
                    r.target_command.clone(),
                    r.reason.clone(),
                ];
                write_csv_record(&mut record, out, &fields)?;
            }
        }
        HistoryFormat::Table => {
            if rows.is_empty() {
                writeln!(out, "no audit records in that range of '{database}'").context(io)?;
                return Ok(());
            }
            // Always dated: a log is read days later, and a time without its day (as when
            // every record fell on one day) says nothing about when.
            let dated = true;
            let first = rows.first().map_or(0, |r| r.record.at_unix_ms);
            let time_header = format!("TIME ({})", zone_label(tz, first));
            let mut table = Table::new(&[
                (&time_header, Align::Left),
                ("BY", Align::Left),
                ("ACTION", Align::Left),
                ("SIGNAL", Align::Left),
                ("PID", Align::Right),
                ("USER", Align::Left),
                ("COMMAND", Align::Left),
                ("OUTCOME", Align::Left),
            ]);
            for row in rows {
                let r = &row.record;
                table.push(vec![
                    clock(tz, r.at_unix_ms, dated),
                    r.actor_user
                        .clone()
                        .unwrap_or_else(|| r.actor_uid.to_string()),
                    r.action.clone(),
                    r.signal.clone(),
                    r.target.pid.to_string(),
                    r.target_user.clone().unwrap_or_else(|| "?".to_owned()),
                    r.target_command.clone(),
                    outcome(&r.outcome).1,
                ]);
            }
            for line in table.render("") {
                writeln!(out, "{}", Untrusted(&line)).context(io)?;
            }
            // The reasons are long (a policy's evidence): one line each, by row.
            writeln!(out).context(io)?;
            for row in rows {
                writeln!(
                    out,
                    "{} {} PID {}: {}",
                    clock(tz, row.record.at_unix_ms, dated),
                    row.record.action,
                    row.record.target.pid,
                    Untrusted(&row.record.reason)
                )
                .context(io)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use vramctl_procs::audit_record::AuditRecord;

    use super::*;

    fn row(id: i64, at_unix_ms: i64, outcome: AuditOutcome) -> AuditRow {
        AuditRow {
            id,
            record: AuditRecord {
                at_unix_ms,
                actor_uid: 0,
                actor_user: Some("root".into()),
                action: "reap".into(),
                target: ProcessIdentity {
                    boot_id: "b0".into(),
                    pid: 4242,
                    start_time_ticks: 77,
                },
                target_command: "python -c \"hold, then sleep\"".into(),
                target_user: Some("alice".into()),
                signal: "SIGTERM+SIGCONT".into(),
                reason: "vramctl reap, policy 'notebooks': idle 2 h".into(),
                outcome,
            },
            updated_ms: None,
        }
    }

    fn text(format: HistoryFormat, rows: &[AuditRow]) -> String {
        let mut out = Vec::new();
        write(&mut out, format, rows, "/h.db", &TimeZone::UTC).unwrap();
        String::from_utf8(out).unwrap()
    }

    const T: i64 = 1_795_984_291_000;

    #[test]
    fn audit_times_carry_their_date_and_zone() {
        // Records of one day printed `20:31:31`: no date (the log is read days later) and
        // no zone.
        let rows = [
            row(1, T, AuditOutcome::Pending),
            row(2, T + 60_000, AuditOutcome::Pending),
        ];
        let mut out = Vec::new();
        let paris = TimeZone::get("Europe/Paris").unwrap();
        write(&mut out, HistoryFormat::Table, &rows, "/h.db", &paris).unwrap();
        let table = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("TIME (CET)"), "{table}");
        assert!(lines[1].starts_with("2026-11-29 21:31:31  "), "{table}");
        assert!(
            table.contains("\n2026-11-29 21:32:31 reap PID 4242: "),
            "{table}"
        );
    }

    #[test]
    fn every_outcome_reads_back_in_each_format() {
        let rows = [
            row(
                1,
                T,
                AuditOutcome::Exited {
                    freed_bytes: 2 << 30,
                    after_ms: 1500,
                },
            ),
            row(2, T + 1000, AuditOutcome::Refused("PID 1 is init".into())),
            row(3, T + 2000, AuditOutcome::Pending),
        ];
        let table = text(HistoryFormat::Table, &rows);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("TIME (UTC)"), "{table}");
        assert!(
            lines[1].starts_with("2026-11-29 20:31:31  root  reap"),
            "{table}"
        );
        assert!(
            lines[1].ends_with("exited, freed 2.0 GiB after 1.50 s"),
            "{table}"
        );
        assert!(lines[2].ends_with("refused: PID 1 is init"), "{table}");
        assert!(
            lines[3].contains("the signal may have been sent"),
            "{table}"
        );
        assert_eq!(
            lines[5],
            "2026-11-29 20:31:31 reap PID 4242: vramctl reap, policy 'notebooks': idle 2 h"
        );

        let json: serde_json::Value =
            serde_json::from_str(&text(HistoryFormat::Json, &rows)).unwrap();
        assert_eq!(json["schema"], 1);
        assert_eq!(json["database"], "/h.db");
        let r = &json["records"][0];
        assert_eq!(r["id"], 1);
        assert_eq!(r["at"], "2026-11-29T20:31:31.000Z");
        assert_eq!(r["target"]["pid"], 4242);
        assert_eq!(r["target"]["start_time_ticks"], 77);
        assert_eq!(r["outcome"]["outcome"], "exited");
        assert_eq!(r["outcome"]["detail"]["freed_bytes"], 2_u64 << 30);
        assert_eq!(json["records"][1]["outcome"]["detail"], "PID 1 is init");

        let csv = text(HistoryFormat::Csv, &rows);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], CSV_COLUMNS);
        assert_eq!(
            lines[1],
            "1,2026-11-29T20:31:31.000Z,0,root,reap,SIGTERM+SIGCONT,4242,77,b0,alice,exited,\
             2147483648,1500,,,\"python -c \"\"hold, then sleep\"\"\",\"vramctl reap, policy \
             'notebooks': idle 2 h\""
        );
        assert!(
            lines[2].contains(",refused,,,PID 1 is init,"),
            "{}",
            lines[2]
        );
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn nothing_in_range_says_so() {
        assert_eq!(
            text(HistoryFormat::Table, &[]),
            "no audit records in that range of '/h.db'\n"
        );
        assert_eq!(text(HistoryFormat::Csv, &[]), format!("{CSV_COLUMNS}\n"));
    }
}
