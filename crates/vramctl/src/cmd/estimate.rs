//! `vramctl estimate`: a thin shell over `vramctl_model` — the flags into a `Model` and a
//! `Job`, the estimate and the largest batch out, as a table or JSON, and the exit code.

use anyhow::Context;
use serde::Serialize;
use vramctl_model::fit_check::{self, FitCheck, WeightsFit};
use vramctl_model::memory_model::{
    self, Attention, Estimate, Job, Lora, LoraTargets, Mode, Optimizer, Precision, Quant, Sharding,
};
use vramctl_model::{Dtype, Model};

use crate::cli::{
    EstimateArgs, EstimateAttention, EstimateBaseQuant, EstimateKvDtype, EstimateLoraTargets,
    EstimateOptimizer, EstimatePrecision, EstimateQuant, GlobalArgs, GpuTarget,
};
use crate::exit::Exit;
use crate::output::emit::{Format, Lines, emit};
use crate::output::table::{Align, Table};
use vramctl_observe::units;

/// Version of the JSON below (docs/json.md).
const SCHEMA: u32 = 1;

/// Does the job fit the GPU given with `--gpu`, and what would (`vramctl_model::fit_check`),
/// in the JSON's flat shape: the values as before, each with the margin it leaves beside it.
#[derive(Debug, Serialize)]
struct GpuCheck {
    /// What the job may use: the size given, or the device's usable memory now.
    capacity_bytes: u64,
    /// The device `--gpu INDEX|NAME` chose; `None` for a size.
    device: Option<GpuDevice>,
    fits: bool,
    /// Capacity − the estimate; negative when it does not fit.
    margin_bytes: i64,
    /// What every inverse answer below keeps free for the model's error (5 % of the
    /// capacity): each answer's margin is at least this.
    safety_margin_bytes: u64,
    /// The largest batch at the job's sequence length (for generation: the most concurrent
    /// sequences); `None` when not even 1 fits.
    largest_batch: Option<u64>,
    largest_batch_margin_bytes: Option<u64>,
    /// The largest sequence at the job's batch; `None` when not even 1 token fits.
    largest_seq: Option<u64>,
    largest_seq_margin_bytes: Option<u64>,
    /// The most precise weight format that fits at the job's batch and sequence.
    weights_that_fit: Option<WeightsFit>,
}

impl GpuCheck {
    fn new(check: FitCheck, device: Option<GpuDevice>) -> Self {
        Self {
            capacity_bytes: check.capacity_bytes,
            device,
            fits: check.fits,
            margin_bytes: check.margin_bytes,
            safety_margin_bytes: check.safety_margin_bytes,
            largest_batch: check.largest_batch.map(|f| f.value),
            largest_batch_margin_bytes: check.largest_batch.map(|f| f.margin_bytes),
            largest_seq: check.largest_seq.map(|f| f.value),
            largest_seq_margin_bytes: check.largest_seq.map(|f| f.margin_bytes),
            weights_that_fit: check.weights,
        }
    }
}

/// The GPU `--gpu INDEX|NAME` resolved to, and how its usable memory was counted.
#[derive(Debug, Serialize)]
struct GpuDevice {
    index: u32,
    uuid: String,
    name: Option<String>,
    total_bytes: u64,
    /// Set aside by the driver and firmware (NVML's v2 `reserved`).
    driver_reserved_bytes: u64,
    /// In use by other processes now (NVML's `used`): the job is not running yet.
    in_use_bytes: u64,
    /// How many GPUs the selector matched; the one with the most usable memory is checked.
    matched: usize,
}

impl GpuDevice {
    fn usable_bytes(&self) -> u64 {
        self.total_bytes
            .saturating_sub(self.driver_reserved_bytes)
            .saturating_sub(self.in_use_bytes)
    }
}

#[derive(Serialize)]
struct Document<'a> {
    schema: u32,
    model: ModelSummary<'a>,
    job: &'a Job,
    peak_phase: &'static str,
    terms: &'a [memory_model::Term],
    total_bytes: u64,
    gpu: Option<&'a GpuCheck>,
}

#[derive(Serialize)]
struct ModelSummary<'a> {
    #[serde(flatten)]
    model: &'a Model,
    params: u64,
}

/// Runs `vramctl estimate`.
///
/// # Errors
/// The model's files cannot be read or are malformed (exit 2), a job longer than a learned
/// position table (exit 2), no GPU matches `--gpu`
/// (exit 2), NVML cannot be opened for `--gpu INDEX|NAME` (exit 3), stdout closed.
pub fn run(global: &GlobalArgs, args: &EstimateArgs) -> anyhow::Result<Exit> {
    let model = match (&args.model, args.params) {
        (Some(path), _) => vramctl_model::read_model(path, args.arch)?,
        (None, Some(params)) => {
            // clap requires --arch with --params.
            let family = args.arch.context("--params needs --arch A")?;
            Model::synthesized(params, family)
        }
        (None, None) => anyhow::bail!("give MODEL, or --params N --arch A"),
    };
    if args.target_seq.is_some() && model.architecture.family != vramctl_model::Family::T5 {
        anyhow::bail!(
            "--target-seq is for an encoder-decoder (t5): a {} model has one sequence, --seq",
            model.architecture.family.model_type()
        );
    }
    let job = job_of(args, &model);
    if let Some(max) = model
        .architecture
        .max_positions
        .filter(|_| model.architecture.learned_positions)
    {
        // A learned position table has no row past its end: such a job stops with an
        // index error (on a GPU, a device-side assert), it never reaches its memory peak.
        // Found on the H200: GPT-2 generating 64 tokens after a 1024-token prompt.
        let tokens = job.seq.saturating_add(job.generated);
        if tokens > max {
            anyhow::bail!(
                "a {} model has {max} learned positions: --seq {} + --gen {} = {tokens} tokens \
                 cannot run (no position embedding past {max}); keep the prompt and the generated \
                 tokens within {max}",
                model.architecture.family.model_type(),
                job.seq,
                job.generated
            );
        }
    }
    let estimate = memory_model::estimate(&model, &job);
    let gpu = match &args.gpu {
        None => None,
        Some(GpuTarget::Size(bytes)) => Some((*bytes, None)),
        Some(GpuTarget::Device(selector)) => {
            let device = resolve_device(global, selector)?;
            Some((device.usable_bytes(), Some(device)))
        }
    }
    .map(|(capacity_bytes, device)| {
        GpuCheck::new(fit_check::check(&model, &job, capacity_bytes), device)
    });
    let mut out = std::io::stdout().lock();
    emit(
        &mut out,
        Format::from_json_flag(args.json, Format::JsonPretty),
        || Document {
            schema: SCHEMA,
            model: ModelSummary {
                model: &model,
                params: model.params(),
            },
            job: &job,
            peak_phase: estimate.peak_phase,
            terms: &estimate.terms,
            total_bytes: estimate.total_bytes,
            gpu: gpu.as_ref(),
        },
        || Lines::Untrusted(render(&model, &job, &estimate, gpu.as_ref())),
    )?;
    Ok(match gpu {
        Some(check) if !check.fits => Exit::ConditionHolds,
        _ => Exit::Ok,
    })
}

/// The GPU `selector` names, read from NVML now: an index exactly, else a part of the
/// name or UUID (any case). Several matches (`H200` on an 8-GPU host) check the one with
/// the most usable memory, the best place to start the job.
///
/// # Errors
/// NVML cannot be opened (exit 3); no GPU matches, or the chosen one cannot report its
/// memory (exit 2).
fn resolve_device(global: &GlobalArgs, selector: &str) -> anyhow::Result<GpuDevice> {
    let mut sampler = crate::cmd::open_sampler(global)?;
    let snapshot = sampler.tick();
    let wanted = selector.to_ascii_lowercase();
    let by_index = selector.parse::<u32>().ok();
    let matches = |info: &vramctl_core::types::DeviceInfo| match by_index {
        Some(index) => info.index == index,
        None => {
            info.uuid.to_ascii_lowercase().contains(&wanted)
                || info
                    .name
                    .as_ref()
                    .is_some_and(|n| n.to_ascii_lowercase().contains(&wanted))
        }
    };
    let chosen: Vec<_> = snapshot
        .devices
        .iter()
        .filter(|d| matches(&d.info))
        .collect();
    if chosen.is_empty() {
        let known: Vec<String> = snapshot
            .devices
            .iter()
            .map(|d| {
                format!(
                    "{} {} ({})",
                    d.info.index,
                    d.info.name.as_deref().unwrap_or("unnamed"),
                    d.info.uuid
                )
            })
            .collect();
        anyhow::bail!(
            "no GPU matches '{selector}'; give an index, a part of a name or UUID of: {}, or a size such as 80GiB",
            if known.is_empty() {
                "none found".to_owned()
            } else {
                known.join(", ")
            }
        );
    }
    let matched = chosen.len();
    let mut devices: Vec<GpuDevice> = Vec::new();
    for d in chosen {
        let Some(memory) = d.reading().and_then(|r| r.memory) else {
            // One of several that cannot answer is passed over; a single one is an error.
            if matched == 1 {
                anyhow::bail!(
                    "GPU {} ('{selector}') does not report its memory now; give its size instead, e.g. --gpu 80GiB",
                    d.info.index
                );
            }
            continue;
        };
        devices.push(GpuDevice {
            index: d.info.index,
            uuid: d.info.uuid.clone(),
            name: d.info.name.clone(),
            total_bytes: memory.total_bytes,
            driver_reserved_bytes: memory.reserved_bytes,
            in_use_bytes: memory.used_bytes,
            matched,
        });
    }
    devices
        .into_iter()
        .max_by_key(|d| (d.usable_bytes(), std::cmp::Reverse(d.index)))
        .with_context(|| {
            format!("none of the {matched} GPUs matching '{selector}' reports its memory now; give a size instead, e.g. --gpu 80GiB")
        })
}

fn job_of(args: &EstimateArgs, model: &Model) -> Job {
    let mode = if args.infer { Mode::Infer } else { Mode::Train };
    let precision = match args.precision {
        Some(EstimatePrecision::Fp32) => Precision::Fp32,
        Some(EstimatePrecision::Fp16) => Precision::Fp16,
        Some(EstimatePrecision::Bf16) => Precision::Bf16,
        Some(EstimatePrecision::AmpBf16) => Precision::AmpBf16,
        Some(EstimatePrecision::AmpFp16) => Precision::AmpFp16,
        // transformers' Trainer trains in fp32 unless told; generation loads the
        // checkpoint's dtype.
        None if mode == Mode::Train => Precision::Fp32,
        None => Precision::of_dtype(model.architecture.dtype),
    };
    Job {
        mode,
        batch: args.batch,
        seq: args.seq,
        generated: args.generated,
        target_seq: args.target_seq,
        precision,
        optimizer: match args.optimizer {
            EstimateOptimizer::Adamw => Optimizer::Adamw,
            EstimateOptimizer::AdamwFused => Optimizer::AdamwFused,
            EstimateOptimizer::Adam => Optimizer::Adam,
            EstimateOptimizer::Sgd => Optimizer::Sgd,
            EstimateOptimizer::SgdMomentum => Optimizer::SgdMomentum,
            EstimateOptimizer::Adafactor => Optimizer::Adafactor,
            EstimateOptimizer::Adamw8bit => Optimizer::Adamw8bit,
        },
        checkpointing: args.checkpointing,
        cast_from_fp32: args.cast_from_fp32,
        attention: match args.attention {
            EstimateAttention::Sdpa => Attention::Sdpa,
            EstimateAttention::Eager => Attention::Eager,
            EstimateAttention::Flash => Attention::Flash,
        },
        lora: args.lora_rank.map(|rank| Lora {
            rank,
            quant_base: args.quant_base.map(|q| match q {
                EstimateBaseQuant::Int4 => Quant::Int4,
                EstimateBaseQuant::Int8 => Quant::Int8,
            }),
            targets: match args.lora_targets {
                EstimateLoraTargets::QV => LoraTargets::QV,
                EstimateLoraTargets::AllLinear => LoraTargets::AllLinear,
            },
            dropout: args.lora_dropout,
        }),
        quant: args.quant.map(|q| match q {
            EstimateQuant::Int8 => Quant::Int8,
            EstimateQuant::Int4 => Quant::Int4,
            EstimateQuant::Fp8 => Quant::Fp8,
        }),
        kv_dtype: args.kv_dtype.map(|d| match d {
            EstimateKvDtype::Fp32 => Dtype::F32,
            EstimateKvDtype::Fp16 => Dtype::F16,
            EstimateKvDtype::Bf16 => Dtype::Bf16,
            EstimateKvDtype::Fp8 => Dtype::F8,
        }),
        gpus: args.gpus,
        sharding: match (args.zero, args.fsdp) {
            (Some(stage), _) => Sharding::Zero(stage),
            (None, true) => Sharding::Fsdp,
            (None, false) => Sharding::Replicated,
        },
    }
}

fn render(model: &Model, job: &Job, estimate: &Estimate, gpu: Option<&GpuCheck>) -> Vec<String> {
    let arch = &model.architecture;
    let source = match model.source {
        vramctl_model::model::SourceKind::Config => "config.json",
        vramctl_model::model::SourceKind::ConfigAndSafetensors => {
            "config.json and safetensors headers"
        }
        vramctl_model::model::SourceKind::Safetensors => "safetensors headers, shape from --arch",
        vramctl_model::model::SourceKind::Gguf => "GGUF metadata",
        vramctl_model::model::SourceKind::Synthesized => "--params, shape from --arch",
    };
    let mut lines = vec![format!(
        "model  {} ({source}): {} params, {} layers, hidden {}, {} heads ({} kv), vocab {}",
        arch.family.model_type(),
        memory_model::grouped(model.params()),
        arch.total_layers(),
        arch.hidden,
        arch.heads,
        arch.kv_heads,
        arch.vocab
    )];
    let precision = memory_model::precision_name(job.precision);
    let attention = memory_model::attention_name(job.attention);
    let mut job_line = match job.mode {
        Mode::Train => format!(
            "job    train ({}), batch {} × seq {} per GPU, {precision}, {}, {attention} attention",
            memory_model::objective(arch.family),
            job.batch,
            job.seq,
            memory_model::optimizer_name(job.optimizer),
        ),
        Mode::Infer => format!(
            "job    infer, batch {} × (prompt {} + generated {}), {precision}, {attention} attention",
            job.batch, job.seq, job.generated
        ),
    };
    if job.checkpointing {
        job_line.push_str(", checkpointing");
    }
    if let Some(lora) = job.lora {
        job_line.push_str(&format!(", lora rank {}", lora.rank));
    }
    if job.gpus > 1 || job.sharding != Sharding::Replicated {
        let how = match job.sharding {
            Sharding::Replicated => "ddp".to_owned(),
            Sharding::Zero(stage) => format!("zero-{stage}"),
            Sharding::Fsdp => "fsdp".to_owned(),
        };
        job_line.push_str(&format!(", {} gpus {how}", job.gpus));
    }
    lines.push(job_line);
    lines.push(format!("peak   {}", estimate.peak_phase));
    lines.push(String::new());
    let mut table = Table::new(&[
        ("TERM", Align::Left),
        ("BYTES", Align::Right),
        ("SHARE", Align::Right),
        ("NOTE", Align::Left),
    ]);
    let total = estimate.total_bytes.max(1);
    for term in &estimate.terms {
        let share = if term.at_peak {
            let tenths = u128::from(term.bytes) * 1000 / u128::from(total);
            format!("{}.{} %", tenths / 10, tenths % 10)
        } else {
            "-".to_owned()
        };
        let note = if term.at_peak {
            term.note.clone()
        } else {
            format!("not held at the peak; {}", term.note)
        };
        table.push(vec![
            term.name.to_owned(),
            units::bytes(term.bytes),
            share,
            note,
        ]);
    }
    table.push(vec![
        "total".to_owned(),
        units::bytes(estimate.total_bytes),
        "100.0 %".to_owned(),
        format!(
            "{} bytes per GPU at the peak, as nvidia-smi would show the process",
            memory_model::grouped(estimate.total_bytes)
        ),
    ]);
    lines.extend(table.render(""));
    if let Some(check) = gpu {
        lines.push(String::new());
        let verdict = if check.fits {
            format!(
                "fits ({} to spare)",
                units::bytes(check.margin_bytes.unsigned_abs())
            )
        } else {
            format!(
                "does not fit ({} short)",
                units::bytes(check.margin_bytes.unsigned_abs())
            )
        };
        let spare = |margin: Option<u64>| {
            margin.map_or_else(String::new, |m| format!(" ({} to spare)", units::bytes(m)))
        };
        // For generation the batch is the number of sequences decoded together.
        let (batch_word, seq_word) = match job.mode {
            Mode::Infer => ("concurrent sequences", "prompt"),
            Mode::Train => ("batch", "seq"),
        };
        let batch = match check.largest_batch {
            Some(b) => format!(
                "largest {batch_word} {b} at seq {}{}",
                job.seq,
                spare(check.largest_batch_margin_bytes)
            ),
            None => match job.mode {
                Mode::Infer => format!("not even one sequence fits at seq {}", job.seq),
                Mode::Train => format!("no batch fits at seq {}", job.seq),
            },
        };
        let seq = match check.largest_seq {
            Some(s) => format!(
                "longest {seq_word} {s} at batch {}{}",
                job.batch,
                spare(check.largest_seq_margin_bytes)
            ),
            None => format!("no {seq_word} fits at batch {}", job.batch),
        };
        let weights = match &check.weights_that_fit {
            Some(w) if !w.changed => None,
            Some(w) => Some(format!(
                "       weights that fit at this batch and seq: {} ({} to spare)",
                weight_format_text(w, job),
                units::bytes(w.margin_bytes)
            )),
            None if check.fits => None,
            None => {
                Some("       no lighter weight format fits at this batch and seq either".to_owned())
            }
        };
        match &check.device {
            None => lines.push(format!(
                "gpu    {}: {verdict}; {batch}; {seq}",
                units::bytes(check.capacity_bytes)
            )),
            Some(d) => {
                let which = if d.matched > 1 {
                    format!(" (the most free of {} matching)", d.matched)
                } else {
                    String::new()
                };
                lines.push(format!(
                    "gpu    {} {} ({}){which}: {} usable = {} total − {} driver reserved − {} in use now",
                    d.index,
                    d.name.as_deref().unwrap_or("unnamed"),
                    d.uuid,
                    units::bytes(check.capacity_bytes),
                    units::bytes(d.total_bytes),
                    units::bytes(d.driver_reserved_bytes),
                    units::bytes(d.in_use_bytes),
                ));
                lines.push(format!("       {verdict}; {batch}; {seq}"));
            }
        }
        lines.extend(weights);
        lines.push(format!(
            "       each answer above keeps {} (5 % of the capacity) for the estimate's own error",
            units::bytes(check.safety_margin_bytes)
        ));
    }
    lines.push(String::new());
    lines.push(
        "Measured on an H200 (docs/estimate.md): the 57 measured cases within 2.7 % of nvidia-smi's peak (17 of them held back when first run, then within 3.1 %); round 4's 11 held-back cases (checkpointing under autocast, generation's replay, --cast-from-fp32, adamw-fused, LoRA on all linears, T5 targets) within 10 %, 9 within 5 % (the two misses fixed since); round 5's 14 held-back jobs 12 within 5 % (Pythia's generation +11.6 %, on an H100, fixed since from its trace); round 6's 3 OPT jobs within 3 %; round 7's 5 GPT-NeoX jobs 4 within 5 % (+5.0 % generation, before that fix); round 8's 6 generation jobs 5 within 5 % (Pythia-160M at batch 128 −23.5 %, fixed since from its trace); round 9's 6 generation jobs all within 5 % (median 0.1 %, largest −3.3 %); sharded training (--gpus) is not measured.".to_owned(),
    );
    lines
}

/// `bf16 weights`, `int4 weights (bf16 otherwise)`, `amp-bf16`, `LoRA on an int4 base`.
fn weight_format_text(w: &WeightsFit, job: &Job) -> String {
    let precision = match w.format.precision {
        Precision::Fp32 => "fp32",
        Precision::Fp16 => "fp16",
        Precision::Bf16 => "bf16",
        Precision::AmpBf16 => "amp-bf16",
        Precision::AmpFp16 => "amp-fp16",
    };
    let quant = |q: Quant| match q {
        Quant::Int8 => "int8",
        Quant::Int4 => "int4",
        Quant::Fp8 => "fp8",
    };
    match (job.lora.is_some(), w.format.quant) {
        (true, Some(q)) => format!("LoRA on an {} base (--quant-base {})", quant(q), quant(q)),
        (true, None) => format!("LoRA on a {precision} base"),
        (false, Some(q)) => format!(
            "{} weights (--quant {}), {precision} otherwise",
            quant(q),
            quant(q)
        ),
        (false, None) => format!("--precision {precision}"),
    }
}
