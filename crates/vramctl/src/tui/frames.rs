//! Whole frames, rendered with ratatui's `TestBackend` and snapshotted (insta): what a
//! person would see in each situation. States come from the example scenarios through the
//! real sampler on the fake NVML library (`fixtures::from_scenario`), with made-up /proc
//! facts so frames do not depend on the machine running them.

use std::sync::Arc;

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyEventState, KeyModifiers};
use ratatui::style::Color;

use super::app::{App, AppConfig, KillDialog, KillResult};
use super::event::Event;
use super::fixtures::from_scenario;
use super::kill::{KillOutcome, Killer, RecordingKiller};
use super::observe::Observation;
use super::replay::{MemoryReplay, seek_frame};
use super::verdict::{ProcessVerdict, VerdictKind};
use super::view;

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
    assert_eq!(app.rows.len(), 240);
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
        },
    );
    let mut app = live(120, 40);
    app.analysis = true;
    feed(&mut app, &observations);
    feed(&mut app, &[Arc::new(last)]);
    let leaker = app.rows.iter().position(|r| r.key.pid == 24177).unwrap();
    for _ in 0..leaker {
        app.update(key(KeyCode::Down));
    }
    app.update(key(KeyCode::Enter));
    assert_eq!(app.selected_row().unwrap().flags.text(), "L");
    insta::assert_snapshot!("leak_flagged", frame(&app));
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
        app.dialog,
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
    let frame_data = seek_frame(&recording, seek, app.zoom.span_ms(), 512).unwrap();
    app.update(Event::Replay(Box::new(frame_data)));
    assert_eq!(app.now_ms(), Some(t));
    insta::assert_snapshot!("replay_at_cursor", frame(&app));
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
