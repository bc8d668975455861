//! vramctl's own NDJSON: `vramctl export` (lossless), and `vramctl status --json --watch`.
//!
//! An export is the store's content line by line, in this order (schema 1, documented in
//! `docs/json.md`):
//!
//! ```text
//! {"type":"header","format":"vramctl-history","schema":1,"exported_at":"…","vramctl":"0.1.0"}
//! {"type":"device","ref":1,"uuid":"GPU-…","index":0,"name":"NVIDIA H200","pci_bus_id":"…","parent_uuid":null}
//! {"type":"process","ref":7,"pid":4242,"boot_id":"…","start_time_ticks":123,"uid":1000,"user":"alice","command":"python train.py","container_id":null,"pod_uid":null,"first_seen_ms":…,"last_seen_ms":…}
//! {"type":"series","ref":12,"metric":"process_used_bytes","device":1,"process":7}
//! {"type":"frame","t":"2026-11-29T20:31:31.000Z","unix_ms":…,"span_ms":0,"key":true,"values":[[12,1073741824],[13],[14,null],[15,1,5,3]]}
//! {"type":"gap","device":"GPU-…","metric":"power_mw","from_ms":…,"to_ms":…,"open":false,"reason":"not supported"}
//! {"type":"audit","id":1,…}
//! ```
//!
//! A frame lists the series whose value changed since the previous frame line (all of them
//! when `key` is true): `[ref, value]`, `[ref]` gone, `[ref, null]` present but unknown,
//! `[ref, min, max, last]` a downsampled bucket (`span_ms > 0`). `process` and `series`
//! lines come before the first frame that uses them. A frame that saw only some devices
//! (an imported log) carries `"observed":[[device_ref, metrics, processes], …]`.

use std::collections::HashMap;
use std::io::Write;

use serde_json::{Value, json};
use vramctl_procs::audit_record::AuditRecord;

use super::input::Input;
use super::{ImportError, Rows, rfc3339, shown};
use crate::codec::{self, Entry, State};
use crate::db::Store;
use crate::model::{
    DeviceMeta, DeviceSample, DeviceSampleState, Gap, Metric, Observed, ProcessKey, ProcessList,
    ProcessMeta, ProcessOnDevice, ProcessSample, SessionInfo, TickSample, TimeRange,
};

/// Schema of the export format.
pub const SCHEMA: u64 = 1;

/// Writes the history in `range` as NDJSON; returns the number of frame lines.
///
/// # Errors
/// A store failure or a write failure.
pub fn export(
    store: &mut Store,
    range: TimeRange,
    out: &mut dyn Write,
) -> Result<u64, super::smi::ExportError> {
    let line = |out: &mut dyn Write, v: &Value| -> std::io::Result<()> {
        serde_json::to_writer(&mut *out, v)?;
        out.write_all(b"\n")
    };
    line(
        out,
        &json!({
            "type": "header",
            "format": "vramctl-history",
            "schema": SCHEMA,
            "exported_at": rfc3339(jiff::Timestamp::now().as_millisecond()),
            "vramctl": env!("CARGO_PKG_VERSION"),
        }),
    )?;
    for d in store.devices()? {
        line(
            out,
            &json!({
                "type": "device", "ref": d.id, "uuid": d.meta.uuid, "index": d.meta.index,
                "name": d.meta.name, "pci_bus_id": d.meta.pci_bus_id,
                "parent_uuid": d.meta.parent_uuid,
            }),
        )?;
    }
    store.load_catalog()?;
    let processes = store.all_processes()?;
    let catalog_series = store.catalog.series.clone();
    let mut declared_series = vec![false; catalog_series.len()];
    let mut declared_processes: std::collections::HashSet<i64> = std::collections::HashSet::new();
    let mut prev = State::default();
    let mut prev_span = -1;
    let mut last_key = i64::MIN;
    let mut frames = 0u64;
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut ids: Vec<u32> = Vec::new();
    let mut failure: Option<std::io::Error> = None;
    store.scan(range, |frame| {
        if failure.is_some() {
            return;
        }
        let key = frame.span_ms != prev_span || frame.t_ms.saturating_sub(last_key) >= 60_000;
        if key {
            last_key = frame.t_ms;
            prev_span = frame.span_ms;
        }
        let state = frame.state();
        buf.clear();
        // The ids to look at: what the frame changed, or everything (key frames, the first).
        let n = state.len().max(prev.len());
        ids.clear();
        match frame.changed().filter(|_| !key) {
            Some(changed) => ids.extend_from_slice(changed),
            None => ids.extend((0..n).filter_map(|i| u32::try_from(i).ok())),
        }
        // Declarations of the series (and their processes) this frame uses first.
        for &id in &ids {
            let i = usize::try_from(id).unwrap_or(usize::MAX);
            let now = state.get(id);
            if now.is_none() || declared_series.get(i).copied().unwrap_or(false) {
                continue;
            }
            let Some(Some(k)) = catalog_series.get(i) else { continue };
            if declared_series.len() <= i {
                declared_series.resize(i + 1, false);
            }
            declared_series[i] = true;
            if let Some(p) = k.process.filter(|p| declared_processes.insert(*p)) {
                if let Some(r) = processes.get(&p) {
                    let v = json!({
                        "type": "process", "ref": r.id, "pid": r.meta.key.pid,
                        "boot_id": r.meta.key.boot_id,
                        "start_time_ticks": r.meta.key.start_time_ticks, "uid": r.meta.uid,
                        "user": r.meta.user, "command": r.meta.command,
                        "container_id": r.meta.container_id, "pod_uid": r.meta.pod_uid,
                        "first_seen_ms": r.first_seen_ms, "last_seen_ms": r.last_seen_ms,
                    });
                    let _ = serde_json::to_writer(&mut buf, &v);
                    buf.push(b'\n');
                }
            }
            let _ = writeln!(
                buf,
                "{{\"type\":\"series\",\"ref\":{id},\"metric\":\"{}\",\"device\":{},\"process\":{}}}",
                k.metric.name(),
                k.device.map_or_else(|| "null".into(), |d| d.to_string()),
                k.process.map_or_else(|| "null".into(), |p| p.to_string()),
            );
        }
        let _ = write!(
            buf,
            "{{\"type\":\"frame\",\"t\":\"{}\",\"unix_ms\":{},\"span_ms\":{},\"key\":{},\"values\":[",
            rfc3339(frame.t_ms),
            frame.t_ms,
            frame.span_ms,
            key
        );
        let mut first = true;
        for &id in &ids {
            let now = state.get(id);
            if (!key && now == prev.get(id)) || (key && now.is_none()) {
                continue;
            }
            if !first {
                buf.push(b',');
            }
            first = false;
            let _ = match now {
                None => write!(buf, "[{id}]"),
                Some(Entry::Unknown) => write!(buf, "[{id},null]"),
                Some(Entry::Value(v)) => write!(buf, "[{id},{v}]"),
                Some(Entry::Range { min, max, last }) => write!(buf, "[{id},{min},{max},{last}]"),
            };
        }
        buf.push(b']');
        if let Some(obs) = frame.observed_raw() {
            buf.extend_from_slice(b",\"observed\":[");
            let mut pos = 0;
            let mut first = true;
            while pos < obs.len() {
                let Ok(v) = codec::get_varint(obs, &mut pos) else { break };
                if !first {
                    buf.push(b',');
                }
                first = false;
                let _ = write!(buf, "[{},{},{}]", v >> 2, v & 2 != 0, v & 1 != 0);
            }
            buf.push(b']');
        }
        buf.extend_from_slice(b"}\n");
        if let Err(e) = out.write_all(&buf) {
            failure = Some(e);
        }
        if frame.changed().is_some() && !key {
            for &id in &ids {
                prev.set(id, state.get(id));
            }
        } else {
            prev.clone_from(state);
        }
        frames += 1;
    })?;
    if let Some(e) = failure {
        return Err(e.into());
    }
    for gap in store.gaps(range)? {
        line(
            out,
            &json!({
                "type": "gap", "device": gap.device_uuid,
                "metric": gap.metric.map(Metric::name), "from_ms": gap.from_ms,
                "to_ms": gap.to_ms, "open": gap.open, "reason": gap.reason,
            }),
        )?;
    }
    for row in store.audit_rows(range)? {
        let mut v = serde_json::to_value(&row.record).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut v {
            map.insert("type".into(), "audit".into());
            map.insert("id".into(), row.id.into());
            map.insert("updated_ms".into(), row.updated_ms.into());
        }
        line(out, &v)?;
    }
    Ok(frames)
}

/// Reads an export back into `store` (lossless: frames, downsampled buckets, gaps and
/// audit rows); returns the number of frames written.
///
/// # Errors
/// A line that is not an export line (always fatal: a frame left out would corrupt the
/// ones after it), a newer schema, data not after the store's last sample, a store failure.
pub(crate) fn import(
    store: &mut Store,
    input: &mut Input,
    rows: &mut Rows<'_>,
) -> Result<u64, ImportError> {
    let mut devices: HashMap<i64, i64> = HashMap::new();
    let mut processes: HashMap<i64, (ProcessMeta, i64, i64)> = HashMap::new();
    let mut process_ids: HashMap<i64, i64> = HashMap::new();
    let mut series: HashMap<u64, u32> = HashMap::new();
    let mut state = State::default();
    let mut frames = 0u64;
    let mut gaps = Vec::new();
    let mut audits = Vec::new();
    let mut seen_header = false;
    let mut began = false;
    let last = store.last_sample_ms()?;
    while let Some((line_no, line)) = input.next_line()? {
        if line.trim().is_empty() {
            continue;
        }
        rows.read += 1;
        let v: Value = serde_json::from_str(&line).map_err(|e| {
            rows.fatal(
                line_no,
                format!("not JSON ({e}); the export is truncated or damaged"),
            )
        })?;
        let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
        let need = |field: &str| -> Result<&Value, ImportError> {
            v.get(field)
                .ok_or_else(|| rows.fatal(line_no, format!("a '{kind}' line without '{field}'")))
        };
        let int = |field: &str| -> Result<i64, ImportError> {
            need(field)?
                .as_i64()
                .ok_or_else(|| rows.fatal(line_no, format!("'{field}' is not an integer")))
        };
        let opt_str = |field: &str| v.get(field).and_then(Value::as_str).map(str::to_owned);
        if !seen_header && kind != "header" {
            return Err(rows.fatal(line_no, "the first line is not the export header"));
        }
        match kind {
            "header" => {
                let schema = need("schema")?.as_u64().unwrap_or(0);
                if schema != SCHEMA {
                    return Err(rows.fatal(
                        line_no,
                        format!("export schema {schema}; this vramctl reads schema {SCHEMA}"),
                    ));
                }
                seen_header = true;
            }
            "device" => {
                let meta = DeviceMeta {
                    uuid: opt_str("uuid")
                        .ok_or_else(|| rows.fatal(line_no, "a device without 'uuid'"))?,
                    index: v
                        .get("index")
                        .and_then(Value::as_u64)
                        .and_then(|i| u32::try_from(i).ok()),
                    name: opt_str("name"),
                    pci_bus_id: opt_str("pci_bus_id"),
                    parent_uuid: opt_str("parent_uuid"),
                };
                let local = store.import_device(&meta, 0)?;
                devices.insert(int("ref")?, local);
            }
            "process" => {
                let meta = ProcessMeta {
                    key: ProcessKey {
                        boot_id: opt_str("boot_id"),
                        pid: u32::try_from(int("pid")?)
                            .map_err(|_| rows.fatal(line_no, "'pid' out of range"))?,
                        start_time_ticks: v.get("start_time_ticks").and_then(Value::as_u64),
                    },
                    uid: v
                        .get("uid")
                        .and_then(Value::as_u64)
                        .and_then(|u| u32::try_from(u).ok()),
                    user: opt_str("user"),
                    command: opt_str("command"),
                    container_id: opt_str("container_id"),
                    pod_uid: opt_str("pod_uid"),
                };
                let seen = (
                    v.get("first_seen_ms").and_then(Value::as_i64).unwrap_or(0),
                    v.get("last_seen_ms").and_then(Value::as_i64).unwrap_or(0),
                );
                processes.insert(int("ref")?, (meta, seen.0, seen.1));
            }
            "series" => {
                let metric = need("metric")?
                    .as_str()
                    .and_then(Metric::from_name)
                    .ok_or_else(|| rows.fatal(line_no, "unknown 'metric'"))?;
                let device = match v.get("device").and_then(Value::as_i64) {
                    Some(r) => Some(*devices.get(&r).ok_or_else(|| {
                        rows.fatal(
                            line_no,
                            format!("series names device {r}, not declared before"),
                        )
                    })?),
                    None => None,
                };
                let process = match v.get("process").and_then(Value::as_i64) {
                    Some(r) => {
                        let (meta, first_seen, last_seen) = processes.get(&r).ok_or_else(|| {
                            rows.fatal(
                                line_no,
                                format!("series names process {r}, not declared before"),
                            )
                        })?;
                        let id = match process_ids.get(&r) {
                            Some(id) => *id,
                            None => {
                                if !began {
                                    store.begin_session(&SessionInfo {
                                        source: "import:ndjson".into(),
                                        ..SessionInfo::default()
                                    })?;
                                    began = true;
                                }
                                let id = store.import_process(meta, *first_seen, *last_seen)?;
                                process_ids.insert(r, id);
                                id
                            }
                        };
                        Some(id)
                    }
                    None => None,
                };
                let local = store.import_series(metric, device, process)?;
                let r = need("ref")?
                    .as_u64()
                    .ok_or_else(|| rows.fatal(line_no, "'ref' is not a number"))?;
                series.insert(r, local);
            }
            "frame" => {
                let t = int("unix_ms")?;
                let span = int("span_ms")?;
                let key = need("key")?.as_bool().unwrap_or(false);
                if frames == 0 && span == 0 {
                    if let Some(last) = last.filter(|&l| t <= l) {
                        return Err(ImportError::Overlap {
                            path: rows.path.to_path_buf(),
                            at: rfc3339(t),
                            last: rfc3339(last),
                            why: "an export is imported only after the history's end".into(),
                        });
                    }
                }
                if key {
                    state.clear();
                }
                let values = need("values")?
                    .as_array()
                    .ok_or_else(|| rows.fatal(line_no, "'values' is not a list"))?;
                for item in values {
                    let parts = item.as_array().map(Vec::as_slice).unwrap_or(&[]);
                    let id = parts
                        .first()
                        .and_then(Value::as_u64)
                        .and_then(|r| series.get(&r))
                        .copied()
                        .ok_or_else(|| {
                            rows.fatal(
                                line_no,
                                format!(
                                    "value '{}' names no declared series",
                                    shown(&item.to_string(), 40)
                                ),
                            )
                        })?;
                    let num = |j: usize| parts.get(j).and_then(Value::as_u64);
                    let entry = match parts.len() {
                        1 => None,
                        2 if parts[1].is_null() => Some(Entry::Unknown),
                        2 => {
                            Some(Entry::Value(num(1).ok_or_else(|| {
                                rows.fatal(line_no, "a value is not a number")
                            })?))
                        }
                        4 => match (num(1), num(2), num(3)) {
                            (Some(min), Some(max), Some(last)) => {
                                Some(Entry::Range { min, max, last })
                            }
                            _ => return Err(rows.fatal(line_no, "a bucket is not three numbers")),
                        },
                        _ => {
                            return Err(rows.fatal(
                                line_no,
                                "a value is not [ref], [ref, v] or [ref, min, max, last]",
                            ));
                        }
                    };
                    state.set(id, entry);
                }
                let observed = match v.get("observed").and_then(Value::as_array) {
                    None => None,
                    Some(list) => {
                        let mut out = Vec::new();
                        for o in list {
                            let o = o.as_array().map(Vec::as_slice).unwrap_or(&[]);
                            let d = o
                                .first()
                                .and_then(Value::as_i64)
                                .and_then(|r| devices.get(&r))
                                .copied()
                                .ok_or_else(|| {
                                    rows.fatal(line_no, "'observed' names no declared device")
                                })?;
                            let m = o.get(1).and_then(Value::as_bool).unwrap_or(false);
                            let p = o.get(2).and_then(Value::as_bool).unwrap_or(false);
                            codec::put_varint(
                                &mut out,
                                u64::try_from(d).unwrap_or(0) << 2
                                    | u64::from(m) << 1
                                    | u64::from(p),
                            );
                        }
                        Some(out)
                    }
                };
                if !began {
                    store.begin_session(&SessionInfo {
                        source: "import:ndjson".into(),
                        ..SessionInfo::default()
                    })?;
                    began = true;
                }
                store.put_frame(t, span, &state, observed.as_deref())?;
                frames += 1;
            }
            "gap" => gaps.push(Gap {
                device_uuid: opt_str("device"),
                metric: v
                    .get("metric")
                    .and_then(Value::as_str)
                    .and_then(Metric::from_name),
                from_ms: int("from_ms")?,
                to_ms: int("to_ms")?,
                open: false,
                reason: opt_str("reason").unwrap_or_default(),
            }),
            "audit" => {
                let record: AuditRecord = serde_json::from_value(v.clone()).map_err(|e| {
                    rows.fatal(line_no, format!("an audit line that does not parse: {e}"))
                })?;
                audits.push(record);
            }
            other => {
                rows.bad(line_no, format!("unknown line type '{}'", shown(other, 20)))?;
            }
        }
    }
    store.flush_import()?;
    for gap in &gaps {
        store.record_gap(gap)?;
    }
    for record in &audits {
        store.append_audit(record)?;
    }
    Ok(frames)
}

/// Reads `vramctl status --json --watch` output (schema 1) as ticks, one line at a time.
pub(crate) struct StatusReader {
    input: Input,
    last_ms: Option<i64>,
}

impl StatusReader {
    pub fn new(input: Input) -> Self {
        Self {
            input,
            last_ms: None,
        }
    }

    /// The next tick; `None` at the end.
    ///
    /// # Errors
    /// With `strict`, the first bad line.
    pub fn next_tick(&mut self, rows: &mut Rows<'_>) -> Result<Option<TickSample>, ImportError> {
        while let Some((line_no, line)) = self.input.next_line()? {
            if line.trim().is_empty() {
                continue;
            }
            rows.read += 1;
            match status_tick(&line) {
                Ok(tick) => {
                    if self.last_ms.is_some_and(|t| tick.at_unix_ms <= t) {
                        rows.bad(line_no, "its time is not after the previous line's")?;
                        continue;
                    }
                    self.last_ms = Some(tick.at_unix_ms);
                    return Ok(Some(tick));
                }
                Err(e) => rows.bad(line_no, e)?,
            }
        }
        Ok(None)
    }
}

fn status_tick(line: &str) -> Result<TickSample, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e})"))?;
    let schema = v.get("schema").and_then(Value::as_u64);
    if schema != Some(1) {
        return Err(format!(
            "status schema {}; this vramctl reads schema 1",
            schema.map_or_else(|| "missing".into(), |s| s.to_string())
        ));
    }
    let at = v
        .get("taken_at")
        .and_then(Value::as_str)
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .ok_or("no valid 'taken_at'")?
        .as_millisecond();
    let mut tick = TickSample {
        at_unix_ms: at,
        ..TickSample::default()
    };
    let devices = v
        .get("devices")
        .and_then(Value::as_array)
        .ok_or("no 'devices' list")?;
    for d in devices {
        let s = |f: &str| d.get(f).and_then(Value::as_str).map(str::to_owned);
        let meta = DeviceMeta {
            uuid: s("uuid").ok_or("a device without 'uuid'")?,
            index: d
                .get("index")
                .and_then(Value::as_u64)
                .and_then(|i| u32::try_from(i).ok()),
            name: s("name"),
            pci_bus_id: s("pci_bus_id"),
            parent_uuid: None,
        };
        let missing = |field: &str| {
            d.get("missing")
                .and_then(|m| m.get(field))
                .and_then(Value::as_str)
                .unwrap_or("not reported")
                .to_owned()
        };
        let state = match s("state").as_deref() {
            Some("lost") => DeviceSampleState::Unreadable(format!(
                "GPU lost: {}",
                s("error").unwrap_or_default()
            )),
            Some("error") => {
                DeviceSampleState::Unreadable(s("error").unwrap_or_else(|| "error".into()))
            }
            _ => {
                let memory = d.get("memory").filter(|m| !m.is_null());
                let mem = |f: &str| memory.and_then(|m| m.get(f)).and_then(Value::as_u64);
                let obs = |v: Option<u64>, field: &str| {
                    v.map_or_else(|| Observed::Missing(missing(field)), Observed::Value)
                };
                let num = |f: &str| d.get(f).and_then(Value::as_u64);
                // The sanity rules of live readings (the file may have been edited, or
                // written by a vramctl before them).
                let others: Vec<u64> = ["reserved_bytes", "free_bytes"]
                    .into_iter()
                    .filter_map(mem)
                    .collect();
                if let Some(why) = vramctl_core::sanity::memory_problem(
                    mem("total_bytes"),
                    mem("used_bytes"),
                    &others,
                ) {
                    return Err(format!("impossible memory: {why}"));
                }
                let metrics = vec![
                    (Metric::UsedBytes, obs(mem("used_bytes"), "memory")),
                    (Metric::ReservedBytes, obs(mem("reserved_bytes"), "memory")),
                    (Metric::FreeBytes, obs(mem("free_bytes"), "memory")),
                    (Metric::TotalBytes, obs(mem("total_bytes"), "memory")),
                    (
                        Metric::UtilizationGpuPercent,
                        obs(num("utilization_gpu_percent"), "utilization"),
                    ),
                    (
                        Metric::UtilizationMemoryPercent,
                        obs(num("utilization_memory_percent"), "utilization"),
                    ),
                    (
                        Metric::TemperatureC,
                        obs(num("temperature_c"), "temperature"),
                    ),
                    (Metric::PowerMw, obs(num("power_mw"), "power")),
                ];
                let processes = match d.get("processes").and_then(Value::as_array) {
                    None => ProcessList::Missing(missing("compute_processes")),
                    Some(list) => {
                        let mut out = Vec::new();
                        for p in list {
                            let pid = p
                                .get("pid")
                                .and_then(Value::as_u64)
                                .and_then(|p| u32::try_from(p).ok())
                                .ok_or("a process without a valid 'pid'")?;
                            let used_bytes = p.get("used_bytes").and_then(Value::as_u64);
                            if let Some(why) = vramctl_core::sanity::process_problem(
                                pid,
                                used_bytes,
                                mem("total_bytes"),
                                super::IMPORT_LIMITS,
                            ) {
                                return Err(format!("impossible process entry: {why}"));
                            }
                            out.push(ProcessOnDevice {
                                pid,
                                used_bytes,
                                sm_percent: None,
                                agent: None,
                            });
                            if !tick.processes.iter().any(|x| x.meta.key.pid == pid) {
                                tick.processes.push(ProcessSample {
                                    meta: ProcessMeta {
                                        key: ProcessKey {
                                            boot_id: None,
                                            pid,
                                            start_time_ticks: None,
                                        },
                                        user: p
                                            .get("user")
                                            .and_then(Value::as_str)
                                            .map(str::to_owned),
                                        command: p
                                            .get("command")
                                            .and_then(Value::as_str)
                                            .map(str::to_owned),
                                        ..ProcessMeta::default()
                                    },
                                    cpu_ticks: None,
                                });
                            }
                        }
                        ProcessList::Observed(out)
                    }
                };
                DeviceSampleState::Read { metrics, processes }
            }
        };
        tick.devices.push(DeviceSample {
            device: meta,
            state,
        });
    }
    Ok(tick)
}
