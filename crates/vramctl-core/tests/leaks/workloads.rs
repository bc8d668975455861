//! Scores on the synthetic workloads and the H200 fixture.

use vramctl_core::analysis::{LeakConfig, Verdict};

use super::labeled::{Class, evaluate, render, score};
use super::readers::read_fixture;
use super::synth;

fn cfg() -> LeakConfig {
    LeakConfig {
        idle_for: std::time::Duration::from_secs(60),
        ..LeakConfig::default()
    }
}

#[test]
fn synthetic_workloads() {
    let mut outcomes = Vec::new();
    for trace in synth::workloads(300, 1) {
        outcomes.extend(evaluate(&trace, &cfg()));
    }
    println!("{}", render(&outcomes));
    for o in &outcomes {
        println!(
            "{} {:?}",
            o.role,
            o.changes
                .iter()
                .map(|c| ((c.0 - synth::T0) as f64 / 1000.0, c.1))
                .collect::<Vec<_>>()
        );
    }
    let s = score(&outcomes);
    assert_eq!(s.recall, 1.0, "every leak found");
    assert_eq!(s.false_alarms, 0, "no false alarm");
}

#[test]
fn h200_fixture() {
    let json = include_str!("../data/h200/trace-hold-leak-steady.json");
    let labels = include_str!("../data/h200/trace-hold-leak-steady.labels.jsonl");
    let trace = read_fixture(json, labels, synth::T0).unwrap();
    let outcomes = evaluate(&trace, &cfg());
    println!("{}", render(&outcomes));
    for o in &outcomes {
        println!(
            "{} {:?}",
            o.role,
            o.changes
                .iter()
                .map(|c| ((c.0 - synth::T0) as f64 / 1000.0, c.1))
                .collect::<Vec<_>>()
        );
    }
    let by_role = |r: &str| outcomes.iter().find(|o| o.role == r).unwrap();
    assert_eq!(by_role("leak").class, Class::Found);
    assert_eq!(by_role("steady").final_verdict, Some(Verdict::Stable));
    assert_eq!(by_role("hold").final_verdict, Some(Verdict::Stable));
}

#[test]
#[ignore = "debug print"]
fn print_dyn() {
    let t = synth::dyn_shapes(300, 4);
    let mut last = 0;
    for s in &t.series[0].samples {
        if s.bytes != last {
            println!(
                "{:.1} {}",
                (s.t_unix_ms - synth::T0) as f64 / 1000.0,
                s.bytes / 1048576
            );
            last = s.bytes;
        }
    }
}
