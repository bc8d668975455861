//! The search replayed against the H200's recorded trials (testdata/h200/fit and
//! testdata/h200/round4/fit34): a trial at a value succeeds when the value is at most the
//! recorded truth, and measures each figure (NVML, reserved, allocated peak) interpolated
//! linearly between the recorded succeeded trials of that job (extrapolated from the two
//! nearest outside them). The trace predictor's edge is the one it printed on the H200
//! (`predictor.trace.value`), given to the search after the second calibration as the
//! trial loop does; the 2026-12-02 GPT-2 run had no traces (the line is used).
//!
//! "Before" replays without the allocated peaks (so no allocated bound: the search of
//! 2026-12-05, which reproduces that day's trial values), "after" with them.
//!
//! ResNet-50's run of 2026-12-05 is the **tuning case** of the allocated bound (its
//! six-trial search is what the rule was built for); the others were replayed as
//! regression checks after the rule was written. The held-out check was ConvNeXt-T and
//! ViT-B/16 on an H100 (testdata/h100/round5, 2026-12-05 evening): 5 and 6 trials. They
//! are replayed here from then on, as tuning data for the next rule, not evidence for it.

use super::*;

/// One recorded trial's figures.
#[derive(Debug, Clone, Copy)]
struct Figures {
    value: u64,
    nvml: f64,
    reserved: f64,
    allocated: f64,
    capacity: u64,
}

#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    truth: u64,
    /// The trace predictor's edge on the H200; `None`: no traces (the line).
    trace_prediction: Option<u64>,
    low: u64,
    high: u64,
    /// The recorded runs' JSON reports (their succeeded trials give the figures).
    reports: &'static [&'static str],
    /// Trials `fit` made on the H200 with the same search (2026-12-05), if it ran there.
    h200_trials: Option<usize>,
    /// Where the search with the allocated bound takes more than four trials today: how
    /// many (an open miss of issue 34, docs/fit.md "Held out on the H100").
    over_four: Option<usize>,
}

const RESNET_FIT: &str = include_str!("../../../../testdata/h200/round4/fit34/resnet-fit.json");
const RESNET_BISECT: &str = include_str!("../../../../testdata/h200/fit/resnet-bisect.json");
const LLAMA_FIT: &str = include_str!("../../../../testdata/h200/round4/fit34/llama-fit.json");
const LLAMA_FIT_1202: &str = include_str!("../../../../testdata/h200/fit/llama-fit.json");
const CKPT_FIT: &str = include_str!("../../../../testdata/h200/round4/fit34/llama-ckpt-fit.json");
const CKPT_FIT_1202: &str = include_str!("../../../../testdata/h200/fit/llama-ckpt-fit.json");
const SEQ_FIT: &str = include_str!("../../../../testdata/h200/round4/fit34/gpt2-seq-fit.json");
const SEQ_BISECT: &str =
    include_str!("../../../../testdata/h200/round4/fit34/gpt2-seq-bisect.json");
const GPT2_FIT: &str = include_str!("../../../../testdata/h200/fit/gpt2-fit.json");
const CONVNEXT_FIT: &str =
    include_str!("../../../../testdata/h100/round5/fit34-heldout/convnext-fit.json");
const CONVNEXT_BISECT: &str =
    include_str!("../../../../testdata/h100/round5/fit34-heldout/convnext-bisect.json");
const VIT_FIT: &str = include_str!("../../../../testdata/h100/round5/fit34-heldout/vit-fit.json");
const VIT_BISECT: &str =
    include_str!("../../../../testdata/h100/round5/fit34-heldout/vit-bisect.json");

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "resnet (tuning)",
            truth: 3296,
            trace_prediction: Some(3212),
            low: 1,
            high: 4096,
            reports: &[RESNET_FIT, RESNET_BISECT],
            h200_trials: Some(6),
            over_four: None,
        },
        Case {
            name: "llama",
            truth: 22,
            trace_prediction: Some(22),
            low: 1,
            high: 4096,
            reports: &[LLAMA_FIT, LLAMA_FIT_1202],
            h200_trials: Some(4),
            over_four: None,
        },
        Case {
            name: "llama-ckpt",
            truth: 94,
            trace_prediction: Some(94),
            low: 1,
            high: 4096,
            reports: &[CKPT_FIT, CKPT_FIT_1202],
            h200_trials: Some(4),
            over_four: None,
        },
        Case {
            name: "gpt2-seq",
            truth: 81,
            trace_prediction: Some(81),
            low: 8,
            high: 1024,
            reports: &[SEQ_FIT, SEQ_BISECT],
            h200_trials: Some(4),
            over_four: None,
        },
        Case {
            name: "convnext (H100)",
            truth: 1350,
            trace_prediction: Some(1284),
            low: 1,
            high: 4096,
            reports: &[CONVNEXT_FIT, CONVNEXT_BISECT],
            h200_trials: None,
            over_four: Some(5),
        },
        // The same figures with the prediction today's predictor makes from the recorded
        // calibration traces (the backward aligned: fit_trace.rs, `h100_traces`).
        Case {
            name: "convnext (aligned)",
            truth: 1350,
            trace_prediction: Some(1351),
            low: 1,
            high: 4096,
            reports: &[CONVNEXT_FIT, CONVNEXT_BISECT],
            h200_trials: None,
            over_four: None,
        },
        Case {
            name: "vit (H100)",
            truth: 1175,
            trace_prediction: Some(1125),
            low: 1,
            high: 4096,
            reports: &[VIT_FIT, VIT_BISECT],
            h200_trials: None,
            over_four: Some(6),
        },
        Case {
            name: "gpt2 (line)",
            truth: 95,
            trace_prediction: None,
            low: 1,
            high: 4096,
            reports: &[GPT2_FIT],
            h200_trials: None,
            over_four: None,
        },
    ]
}

fn figures(case: &Case) -> Vec<Figures> {
    let mut out: Vec<Figures> = Vec::new();
    for report in case.reports {
        let json: serde_json::Value = serde_json::from_str(report).expect("a recorded report");
        for t in json["trials"].as_array().expect("trials") {
            if t["outcome"] != "succeeded" {
                continue;
            }
            let num = |k: &str| t[k].as_f64().expect("a recorded figure");
            let value = t["value"].as_u64().expect("value");
            if out.iter().any(|f| f.value == value) {
                continue;
            }
            out.push(Figures {
                value,
                nvml: num("peak_nvml_bytes"),
                reserved: num("peak_reserved_bytes"),
                allocated: num("peak_allocated_bytes"),
                capacity: t["capacity_bytes"].as_u64().expect("capacity"),
            });
        }
    }
    out.sort_by_key(|f| f.value);
    assert!(out.len() >= 2, "{}: two succeeded trials", case.name);
    out
}

/// The figures at `v`: linear between the recorded values around it.
fn at(points: &[Figures], v: u64) -> Figures {
    let i = points
        .windows(2)
        .position(|w| v <= w[1].value)
        .unwrap_or(points.len() - 2);
    let (a, b) = (points[i], points[i + 1]);
    #[allow(clippy::cast_precision_loss)]
    let t = (v as f64 - a.value as f64) / (b.value as f64 - a.value as f64);
    let lerp = |x: f64, y: f64| x + t * (y - x);
    Figures {
        value: v,
        nvml: lerp(a.nvml, b.nvml),
        reserved: lerp(a.reserved, b.reserved),
        allocated: lerp(a.allocated, b.allocated),
        capacity: b.capacity,
    }
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn trial(case: &Case, points: &[Figures], v: u64, agent_allocated: bool) -> Outcome {
    let f = at(points, v);
    let cap = f.capacity as f64;
    let d = DeviceMeasure {
        uuid: "GPU-h200".to_owned(),
        capacity_bytes: f.capacity,
        nvml_peak_bytes: Some(f.nvml.min(cap) as u64),
        reserved_peak_bytes: Some(f.reserved.min(cap) as u64),
        allocated_peak_bytes: agent_allocated.then_some(f.allocated.min(cap) as u64),
    };
    if v <= case.truth {
        Outcome::Succeeded(vec![d])
    } else {
        Outcome::OutOfMemory(vec![d])
    }
}

/// A fresh search over `case`'s range as `vramctl fit` sets it up (2 % tolerance, no margin).
fn search_for(case: &Case) -> Search {
    Search::new(SearchSettings {
        low: case.low,
        high: case.high,
        margin: 0.0,
        tolerance: 0.02,
        strategy: Strategy::Model,
    })
    .expect("settings")
}

/// Runs the search as the trial loop would; the conclusion and the values tried.
fn replay(case: &Case, agent_allocated: bool) -> (Conclusion, Vec<(u64, Reason)>) {
    let points = figures(case);
    let mut s = search_for(case);
    let mut tried = Vec::new();
    for _ in 0..40 {
        match s.next() {
            Next::Done(c) => return (c, tried),
            Next::Try { value, reason } => {
                tried.push((value, reason));
                s.record(value, trial(case, &points, value, agent_allocated));
                if let Some(p) = case.trace_prediction {
                    let succeeded = tried.iter().filter(|t| s.was_ok(t.0) == Some(true)).count();
                    if tried.len() == 1 && succeeded == 1 {
                        s.set_traced_calibration();
                    }
                    if tried.len() == 2 && succeeded == 2 {
                        s.set_trace_prediction(p);
                    }
                }
            }
        }
    }
    panic!("{}: no conclusion in 40 trials: {tried:?}", case.name);
}

#[test]
fn without_the_allocated_figure_the_replay_makes_the_h200_s_trials() {
    // The seam is faithful: the search of 2026-12-05 on these figures tries what it tried.
    let resnet = &cases()[0];
    let (c, tried) = replay(resnet, false);
    let values: Vec<u64> = tried.iter().map(|t| t.0).collect();
    assert_eq!(values, [8, 53, 3179, 3243, 3371, 3307]);
    assert_eq!(c.value(), Some(3243));
    for case in cases() {
        if let Some(n) = case.h200_trials {
            assert_eq!(replay(&case, false).1.len(), n, "{}", case.name);
        }
    }
}

#[test]
fn with_the_allocated_bound_every_recorded_fit_is_within_two_percent_in_four_trials() {
    for case in cases() {
        let (c, tried) = replay(&case, true);
        let got = c.value().expect("an answer");
        assert!(
            got <= case.truth,
            "{}: {got} above {}",
            case.name,
            case.truth
        );
        #[allow(clippy::cast_precision_loss)]
        let within = (case.truth - got) as f64 <= 0.02 * case.truth as f64;
        assert!(within, "{}: {got} vs {}: {tried:?}", case.name, case.truth);
        match case.over_four {
            None => assert!(tried.len() <= 4, "{}: {tried:?}", case.name),
            Some(n) => assert_eq!(tried.len(), n, "{}: {tried:?}", case.name),
        }
        // Once a trial near the edge (within 10 % of it) succeeded, the bound never fell
        // below the truth on any recorded job (before, see the next test).
        let points = figures(&case);
        let mut s = search_for(&case);
        for &(v, _) in &tried {
            s.record(v, trial(&case, &points, v, true));
            let near = tried
                .iter()
                .any(|&(w, _)| s.was_ok(w) == Some(true) && 10 * w >= 9 * case.truth);
            if let Some(u) = s.allocated_bound().filter(|_| near) {
                assert!(u >= case.truth, "{}: bound {u} < truth", case.name);
            }
        }
    }
}

/// The allocated bound from two recorded trials alone (`b` the larger), at `b`'s capacity.
fn pair_bound(a: &Figures, b: &Figures) -> Option<u64> {
    let pts: Vec<bound::Point> = [a, b]
        .iter()
        .map(|f| {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            bound::Point {
                value: f.value,
                allocated_bytes: f.allocated as u64,
                outside_pool_bytes: (f.nvml - f.reserved).max(0.0) as u64,
            }
        })
        .collect();
    bound::device_bound(&pts, b.capacity)
}

/// Every recorded figure, every pair: the bound from two succeeded trials of a job is at or
/// above the truth when the larger lies within 10 % of it. From two calibration trials far
/// below the edge it is not always: ConvNeXt-T's and ViT-B/16's allocated peaks grow
/// slightly less per image at a thousand images than at ten (the per-batch part is shared),
/// and their calibration pairs bound the edge 1.2 % and 1.5 % too low (1334 for 1350, 1157
/// for 1175, H100). Such a bound places a trial (`settling_aim`); it stops the search only
/// once a succeeded trial lies within the tolerance below it, i.e. near the edge, where
/// the bound is recomputed through that trial. ConvNeXt-T's third trial went to 1282
/// instead of about 1301 because of it, and took a fifth trial. Pinned: never more than
/// 2 % low.
#[test]
fn the_allocated_bound_of_two_recorded_trials_is_at_or_above_the_truth_from_near_the_edge() {
    let mut low = Vec::new();
    for case in cases() {
        let points = figures(&case);
        for (i, a) in points.iter().enumerate() {
            for b in &points[i + 1..] {
                let Some(u) = pair_bound(a, b) else { continue };
                if 10 * b.value >= 9 * case.truth {
                    assert!(
                        u >= case.truth,
                        "{}: {} and {} bound {u}",
                        case.name,
                        a.value,
                        b.value
                    );
                } else if u < case.truth {
                    assert!(
                        50 * u >= 49 * case.truth,
                        "{}: {} and {} bound {u}",
                        case.name,
                        a.value,
                        b.value
                    );
                    low.push(format!("{} {}+{} {u}", case.name, a.value, b.value));
                }
            }
        }
    }
    assert_eq!(
        low,
        [
            "convnext (H100) 8+37 1334",
            "convnext (aligned) 8+37 1334",
            "vit (H100) 8+30 1157"
        ]
    );
}

/// The replay with the allocated figure makes the trials fit made on the H100 (2026-12-05):
/// the seam is faithful with the bound too. ViT's sixth, 1193, succeeded there although the
/// bisection saw 1176 and 1184 fail (its edge is not the same from run to run); the replay
/// calls it a failure.
#[test]
fn with_the_allocated_figure_the_replay_makes_the_h100_s_trials() {
    for (name, expected) in [
        ("convnext (H100)", &[8_u64, 37, 1282, 1308, 1330][..]),
        ("vit (H100)", &[8, 30, 1113, 1136, 1169, 1193][..]),
    ] {
        let case = cases().into_iter().find(|c| c.name == name).expect("case");
        let values: Vec<u64> = replay(&case, true).1.iter().map(|t| t.0).collect();
        assert_eq!(values, expected, "{name}");
    }
}

/// The table for docs/fit.md: trials per recorded job, before and after the bound.
#[test]
fn trials_per_recorded_h200_job() {
    let mut table = String::from(
        "job             | truth | before (values)                        | after (values)\n",
    );
    for case in cases() {
        let cell = |agent| {
            let (c, tried) = replay(&case, agent);
            let values: Vec<String> = tried.iter().map(|t| t.0.to_string()).collect();
            let kind = match c {
                Conclusion::Bounded { bound, .. } => format!(" bound {bound}"),
                _ => String::new(),
            };
            format!(
                "{} in {} ({}){kind}",
                c.value()
                    .map_or_else(|| "none".to_owned(), |v| v.to_string()),
                tried.len(),
                values.join(" ")
            )
        };
        table.push_str(&format!(
            "{:<15} | {:>5} | {:<38} | {}\n",
            case.name,
            case.truth,
            cell(false),
            cell(true)
        ));
    }
    insta::assert_snapshot!(table);
}

/// Where a job's synthetic edges lie: from 5 % below the prediction the search aims from
/// (the trace predictor's edge; without traces, the line's after the two calibrations) up
/// to the allocated bound after them (with no bound, 5 % above the prediction), less the
/// edges the figures themselves rule out. The
/// calibration trials succeed for every edge in it, so both figures are those of every
/// replay in the sweep.
fn sweep_edges(case: &Case) -> std::ops::RangeInclusive<u64> {
    let points = figures(case);
    let mut s = search_for(case);
    for _ in 0..2 {
        let Next::Try { value, .. } = s.next() else {
            panic!("{}: a calibration trial", case.name);
        };
        if case.trace_prediction.is_some() {
            s.set_traced_calibration();
        }
        s.record(value, trial(case, &points, value, true));
    }
    let prediction = case
        .trace_prediction
        .or_else(|| s.model().and_then(|m| m.prediction))
        .expect("a prediction");
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let (from, above) = (
        (prediction as f64 * 0.95).floor() as u64,
        (prediction as f64 * 1.05).ceil() as u64,
    );
    // An edge its own figures rule out (their allocated peak + outside-the-pool memory over
    // the capacity: the bound through the trials just under it falls below it) cannot be a
    // job's: the top is the largest edge still consistent with them.
    let consistent = |t: u64| {
        let pts: Vec<bound::Point> = [t - 1, t]
            .iter()
            .map(|&v| {
                let Outcome::Succeeded(d) = trial(&Case { truth: t, ..*case }, &points, v, true)
                else {
                    unreachable!("at or below the truth")
                };
                bound::Point::of(v, &d[0]).expect("all three figures")
            })
            .collect();
        bound::device_bound(&pts, at(&points, t).capacity).is_none_or(|u| u >= t)
    };
    // Nor can an edge above the bound of two recorded trials (measured, not interpolated).
    let recorded_bound = points
        .iter()
        .enumerate()
        .flat_map(|(i, a)| points[i + 1..].iter().map(move |b| (a, b)))
        .filter_map(|(a, b)| pair_bound(a, b))
        .min();
    let mut top = s
        .allocated_bound()
        .unwrap_or(above)
        .min(recorded_bound.unwrap_or(u64::MAX));
    while top > from && !consistent(top) {
        top -= 1;
    }
    from..=top
}

/// The rule is not tied to the recorded edges: with each recorded job's figures and its
/// edge moved anywhere from 5 % below the prediction up to the allocated bound, the answer
/// is a value that fit, within 2 %, and the trials it takes are counted (with the bound,
/// and without the allocated figure). These are synthetic edges on recorded figures: the
/// rule for a miss was chosen on them (docs/fit.md), so they are tuning data, not evidence.
#[test]
fn every_recorded_job_s_figures_with_any_edge_up_to_the_bound_stay_within_two_percent() {
    let mut table = String::from(
        "job             | edges     | trials: edges (with the bound) | without the allocated figure\n",
    );
    for base in cases() {
        let edges = sweep_edges(&base);
        // Trials → how many edges took that many.
        let mut counts = std::collections::BTreeMap::<usize, u64>::new();
        let mut before = std::collections::BTreeMap::<usize, u64>::new();
        for truth in edges.clone() {
            let case = Case { truth, ..base };
            for (agent, tally) in [(true, &mut counts), (false, &mut before)] {
                let (c, tried) = replay(&case, agent);
                let got = c.value().expect("an answer");
                #[allow(clippy::cast_precision_loss)]
                let within = got <= truth && (truth - got) as f64 <= 0.02 * truth as f64;
                assert!(within, "{} edge {truth}: {got}: {tried:?}", case.name);
                *tally.entry(tried.len()).or_default() += 1;
            }
        }
        let show = |m: &std::collections::BTreeMap<usize, u64>| {
            m.iter()
                .map(|(t, n)| format!("{t}: {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        table.push_str(&format!(
            "{:<15} | {:<9} | {:<30} | {}\n",
            base.name,
            format!("{}-{}", edges.start(), edges.end()),
            show(&counts),
            show(&before)
        ));
    }
    insta::assert_snapshot!(table);
}
