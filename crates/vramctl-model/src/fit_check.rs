//! The inverse questions people bring to a GPU of known capacity, each answered with the
//! margin it leaves: does the job fit, the largest batch (for generation: the most
//! concurrent sequences), the longest sequence (context) at the job's batch, and the most
//! precise weight format that fits (`estimate --gpu`).
//!
//! Every answer is the forward model ([`memory_model::estimate`]) searched, never a second
//! model: a value is reported only when the estimate at that value is within the capacity,
//! and the margin is the capacity less that estimate.

use serde::Serialize;

#[cfg(test)]
use crate::memory_model::LoraTargets;
use crate::memory_model::{self, Job, Lora, Mode, Precision, Quant};
use crate::model::{Model, SourceKind};

/// The share of the capacity the inverse answers keep free for the model's own error: a
/// value is answered only when its estimate leaves at least this much. The held-out jobs of
/// issue 34 were within 10 % (generation −6.1 % at worst, before its allocator was
/// replayed), and an answer above the truth is an OOM (estimate34 on the H200: 192 GPT-2
/// sequences answered with 5.7 MB to spare, and they did not fit).
pub const SAFETY_FRACTION: f64 = 0.05;

/// The bytes [`SAFETY_FRACTION`] keeps of `capacity_bytes`.
pub fn safety_margin_bytes(capacity_bytes: u64) -> u64 {
    (capacity_bytes as f64 * SAFETY_FRACTION).ceil() as u64
}

/// A value the job can go to, and what it leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Fitted {
    /// The batch, sequence length, ... found.
    pub value: u64,
    /// The estimate at that value.
    pub total_bytes: u64,
    /// Capacity − estimate at that value.
    pub margin_bytes: u64,
}

/// A weight format of the job: the precision its weights are held in and, for generation,
/// the weight quantization (for LoRA, the frozen base's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WeightFormat {
    pub precision: Precision,
    /// `--quant` for generation, `--quant-base` for LoRA; `None` otherwise.
    pub quant: Option<Quant>,
}

/// The most precise weight format that fits, found on the job's ladder from its own format
/// down ([`ladder`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WeightsFit {
    #[serde(flatten)]
    pub format: WeightFormat,
    /// Whether it differs from the job as given (false: the job fits as it is).
    pub changed: bool,
    pub total_bytes: u64,
    pub margin_bytes: u64,
}

/// Does the job fit `capacity_bytes`, and what would.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FitCheck {
    pub capacity_bytes: u64,
    /// What the inverse answers keep free for the model's error ([`SAFETY_FRACTION`]): each
    /// answer's margin is at least this.
    pub safety_margin_bytes: u64,
    pub fits: bool,
    /// Capacity − the job's estimate: negative when it does not fit (by that much).
    pub margin_bytes: i64,
    /// The largest batch at the job's sequence; for generation, the most concurrent
    /// sequences. `None` when not even 1 fits.
    pub largest_batch: Option<Fitted>,
    /// The longest sequence (prompt, for generation) at the job's batch. `None` when not
    /// even one token fits.
    pub largest_seq: Option<Fitted>,
    /// The most precise weight format that fits at the job's batch and sequence; `None` when
    /// none on the ladder does, or the weights are a GGUF file's, loaded as stored.
    pub weights: Option<WeightsFit>,
}

/// The answers for `job` on `model` in `capacity_bytes`.
pub fn check(model: &Model, job: &Job, capacity_bytes: u64) -> FitCheck {
    let total = memory_model::estimate(model, job).total_bytes;
    let at = |job: &Job, value: u64| {
        let total_bytes = memory_model::estimate(model, job).total_bytes;
        Fitted {
            value,
            total_bytes,
            margin_bytes: capacity_bytes.saturating_sub(total_bytes),
        }
    };
    let safety_margin_bytes = safety_margin_bytes(capacity_bytes);
    let answer_bytes = capacity_bytes - safety_margin_bytes;
    let largest_batch = memory_model::largest_batch(model, job, answer_bytes).map(|batch| {
        at(
            &Job {
                batch,
                ..job.clone()
            },
            batch,
        )
    });
    let largest_seq = memory_model::largest_seq(model, job, answer_bytes)
        .map(|seq| at(&Job { seq, ..job.clone() }, seq));
    let weights = if model.source == SourceKind::Gguf && job.quant.is_none() {
        // A GGUF file is loaded as stored: its format is the file's, not a choice.
        None
    } else {
        let own = format_of(job);
        ladder(job).into_iter().find_map(|format| {
            let candidate = with_format(job, format);
            let total_bytes = memory_model::estimate(model, &candidate).total_bytes;
            (total_bytes <= answer_bytes).then(|| WeightsFit {
                format,
                changed: format != own,
                total_bytes,
                margin_bytes: capacity_bytes - total_bytes,
            })
        })
    };
    FitCheck {
        capacity_bytes,
        safety_margin_bytes,
        fits: total <= capacity_bytes,
        margin_bytes: i64::try_from(capacity_bytes)
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(total).unwrap_or(i64::MAX)),
        largest_batch,
        largest_seq,
        weights,
    }
}

/// The job's own weight format.
fn format_of(job: &Job) -> WeightFormat {
    WeightFormat {
        precision: job.precision,
        quant: match (job.mode, job.lora) {
            (_, Some(lora)) => lora.quant_base,
            (Mode::Infer, None) => job.quant,
            (Mode::Train, None) => None,
        },
    }
}

/// `job` with its weights in `format`.
fn with_format(job: &Job, format: WeightFormat) -> Job {
    let mut out = job.clone();
    out.precision = format.precision;
    match (job.mode, job.lora) {
        (_, Some(lora)) => {
            out.lora = Some(Lora {
                quant_base: format.quant,
                ..lora
            });
        }
        (Mode::Infer, None) => out.quant = format.quant,
        (Mode::Train, None) => {}
    }
    out
}

/// The formats tried, from the job's own down to the lightest, each lighter than the one
/// before; formats heavier than the job's own are never offered.
///
/// - Full training: fp32 → amp-bf16 (fp32 master weights, bf16 activations) → bf16.
///   (fp16 variants hold the same bytes as their bf16 twins and are not listed.)
/// - LoRA: the frozen base in the job's 16-bit dtype → int8 → int4 (QLoRA's NF4).
/// - Generation: fp32 → the 16-bit dtype → int8 → int4 weights (fp8 holds as int8).
pub fn ladder(job: &Job) -> Vec<WeightFormat> {
    let own = format_of(job);
    let sixteen = match job.precision {
        Precision::Fp16 | Precision::AmpFp16 => Precision::Fp16,
        _ => Precision::Bf16,
    };
    let formats: Vec<WeightFormat> = match (job.mode, job.lora) {
        (Mode::Train, None) => {
            let amp = if sixteen == Precision::Fp16 {
                Precision::AmpFp16
            } else {
                Precision::AmpBf16
            };
            [Precision::Fp32, amp, sixteen]
                .into_iter()
                .map(|precision| WeightFormat {
                    precision,
                    quant: None,
                })
                .collect()
        }
        (Mode::Train, Some(_)) => [None, Some(Quant::Int8), Some(Quant::Int4)]
            .into_iter()
            .map(|quant| WeightFormat {
                precision: job.precision,
                quant,
            })
            .collect(),
        (Mode::Infer, _) => {
            let mut v = vec![WeightFormat {
                precision: Precision::Fp32,
                quant: None,
            }];
            v.extend(
                [None, Some(Quant::Int8), Some(Quant::Int4)]
                    .into_iter()
                    .map(|quant| WeightFormat {
                        precision: sixteen,
                        quant,
                    }),
            );
            v
        }
    };
    // Start at the job's own format; a format off the ladder (fp8 weights, an fp16 job
    // asked as amp) starts at the first lighter rung by bytes.
    match formats.iter().position(|f| *f == own) {
        Some(i) => formats[i..].to_vec(),
        None => {
            let own_bytes = weight_bytes_per_param(own);
            let mut out = vec![own];
            out.extend(
                formats
                    .into_iter()
                    .filter(|f| weight_bytes_per_param(*f) < own_bytes),
            );
            out
        }
    }
}

/// Bytes per block-linear weight of a format, for ordering the ladder only.
fn weight_bytes_per_param(format: WeightFormat) -> f64 {
    match format.quant {
        Some(Quant::Int4) => 0.5,
        Some(Quant::Int8 | Quant::Fp8) => 1.0,
        None => format.precision.param_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Family;
    use crate::memory_model::default_job;

    const GIB: u64 = 1 << 30;

    #[test]
    fn every_answer_fits_and_the_next_step_does_not() {
        let model = Model::synthesized(8_000_000_000, Family::Llama);
        let job = Job {
            batch: 8,
            seq: 4096,
            generated: 512,
            ..default_job(Mode::Infer)
        };
        let capacity = 40 * GIB;
        let c = check(&model, &job, capacity);
        // Every answer keeps 5 % of the capacity for the model's error: the values are
        // searched within the rest.
        assert_eq!(c.safety_margin_bytes, 2 * GIB);
        let room = capacity - c.safety_margin_bytes;
        let total = |j: &Job| memory_model::estimate(&model, j).total_bytes;
        let b = c.largest_batch.expect("a batch fits");
        assert_eq!(
            b.total_bytes,
            total(&Job {
                batch: b.value,
                ..job.clone()
            })
        );
        assert_eq!(b.margin_bytes, capacity - b.total_bytes);
        assert!(b.margin_bytes >= c.safety_margin_bytes);
        assert!(
            total(&Job {
                batch: b.value + 1,
                ..job.clone()
            }) > room
        );
        let s = c.largest_seq.expect("a sequence fits");
        assert!(s.total_bytes <= room);
        assert!(
            total(&Job {
                seq: s.value + 1,
                ..job.clone()
            }) > room
        );
        assert_eq!(c.fits, total(&job) <= capacity);
        assert_eq!(
            c.margin_bytes,
            i64::try_from(capacity).unwrap() - i64::try_from(total(&job)).unwrap()
        );
    }

    #[test]
    fn the_weights_answer_is_the_most_precise_that_fits() {
        let model = Model::synthesized(8_000_000_000, Family::Llama);
        let job = Job {
            batch: 1,
            seq: 2048,
            ..default_job(Mode::Infer)
        };
        let bf16 = memory_model::estimate(&model, &job).total_bytes;
        let int8 = memory_model::estimate(
            &model,
            &Job {
                quant: Some(Quant::Int8),
                ..job.clone()
            },
        )
        .total_bytes;
        let int4 = memory_model::estimate(
            &model,
            &Job {
                quant: Some(Quant::Int4),
                ..job.clone()
            },
        )
        .total_bytes;
        assert!(int4 < int8 && int8 < bf16);
        // The capacity at which `total` leaves exactly the 5 % kept for the model's error.
        let at = |total: u64| (total as f64 / (1.0 - SAFETY_FRACTION)).ceil() as u64 + 1;
        // Fits as given, with the margin kept: no change.
        let w = check(&model, &job, at(bf16)).weights.unwrap();
        assert!(!w.changed);
        assert!(w.margin_bytes >= safety_margin_bytes(at(bf16)));
        // Without that margin for bf16: int8, not int4.
        let w = check(&model, &job, bf16).weights.unwrap();
        assert_eq!(w.format.quant, Some(Quant::Int8));
        assert!(w.changed);
        assert_eq!(w.margin_bytes, bf16 - int8);
        // Between int4 and int8 (with the margin): int4.
        let w = check(&model, &job, at(int8) - 2).weights.unwrap();
        assert_eq!(w.format.quant, Some(Quant::Int4));
        // Below int4 with its margin: nothing on the ladder.
        assert_eq!(check(&model, &job, int4).weights, None);
    }

    #[test]
    fn the_ladder_never_offers_a_heavier_format_than_the_jobs() {
        let train = Job {
            precision: Precision::AmpBf16,
            ..default_job(Mode::Train)
        };
        let l = ladder(&train);
        assert_eq!(l[0].precision, Precision::AmpBf16);
        assert!(!l.iter().any(|f| f.precision == Precision::Fp32));
        let quantized = Job {
            quant: Some(Quant::Int8),
            ..default_job(Mode::Infer)
        };
        let l = ladder(&quantized);
        assert_eq!(l.first().and_then(|f| f.quant), Some(Quant::Int8));
        assert!(l.iter().all(|f| f.quant.is_some()));
        let fp8 = Job {
            quant: Some(Quant::Fp8),
            ..default_job(Mode::Infer)
        };
        let l = ladder(&fp8);
        assert_eq!(l[0].quant, Some(Quant::Fp8));
        assert_eq!(
            l[1..].iter().map(|f| f.quant).collect::<Vec<_>>(),
            vec![Some(Quant::Int4)]
        );
        let lora = Job {
            precision: Precision::Bf16,
            lora: Some(Lora {
                rank: 16,
                quant_base: None,
                targets: LoraTargets::QV,
                dropout: false,
            }),
            ..default_job(Mode::Train)
        };
        assert_eq!(
            ladder(&lora).iter().map(|f| f.quant).collect::<Vec<_>>(),
            vec![None, Some(Quant::Int8), Some(Quant::Int4)]
        );
    }
}
