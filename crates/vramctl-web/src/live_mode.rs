//! The live/history mode (`#live`): per GPU the memory now and its curve stacked by
//! process, the process table with verdicts, marks for leak onsets, kills and reclaims,
//! a process's own curve. Its API:
//!
//! | route | answer |
//! | --- | --- |
//! | `/api/now` | the latest tick ([`crate::live_feed::Tick`]) |
//! | `/api/recent[?after=T]` | the ticks this server still holds (about two minutes) taken after `T`, oldest first |
//! | `/api/events[?last=SEQ]` | Server-Sent Events: `tick` events, id = the tick's `seq`; after `Last-Event-ID` (or `last`), the ticks missed first |
//! | `/api/history?gpu=&from=&to=&points=` (or `window=MS` for the last `MS` before the latest sample) | the recorded history downsampled ([`crate::history_series`]) |
//! | `/api/process?id=&gpu=&from=&to=&points=` | one recorded process's curve, with its agent's figures |
//! | `/api/marks?from=&to=` | leak onsets seen live, and the audit log's kills and reclaims |
//!
//! Times are ms since the Unix epoch. Without `serve --record` the history routes answer
//! `{"recorded": false}` and the page draws what `/api/recent` and the stream give.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use vramctl_exporter::routes::RouteRequest;
use vramctl_leaks::analysis::{LeakConfig, Verdict};
use vramctl_store::{OpenMode, Store, TimeRange};

use crate::history_series::{SeriesRequest, history_series};
use crate::live_feed::{LiveFeed, Onset};
use crate::{Mode, Query, Reply, WebSettings};

/// Buckets a chart gets when it does not say.
const DEFAULT_POINTS: usize = 600;
/// Audit rows sent at most.
const MAX_AUDIT_MARKS: usize = 1000;

/// The live/history mode.
pub struct LiveMode {
    feed: Arc<LiveFeed>,
    history_db: Option<PathBuf>,
    leak: LeakConfig,
}

impl LiveMode {
    /// The mode over `feed` and, with `serve --record`, its history database.
    pub fn new(settings: &WebSettings, feed: Arc<LiveFeed>) -> Self {
        Self {
            feed,
            history_db: settings.history_db.clone(),
            leak: settings.leak.clone(),
        }
    }

    fn open_store(&self) -> Result<Option<Store>, Reply> {
        let Some(path) = &self.history_db else {
            return Ok(None);
        };
        Store::open(path, OpenMode::ReadOnly)
            .map(Some)
            .map_err(|err| Reply::error(503, &format!("cannot read the history: {err}")))
    }

    fn now(&self) -> Reply {
        match self.feed.latest() {
            Some(json) => Reply::json_bytes(json),
            None => Reply::error(503, "no sample yet"),
        }
    }

    fn recent(&self, query: &Query) -> Result<Reply, Reply> {
        let ticks = self.feed.recent(query.int("after")?);
        let mut body = Vec::with_capacity(ticks.iter().map(Bytes::len).sum::<usize>() + 2);
        body.push(b'[');
        for (i, tick) in ticks.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            body.extend_from_slice(tick);
        }
        body.push(b']');
        Ok(Reply::json_bytes(Bytes::from(body)))
    }

    fn events(&self, request: &RouteRequest, query: &Query) -> Reply {
        if request.head {
            return Reply::json_bytes(Bytes::new());
        }
        // The header when the browser reconnects by itself; `?last=` when the page opens a
        // new stream after an error answer.
        let last = request
            .last_event_id
            .as_deref()
            .and_then(|id| id.trim().parse::<u64>().ok())
            .or_else(|| {
                query
                    .int("last")
                    .ok()
                    .flatten()
                    .and_then(|n| u64::try_from(n).ok())
            });
        match self.feed.subscribe(last) {
            Ok(receiver) => Reply::event_stream(receiver),
            Err(_) => Reply::error(503, "too many live streams open; try again later"),
        }
    }

    fn history(&self, query: &Query, process: bool) -> Result<Reply, Reply> {
        let Some(mut store) = self.open_store()? else {
            return Ok(Reply::json(&NotRecorded { recorded: false }));
        };
        let from = query.int("from")?;
        let to = query.int("to")?;
        // `window`: the last MS before the latest sample, the server's time (the page need
        // not wait for a tick to know it, nor trust its own clock).
        let window = query.int("window")?;
        let (from, to) = match window {
            Some(ms) if ms > 0 => {
                let end = store
                    .time_bounds()
                    .ok()
                    .flatten()
                    .map(|(_, hi)| hi)
                    .into_iter()
                    .chain(self.feed.latest_t_ms())
                    .max();
                match end {
                    Some(end) => (Some(end.saturating_sub(ms)), Some(end)),
                    None => (None, None),
                }
            }
            Some(_) => return Err(Reply::error(400, "'window' must be 1 or more")),
            None => (from, to),
        };
        let range = match (from, to) {
            (None, None) => None,
            (from, to) => Some(TimeRange {
                from_ms: from.unwrap_or(i64::MIN),
                to_ms: to.unwrap_or(i64::MAX),
            }),
        };
        if let Some(r) = range
            && r.from_ms > r.to_ms
        {
            return Err(Reply::error(400, "'from' is after 'to'"));
        }
        let points = match query.int("points")? {
            None => DEFAULT_POINTS,
            Some(p) => usize::try_from(p)
                .ok()
                .filter(|p| *p >= 1)
                .ok_or_else(|| Reply::error(400, "'points' must be 1 or more"))?,
        };
        let id = query.int("id")?;
        if process && id.is_none() {
            return Err(Reply::error(
                400,
                "'id' (the process's id in the history) is required",
            ));
        }
        let series = history_series(
            &mut store,
            SeriesRequest {
                gpu: query.get("gpu").filter(|g| !g.is_empty()),
                range,
                points,
                process: id,
            },
        )
        .map_err(|err| Reply::error(503, &format!("cannot read the history: {err:#}")))?;
        Ok(Reply::json(&Recorded {
            recorded: true,
            series,
        }))
    }

    fn marks(&self, query: &Query) -> Result<Reply, Reply> {
        let from = query.int("from")?.unwrap_or(i64::MIN);
        let to = query.int("to")?.unwrap_or(i64::MAX);
        let mut onsets = self.feed.onsets(from, to);
        let mut audit = Vec::new();
        if let Some(mut store) = self.open_store()? {
            onsets.extend(
                recorded_onsets(&mut store, from, to, &self.leak).map_err(|err| {
                    Reply::error(503, &format!("cannot analyse the history: {err:#}"))
                })?,
            );
            onsets.sort_by(|a, b| a.t_ms.cmp(&b.t_ms).then(a.pid.cmp(&b.pid)));
            onsets.dedup_by(|a, b| a.gpu == b.gpu && a.pid == b.pid);
            let rows = store
                .audit_rows(TimeRange {
                    from_ms: from,
                    to_ms: to,
                })
                .map_err(|err| Reply::error(503, &format!("cannot read the audit log: {err}")))?;
            audit = rows
                .into_iter()
                .rev()
                .take(MAX_AUDIT_MARKS)
                .map(|row| AuditMark {
                    t_ms: row.record.at_unix_ms,
                    action: row.record.action,
                    pid: row.record.target.pid,
                    command: row.record.target_command,
                    user: row.record.target_user,
                    signal: row.record.signal,
                    reason: row.record.reason,
                    outcome: serde_json::to_value(&row.record.outcome).unwrap_or_default(),
                })
                .collect();
            audit.reverse();
        }
        Ok(Reply::json(&Marks { onsets, audit }))
    }
}

/// The leak onsets the history's leak scan (what `leaks` and `plot` run) finds in
/// `[from, to]`, clamped to the history. A verdict and its onset are properties of a whole
/// series (its warm-up, its floor), so the scan starts where the earliest process still
/// alive at `from` started, not at `from`.
fn recorded_onsets(
    store: &mut Store,
    from: i64,
    to: i64,
    leak: &LeakConfig,
) -> anyhow::Result<Vec<Onset>> {
    let Some((lo, hi)) = store.time_bounds()? else {
        return Ok(Vec::new());
    };
    let (from, to) = (from.max(lo), to.min(hi));
    if from > to {
        return Ok(Vec::new());
    }
    let first_alive = store
        .all_processes()?
        .into_iter()
        .filter(|(_, p)| p.last_seen_ms >= from && p.first_seen_ms <= to)
        .map(|(_, p)| p.first_seen_ms)
        .min()
        .unwrap_or(from);
    let range = TimeRange {
        from_ms: first_alive.clamp(lo, from),
        to_ms: to,
    };
    let devices = store.devices()?;
    let findings = vramctl_history::leak_scan::analyse(store, range, &devices, &[], leak)?;
    Ok(findings
        .into_iter()
        .filter(|f| f.report.verdict == Verdict::Leak)
        .filter(|f| {
            f.report
                .onset_unix_ms
                .is_some_and(|t| (from..=to).contains(&t))
        })
        .filter_map(|f| {
            Some(Onset {
                t_ms: f.report.onset_unix_ms?,
                gpu: f.device.meta.uuid.clone(),
                pid: f.process.as_ref()?.meta.key.pid,
                reason: Some(f.report.explanation.clone()),
            })
        })
        .collect())
}

#[derive(Serialize)]
struct NotRecorded {
    recorded: bool,
}

#[derive(Serialize)]
struct Recorded {
    recorded: bool,
    #[serde(flatten)]
    series: crate::history_series::HistorySeries,
}

/// A kill or reclaim from the audit log.
#[derive(Serialize)]
struct AuditMark {
    t_ms: i64,
    action: String,
    pid: u32,
    command: String,
    user: Option<String>,
    signal: String,
    reason: String,
    outcome: serde_json::Value,
}

#[derive(Serialize)]
struct Marks {
    onsets: Vec<Onset>,
    audit: Vec<AuditMark>,
}

impl Mode for LiveMode {
    fn name(&self) -> &'static str {
        "live"
    }

    fn title(&self) -> &'static str {
        "Live"
    }

    fn script(&self) -> &'static str {
        include_str!("../assets/live.js")
    }

    fn api(&self, request: &RouteRequest, query: &Query) -> Option<Reply> {
        let reply = match request.path.as_str() {
            "/api/now" => self.now(),
            "/api/recent" => self.recent(query).unwrap_or_else(|e| e),
            "/api/events" => self.events(request, query),
            "/api/history" => self.history(query, false).unwrap_or_else(|e| e),
            "/api/process" => self.history(query, true).unwrap_or_else(|e| e),
            "/api/marks" => self.marks(query).unwrap_or_else(|e| e),
            _ => return None,
        };
        Some(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example_store() -> Store {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/h200-recording.db");
        Store::open(&path, OpenMode::ReadOnly).expect("the example recording")
    }

    #[test]
    fn the_h200_recordings_leak_onsets_are_marked_in_any_range_that_holds_them() {
        let mut store = example_store();
        let (lo, _) = store.time_bounds().expect("bounds").expect("samples");
        // From the start, and from 7 s in: the scan still sees the series from their start.
        for from in [i64::MIN, lo + 7_000] {
            let onsets = recorded_onsets(&mut store, from, i64::MAX, &LeakConfig::default())
                .expect("the scan");
            let mut pids: Vec<u32> = onsets.iter().map(|o| o.pid).collect();
            pids.sort_unstable();
            // examples/README.md: the three leaking workloads, and only them.
            assert_eq!(pids, [679, 680, 681], "{onsets:?}");
        }
        // A range after every onset (the last is 23:39:16, 70 s in) marks none.
        let late = recorded_onsets(&mut store, lo + 200_000, i64::MAX, &LeakConfig::default())
            .expect("the scan");
        assert!(late.is_empty(), "{late:?}");
    }
}
