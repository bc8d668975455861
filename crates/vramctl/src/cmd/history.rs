//! `vramctl history`: recorded samples per device and per process.
//!
//! One pass over the store (`Store::scan`): rows are aggregated into `--step` buckets on the
//! fly (min, max and last, so a spike inside a bucket shows as its max) and written as they
//! complete, so `--format csv` streams any range in constant memory. The table picks a step
//! giving about 30 rows per series; CSV and JSON default to every sample. JSON (schema 1,
//! docs/json.md) is one document, built in memory: use a step or CSV for long raw ranges.

mod audit_report;

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use anyhow::Context;
use jiff::tz::TimeZone;
use serde::Serialize;
use vramctl_core::untrusted::Untrusted;
use vramctl_core::wall_time;
use vramctl_store::{DeviceRecord, Entry, Gap, Metric, ProcessRecord, TimeRange, format::rfc3339};

use vramctl_history::csv_record::{CsvRecord, write_csv_record};
use vramctl_history::history_chart::{gpu_label, nice_step};
use vramctl_history::time_window::SinceDefault;
use vramctl_observe::gpu_selection::select_devices;

use super::db_path;
use crate::cli::{GlobalArgs, HistoryArgs, HistoryFormat, Step};
use crate::exit::Exit;
use crate::output::table::{Align, Table};
use vramctl_observe::units;

/// Version of the JSON below.
pub const SCHEMA: u32 = 1;

/// Rows a table shows per series when no `--step` is given.
const TABLE_ROWS: i64 = 30;

/// One bucket (or sample) of one metric.
#[derive(Debug, Clone, Copy, Serialize)]
struct Agg {
    min: u64,
    max: u64,
    last: u64,
}

impl Agg {
    fn add(&mut self, e: (u64, u64, u64)) {
        self.min = self.min.min(e.0);
        self.max = self.max.max(e.1);
        self.last = e.2;
    }
}

/// What a series is to this query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A metric of a shown device.
    Device(i64, Metric),
    /// A shown process's memory on a shown device: (process, device).
    Process(i64, i64),
    /// Its agent's allocated or reserved bytes there: (process, device, metric).
    ProcessAgent(i64, i64, Metric),
    /// Not asked for.
    Skip,
}

/// A device row: its metrics over one bucket.
#[derive(Debug, Clone, Default)]
struct DeviceRow {
    values: BTreeMap<Metric, Agg>,
}

/// What the scan produces: completed rows in time order.
enum Row<'a> {
    Device(i64, i64, &'a DeviceRecord, &'a DeviceRow),
    Process(i64, i64, i64, &'a DeviceRecord, Agg, AgentLast),
}

/// The last allocated and reserved bytes of a process's agent in a bucket (`None`: no
/// agent then, or the framework cannot say).
#[derive(Debug, Clone, Copy, Default)]
struct AgentLast {
    allocated_bytes: Option<u64>,
    reserved_bytes: Option<u64>,
}

/// Runs `history`.
pub fn run(global: &GlobalArgs, args: &HistoryArgs) -> anyhow::Result<Exit> {
    let tz = wall_time::zone(args.tz.as_deref())?;
    let now = jiff::Timestamp::now().as_millisecond();
    let window = args.window.settle();
    if args.audit {
        let range = window.resolve(now, &tz, None, SinceDefault::Everything)?;
        return audit_report::run(&db_path(global)?, args, range, &tz);
    }
    let mut store = super::open_history(&db_path(global)?)?;
    let devices = select_devices(store.devices()?, &args.gpu.selectors)?;
    let bounds = store.time_bounds()?;
    let range = window.resolve(now, &tz, bounds, SinceDefault::LastSpan)?;
    let step_ms = match args.step {
        Some(Step::Raw) => 0,
        Some(Step::Every(length)) => super::millis(length),
        None if args.format == HistoryFormat::Table => {
            let (lo, hi) = bounds.unwrap_or((0, 0));
            let span = range.to_ms.min(hi).saturating_sub(range.from_ms.max(lo));
            nice_step(span / TABLE_ROWS)
        }
        None => 0,
    };
    let by_id: HashMap<i64, &DeviceRecord> = devices.iter().map(|d| (d.id, d)).collect();
    // All processes by id (one query); those outside the range simply never appear.
    let processes: HashMap<i64, ProcessRecord> = store
        .all_processes()?
        .into_iter()
        .filter(|(_, p)| args.pid.is_empty() || args.pid.contains(&p.meta.key.pid))
        .filter(|(_, p)| args.job.is_none_or(|job| p.meta.slurm_job_id == Some(job)))
        .collect();
    if let (Some(job), true) = (args.job, processes.is_empty()) {
        eprintln!(
            "vramctl: no process of job {job} is recorded in this history (the recorder stores \
             each process's job id since schema 3)"
        );
    }
    let gaps: Vec<Gap> = store
        .gaps(range)?
        .into_iter()
        .filter(|g| {
            g.device_uuid
                .as_ref()
                .is_none_or(|u| devices.iter().any(|d| &d.meta.uuid == u))
        })
        .collect();
    let show_devices = args.pid.is_empty() && args.job.is_none();

    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut sink: Box<dyn Sink> = match args.format {
        HistoryFormat::Csv => Box::new(Csv::new()),
        HistoryFormat::Json => Box::new(Json::default()),
        HistoryFormat::Table => Box::new(TableSink::new(tz.clone(), step_ms)),
    };
    sink.begin(&mut out)?;
    // Per series id: what it is to this query (resolved once), and its bucket so far.
    // A frame only moves the series it changed, so within a bucket only those are merged;
    // a new bucket starts from every present series.
    let mut roles: Vec<Option<Role>> = Vec::new();
    let mut aggs: Vec<Option<Agg>> = Vec::new();
    let mut bucket: Option<(i64, i64)> = None;
    let mut bucket_partial = false;
    let mut failure: Option<anyhow::Error> = None;
    let flush = |t: i64,
                 span: i64,
                 roles: &[Option<Role>],
                 aggs: &mut Vec<Option<Agg>>,
                 out: &mut dyn Write,
                 sink: &mut dyn Sink|
     -> anyhow::Result<()> {
        let mut dev_rows: BTreeMap<i64, DeviceRow> = BTreeMap::new();
        let mut proc_rows: BTreeMap<(i64, i64), Agg> = BTreeMap::new();
        let mut agent_rows: HashMap<(i64, i64), AgentLast> = HashMap::new();
        for (id, agg) in aggs.iter_mut().enumerate() {
            let Some(agg) = agg.take() else { continue };
            match roles.get(id).copied().flatten() {
                Some(Role::Device(d, m)) => {
                    dev_rows.entry(d).or_default().values.insert(m, agg);
                }
                Some(Role::Process(p, d)) => {
                    proc_rows.insert((p, d), agg);
                }
                Some(Role::ProcessAgent(p, d, m)) => {
                    let row = agent_rows.entry((p, d)).or_default();
                    if m == Metric::ProcessAllocatedBytes {
                        row.allocated_bytes = Some(agg.last);
                    } else {
                        row.reserved_bytes = Some(agg.last);
                    }
                }
                Some(Role::Skip) | None => {}
            }
        }
        for (d, row) in &dev_rows {
            if let Some(dev) = by_id.get(d) {
                sink.row(out, Row::Device(t, span, dev, row), &processes)?;
            }
        }
        for ((p, d), agg) in proc_rows {
            if let Some(dev) = by_id.get(&d) {
                let agent = agent_rows.get(&(p, d)).copied().unwrap_or_default();
                sink.row(out, Row::Process(t, span, p, dev, agg, agent), &processes)?;
            }
        }
        Ok(())
    };
    store.scan(range, |frame| {
        if failure.is_some() {
            return;
        }
        let (b, span) = if step_ms > 0 {
            (
                frame.t_ms.div_euclid(step_ms) * step_ms,
                step_ms.max(frame.span_ms),
            )
        } else {
            (frame.t_ms, frame.span_ms)
        };
        let new_bucket = bucket.is_none_or(|(prev, _)| prev != b);
        if let Some((prev, prev_span)) = bucket.filter(|_| new_bucket) {
            if let Err(e) = flush(prev, prev_span, &roles, &mut aggs, &mut out, sink.as_mut()) {
                failure = Some(e);
                return;
            }
        }
        bucket = Some((b, span));
        let mut merge = |id: u32| {
            let i = usize::try_from(id).unwrap_or(usize::MAX);
            if i >= roles.len() {
                roles.resize(i + 1, None);
                aggs.resize(i + 1, None);
            }
            let role = *roles[i].get_or_insert_with(|| {
                let Some(s) = frame.series(id) else {
                    return Role::Skip;
                };
                let Some(d) = s.device_id.filter(|d| by_id.contains_key(d)) else {
                    return Role::Skip;
                };
                match (s.metric, s.process_id) {
                    (Metric::ProcessUsedBytes, Some(p)) if processes.contains_key(&p) => {
                        Role::Process(p, d)
                    }
                    (
                        m @ (Metric::ProcessAllocatedBytes | Metric::ProcessReservedBytes),
                        Some(p),
                    ) if processes.contains_key(&p) => Role::ProcessAgent(p, d, m),
                    (m, None) if show_devices => Role::Device(d, m),
                    _ => Role::Skip,
                }
            });
            // A value an imported log's frame carried over without sampling it is not a
            // sample (`Frame::sampled`).
            if role == Role::Skip || !frame.sampled(id) {
                return;
            }
            let Some(v) = frame.entry(id).and_then(Entry::min_max_last) else {
                return;
            };
            match &mut aggs[i] {
                Some(a) => a.add(v),
                slot @ None => {
                    *slot = Some(Agg {
                        min: v.0,
                        max: v.1,
                        last: v.2,
                    });
                }
            }
        };
        // Where frames sample only part of the state (an imported log), a series can be
        // sampled without changing: such a bucket looks at every present series.
        bucket_partial = (bucket_partial && !new_bucket) || !frame.observed_all();
        match frame.changed().filter(|_| !new_bucket && !bucket_partial) {
            Some(changed) => changed.iter().for_each(|&id| merge(id)),
            None => frame.entries().for_each(|(id, _)| merge(id)),
        }
    })?;
    if let Some(e) = failure {
        return Err(e);
    }
    if let Some((b, span)) = bucket {
        flush(b, span, &roles, &mut aggs, &mut out, sink.as_mut())?;
    }
    sink.end(&mut out, &gaps, range, step_ms, &devices)?;
    out.flush().context("cannot write to stdout")?;
    Ok(Exit::Ok)
}

trait Sink {
    fn begin(&mut self, _out: &mut dyn Write) -> anyhow::Result<()> {
        Ok(())
    }
    fn row(
        &mut self,
        out: &mut dyn Write,
        row: Row<'_>,
        processes: &HashMap<i64, ProcessRecord>,
    ) -> anyhow::Result<()>;
    fn end(
        &mut self,
        out: &mut dyn Write,
        gaps: &[Gap],
        range: TimeRange,
        step_ms: i64,
        devices: &[DeviceRecord],
    ) -> anyhow::Result<()>;
}

const DEVICE_METRICS: [Metric; 8] = Metric::DEVICE;

/// `--format csv`, through the store's one CSV writer (`format::csv_writer`): a record is
/// written into a small buffer and passed on, so a range streams in constant memory.
struct Csv {
    record: CsvRecord,
}

impl Csv {
    fn new() -> Self {
        Self {
            record: CsvRecord::new(),
        }
    }
}

impl Sink for Csv {
    fn begin(&mut self, out: &mut dyn Write) -> anyhow::Result<()> {
        let mut header = vec![
            "time",
            "unix_ms",
            "span_ms",
            "gpu_uuid",
            "gpu_index",
            "pid",
            "user",
            "command",
        ];
        header.extend([
            "process_used_bytes",
            "process_used_bytes_min",
            "process_used_bytes_max",
        ]);
        header.extend(DEVICE_METRICS.iter().map(|m| m.name()));
        header.push("used_bytes_max");
        write_csv_record(&mut self.record, out, header)
    }

    fn row(
        &mut self,
        out: &mut dyn Write,
        row: Row<'_>,
        processes: &HashMap<i64, ProcessRecord>,
    ) -> anyhow::Result<()> {
        let mut f: Vec<String> = Vec::with_capacity(20);
        match row {
            Row::Device(t, span, dev, values) => {
                f.extend([
                    rfc3339(t),
                    t.to_string(),
                    span.to_string(),
                    dev.meta.uuid.clone(),
                    opt(dev.meta.index),
                ]);
                f.extend(std::iter::repeat_n(String::new(), 6));
                for m in DEVICE_METRICS {
                    f.push(
                        values
                            .values
                            .get(&m)
                            .map_or_else(String::new, |a| a.last.to_string()),
                    );
                }
                f.push(
                    values
                        .values
                        .get(&Metric::UsedBytes)
                        .map_or_else(String::new, |a| a.max.to_string()),
                );
            }
            Row::Process(t, span, p, dev, agg, _) => {
                let proc = processes.get(&p);
                f.extend([
                    rfc3339(t),
                    t.to_string(),
                    span.to_string(),
                    dev.meta.uuid.clone(),
                    opt(dev.meta.index),
                ]);
                f.push(proc.map_or_else(String::new, |p| p.meta.key.pid.to_string()));
                f.push(proc.and_then(|p| p.meta.user.clone()).unwrap_or_default());
                f.push(
                    proc.and_then(|p| p.meta.command.clone())
                        .unwrap_or_default(),
                );
                f.extend([
                    agg.last.to_string(),
                    agg.min.to_string(),
                    agg.max.to_string(),
                ]);
                f.extend(std::iter::repeat_n(String::new(), DEVICE_METRICS.len() + 1));
            }
        }
        write_csv_record(&mut self.record, out, f)
    }

    fn end(
        &mut self,
        _: &mut dyn Write,
        _: &[Gap],
        _: TimeRange,
        _: i64,
        _: &[DeviceRecord],
    ) -> anyhow::Result<()> {
        Ok(())
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

#[derive(Debug, Serialize)]
struct JsonDoc {
    schema: u32,
    from: Option<String>,
    to: Option<String>,
    step_ms: i64,
    devices: Vec<JsonDevice>,
    processes: Vec<JsonProcess>,
    gaps: Vec<JsonGap>,
}

#[derive(Debug, Serialize)]
struct JsonDevice {
    uuid: String,
    index: Option<u32>,
    name: Option<String>,
    samples: Vec<BTreeMap<&'static str, serde_json::Value>>,
}

#[derive(Debug, Serialize)]
struct JsonProcess {
    pid: u32,
    boot_id: Option<String>,
    start_time_ticks: Option<u64>,
    user: Option<String>,
    command: Option<String>,
    container_id: Option<String>,
    pod_uid: Option<String>,
    gpu_uuid: String,
    samples: Vec<JsonProcessSample>,
}

#[derive(Debug, Serialize)]
struct JsonProcessSample {
    t: String,
    unix_ms: i64,
    span_ms: i64,
    used_bytes: u64,
    used_bytes_min: u64,
    used_bytes_max: u64,
    /// The in-process agent's figures at the end of the bucket; absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    allocated_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reserved_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
struct JsonGap {
    gpu_uuid: Option<String>,
    metric: Option<&'static str>,
    from: String,
    to: String,
    reason: String,
}

#[derive(Default)]
struct Json {
    devices: BTreeMap<i64, JsonDevice>,
    processes: BTreeMap<(i64, i64), JsonProcess>,
}

impl Sink for Json {
    fn row(
        &mut self,
        _out: &mut dyn Write,
        row: Row<'_>,
        processes: &HashMap<i64, ProcessRecord>,
    ) -> anyhow::Result<()> {
        match row {
            Row::Device(t, span, dev, values) => {
                let entry = self.devices.entry(dev.id).or_insert_with(|| JsonDevice {
                    uuid: dev.meta.uuid.clone(),
                    index: dev.meta.index,
                    name: dev.meta.name.clone(),
                    samples: Vec::new(),
                });
                let mut sample = BTreeMap::new();
                sample.insert("t", rfc3339(t).into());
                sample.insert("unix_ms", t.into());
                sample.insert("span_ms", span.into());
                for m in DEVICE_METRICS {
                    sample.insert(m.name(), values.values.get(&m).map(|a| a.last).into());
                }
                sample.insert(
                    "used_bytes_max",
                    values.values.get(&Metric::UsedBytes).map(|a| a.max).into(),
                );
                entry.samples.push(sample);
            }
            Row::Process(t, span, p, dev, agg, agent) => {
                let Some(proc) = processes.get(&p) else {
                    return Ok(());
                };
                let entry = self
                    .processes
                    .entry((p, dev.id))
                    .or_insert_with(|| JsonProcess {
                        pid: proc.meta.key.pid,
                        boot_id: proc.meta.key.boot_id.clone(),
                        start_time_ticks: proc.meta.key.start_time_ticks,
                        user: proc.meta.user.clone(),
                        command: proc.meta.command.clone(),
                        container_id: proc.meta.container_id.clone(),
                        pod_uid: proc.meta.pod_uid.clone(),
                        gpu_uuid: dev.meta.uuid.clone(),
                        samples: Vec::new(),
                    });
                entry.samples.push(JsonProcessSample {
                    t: rfc3339(t),
                    unix_ms: t,
                    span_ms: span,
                    used_bytes: agg.last,
                    used_bytes_min: agg.min,
                    used_bytes_max: agg.max,
                    allocated_bytes: agent.allocated_bytes,
                    reserved_bytes: agent.reserved_bytes,
                });
            }
        }
        Ok(())
    }

    fn end(
        &mut self,
        out: &mut dyn Write,
        gaps: &[Gap],
        range: TimeRange,
        step_ms: i64,
        _devices: &[DeviceRecord],
    ) -> anyhow::Result<()> {
        let doc = JsonDoc {
            schema: SCHEMA,
            from: (range.from_ms != i64::MIN).then(|| rfc3339(range.from_ms)),
            to: (range.to_ms != i64::MAX).then(|| rfc3339(range.to_ms)),
            step_ms,
            devices: std::mem::take(&mut self.devices).into_values().collect(),
            processes: std::mem::take(&mut self.processes).into_values().collect(),
            gaps: gaps
                .iter()
                .map(|g| JsonGap {
                    gpu_uuid: g.device_uuid.clone(),
                    metric: g.metric.map(Metric::name),
                    from: rfc3339(g.from_ms),
                    to: rfc3339(g.to_ms),
                    reason: g.reason.clone(),
                })
                .collect(),
        };
        serde_json::to_writer_pretty(&mut *out, &doc).context("cannot write JSON")?;
        writeln!(out).context("cannot write to stdout")
    }
}

struct TableSink {
    tz: TimeZone,
    step_ms: i64,
    devices: Table,
    processes: Table,
    device_rows: usize,
    process_rows: usize,
    /// The first time shown, where the zone is named.
    first_ms: Option<i64>,
}

impl TableSink {
    fn new(tz: TimeZone, step_ms: i64) -> Self {
        Self {
            tz,
            step_ms,
            devices: Table::new(&[
                ("TIME", Align::Left),
                ("GPU", Align::Right),
                ("USED", Align::Right),
                ("PEAK", Align::Right),
                ("TOTAL", Align::Right),
                ("UTIL", Align::Right),
                ("TEMP", Align::Right),
                ("POWER", Align::Left),
            ]),
            processes: Table::new(&[
                ("TIME", Align::Left),
                ("GPU", Align::Right),
                ("PID", Align::Right),
                ("USER", Align::Left),
                ("USED", Align::Right),
                ("PEAK", Align::Right),
                ("COMMAND", Align::Left),
            ]),
            device_rows: 0,
            process_rows: 0,
            first_ms: None,
        }
    }

    fn time(&mut self, t: i64) -> String {
        self.first_ms.get_or_insert(t);
        jiff::Timestamp::from_millisecond(t).map_or_else(
            |_| t.to_string(),
            |ts| {
                let format = if self.step_ms > 0 && self.step_ms % 60_000 == 0 {
                    "%Y-%m-%d %H:%M"
                } else if self.step_ms == 0 {
                    "%Y-%m-%d %H:%M:%S%.3f"
                } else {
                    "%Y-%m-%d %H:%M:%S"
                };
                ts.to_zoned_datetime(self.tz.clone())
                    .strftime(format)
                    .to_string()
            },
        )
    }
}

impl Sink for TableSink {
    fn row(
        &mut self,
        _out: &mut dyn Write,
        row: Row<'_>,
        processes: &HashMap<i64, ProcessRecord>,
    ) -> anyhow::Result<()> {
        match row {
            Row::Device(t, _, dev, values) => {
                let v = |m: Metric| values.values.get(&m).copied();
                let used = v(Metric::UsedBytes);
                let time = self.time(t);
                self.devices.push(vec![
                    time,
                    gpu_label(dev),
                    used.map_or_else(|| "-".into(), |a| units::bytes(a.last)),
                    used.map_or_else(|| "-".into(), |a| units::bytes(a.max)),
                    v(Metric::TotalBytes).map_or_else(|| "-".into(), |a| units::bytes(a.last)),
                    v(Metric::UtilizationGpuPercent)
                        .map_or_else(|| "-".into(), |a| format!("{}%", a.last)),
                    v(Metric::TemperatureC).map_or_else(|| "-".into(), |a| format!("{}°C", a.last)),
                    v(Metric::PowerMw).map_or_else(
                        || "-".into(),
                        |a| units::watts(u32::try_from(a.last).unwrap_or(u32::MAX)),
                    ),
                ]);
                self.device_rows += 1;
            }
            Row::Process(t, _, p, dev, agg, _) => {
                let proc = processes.get(&p);
                let time = self.time(t);
                self.processes.push(vec![
                    time,
                    gpu_label(dev),
                    proc.map_or_else(|| "?".into(), |p| p.meta.key.pid.to_string()),
                    proc.and_then(|p| p.meta.user.clone())
                        .unwrap_or_else(|| "-".into()),
                    units::bytes(agg.last),
                    units::bytes(agg.max),
                    proc.and_then(|p| p.meta.command.clone())
                        .unwrap_or_else(|| "-".into()),
                ]);
                self.process_rows += 1;
            }
        }
        Ok(())
    }

    fn end(
        &mut self,
        out: &mut dyn Write,
        gaps: &[Gap],
        range: TimeRange,
        step_ms: i64,
        devices: &[DeviceRecord],
    ) -> anyhow::Result<()> {
        let w = |out: &mut dyn Write, line: &str| {
            writeln!(out, "{}", Untrusted(line)).context("cannot write to stdout")
        };
        let step = if step_ms == 0 {
            "every sample".to_owned()
        } else {
            format!(
                "buckets of {} (USED is the last value, PEAK the highest)",
                units::exact_length(step_ms)
            )
        };
        // The zone once per output, at the first time shown (or the range's start).
        let zone_at = self.first_ms.unwrap_or(range.from_ms.max(0));
        let step = format!(
            "{step}, times in {}",
            wall_time::zone_label(&self.tz, zone_at)
        );
        if self.device_rows == 0 && self.process_rows == 0 {
            w(out, "no samples in this range")?;
        }
        if self.device_rows > 0 {
            w(out, &format!("devices, {step}"))?;
            for line in self.devices.render("  ") {
                w(out, &line)?;
            }
        }
        if self.process_rows > 0 {
            if self.device_rows > 0 {
                w(out, "")?;
            }
            w(out, &format!("processes, {step}"))?;
            for line in self.processes.render("  ") {
                w(out, &line)?;
            }
        }
        if !gaps.is_empty() {
            w(out, "")?;
            w(out, "gaps (nothing recorded, and why)")?;
            for g in gaps {
                let who = match &g.device_uuid {
                    None => "all GPUs".to_owned(),
                    Some(u) => devices
                        .iter()
                        .find(|d| &d.meta.uuid == u)
                        .map_or_else(|| u.clone(), |d| format!("GPU {}", gpu_label(d))),
                };
                let what = g
                    .metric
                    .map_or_else(String::new, |m| format!(" {}", m.name()));
                w(
                    out,
                    &format!(
                        "  {} → {}  {who}{what}: {}",
                        self.time(g.from_ms),
                        self.time(g.to_ms),
                        g.reason
                    ),
                )?;
            }
        }
        Ok(())
    }
}
