//! The search against simulated jobs: a closure from the value to what a trial would
//! measure. These numbers are simulation, not an H200; no constant of the search was
//! chosen on them (each is argued where it is defined), they only check it.

use super::*;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TOLERANCE: f64 = 0.02;

/// A simulated job: what a trial at a value would report.
struct Job {
    name: &'static str,
    low: u64,
    high: u64,
    margin: f64,
    trial: Box<dyn Fn(u64) -> Outcome>,
}

fn gpu(uuid: &str, capacity_bytes: u64, nvml: u64) -> DeviceMeasure {
    DeviceMeasure {
        uuid: uuid.to_owned(),
        capacity_bytes,
        nvml_peak_bytes: Some(nvml),
        reserved_peak_bytes: None,
        allocated_peak_bytes: None,
    }
}

/// Memory in bytes of `fixed + per_value·v`, OOM when over `capacity`, NVML only.
fn nvml_job(capacity: u64, memory: impl Fn(u64) -> u64 + 'static) -> Box<dyn Fn(u64) -> Outcome> {
    Box::new(move |v| {
        let need = memory(v);
        let seen = gpu("GPU-0", capacity, need.min(capacity));
        if need > capacity {
            Outcome::OutOfMemory(vec![seen])
        } else {
            Outcome::Succeeded(vec![seen])
        }
    })
}

/// The affine job: context 500 MiB + 6 GiB weights + 1.3 GiB per value.
fn affine(v: u64) -> u64 {
    500 * MIB + 6 * GIB + v * (13 * GIB / 10)
}

/// The same job with the agent: the allocator caches 20 % above what is allocated while it
/// has room, gives the cache back under pressure, and fails when allocated + 2 %
/// fragmentation + context no longer fits.
fn agent_job(capacity: u64, with_agent: bool) -> Box<dyn Fn(u64) -> Outcome> {
    Box::new(move |v| {
        let context = 500 * MIB;
        let allocated = 6 * GIB + v * (13 * GIB / 10);
        let needed = allocated + allocated / 50 + context;
        let reserved = (allocated + allocated / 5)
            .min(capacity - context)
            .max(allocated);
        let d = DeviceMeasure {
            uuid: "GPU-0".to_owned(),
            capacity_bytes: capacity,
            nvml_peak_bytes: Some(reserved + context),
            reserved_peak_bytes: with_agent.then_some(reserved),
            allocated_peak_bytes: with_agent.then_some(allocated),
        };
        if needed > capacity {
            Outcome::OutOfMemory(vec![d])
        } else {
            Outcome::Succeeded(vec![d])
        }
    })
}

/// ±3 % on the measured figure, fixed per value (a hash), the outcome unaffected.
fn noisy(v: u64) -> u64 {
    let h = v.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(17) % 601;
    let factor = 0.97 + (h as f64) / 10_000.0; // 0.97 ..= 1.03
    (affine(v) as f64 * factor) as u64
}

fn jobs() -> Vec<Job> {
    let cap = 140 * GIB;
    vec![
        Job {
            name: "affine",
            low: 1,
            high: 4096,
            margin: 0.0,
            trial: nvml_job(cap, affine),
        },
        Job {
            name: "affine+agent",
            low: 1,
            high: 4096,
            margin: 0.0,
            trial: agent_job(cap, true),
        },
        Job {
            name: "affine, cache, no agent",
            low: 1,
            high: 4096,
            margin: 0.0,
            trial: agent_job(cap, false),
        },
        Job {
            name: "affine margin 5%",
            low: 1,
            high: 4096,
            margin: 0.05,
            trial: nvml_job(cap, affine),
        },
        Job {
            name: "affine+agent margin 5%",
            low: 1,
            high: 4096,
            margin: 0.05,
            trial: agent_job(cap, true),
        },
        Job {
            name: "two GPUs 140+80 GiB",
            low: 1,
            high: 4096,
            margin: 0.0,
            trial: Box::new(|v| {
                let need = affine(v);
                let d = vec![
                    gpu("GPU-0", 140 * GIB, need.min(140 * GIB)),
                    gpu("GPU-1", 80 * GIB, need.min(80 * GIB)),
                ];
                if need > 80 * GIB {
                    Outcome::OutOfMemory(d)
                } else {
                    Outcome::Succeeded(d)
                }
            }),
        },
        Job {
            name: "quadratic (seq len)",
            low: 256,
            high: 65536,
            margin: 0.0,
            // 4.5 GiB + 8 MiB·s + 1 KiB·s²: attention materialised in s.
            trial: nvml_job(cap, |s| 4 * GIB + 512 * MIB + s * 8 * MIB + s * s * 1024),
        },
        Job {
            name: "noisy ±3%",
            low: 1,
            high: 4096,
            margin: 0.0,
            trial: Box::new(move |v| {
                let d = vec![gpu("GPU-0", cap, noisy(v).min(cap))];
                if affine(v) > cap {
                    Outcome::OutOfMemory(d)
                } else {
                    Outcome::Succeeded(d)
                }
            }),
        },
        Job {
            name: "flat, fits",
            low: 1,
            high: 4096,
            margin: 0.0,
            trial: nvml_job(cap, |_| 20 * GIB),
        },
        Job {
            name: "flat, hidden OOM at 700",
            low: 1,
            high: 4096,
            margin: 0.0,
            trial: Box::new(move |v| {
                let d = vec![gpu("GPU-0", cap, 20 * GIB + v * MIB)];
                if v > 700 {
                    Outcome::OutOfMemory(d)
                } else {
                    Outcome::Succeeded(d)
                }
            }),
        },
        Job {
            name: "OOM below prediction (60)",
            low: 1,
            high: 4096,
            margin: 0.0,
            trial: Box::new(move |v| {
                let d = vec![gpu("GPU-0", cap, affine(v).min(cap))];
                if v > 60 {
                    Outcome::OutOfMemory(d)
                } else {
                    Outcome::Succeeded(d)
                }
            }),
        },
        Job {
            name: "top of range fits",
            low: 1,
            high: 64,
            margin: 0.0,
            trial: nvml_job(cap, affine),
        },
        Job {
            name: "nothing fits",
            low: 1,
            high: 4096,
            margin: 0.0,
            trial: nvml_job(5 * GIB, affine),
        },
        Job {
            name: "low == high",
            low: 32,
            high: 32,
            margin: 0.0,
            trial: nvml_job(cap, affine),
        },
    ]
}

/// Whether `v` is ok for the job, by the search's own rule (a fresh search classifies it).
fn is_ok(job: &Job, v: u64) -> bool {
    let mut s = search(job, Strategy::Bisect, 0.0);
    s.record(v, (job.trial)(v));
    s.was_ok(v) == Some(true)
}

/// The largest ok value by scanning the whole range; `None` when `low` is not ok.
fn truth(job: &Job) -> Option<u64> {
    (job.low..=job.high).take_while(|&v| is_ok(job, v)).last()
}

fn search(job: &Job, strategy: Strategy, tolerance: f64) -> Search {
    Search::new(SearchSettings {
        low: job.low,
        high: job.high,
        margin: job.margin,
        tolerance,
        strategy,
    })
    .expect("valid settings")
}

/// Runs the search to its end, checking on every proposal that it is new, in range and
/// strictly inside the bracket. Returns the conclusion and the values tried.
fn drive(job: &Job, strategy: Strategy, tolerance: f64) -> (Conclusion, Vec<(u64, Reason)>) {
    let mut s = search(job, strategy, tolerance);
    let mut tried: Vec<(u64, Reason)> = Vec::new();
    for _ in 0..200 {
        let next = s.next();
        assert_eq!(next, s.next(), "{}: next() is not pure", job.name);
        match next {
            Next::Done(c) => {
                match c {
                    Conclusion::Found { value }
                    | Conclusion::Bounded { value, .. }
                    | Conclusion::TopOfRange { value } => {
                        assert!(
                            tried.iter().any(|t| t.0 == value),
                            "{}: {value} never tried",
                            job.name
                        );
                        assert_eq!(
                            s.was_ok(value),
                            Some(true),
                            "{}: {value} was not ok",
                            job.name
                        );
                    }
                    Conclusion::NothingFits => assert_eq!(s.was_ok(job.low), Some(false)),
                }
                if let Conclusion::TopOfRange { value } = c {
                    assert_eq!(value, job.high);
                }
                return (c, tried);
            }
            Next::Try { value, reason } => {
                assert!(
                    (job.low..=job.high).contains(&value),
                    "{}: {value} outside the range",
                    job.name
                );
                assert!(
                    tried.iter().all(|t| t.0 != value),
                    "{}: {value} proposed twice: {tried:?}",
                    job.name
                );
                let (ok, bad) = s.bracket();
                assert!(
                    ok.is_none_or(|o| value > o) && bad.is_none_or(|b| value < b),
                    "{}: {value} outside {ok:?}..{bad:?}",
                    job.name
                );
                tried.push((value, reason));
                s.record(value, (job.trial)(value));
            }
        }
    }
    panic!("{}: no conclusion after 200 trials: {tried:?}", job.name);
}

#[test]
fn every_strategy_answers_a_value_that_was_tried_and_fits() {
    for job in jobs() {
        let want = truth(&job);
        for (strategy, tol) in [
            (Strategy::Model, TOLERANCE),
            (Strategy::Bisect, TOLERANCE),
            (Strategy::Model, 0.0),
        ] {
            let (c, tried) = drive(&job, strategy, tol);
            let got = c.value();
            match (got, want) {
                (Some(g), Some(w)) => {
                    assert!(g <= w, "{} {strategy:?}: {g} above the truth {w}", job.name);
                    #[allow(clippy::cast_precision_loss)]
                    let within = (w - g) as f64 <= tol * w as f64 + 1e-9;
                    assert!(
                        within,
                        "{} {strategy:?}: {g} not within {tol} of {w}: {tried:?}",
                        job.name
                    );
                }
                (None, None) => {}
                _ => panic!(
                    "{} {strategy:?}: answered {got:?}, truth {want:?}",
                    job.name
                ),
            }
        }
    }
}

#[test]
fn bisect_is_exact() {
    for job in jobs() {
        let (c, _) = drive(&job, Strategy::Bisect, 0.0);
        assert_eq!(c.value(), truth(&job), "{}", job.name);
    }
}

#[test]
fn the_model_is_within_two_percent_in_four_trials_on_affine_jobs() {
    for job in jobs().into_iter().filter(|j| {
        // Jobs whose edge NVML's peak predicts. With the agent's figures the simulated
        // allocator gives its cache back at the edge, which the conservative figure does not
        // foresee (the model then gallops up: ResNet-50 on the H200 did the same, docs/fit.md).
        ["affine", "affine margin 5%", "two GPUs 140+80 GiB"].contains(&j.name)
    }) {
        let (c, tried) = drive(&job, Strategy::Model, TOLERANCE);
        assert!(
            tried.len() <= 4,
            "{}: {} trials: {tried:?}",
            job.name,
            tried.len()
        );
        let (got, want) = (c.value(), truth(&job));
        assert!(matches!(c, Conclusion::Found { .. }), "{}: {c:?}", job.name);
        #[allow(clippy::cast_precision_loss)]
        let within = got
            .zip(want)
            .is_some_and(|(g, w)| g <= w && (w - g) as f64 <= 0.02 * w as f64);
        assert!(within, "{}: {got:?} vs truth {want:?}", job.name);
    }
}

/// The table of the report: trials per job, model vs bisection (simulation, not an H200).
#[test]
fn trials_per_simulated_job() {
    let mut table = String::from(
        "job                       | truth | model 2%      | bisect 2%     | bisect exact\n",
    );
    for job in jobs() {
        let cell = |strategy, tol| {
            let (c, tried) = drive(&job, strategy, tol);
            let answer = c
                .value()
                .map_or_else(|| "none".to_owned(), |v| v.to_string());
            format!("{answer:>5} in {:>2}", tried.len())
        };
        table.push_str(&format!(
            "{:<25} | {:>5} | {:<13} | {:<13} | {}\n",
            job.name,
            truth(&job).map_or_else(|| "none".to_owned(), |v| v.to_string()),
            cell(Strategy::Model, TOLERANCE),
            cell(Strategy::Bisect, TOLERANCE),
            cell(Strategy::Bisect, 0.0),
        ));
    }
    insta::assert_snapshot!(table);
}

/// With the agent's figures the edge is still predicted from NVML's peak (the optimistic
/// fit is reported, not used): the simulated cache that comes back at the edge makes the
/// model aim low and gallop up, and the answer is still a value that fit.
#[test]
fn the_affine_agent_job_is_predicted_from_nvml_s_figure_and_gallops_up() {
    let job = jobs()
        .into_iter()
        .find(|j| j.name == "affine+agent")
        .expect("job");
    let (c, tried) = drive(&job, Strategy::Model, TOLERANCE);
    assert_eq!(tried[0], (8, Reason::Calibrate));
    assert_eq!(tried[2].1, Reason::Predicted);
    let got = c.value().expect("found");
    let want = truth(&job).expect("truth");
    assert!(
        got <= want && (want - got) as f64 <= 0.02 * want as f64,
        "{got} vs {want}"
    );
}
