//! Whole frames, rendered with ratatui's `TestBackend` and snapshotted (insta): what a
//! person would see in each situation. States come from the example scenarios through the
//! real sampler on the fake NVML library (`fixtures::from_scenario`), with made-up /proc
//! facts so frames do not depend on the machine running them.

use std::sync::Arc;

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyEventState, KeyModifiers};
use ratatui::style::Color;

use super::app::kill_flow::{KillDialog, KillResult};
use super::app::{App, AppConfig};
use super::event::Event;
use super::fixtures::from_scenario;
use super::kill::{KillOutcome, Killer, RecordingKiller};
use super::replay::{MemoryReplay, seek_frame};
use super::view;
use vramctl_observe::observation::Observation;
use vramctl_observe::verdict::{ProcessVerdict, VerdictKind};

fn key(code: KeyCode) -> Event {
    Event::Key(KeyEvent {
        code,
        modifiers: KeyModifiers::NONE,
        kind: KeyEventKind::Press,
        state: KeyEventState::NONE,
    })
}

fn live(width: u16, height: u16) -> App {
    let mut app = App::new(AppConfig::default());
    app.update(Event::Resize(width, height));
    app
}

fn feed(app: &mut App, observations: &[Arc<Observation>]) {
    for o in observations {
        app.update(Event::Sample(Arc::clone(o)));
    }
}

fn frame(app: &App) -> TestBackend {
    let mut terminal = Terminal::new(TestBackend::new(app.size.0, app.size.1)).unwrap();
    terminal.draw(|f| view::render(app, f)).unwrap();
    terminal.backend().clone()
}

/// Seconds 0, 5, ..., `until`.
fn every_5s(until: u32) -> Vec<f64> {
    (0..=until / 5).map(|i| f64::from(i * 5)).collect()
}

/// Seconds 0, 10, ..., `until`.
fn every_10s(until: u32) -> Vec<f64> {
    (0..=until / 10).map(|i| f64::from(i * 10)).collect()
}

#[test]
fn idle_machine() {
    let mut app = live(120, 40);
    feed(&mut app, &from_scenario("h200-idle.toml", &[0.0, 1.0]));
    insta::assert_snapshot!("idle_machine", frame(&app));
}

#[test]
fn eight_gpus_thirty_processes() {
    let mut app = live(120, 40);
    feed(
        &mut app,
        &from_scenario("eight-gpus-30-procs.toml", &every_10s(90)),
    );
    assert_eq!(app.table.rows.len(), 240);
    insta::assert_snapshot!("eight_gpus_thirty_processes", frame(&app));
}

#[test]
fn eight_gpus_at_80x24() {
    let mut app = live(80, 24);
    feed(
        &mut app,
        &from_scenario("eight-gpus-30-procs.toml", &every_10s(90)),
    );
    insta::assert_snapshot!("eight_gpus_80x24", frame(&app));
}

#[test]
fn one_gpu_at_80x24_with_chart() {
    let mut app = live(80, 24);
    feed(
        &mut app,
        &from_scenario("h200-training.toml", &every_10s(240)),
    );
    insta::assert_snapshot!("training_80x24", frame(&app));
}

#[test]
fn too_small() {
    let mut app = live(79, 30);
    feed(&mut app, &from_scenario("h200-idle.toml", &[0.0]));
    insta::assert_snapshot!("too_small_79x30", frame(&app));
    app.update(Event::Resize(100, 23));
    insta::assert_snapshot!("too_small_100x23", frame(&app));
    // Still answers keys.
    app.update(key(KeyCode::Char('q')));
    assert!(app.quit);
}

#[test]
fn mig() {
    let mut app = live(120, 40);
    feed(&mut app, &from_scenario("mig.toml", &[0.0]));
    insta::assert_snapshot!("mig", frame(&app));
}

#[test]
fn lost_gpu() {
    let mut app = live(120, 40);
    feed(
        &mut app,
        &from_scenario("fault-gpu-lost.toml", &[0.0, 5.0, 12.0]),
    );
    insta::assert_snapshot!("lost_gpu", frame(&app));
}

/// h200-training over four minutes, with a hand-made leak verdict on the leaker (24177) —
/// the shape the analysis will hand over — and its detail pane open.
#[test]
fn leak_flagged_with_its_numbers() {
    let mut observations = from_scenario("h200-training.toml", &every_10s(240));
    let last = observations.pop().unwrap();
    let mut last = (*last).clone();
    let uuid = last.snapshot.devices[0].info.uuid.clone();
    last.verdicts.insert(
        24177,
        &uuid,
        ProcessVerdict {
            kind: VerdictKind::Leak,
            summary: "leaks 32.0 MiB/s since 21:00:10 UTC; GPU 0 is full in 52 min".into(),
            numbers: vec![
                ("slope".into(), "32.0 MiB/s".into()),
                ("p-value".into(), "< 0.001 (Mann-Kendall)".into()),
                ("onset".into(), "21:00:10 UTC".into()),
                ("time to full".into(), "52 min".into()),
            ],
            idle: None,
        },
    );
    let mut app = live(120, 40);
    app.analysis = true;
    feed(&mut app, &observations);
    feed(&mut app, &[Arc::new(last)]);
    let leaker = app
        .table
        .rows
        .iter()
        .position(|r| r.key.pid == 24177)
        .unwrap();
    for _ in 0..leaker {
        app.update(key(KeyCode::Down));
    }
    app.update(key(KeyCode::Enter));
    assert_eq!(app.selected_row().unwrap().flags.text(), "L");
    insta::assert_snapshot!("leak_flagged", frame(&app));
}

/// h200-training over ten minutes (a sample every 5 s) judged by the live analysis
/// (`AnalysisJudge`, what `top` runs on its sampler thread), idle after 5 minutes: the
/// leaker (24177) is flagged L, the notebook kernel that holds 12 GiB at 0 % SM (24150) I;
/// the trainer that warmed up and the server whose cache breathes are not flagged. The
/// leaker's detail pane shows the analysis' own numbers.
#[test]
fn top_shows_times_in_the_zone_it_was_given() {
    // top printed UTC whatever --tz or TZ said; now its header, charts and verdicts speak
    // the zone given, named once in the header.
    let cfg = vramctl_leaks::analysis::LeakConfig {
        idle_for: std::time::Duration::from_secs(300),
        ..vramctl_leaks::analysis::LeakConfig::default()
    };
    let paris = jiff::tz::TimeZone::get("Europe/Paris").unwrap();
    let observations = super::fixtures::judged_in(
        cfg,
        &from_scenario("h200-training.toml", &every_5s(600)),
        paris.clone(),
    );
    let mut app = App::new(AppConfig {
        time_zone: paris,
        ..AppConfig::default()
    });
    app.update(Event::Resize(120, 40));
    app.analysis = true;
    feed(&mut app, &observations);
    let screen = format!("{}", frame(&app));
    let header = screen.lines().next().unwrap();
    assert!(header.contains(" 22:10:00 CET "), "{header}");
    assert!(!screen.contains("UTC"), "{screen}");
    let last = observations.last().unwrap();
    let leaker = last
        .verdicts
        .get(24177, "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2");
    let summary = &leaker.unwrap().summary;
    assert!(summary.contains("since 22:00:00"), "{summary}");
}

#[test]
fn verdict_flags_from_the_live_analysis() {
    let cfg = vramctl_leaks::analysis::LeakConfig {
        idle_for: std::time::Duration::from_secs(300),
        ..vramctl_leaks::analysis::LeakConfig::default()
    };
    let observations =
        super::fixtures::judged(cfg, &from_scenario("h200-training.toml", &every_5s(600)));
    let mut app = live(120, 40);
    app.analysis = true;
    feed(&mut app, &observations);
    let flags = |pid: u32| {
        app.table
            .rows
            .iter()
            .find(|r| r.key.pid == pid)
            .map(|r| r.flags.text())
            .unwrap()
    };
    assert_eq!(flags(24177), "L");
    assert_eq!(flags(24150), "I");
    assert_eq!(flags(24101), "");
    assert_eq!(flags(24210), "");
    // Down to the leaker (third by memory).
    for _ in 0..app.table.rows.len() {
        if app.selected_row().is_some_and(|r| r.key.pid == 24177) {
            break;
        }
        app.update(key(KeyCode::Down));
    }
    app.update(key(KeyCode::Enter));
    assert_eq!(app.selected_row().unwrap().key.pid, 24177);
    insta::assert_snapshot!("verdict_flags_live_analysis", frame(&app));
}

#[test]
fn kill_dialog_confirm_and_result() {
    let mut app = live(120, 40);
    feed(
        &mut app,
        &from_scenario("h200-training.toml", &every_10s(60)),
    );
    app.update(key(KeyCode::Char('K')));
    insta::assert_snapshot!("kill_dialog_checking", frame(&app));
    let mut killer = RecordingKiller::new(KillOutcome::AlreadyGone);
    let plan = killer.plan(&app.kill_target().unwrap()).unwrap();
    app.update(Event::KillPlanned(Ok(plan.clone())));
    insta::assert_snapshot!("kill_dialog_confirm", frame(&app));
    app.update(key(KeyCode::Char('y')));
    app.update(Event::KillFinished {
        plan: plan.clone(),
        outcome: KillOutcome::Exited {
            escalated: false,
            after_ms: 300,
        },
    });
    // The next sample no longer lists it.
    let mut gone = (*from_scenario("h200-training.toml", &[70.0])[0]).clone();
    let snapshot = Arc::make_mut(&mut gone.snapshot);
    if let vramctl_core::types::DeviceState::Ok(r) = &mut snapshot.devices[0].state {
        r.processes
            .as_mut()
            .unwrap()
            .retain(|p| p.pid != plan.target.pid);
    }
    app.update(Event::Sample(Arc::new(gone)));
    assert!(matches!(
        app.kill.dialog,
        Some(KillDialog::Finished {
            result: KillResult::Freed { .. },
            ..
        })
    ));
    insta::assert_snapshot!("kill_dialog_freed", frame(&app));
}

#[test]
fn kill_refused() {
    let mut app = live(120, 40);
    feed(&mut app, &from_scenario("h200-training.toml", &[0.0]));
    app.update(key(KeyCode::Char('K')));
    app.update(Event::KillPlanned(Err(
        "process 24210 belongs to bob; only root may signal other users' processes".into(),
    )));
    insta::assert_snapshot!("kill_refused", frame(&app));
}

#[test]
fn help_overlay() {
    let mut app = live(120, 40);
    feed(&mut app, &from_scenario("h200-training.toml", &[0.0]));
    app.update(key(KeyCode::Char('?')));
    insta::assert_snapshot!("help", frame(&app));
}

/// Live without a recorder's database: the header says so, and the help says where the
/// charts' past would come from.
#[test]
fn no_history_database_in_the_header_and_the_help() {
    let mut app = App::new(AppConfig {
        history_note: Some(
            "only since top started: no recorder database at \
             '/home/ada/.local/state/vramctl/history.db' (vramctl record keeps one)"
                .into(),
        ),
        ..AppConfig::default()
    });
    app.update(Event::Resize(120, 40));
    feed(&mut app, &from_scenario("h200-training.toml", &[0.0]));
    app.update(key(KeyCode::Char('?')));
    insta::assert_snapshot!("help_no_history_db", frame(&app));
}

#[test]
fn tree_and_filter() {
    let mut app = live(120, 40);
    feed(
        &mut app,
        &from_scenario("eight-gpus-30-procs.toml", &[0.0, 10.0]),
    );
    app.update(key(KeyCode::Char('t')));
    app.update(key(KeyCode::Char('/')));
    for c in "gpu 2".chars() {
        app.update(key(KeyCode::Char(c)));
    }
    insta::assert_snapshot!("tree_filtered_typing", frame(&app));
}

#[test]
fn replay_at_a_cursor() {
    let recording = MemoryReplay::new(
        from_scenario("h200-training.toml", &every_10s(600))
            .into_iter()
            .map(|o| (*o).clone())
            .collect(),
    );
    let mut app = App::new(AppConfig {
        live_interval: None,
        ..AppConfig::default()
    });
    app.update(Event::Resize(120, 40));
    app.start();
    // Cursor at 5 minutes in, as the replay thread answers a seek.
    let t = super::fixtures::T0_MS + 300_000;
    let seek = super::replay::Seek::AtOrBefore(t);
    let frame_data = seek_frame(&recording, seek, app.charts.zoom.span_ms(), 512).unwrap();
    app.update(Event::Replay(Box::new(frame_data)));
    assert_eq!(app.now_ms(), Some(t));
    insta::assert_snapshot!("replay_at_cursor", frame(&app));
}

/// The same ten minutes of h200-training, recorded into the history store and browsed
/// through `StoreSource` (what `top --replay DB` runs): the cursor 5 minutes in, then one
/// step forward. Differs from `replay_at_cursor` only where a recording keeps less: no
/// driver version, and CPU% averaged over the minute before the cursor (the fixture's CPU
/// time does not move: 0).
#[test]
fn replay_from_the_store_at_a_cursor_and_after_a_step() {
    use super::store::StoreSource;
    let observations = from_scenario("h200-training.toml", &every_10s(600));
    let source = StoreSource::new(super::fixtures::recorded(&observations), None);
    let mut app = App::new(AppConfig {
        live_interval: None,
        ..AppConfig::default()
    });
    app.update(Event::Resize(120, 40));
    let t = super::fixtures::T0_MS + 300_000;
    let frame_data = seek_frame(
        &source,
        super::replay::Seek::AtOrBefore(t + 5_000),
        app.charts.zoom.span_ms(),
        512,
    )
    .unwrap();
    app.update(Event::Replay(Box::new(frame_data)));
    assert_eq!(app.now_ms(), Some(t));
    insta::assert_snapshot!("replay_store_at_cursor", frame(&app));

    // → : the next recorded sample, 10 s later; the leaker's memory moved on.
    let effects = app.update(key(KeyCode::Right));
    let [super::app::Effect::Seek(seek)] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    let frame_data = seek_frame(&source, *seek, app.charts.zoom.span_ms(), 512).unwrap();
    app.update(Event::Replay(Box::new(frame_data)));
    assert_eq!(app.now_ms(), Some(t + 10_000));
    insta::assert_snapshot!("replay_store_after_a_step", frame(&app));
}

/// A real H200 recording (45 s at 10 Hz, three PyTorch processes: an idle holder, a leak,
/// a steady trainer; `crates/vramctl-leaks/tests/data/h200/`) browsed in replay, the cursor
/// 40 s in, the leaking process selected with its detail pane open.
#[test]
fn replay_of_a_real_h200_trace() {
    use vramctl_core::types::{
        DeviceInfo, DeviceReading, DeviceSnapshot, DeviceState, DriverInfo, MemoryReading,
        ProcessKind, ProcessUsage, Snapshot,
    };

    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../vramctl-leaks/tests/data/h200/trace-hold-leak-steady.json"
    );
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let roles: Vec<(u32, String)> = trace["roles"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(role, pid)| (u32::try_from(pid.as_u64().unwrap()).unwrap(), role.clone()))
        .collect();
    let info = Arc::new(DeviceInfo {
        index: 0,
        uuid: "GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2".into(),
        name: Some("NVIDIA H200".into()),
        pci_bus_id: None,
        minor_number: Some(0),
        mig_enabled: Some(false),
        mig_instances: vec![],
    });
    let driver = Arc::new(DriverInfo {
        driver_version: Some("580.159.04".into()),
        nvml_version: None,
        cuda_driver_version: None,
    });
    let u = |v: &serde_json::Value| v.as_u64().unwrap();
    let observations: Vec<Observation> = trace["trace"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            #[allow(clippy::cast_possible_truncation)]
            let t_ms = (s["t"].as_f64().unwrap() * 1000.0).round() as i64;
            let processes = s["procs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| ProcessUsage {
                    pid: u32::try_from(u(&p[0])).unwrap(),
                    used_bytes: Some(u(&p[1])),
                    kind: ProcessKind::Compute,
                    gpu_instance_id: None,
                    compute_instance_id: None,
                })
                .collect();
            let mut o = Observation::bare(Snapshot {
                taken_at_unix_ms: super::fixtures::T0_MS + t_ms,
                monotonic_ms: super::fixtures::T0_MS + t_ms,
                driver: Arc::clone(&driver),
                devices: vec![DeviceSnapshot {
                    info: Arc::clone(&info),
                    state: DeviceState::Ok(DeviceReading {
                        memory: Some(MemoryReading {
                            total_bytes: u(&s["total"]),
                            used_bytes: u(&s["used"]),
                            reserved_bytes: u(&s["reserved"]),
                            free_bytes: u(&s["free"]),
                        }),
                        utilization_gpu_percent: Some(u32::try_from(u(&s["util_gpu"])).unwrap()),
                        utilization_memory_percent: Some(u32::try_from(u(&s["util_mem"])).unwrap()),
                        processes: Some(processes),
                        ..DeviceReading::default()
                    }),
                }],
                unopened: vec![],
            });
            for (pid, role) in &roles {
                let command = format!("python3 workloads/{role}.py");
                o.hosts
                    .insert(*pid, super::fixtures::host(*pid, 1, "ubuntu", &command));
            }
            o
        })
        .collect();
    let recording = MemoryReplay::new(observations);
    let mut app = App::new(AppConfig {
        live_interval: None,
        ..AppConfig::default()
    });
    app.update(Event::Resize(120, 40));
    app.update(key(KeyCode::Char('z')));
    let seek = super::replay::Seek::AtOrBefore(super::fixtures::T0_MS + 40_000);
    let frame_data = seek_frame(&recording, seek, app.charts.zoom.span_ms(), 512).unwrap();
    app.update(Event::Replay(Box::new(frame_data)));
    // The leak holds the most memory by now; it is the first row.
    let leak = roles.iter().find(|(_, r)| r == "leak").unwrap().0;
    assert_eq!(app.table.rows[0].key.pid, leak);
    let delta = app.table.rows[0].delta_per_min.unwrap();
    assert!(
        delta > 50 << 30,
        "the leak grew > 50 GiB in the last minute: {delta}"
    );
    app.update(key(KeyCode::Enter));
    insta::assert_snapshot!("replay_h200_trace", frame(&app));
}

#[test]
fn no_color_draws_no_colour_and_color_does() {
    let observations = from_scenario("h200-training.toml", &every_10s(60));
    for color in [false, true] {
        let mut app = App::new(AppConfig {
            color,
            ..AppConfig::default()
        });
        app.update(Event::Resize(120, 40));
        feed(&mut app, &observations);
        app.update(key(KeyCode::Char('?')));
        let backend = frame(&app);
        let coloured = backend
            .buffer()
            .content()
            .iter()
            .filter(|c| c.fg != Color::Reset || c.bg != Color::Reset)
            .count();
        if color {
            assert!(coloured > 100, "{coloured}");
        } else {
            assert_eq!(coloured, 0);
        }
    }
}

/// `observations` with agent figures, by each GPU's process order: the first with both
/// figures, the second with an agent whose framework cannot say its cache, the third
/// without an agent, and so on.
fn with_agents(observations: &[Arc<Observation>]) -> Vec<Arc<Observation>> {
    use vramctl_agent::agent_client::AgentMemory;
    let figures = [
        Some(AgentMemory {
            allocated_bytes: Some(1 << 30),
            cached_bytes: Some(1 << 30),
            releasable_bytes: Some(768 << 20),
        }),
        Some(AgentMemory {
            allocated_bytes: Some(512 << 20),
            cached_bytes: None,
            releasable_bytes: None,
        }),
        None,
    ];
    observations
        .iter()
        .map(|o| {
            let mut o = (**o).clone();
            for device in &o.snapshot.devices {
                let listed = device.reading().and_then(|r| r.processes.as_ref());
                for (p, memory) in listed.into_iter().flatten().zip(figures.iter().cycle()) {
                    if let Some(memory) = memory {
                        o.agents.insert(p.pid, &device.info.uuid, *memory);
                    }
                }
            }
            Arc::new(o)
        })
        .collect()
}

#[test]
fn agent_columns_appear_only_when_a_process_has_an_agent() {
    let observations = from_scenario("eight-gpus-30-procs.toml", &every_10s(30));
    let mut without = live(120, 40);
    feed(&mut without, &observations);
    let screen = frame(&without).to_string();
    assert!(!screen.contains("ALLOC") && !screen.contains("CACHED"));

    let mut with = live(120, 40);
    feed(&mut with, &with_agents(&observations));
    let screen = frame(&with).to_string();
    assert!(screen.contains("ALLOC") && screen.contains("CACHED"));
    insta::assert_snapshot!("agent_columns", frame(&with));
}

#[test]
fn agent_figures_in_the_detail_pane() {
    let observations = with_agents(&from_scenario("h200-training.toml", &every_10s(60)));
    let mut app = live(120, 40);
    feed(&mut app, &observations);
    app.update(key(KeyCode::Enter));
    insta::assert_snapshot!("agent_detail", frame(&app));
}

/// Two GPUs shared by two Slurm jobs, a Docker container with a hostile name, a process
/// of no job and one not visible here (no host facts).
fn owners_machine() -> Arc<Observation> {
    use super::fixtures::{GIB, gpu, host, obs};
    use vramctl_procs::container::{ContainerFacts, ContainerRuntime};
    use vramctl_procs::slurm::{SlurmJob, SlurmSource, SlurmStep};
    let job = |id: u32, user: &str| SlurmJob {
        job_id: id,
        step: Some(SlurmStep::Number(0)),
        user: Some(user.into()),
        uid: None,
        partition: Some("gpu".into()),
        source: SlurmSource::Cgroup,
        environ_conflict: None,
    };
    let in_job = |pid: u32, user: &str, id: u32| {
        let mut h = host(pid, 1, user, "python train.py");
        h.slurm = Some(job(id, user));
        h
    };
    let mut contained = host(300, 1, "carol", "python serve.py");
    contained.container = Some(ContainerFacts {
        id: "3f0c2b7a9d8e4f61a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f70819".into(),
        runtime: Some(ContainerRuntime::Docker),
        name: Some("web\u{1b}[2Kforged".into()),
        rootless_uid: None,
    });
    contained.container_id = contained.container.as_ref().map(|c| c.id.clone());
    obs(
        0,
        vec![
            gpu(
                0,
                141 * GIB,
                60 * GIB,
                &[
                    (100, 20 * GIB),
                    (101, 20 * GIB),
                    (200, 10 * GIB),
                    (300, 5 * GIB),
                    (900, 4 * GIB),
                ],
            ),
            gpu(1, 141 * GIB, 30 * GIB, &[(101, 10 * GIB), (200, 20 * GIB)]),
        ],
        vec![
            in_job(100, "alice", 1234),
            in_job(101, "alice", 1234),
            in_job(200, "bob", 77),
            contained,
        ],
    )
}

/// `o` cycles the table through each owner grouping of `ps --by` and back to processes;
/// while grouped, a kill is refused (no process is selected on screen).
#[test]
fn grouped_by_owner() {
    let mut app = live(100, 30);
    feed(&mut app, &[owners_machine()]);
    app.update(key(KeyCode::Char('o')));
    assert_eq!(app.by, Some(vramctl_observe::owners::OwnerKey::User));
    insta::assert_snapshot!("grouped_by_user", frame(&app));
    app.update(key(KeyCode::Char('o')));
    insta::assert_snapshot!("grouped_by_container", frame(&app));
    app.update(key(KeyCode::Char('o')));
    app.update(key(KeyCode::Char('o')));
    assert_eq!(app.by, Some(vramctl_observe::owners::OwnerKey::Job));
    assert!(app.update(key(KeyCode::Char('K'))).is_empty());
    assert!(!app.kill.shown(), "no kill dialog while grouped");
    insta::assert_snapshot!("grouped_by_job", frame(&app));
    app.update(key(KeyCode::Char('o')));
    assert_eq!(app.by, None, "back to one row per process");
    let mut started = App::new(AppConfig {
        by: Some(vramctl_observe::owners::OwnerKey::Job),
        ..AppConfig::default()
    });
    started.update(Event::Resize(100, 30));
    feed(&mut started, &[owners_machine()]);
    for _ in 0..4 {
        app.update(key(KeyCode::Char('o')));
    }
    app.message = None;
    assert_eq!(
        frame(&started),
        frame(&app),
        "top --by job starts where o o o o leads"
    );
}

/// The trainer (24101) of h200-training with the OOMs its agent reported, in `state`
/// (what `Observer` puts on each observation once it has seen them).
fn with_an_oom(
    observations: &[Arc<Observation>],
    state: vramctl_observe::agent_ooms::OomState,
) -> Vec<Arc<Observation>> {
    use vramctl_observe::agent_ooms::{OomState, ProcessOoms};
    let classified = state == OomState::Classified;
    let oom = ProcessOoms {
        count: 3,
        seen_at_unix_ms: 1_764_450_010_000,
        state,
        cause: classified.then(|| "fragmentation".to_owned()),
        fix: classified.then(|| "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True".to_owned()),
        why: classified.then(|| {
            "2.00 GiB asked; 3.10 GiB reserved is free but the largest free block is 1.50 GiB"
                .to_owned()
        }),
        oom_at_unix_ms: classified.then_some(1_764_450_008_000),
        device: Some(0),
        others_when_seen: vec![vramctl_observe::agent_ooms::HeldBeside {
            pid: 24150,
            used_bytes: 12 << 30,
        }],
    };
    let mut out: Vec<Arc<Observation>> = observations.to_vec();
    if let Some(last) = out.last_mut() {
        let mut o = (**last).clone();
        o.ooms.insert(24101, oom);
        *last = Arc::new(o);
    }
    out
}

/// At 80 columns a process that hit an OOM is flagged `O` in its row.
#[test]
fn oom_flagged_at_80x24() {
    use vramctl_observe::agent_ooms::OomState;
    let mut app = live(80, 24);
    feed(
        &mut app,
        &with_an_oom(
            &from_scenario("h200-training.toml", &every_10s(240)),
            OomState::Classified,
        ),
    );
    let flags = |pid| {
        app.table
            .rows
            .iter()
            .find(|r| r.key.pid == pid)
            .map(|r| r.flags.text())
    };
    assert_eq!(flags(24101).as_deref(), Some("O"));
    assert_eq!(flags(24210).as_deref(), Some(""));
    insta::assert_snapshot!("oom_flagged_80x24", frame(&app));
}

/// The detail pane says how many OOMs, the first one's cause, its fix and why; while
/// the snapshot is being read, that it is.
#[test]
fn oom_cause_and_fix_in_the_detail_pane() {
    use vramctl_observe::agent_ooms::OomState;
    let observations = from_scenario("h200-training.toml", &every_10s(70));
    let (before, last) = observations.split_at(observations.len() - 1);
    let mut app = live(120, 40);
    feed(&mut app, &with_an_oom(before, OomState::Classifying));
    // The selection follows its process as rows reorder: move from where it is.
    let trainer = app
        .table
        .rows
        .iter()
        .position(|r| r.key.pid == 24101)
        .unwrap();
    let at = app.table.selected_index().unwrap_or(0);
    for _ in trainer..at {
        app.update(key(KeyCode::Up));
    }
    for _ in at..trainer {
        app.update(key(KeyCode::Down));
    }
    app.update(key(KeyCode::Enter));
    assert_eq!(app.selected_row().map(|r| r.key.pid), Some(24101));
    let screen = format!("{:?}", frame(&app));
    assert!(screen.contains("classifying…"), "{screen}");
    // The next observation has its cause.
    feed(&mut app, &with_an_oom(last, OomState::Classified));
    insta::assert_snapshot!("oom_detail", frame(&app));
}

/// Inside a container, as a host daemon answered for its PID namespace: its processes
/// under its own PIDs, and under each GPU one line for the memory of processes outside it
/// (no row: nothing to select, kill or reclaim).
#[test]
fn container_view_with_the_others_line() {
    use std::collections::BTreeMap;

    use super::fixtures::{GIB, gpu, host, obs};
    use vramctl_observe::pid_view::{NamespaceView, OtherHolders, PidView};

    let mut app = live(80, 24);
    let mut o = (*obs(
        0,
        vec![
            gpu(0, 140 * GIB, 24 * GIB, &[(7, 3 * GIB)]),
            gpu(1, 140 * GIB, 16 * GIB, &[(9, 5 * GIB)]),
        ],
        vec![
            host(7, 1, "alice", "python train.py"),
            host(9, 1, "alice", "python eval.py"),
        ],
    ))
    .clone();
    o.pid_view = PidView::Mapped(NamespaceView {
        pid_namespace: 4_026_532_000,
        host_pids: BTreeMap::from([(7, 1007), (9, 1009)]),
        others: vec![
            OtherHolders {
                index: 0,
                uuid: o.snapshot.devices[0].info.uuid.clone(),
                processes: 2,
                used_bytes: Some(20 * GIB),
            },
            OtherHolders {
                index: 1,
                uuid: o.snapshot.devices[1].info.uuid.clone(),
                processes: 1,
                used_bytes: Some(11 * GIB),
            },
        ],
    });
    feed(&mut app, &[Arc::new(o)]);
    let pids: Vec<u32> = app.table.rows.iter().map(|r| r.key.pid).collect();
    assert_eq!(pids.len(), 2);
    assert!(pids.contains(&7) && pids.contains(&9), "{pids:?}");
    insta::assert_snapshot!("container_view_with_the_others_line", frame(&app));
}

/// Without a daemon, inside a container: NVML's PIDs as `host:PID`, and the kill and
/// reclaim keys refuse them (the number may be any process's in this namespace).
#[test]
fn host_pids_that_cannot_be_mapped_are_neither_killed_nor_reclaimed() {
    use super::fixtures::{GIB, gpu, obs};
    use vramctl_observe::pid_view::{PidView, Unmapped};

    let mut app = live(80, 24);
    let mut o = (*obs(
        0,
        vec![gpu(0, 140 * GIB, 4 * GIB, &[(4_100_123, 3 * GIB)])],
        vec![],
    ))
    .clone();
    o.pid_view = PidView::CannotMap(Unmapped::default());
    feed(&mut app, &[Arc::new(o)]);
    assert!(app.table.rows.iter().all(|r| r.flags.host_pid));
    for code in [KeyCode::Char('K'), KeyCode::Char('R'), KeyCode::Delete] {
        assert!(app.update(key(code)).is_empty(), "{code:?}");
        assert!(!app.kill.shown(), "{code:?} opened the kill dialog");
    }
    let screen = frame(&app);
    insta::assert_snapshot!("host_pids_cannot_map", screen);
}
