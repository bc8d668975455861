//! The leak-set scorer (`examples/evaluate_leakset/`) on hand-made recordings: thinning is
//! exact, and the scores of a tiny labeled recording, through the real `vramctl leaks`
//! binary and the live `FleetTracker`, are the ones worked out by hand.

#![allow(dead_code)]

#[path = "../../examples/evaluate_leakset/batch.rs"]
mod batch;
#[path = "../../examples/evaluate_leakset/eval.rs"]
mod eval;
#[path = "../../examples/evaluate_leakset/labels.rs"]
mod labels;
#[path = "../../examples/evaluate_leakset/live.rs"]
mod live;
#[path = "../../examples/evaluate_leakset/render.rs"]
mod render;
#[path = "../../examples/evaluate_leakset/replay.rs"]
mod replay;
#[path = "../../examples/evaluate_leakset/score.rs"]
mod score;
#[path = "../../examples/evaluate_leakset/sources.rs"]
mod sources;

use std::path::Path;
use std::time::Duration;

use vramctl_leaks::analysis::{LeakConfig, Verdict};
use vramctl_store::{
    DeviceMeta, DeviceSample, DeviceSampleState, Metric, Observed, OpenMode, ProcessKey,
    ProcessList, ProcessMeta, ProcessOnDevice, ProcessSample, Store, TickSample,
};

use self::batch::{Input, Vramctl};
use self::eval::{BATCH, Settings};
use self::labels::{Half, Truth};
use self::live::LiveCadence;
use self::replay::{Recording, Tick, thin};
use self::score::Class;
use self::sources::{Source, Workspace};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// 2026-12-01T20:00:00Z.
const T0: i64 = 1_796_155_200_000;
const TOTAL: u64 = 100 * GIB;

/// One GPU, utilization 90 % (busy and shared: no device idle evidence), the processes
/// `(pid, bytes, cpu ticks if read this tick)`.
fn tick(t: i64, procs: &[(u32, u64, Option<u64>)]) -> TickSample {
    let used: u64 = procs.iter().map(|p| p.1).sum();
    TickSample {
        at_unix_ms: t,
        devices: vec![DeviceSample {
            device: DeviceMeta {
                uuid: "GPU-eval".into(),
                index: Some(0),
                name: Some("NVIDIA H200".into()),
                ..DeviceMeta::default()
            },
            state: DeviceSampleState::Read {
                metrics: vec![
                    (Metric::UsedBytes, Observed::Value(used)),
                    (Metric::FreeBytes, Observed::Value(TOTAL - used)),
                    (Metric::TotalBytes, Observed::Value(TOTAL)),
                    (Metric::UtilizationGpuPercent, Observed::Value(90)),
                ],
                processes: ProcessList::Observed(
                    procs
                        .iter()
                        .map(|&(pid, bytes, _)| ProcessOnDevice {
                            pid,
                            used_bytes: Some(bytes),
                            sm_percent: None,
                            agent: None,
                        })
                        .collect(),
                ),
            },
        }],
        processes: procs
            .iter()
            .map(|&(pid, _, cpu)| ProcessSample {
                meta: ProcessMeta {
                    key: ProcessKey {
                        boot_id: Some("boot".into()),
                        pid,
                        start_time_ticks: Some(1000 + u64::from(pid)),
                    },
                    command: Some(format!("python job{pid}.py")),
                    ..ProcessMeta::default()
                },
                cpu_ticks: cpu,
            })
            .collect(),
        ..TickSample::default()
    }
}

/// The tiny labeled recording: 120 s at 100 ms, five processes from `T0`.
///
/// - 101 `late-leak` (tune): 2 GiB, then from 40 s 16 MiB every 500 ms (33.5 MB/s).
/// - 102 `steady` (tune): 4 GiB throughout.
/// - 103 `cached-leak` (tune): labeled a leak from its first step (1 s), but the leak is
///   inside the allocator's cache: NVML sees 3 GiB throughout. No analysis can flag it.
/// - 104 `grows-unlabeled` (holdout): labeled not a leak, yet 1 GiB for 30 s and then
///   64 MiB every 500 ms to the end: every analysis must call that a leak, so the
///   scorer must count a false alarm.
/// - 105 `idle` (holdout): 2 GiB; CPU time read every 10 s (as `record` does), rising
///   until 10 s, constant after; labeled idle from 5 s.
fn write_recording(path: &Path) {
    let mut store = Store::open(path, OpenMode::Append).expect("hand-made data");
    for i in 0..1200_i64 {
        let t = T0 + i * 100;
        let s = i * 100;
        let cpu_due = i % 100 == 0;
        let late = 2 * GIB
            + if s >= 40_000 {
                16 * MIB * (1 + u64::try_from((s - 40_000) / 500).expect("hand-made data"))
            } else {
                0
            };
        let grows = GIB
            + if s >= 30_000 {
                64 * MIB * (1 + u64::try_from((s - 30_000) / 500).expect("hand-made data"))
            } else {
                0
            };
        let idle_cpu = if s < 10_000 { 100 } else { 150 };
        let busy_cpu = 100 + u64::try_from(s / 10).expect("hand-made data");
        let procs = [
            (101, late, cpu_due.then_some(busy_cpu)),
            (102, 4 * GIB, cpu_due.then_some(busy_cpu)),
            (103, 3 * GIB, cpu_due.then_some(busy_cpu)),
            (104, grows, cpu_due.then_some(busy_cpu)),
            (105, 2 * GIB, cpu_due.then_some(idle_cpu)),
        ];
        store.append(&tick(t, &procs)).expect("hand-made data");
    }
    store.close().expect("hand-made data");
}

fn labels_text() -> String {
    let t = |ms: i64| (T0 + ms) as f64 / 1000.0;
    let line = |ms: i64, pid: u32, role: &str, event: &str, extra: &str| {
        format!(
            "{{\"t\": {}, \"pid\": {pid}, \"role\": \"{role}\", \"event\": \"{event}\"{extra}}}\n",
            t(ms)
        )
    };
    let mut s = String::new();
    s += &line(
        0,
        101,
        "late-leak",
        "start",
        r#", "half": "tune", "leaks": true, "rate_mb_s": 33.5, "leak_after_s": 40"#,
    );
    s += &line(
        40_000,
        101,
        "late-leak",
        "leak_start",
        r#", "at": "after 40 s""#,
    );
    s += &line(
        0,
        102,
        "steady",
        "start",
        r#", "half": "tune", "leaks": false"#,
    );
    s += &line(
        0,
        103,
        "cached-leak",
        "start",
        r#", "half": "tune", "leaks": true, "rate_mb_s": 20"#,
    );
    s += &line(
        1_000,
        103,
        "cached-leak",
        "leak_start",
        r#", "at": "first step""#,
    );
    s += &line(
        0,
        104,
        "grows-unlabeled",
        "start",
        r#", "half": "holdout", "leaks": false"#,
    );
    s += &line(
        0,
        105,
        "idle",
        "start",
        r#", "half": "holdout", "leaks": false, "idle": true"#,
    );
    s += &line(5_000, 105, "idle", "idle_start", "");
    s
}

fn vramctl() -> Vramctl {
    Vramctl {
        bin: assert_cmd::cargo::cargo_bin("vramctl"),
        idle_for: "60s".into(),
        tz: "UTC".into(),
    }
}

fn cfg() -> LeakConfig {
    LeakConfig {
        idle_for: Duration::from_secs(60),
        ..LeakConfig::default()
    }
}

/// The state of every tick of `rec`.
fn all_ticks(rec: &mut Recording) -> Vec<Tick> {
    let mut out = Vec::new();
    rec.ticks(|_, t| out.push(t.clone()))
        .expect("hand-made data");
    out
}

#[test]
fn thinning_keeps_the_first_tick_of_each_interval_with_the_state_it_had() {
    let dir = tempfile::tempdir().unwrap();
    let src_path = dir.path().join("src.db");
    // 100 ms ticks for 6 s, but none from 2.05 s to 3.35 s (a recorder that stalled);
    // memory changes every tick, CPU time every 10 ticks.
    let mut store = Store::open(&src_path, OpenMode::Append).unwrap();
    for i in (0..60_i64).filter(|i| !(21..34).contains(i)) {
        let n = u64::try_from(i).unwrap();
        store
            .append(&tick(
                T0 + i * 100,
                &[(7, GIB + n * MIB, (i % 10 == 0).then_some(n))],
            ))
            .unwrap();
    }
    store.close().unwrap();
    let mut src = Recording::open(&src_path).unwrap();
    let source_ticks = all_ticks(&mut src);
    let dst = dir.path().join("thin.db");
    let kept = thin(&mut src, &dst, 1000).unwrap();
    assert_eq!((kept.source_ticks, kept.kept_ticks), (47, 6));
    let mut thinned = Recording::open(&dst).unwrap();
    let got = all_ticks(&mut thinned);
    let times: Vec<i64> = got.iter().map(|t| t.t_ms - T0).collect();
    // Every 10th tick, and after the hole its first tick (3.4 s, not 3.0 s).
    assert_eq!(times, vec![0, 1000, 2000, 3400, 4000, 5000]);
    for t in &got {
        let want = source_ticks.iter().find(|s| s.t_ms == t.t_ms).unwrap();
        let used = |x: &Tick| {
            x.devices[0]
                .processes
                .iter()
                .map(|p| p.used_bytes)
                .collect::<Vec<_>>()
        };
        assert_eq!(used(t), used(want), "memory at {}", t.t_ms - T0);
        assert_eq!(t.devices[0].metrics, want.devices[0].metrics);
        // The CPU time is the value the source carried at that tick.
        let cpu = |x: &Tick| x.cpu_ticks.values().copied().collect::<Vec<_>>();
        assert_eq!(cpu(t), cpu(want), "CPU time at {}", t.t_ms - T0);
    }
    // The thinned store names the same process.
    let p = thinned.catalog.processes.values().next().unwrap();
    assert_eq!(p.meta.key.start_time_ticks, Some(1007));
}

/// The scorer's settings of these tests: idle for 60 s, live = batch checked.
fn settings(
    half: labels::HalfArg,
    hidden_workloads: usize,
    batch_every_ms: i64,
    live: Vec<LiveCadence>,
) -> Settings {
    Settings {
        half,
        hidden_workloads,
        idle_for: "60s".into(),
        batch_every_ms,
        equality: true,
        live,
    }
}

/// `eval::evaluate` of `workloads` (with `hidden` left out unseen) on `sources`, through
/// the built `vramctl` and the default analysis.
fn score(
    workloads: &[labels::Workload],
    hidden: &[labels::Workload],
    sources: &[Source],
    ws: &Workspace,
    settings: &Settings,
) -> Vec<eval::SourceReport> {
    eval::evaluate(
        workloads,
        hidden,
        sources,
        ws,
        &vramctl(),
        settings,
        &cfg(),
        |_| {},
    )
    .expect("the scorer runs")
}

#[test]
fn the_scorer_gives_the_worked_out_scores_on_a_tiny_labeled_recording() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tiny.db");
    write_recording(&db);
    let workloads = labels::parse(&labels_text()).unwrap();
    let ws = Workspace::new(jiff::tz::TimeZone::UTC).unwrap();
    let sources = vec![Source {
        name: "100ms".into(),
        what: "hand-made".into(),
        input: Input::Db(db),
    }];
    let settings = settings(
        labels::HalfArg::All,
        0,
        1000,
        vec![LiveCadence::Interactive, LiveCadence::Scraped],
    );
    let reports = score(&workloads, &[], &sources, &ws, &settings);
    let r = &reports[0];
    assert_eq!((r.ticks, r.interval_ms), (1200, 100));
    let report = eval::Report {
        schema: 1,
        settings: settings.clone(),
        notes: Vec::new(),
        workloads: workloads.clone(),
        sources: reports.clone(),
    };
    println!("{}", render::markdown(&report));

    for path in [BATCH, "watch", "serve"] {
        let of = |role: &str| {
            r.outcomes[path]
                .iter()
                .find(|o| o.role == role)
                .unwrap_or_else(|| panic!("{role} on {path}"))
        };
        // The late leak: 128 MiB after 8 steps (43.5 s), but the growth must last 10 s:
        // from the last flat sample (39.9 s) to a step at 50.0 s. Every path analyses at
        // 50.0 s (watch every second while it grows; serve 10 s after its forced
        // analysis at 40 s; batch at each whole second).
        let late = of("late-leak");
        assert_eq!(late.class, Class::Found, "{path}: {:?}", late.timeline);
        assert_eq!(late.delay_from_leak_start_sec, Some(10.0), "{path}");
        assert_eq!(late.delay_from_process_start_sec, Some(50.0), "{path}");
        assert_eq!(of("steady").class, Class::Quiet, "{path}");
        assert_eq!(of("cached-leak").class, Class::Missed, "{path}");
        // The unlabeled growth, found the same way: 30 s flat, steps from 30.0 s, 10 s
        // of growth at 40.0 s.
        let grows = of("grows-unlabeled");
        assert_eq!(grows.class, Class::FalseAlarm, "{path}");
        assert_eq!(grows.first_leak_ms, Some(T0 + 40_000), "{path}");
        let idle = of("idle");
        assert_eq!(idle.class, Class::Quiet, "{path}");
        assert_eq!(idle.truth, Truth::Idle);

        let summary = |half: Half| {
            r.summaries
                .iter()
                .find(|s| s.half == half && s.path == path)
                .unwrap()
        };
        let tune = summary(Half::Tune);
        assert_eq!(
            (tune.leaks, tune.found, tune.missed, tune.false_alarms),
            (2, 1, 1, 0)
        );
        assert_eq!((tune.precision, tune.recall), (1.0, 0.5));
        assert_eq!(
            (
                tune.delay_min_sec,
                tune.delay_median_sec,
                tune.delay_max_sec
            ),
            (Some(10.0), Some(10.0), Some(10.0))
        );
        let holdout = summary(Half::Holdout);
        assert_eq!((holdout.found, holdout.false_alarms), (0, 1));
        assert_eq!((holdout.precision, holdout.recall), (0.0, 1.0));
        assert_eq!(holdout.false_alarm_roles, vec!["grows-unlabeled"]);
        // Goals on the tune half at 100 ms: the after-plateau leak within 30 s (met); the
        // first-step leak of 20 MB/s within 60 s (not met: never flagged).
        let goals = &r
            .goals
            .iter()
            .find(|set| set.half == Half::Tune && set.path == path)
            .unwrap()
            .checks;
        let goal = |start: &str| goals.iter().find(|g| g.goal.starts_with(start)).unwrap();
        assert_eq!(goal("leaks that begin after a plateau").pass, Some(true));
        let first = goal("leaks >= 10 MB/s from the first step");
        assert_eq!(first.failing, vec!["cached-leak: not flagged"]);
        assert_eq!(goal("no false alarm").pass, Some(true));
    }
    // Idle holder: CPU time constant from 10 s, read every 10 s: 60 s of idle evidence
    // at 70 s, 65 s after the labeled idle start. `serve` sees it at its next forced
    // analysis (every 20 s: at 80 s), an idle span growing longer not being a change.
    for (path, delay) in [(BATCH, 65.0), ("watch", 65.0), ("serve", 75.0)] {
        let idle = r.outcomes[path].iter().find(|o| o.role == "idle").unwrap();
        assert_eq!(
            idle.idle_delay_sec,
            Some(delay),
            "{path}: {:?}",
            idle.timeline
        );
        assert_eq!(
            idle.final_change().map(|c| c.verdict),
            Some(Verdict::IdleHolder)
        );
    }
    // Every live verdict is what `vramctl leaks --until` its time says.
    assert!(r.same_samples_checked > 10);
    assert_eq!(r.same_samples_mismatches, Vec::new());
}

#[test]
fn the_tune_half_is_scored_without_a_trace_of_the_holdout_series() {
    // `--half tune`: the holdout workloads (104 grows-unlabeled, 105 idle) are left out,
    // and their series must appear nowhere: not as outcomes, not as unlabeled series,
    // not in the live = batch checks, not among the final differences.
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tiny.db");
    write_recording(&db);
    let (tune, holdout): (Vec<_>, Vec<_>) = labels::parse(&labels_text())
        .unwrap()
        .into_iter()
        .partition(|w| labels::HalfArg::Tune.keeps(w.half));
    assert_eq!(holdout.len(), 2);
    let ws = Workspace::new(jiff::tz::TimeZone::UTC).unwrap();
    let sources = vec![Source {
        name: "100ms".into(),
        what: "hand-made".into(),
        input: Input::Db(db),
    }];
    let settings = settings(
        labels::HalfArg::Tune,
        holdout.len(),
        1000,
        vec![LiveCadence::Interactive, LiveCadence::Scraped],
    );
    let reports = score(&tune, &holdout, &sources, &ws, &settings);
    let r = &reports[0];
    let hidden = |pid: u32| holdout.iter().any(|w| w.pid == pid);
    for (path, list) in &r.outcomes {
        assert!(list.iter().all(|o| o.half == Half::Tune), "{path}");
        assert!(
            r.unlabeled[path].iter().all(|u| !hidden(u.series.pid)),
            "{path}: {:?}",
            r.unlabeled[path]
        );
    }
    assert!(r.same_samples_checked > 0);
    assert!(
        r.same_samples_mismatches
            .iter()
            .all(|m| !hidden(m.series.pid))
    );
    assert!(r.final_differences.iter().all(|d| !hidden(d.series.pid)));
    assert!(r.summaries.iter().all(|s| s.half == Half::Tune));
    let json = serde_json::to_string(r).unwrap();
    for pid in [104, 105] {
        assert!(
            !json.contains(&format!("\"pid\":{pid}")),
            "PID {pid} in {json}"
        );
    }
}

/// `YYYY/MM/DD HH:MM:SS.mmm` (nvidia-smi's timestamps, here in UTC) of `T0 + ms`.
fn smi_time(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(T0 + ms)
        .expect("hand-made data")
        .strftime("%Y/%m/%d %H:%M:%S%.3f")
        .to_string()
}

#[test]
fn an_nvidia_smi_log_replays_live_at_its_process_rows_with_no_gaps_and_as_batch_says() {
    // `-l 1` logs of both queries, the GPU rows half a second after the process rows.
    // PID 201: 2 GiB for 30 s, then 100 MiB more every second.
    let dir = tempfile::tempdir().unwrap();
    let mut apps = String::from("timestamp, gpu_uuid, pid, process_name, used_gpu_memory [MiB]\n");
    let mut gpu = String::from(
        "timestamp, index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%]\n",
    );
    for i in 0..150_i64 {
        let mib = 2048 + if i >= 30 { 100 * (i - 29) } else { 0 };
        apps += &format!("{}, GPU-smi, 201, python3, {mib} MiB\n", smi_time(i * 1000));
        gpu += &format!(
            "{}, 0, GPU-smi, NVIDIA H200, 143771 MiB, {mib} MiB, {} MiB, 80 %\n",
            smi_time(i * 1000 + 500),
            143_771 - mib
        );
    }
    let apps_path = dir.path().join("smi-apps.csv");
    let gpu_path = dir.path().join("smi-gpu.csv");
    std::fs::write(&apps_path, apps).unwrap();
    std::fs::write(&gpu_path, gpu).unwrap();
    let labels = format!(
        "{{\"t\": {}, \"pid\": 201, \"role\": \"late\", \"event\": \"start\", \"half\": \"tune\", \"leaks\": true, \"rate_mb_s\": 104.9}}\n\
         {{\"t\": {}, \"pid\": 201, \"role\": \"late\", \"event\": \"leak_start\", \"at\": \"after 30 s\"}}\n",
        T0 as f64 / 1000.0,
        (T0 + 29_500) as f64 / 1000.0
    );
    let workloads = labels::parse(&labels).unwrap();
    let ws = Workspace::new(jiff::tz::TimeZone::UTC).unwrap();
    let input = Input::Files(vec![apps_path, gpu_path]);
    // The live replay sees one snapshot per process row (not per GPU row), each sample
    // following the one before without a gap.
    let mut rec = ws.recording(&input).unwrap();
    let watch = live::run(&mut rec, &cfg(), LiveCadence::Interactive).unwrap();
    let (_, timeline) = watch.iter().next().unwrap();
    let last = timeline.last_report.as_ref().unwrap();
    assert_eq!((last.samples, last.gaps), (150, 0));
    let settings = settings(
        labels::HalfArg::All,
        0,
        1000,
        vec![LiveCadence::Interactive],
    );
    let sources = vec![Source {
        name: "smi-1s".into(),
        what: "hand-made nvidia-smi logs".into(),
        input,
    }];
    let r = &score(&workloads, &[], &sources, &ws, &settings)[0];
    assert_eq!((r.ticks, r.interval_ms), (150, 1000));
    assert_eq!(r.same_samples_mismatches, Vec::new());
    let batch = &r.outcomes[BATCH][0];
    let watch = &r.outcomes["watch"][0];
    assert_eq!(batch.class, Class::Found);
    assert_eq!(batch.found_ms, watch.found_ms);
}

/// The 10 s history of the leak set's held-back half (`testdata/h200/leakset/`; its
/// figures were measured once, after the design of issue 13 was final), replayed live at
/// the `--watch`/`top` and `serve` cadences: every live verdict is what `vramctl leaks`
/// says on the same samples, every leak is found on every path, none falsely.
#[test]
fn live_and_batch_agree_on_the_held_back_leakset_half_at_10_s() {
    let leakset = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/h200/leakset");
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("leakset-10s.db");
    let gz = std::fs::File::open(leakset.join("leakset-10s.db.gz")).unwrap();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(gz), &mut bytes).unwrap();
    std::fs::write(&db, bytes).unwrap();
    let (holdout, tune): (Vec<_>, Vec<_>) =
        labels::parse(&std::fs::read_to_string(leakset.join("labels.jsonl")).unwrap())
            .unwrap()
            .into_iter()
            .partition(|w| labels::HalfArg::Holdout.keeps(w.half));
    assert_eq!(holdout.len(), 16);
    let ws = Workspace::new(jiff::tz::TimeZone::UTC).unwrap();
    let sources = vec![Source {
        name: "10s".into(),
        what: "leak set, 10 s history".into(),
        input: Input::Db(db),
    }];
    let settings = settings(
        labels::HalfArg::Holdout,
        tune.len(),
        10_000,
        vec![LiveCadence::Interactive, LiveCadence::Scraped],
    );
    let reports = score(&holdout, &tune, &sources, &ws, &settings);
    let r = &reports[0];
    assert!(r.same_samples_checked > 100, "{}", r.same_samples_checked);
    assert!(
        r.same_samples_mismatches.is_empty(),
        "{:?}",
        r.same_samples_mismatches
    );
    for s in &r.summaries {
        assert_eq!((s.leaks, s.found, s.false_alarms), (8, 8, 0), "{}", s.path);
        assert_eq!(s.idle_found, 1, "{}", s.path);
    }
    assert_eq!(r.summaries.len(), 3);
}
