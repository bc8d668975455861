//! `vramctl estimate` on the model files of testdata/model (made by make.py with the
//! safetensors and gguf packages, and real models' config.json files). No GPU is asked,
//! except by `--gpu INDEX|NAME`, on the fake NVML's scenarios.

use std::path::{Path, PathBuf};

use crate::harness::{json_of, redactions, stdout_of, vramctl_on};

fn model(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/model")
        .join(name)
}

fn estimate(args: &[&str]) -> assert_cmd::Command {
    let mut cmd = vramctl_on("h200-idle.toml");
    cmd.arg("estimate").args(args);
    cmd
}

fn stderr_line(output: &std::process::Output) -> String {
    let text = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(text.lines().count(), 1, "one line: {text}");
    text.trim_end().to_owned()
}

#[test]
fn llama3_training_table_with_a_gpu_check() {
    let path = model("configs/llama-3-8b.json");
    let out = stdout_of(&mut estimate(&[
        path.to_str().expect("utf-8"),
        "--train",
        "--batch",
        "4",
        "--seq",
        "2048",
        "--precision",
        "bf16",
        "--checkpointing",
        "--gpu",
        "141GiB",
    ]));
    redactions().bind(|| insta::assert_snapshot!("estimate_llama3_train_table", out));
}

#[test]
fn inference_json_from_a_directory_with_a_safetensors_header() {
    let path = model("tiny-llama");
    let doc = json_of(&mut estimate(&[
        path.to_str().expect("utf-8"),
        "--infer",
        "--batch",
        "2",
        "--seq",
        "64",
        "--gen",
        "16",
        "--gpu",
        "1GiB",
        "--json",
    ]));
    assert_eq!(doc["schema"], 1);
    assert_eq!(doc["model"]["source"], "config_and_safetensors");
    assert_eq!(doc["model"]["params"], 26_784);
    assert_eq!(doc["model"]["weights"]["by_dtype"]["F16"]["bytes"], 53_568);
    // The checkpoint's dtype (float16) when --precision is not given.
    assert_eq!(doc["job"]["precision"], "fp16");
    assert_eq!(
        doc["job"].get("optimizer"),
        None,
        "generation has no optimizer"
    );
    // 2 × 2 layers × 16 (2 kv heads × 8) × 2 B × 2 sequences × 80 tokens.
    let kv = doc["terms"]
        .as_array()
        .expect("terms")
        .iter()
        .find(|t| t["name"] == "KV cache")
        .expect("a KV term");
    assert_eq!(kv["bytes"], 2 * 2 * 16 * 2 * 2 * 80);
    let sum: u64 = doc["terms"]
        .as_array()
        .expect("terms")
        .iter()
        .filter(|t| t["at_peak"] == true)
        .map(|t| t["bytes"].as_u64().expect("bytes"))
        .sum();
    assert_eq!(
        doc["total_bytes"], sum,
        "the total is its terms at the peak"
    );
    assert_eq!(doc["gpu"]["fits"], true);
    let mut doc = doc;
    // Where the checkout is differs between machines.
    doc["model"]["path"] = "[PATH]".into();
    redactions().bind(|| insta::assert_json_snapshot!("estimate_tiny_llama_infer_json", doc));
}

#[test]
fn gpt2_fp32_step_matches_the_hand_worked_total() {
    let path = model("configs/gpt2.json");
    let doc = json_of(&mut estimate(&[path.to_str().expect("utf-8"), "--json"]));
    // docs/estimate.md works this case by hand (the allocator term is the replay's since
    // round 2: 418,375,680 B where 5.5 % of the tensors gave 140,805,463).
    assert_eq!(doc["total_bytes"], 3_756_518_400_u64);
    assert_eq!(doc["peak_phase"], "optimizer step");
    assert_eq!(doc["job"]["precision"], "fp32");
    assert_eq!(doc["job"]["optimizer"], "adamw");
}

#[test]
fn gguf_table_reads_the_metadata_and_tensor_bytes() {
    let path = model("tiny-llama.gguf");
    let out = stdout_of(&mut estimate(&[
        path.to_str().expect("utf-8"),
        "--infer",
        "--seq",
        "128",
        "--kv-dtype",
        "fp8",
    ]));
    assert!(
        out.contains("llama (GGUF metadata): 26,784 params, 2 layers"),
        "{out}"
    );
    // Loaded as stored: F16 + Q8_0 + F32 bytes.
    assert!(out.contains("41.4 KiB"), "{out}");
    redactions().bind(|| insta::assert_snapshot!("estimate_gguf_infer_table", out));
}

#[test]
fn not_fitting_the_gpu_is_exit_1_with_the_largest_batch_that_does() {
    let path = model("configs/llama-3-8b.json");
    let output = estimate(&[
        path.to_str().expect("utf-8"),
        "--precision",
        "bf16",
        "--gpu",
        "72GiB",
    ])
    .output()
    .expect("run");
    assert_eq!(output.status.code(), Some(1));
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(out.contains("72.0 GiB: does not fit ("), "{out}");
    assert!(out.contains(" short); no batch fits at seq 512"), "{out}");
    // bf16 is the lightest format full training has: nothing lighter is offered.
    assert!(
        out.contains("no lighter weight format fits at this batch and seq either"),
        "{out}"
    );
    let lora = estimate(&[
        path.to_str().expect("utf-8"),
        "--lora-rank",
        "16",
        "--quant-base",
        "int4",
        "--precision",
        "bf16",
        "--gpu",
        "24GiB",
        "--json",
    ])
    .output()
    .expect("run");
    assert_eq!(lora.status.code(), Some(0), "QLoRA of 8B fits 24 GiB");
    let doc: serde_json::Value = serde_json::from_slice(&lora.stdout).expect("json");
    assert!(doc["gpu"]["largest_batch"].as_u64().expect("a batch") >= 1);
}

#[test]
fn bad_models_are_one_line_errors_with_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mamba = dir.path().join("config.json");
    std::fs::write(&mamba, r#"{"model_type": "mamba"}"#).expect("write");
    let output = estimate(&[mamba.to_str().expect("utf-8")])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    let line = stderr_line(&output);
    assert!(
        line.contains("model_type 'mamba' is not supported"),
        "{line}"
    );
    assert!(line.contains("--params N --arch A"), "{line}");
    // A vision-language config names its text model's model_type.
    std::fs::write(&mamba, r#"{"model_type": "gemma3"}"#).expect("write");
    let output = estimate(&[mamba.to_str().expect("utf-8")])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr_line(&output).contains("'gemma3_text'"));

    // A hostile header: 2^64 − 1 bytes declared in a 10-byte file.
    let huge = dir.path().join("huge.safetensors");
    let mut bytes = u64::MAX.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&huge, bytes).expect("write");
    let output = estimate(&[huge.to_str().expect("utf-8"), "--arch", "llama"])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr_line(&output).contains("more than the 100000000 allowed"));

    let fake = dir.path().join("fake.gguf");
    std::fs::write(&fake, b"GGML\x03\0\0\0").expect("write");
    let output = estimate(&[fake.to_str().expect("utf-8")])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr_line(&output).contains("is not a GGUF file"));

    let output = estimate(&["--params", "7B", "--arch", "llama", "--gpu", "0GiB"])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr_line(&output).contains("'0GiB' is no memory"));
}

#[test]
fn a_job_past_a_learned_position_table_is_refused_not_estimated() {
    // The H200 run of 2026-12-05 asked GPT-2 (1024 learned positions) for 1024 + 64 tokens:
    // the job itself died on a device-side assert. RoPE models have no such table.
    let gpt2 = model("configs/gpt2.json");
    let gpt2 = gpt2.to_str().expect("utf-8");
    let output = estimate(&[
        gpt2, "--infer", "--batch", "96", "--seq", "1024", "--gen", "64",
    ])
    .output()
    .expect("run");
    assert_eq!(output.status.code(), Some(2));
    let line = stderr_line(&output);
    assert!(
        line.contains("1024 learned positions") && line.contains("= 1088 tokens"),
        "{line}"
    );
    for fits in [
        &["--seq", "960", "--gen", "64"][..],
        &["--seq", "1024", "--gen", "0"][..],
    ] {
        let mut args = vec![gpt2, "--infer", "--batch", "96"];
        args.extend_from_slice(fits);
        estimate(&args).assert().success();
    }
    let llama = model("configs/llama-3-8b.json");
    estimate(&[
        llama.to_str().expect("utf-8"),
        "--infer",
        "--seq",
        "8192",
        "--gen",
        "64",
    ])
    .assert()
    .success();
}

/// The idle H200 of h200-idle.toml: 150,754,820,096 total − 644,939,776 driver reserved −
/// 0 in use = 150,109,880,320 usable.
const H200_IDLE_USABLE_BYTES: u64 = 150_754_820_096 - 644_939_776;

fn gpu_of(args: &[&str]) -> serde_json::Value {
    let path = model("configs/mistral-7b.json");
    let mut all = vec![path.to_str().expect("utf-8"), "--infer", "--json"];
    all.extend_from_slice(args);
    json_of(&mut estimate(&all))["gpu"].clone()
}

#[test]
fn gpu_by_index_checks_its_usable_memory_from_nvml() {
    let gpu = gpu_of(&["--gpu", "0"]);
    assert_eq!(gpu["capacity_bytes"], H200_IDLE_USABLE_BYTES);
    assert_eq!(gpu["device"]["index"], 0);
    assert_eq!(gpu["device"]["name"], "NVIDIA H200");
    assert_eq!(gpu["device"]["total_bytes"], 150_754_820_096_u64);
    assert_eq!(gpu["device"]["driver_reserved_bytes"], 644_939_776);
    assert_eq!(gpu["device"]["in_use_bytes"], 0);
    assert_eq!(gpu["fits"], true);
    // The same as giving that size: the device only sets the capacity.
    let size = format!("{H200_IDLE_USABLE_BYTES}B");
    let by_size = gpu_of(&["--gpu", &size]);
    assert_eq!(by_size["capacity_bytes"], H200_IDLE_USABLE_BYTES);
    assert_eq!(by_size["device"], serde_json::Value::Null);
    assert_eq!(by_size["largest_batch"], gpu["largest_batch"]);

    let path = model("configs/mistral-7b.json");
    let out = stdout_of(&mut estimate(&[
        path.to_str().expect("utf-8"),
        "--infer",
        "--gpu",
        "0",
    ]));
    assert!(
        out.contains(
            "gpu    0 NVIDIA H200 (GPU-7778da7f-089f-2a6e-e610-62d0c1b76bc2): 139.8 GiB usable = 140.4 GiB total − 615.1 MiB driver reserved − 0 B in use now"
        ),
        "{out}"
    );
}

#[test]
fn gpu_by_name_or_uuid_part_counts_what_others_use_now() {
    // h200-training.toml: the same H200 with 36.5 GiB in use by its processes.
    let mut cmd = vramctl_on("h200-training.toml");
    let path = model("configs/mistral-7b.json");
    cmd.args([
        "estimate",
        path.to_str().expect("utf-8"),
        "--infer",
        "--json",
        "--gpu",
        "h200",
    ]);
    let gpu = json_of(&mut cmd)["gpu"].clone();
    let in_use = gpu["device"]["in_use_bytes"].as_u64().expect("in use");
    assert!(in_use > 36 << 30, "{gpu}");
    assert_eq!(
        gpu["capacity_bytes"].as_u64().expect("capacity"),
        150_754_820_096 - 644_939_776 - in_use
    );
    assert_eq!(gpu_of(&["--gpu", "GPU-7778da7f"])["device"]["index"], 0);
}

#[test]
fn an_unknown_gpu_is_a_one_line_error_naming_the_gpus_there() {
    for selector in ["3", "A100"] {
        let path = model("configs/mistral-7b.json");
        let output = estimate(&[path.to_str().expect("utf-8"), "--gpu", selector])
            .output()
            .expect("run");
        assert_eq!(output.status.code(), Some(2));
        let line = stderr_line(&output);
        assert!(
            line.contains(&format!("no GPU matches '{selector}'")),
            "{line}"
        );
        assert!(line.contains("0 NVIDIA H200 (GPU-7778da7f"), "{line}");
        assert!(line.contains("80GiB"), "{line}");
    }
}

#[test]
fn gpu_by_index_without_a_driver_is_exit_3_and_a_size_needs_none() {
    let path = model("configs/mistral-7b.json");
    let output = vramctl_on("fault-driver-not-loaded.toml")
        .args(["estimate", path.to_str().expect("utf-8"), "--gpu", "0"])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(3));
    assert!(stderr_line(&output).contains("modprobe nvidia"));
    let output = vramctl_on("fault-driver-not-loaded.toml")
        .args([
            "estimate",
            path.to_str().expect("utf-8"),
            "--infer",
            "--gpu",
            "141GiB",
        ])
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(0), "a size opens no NVML");
}

/// Every measured case of the H200 truth set (tuning, seen, and round 2's 17 held-back
/// cases, measured once after the model was frozen) within 10 % of its NVML peak. The seen
/// cases that missed in round 1
/// (gpt2-fp32-ckpt-b32x1024 +18.3 %, phi3-mini-bf16-ckpt-b8x1024 +16.7 %,
/// qwen3-6l-bf16-b4x1024 −11.8 %, bert-ampbf16-b64x512 −10.6 %) have no allowance since the
/// allocator replay (docs/estimate.md, "Error table").
#[test]
fn h200_truth_set_estimates_stay_within_their_measured_error() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let table = std::fs::read_to_string(root.join("testdata/h200/estimate/truth.jsonl"))
        .expect("truth.jsonl (scripts/estimate/compare.py --write)");
    let mut cases = 0;
    for line in table.lines() {
        let row: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let name = row["case"].as_str().expect("case");
        let set = row["set"].as_str().expect("set");
        assert!(
            ["tuning", "seen", "held_back"].contains(&set),
            "{name}: set '{set}'"
        );
        let config = root.join(row["config"].as_str().expect("config"));
        let mut args = vec![config.to_str().expect("utf-8").to_owned()];
        args.extend(
            row["args"]
                .as_array()
                .expect("args")
                .iter()
                .map(|a| a.as_str().expect("an argument").to_owned()),
        );
        args.push("--json".to_owned());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let doc = json_of(&mut estimate(&refs));
        let predicted = doc["total_bytes"].as_f64().expect("total");
        let measured = row["nvml_peak_bytes"].as_f64().expect("measured");
        let error = (predicted - measured) / measured;
        assert!(
            error.abs() <= 0.10,
            "{name} ({set}): predicted {predicted}, measured {measured}: error {:.1} %",
            100.0 * error
        );
        cases += 1;
    }
    assert!(cases >= 57, "the truth set has {cases} cases");
}

/// Every sharded case of the truth set (scripts/estimate/cases.py's SHARDED, issue 36, not
/// measured yet) is a command line `estimate` takes, giving a per-GPU figure for 2 GPUs with
/// the terms its sharding adds, and fitting one H200 per rank as the cases say; the FSDP
/// Mistral-7B in fp32 fits only sharded. The list is read from cases.py itself (python3), so
/// a case added there without a working estimate fails here, in CI.
#[test]
fn every_sharded_truth_case_is_an_estimate_per_gpu() {
    const H200_BYTES: f64 = 141e9;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let listed = std::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys; sys.path.insert(0, 'scripts/estimate'); import cases; \
             print(json.dumps([[c['name'], c['set'], c['gpus'], c['sharding'], \
             cases.estimate_args(c)] for c in cases.SHARDED]))",
        ])
        .current_dir(&root)
        .output()
        .expect("python3");
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let list: Vec<(String, String, u64, String, Vec<String>)> =
        serde_json::from_slice(&listed.stdout).expect("the sharded cases as JSON");
    assert!(list.len() >= 8, "{} sharded cases", list.len());
    let total = |args: &[String]| -> serde_json::Value {
        let mut args = args.to_vec();
        args[0] = root.join(&args[0]).to_str().expect("utf-8").to_owned();
        args.push("--json".to_owned());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        json_of(&mut estimate(&refs))
    };
    for (name, set, gpus, sharding, args) in &list {
        let doc = total(args);
        let bytes = doc["total_bytes"].as_f64().expect("total");
        assert_eq!(doc["job"]["gpus"], *gpus, "{name}");
        let kind = if sharding == "ddp" {
            "replicated"
        } else {
            "fsdp"
        };
        assert_eq!(doc["job"]["sharding"]["kind"], kind, "{name}");
        let term = |wanted: &str| {
            doc["terms"]
                .as_array()
                .expect("terms")
                .iter()
                .any(|t| t["name"] == wanted && t["bytes"].as_u64() > Some(0))
        };
        assert!(term("NCCL communicator"), "{name}");
        let added = if sharding == "ddp" {
            "DDP gradient buckets"
        } else {
            "gathered parameters"
        };
        assert!(term(added), "{name}: no '{added}'");
        assert!(
            bytes > 1e9 && bytes < H200_BYTES,
            "{name} ({set}): {bytes} B per GPU"
        );
        // One GPU, the same job: sharding only ever divides or adds per-GPU terms.
        let at = args.iter().position(|a| a == "--gpus").expect("--gpus");
        let single: Vec<String> = args
            .iter()
            .enumerate()
            .filter(|(i, a)| *i != at && *i != at + 1 && a.as_str() != "--fsdp")
            .map(|(_, a)| a.clone())
            .collect();
        let alone = total(&single)["total_bytes"].as_f64().expect("total");
        if name == "mistral-7b-fsdp-fp32-b1x1024" {
            assert!(alone > H200_BYTES, "{name} fits one GPU: {alone} B");
        }
        if sharding == "ddp" {
            assert!(bytes > alone, "{name}: DDP {bytes} B, one GPU {alone} B");
        }
    }
}

/// `--gpu` answers the inverse questions with the margin each leaves, and each answer is
/// the forward estimate of the job changed that way: the weights format offered, run as
/// a job of its own, totals what the check said and fits.
#[test]
fn a_gpu_check_offers_the_most_precise_weights_that_fit_with_their_margin() {
    let path = model("configs/llama-3-8b.json");
    let path = path.to_str().expect("utf-8");
    let json = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![path, "--infer", "--batch", "4", "--seq", "8192", "--json"];
        args.extend_from_slice(extra);
        let output = estimate(&args).output().expect("run");
        serde_json::from_slice(&output.stdout).expect("json")
    };
    let alone = json(&[])["total_bytes"].as_u64().unwrap();
    // 1 MiB short of the job as given in bf16.
    let capacity = alone - (1 << 20);
    let checked = json(&["--gpu", &format!("{capacity}B")]);
    let gpu = &checked["gpu"];
    assert_eq!(gpu["fits"], false);
    assert_eq!(gpu["margin_bytes"], -(1 << 20));
    let weights = &gpu["weights_that_fit"];
    assert_eq!(weights["quant"], "int8", "{gpu}");
    assert_eq!(weights["changed"], true);
    let int8 = json(&["--quant", "int8"])["total_bytes"].as_u64().unwrap();
    assert_eq!(weights["total_bytes"], int8);
    assert_eq!(weights["margin_bytes"], capacity - int8);
    // The most concurrent sequences at this prompt, and the next one does not fit.
    let batch = gpu["largest_batch"].as_u64().unwrap();
    let at = |b: u64| {
        let output = estimate(&[
            path,
            "--infer",
            "--batch",
            &b.to_string(),
            "--seq",
            "8192",
            "--json",
        ])
        .output()
        .expect("run");
        serde_json::from_slice::<serde_json::Value>(&output.stdout).expect("json")["total_bytes"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(gpu["largest_batch_margin_bytes"], capacity - at(batch));
    assert!(at(batch + 1) > capacity);
}

/// The KV cache term of `doc`.
fn kv_bytes(doc: &serde_json::Value) -> u64 {
    doc["terms"]
        .as_array()
        .expect("terms")
        .iter()
        .find(|t| t["name"] == "KV cache")
        .and_then(|t| t["bytes"].as_u64())
        .expect("a KV term")
}

/// Every family added in issue 34, from a real checkpoint's config.json: `--json` gives
/// the parameter count transformers builds (crates/vramctl-model/src/model.rs derives each
/// from the modeling code) and the KV cache its cache layers store, 4 sequences × (1000 +
/// 24) tokens in bf16; training estimates too, with the replay's allocator term. Both
/// figures were checked against transformers 5.25's models built from shrunken configs on
/// a CPU; scripts/estimate-families-h200.py checks them at size on the H200.
#[test]
fn every_new_family_estimates_its_parameters_and_kv_cache_exactly() {
    // (config, family in the JSON, params, KV bytes = layer-tokens × per-token width × 2 B × 4)
    let cases: [(&str, &str, u64, u64); 11] = [
        (
            "pythia-1b.json",
            "gpt_neox",
            1_011_781_632,
            16 * 1024 * 4096,
        ),
        ("opt-1.3b.json", "opt", 1_315_758_080, 24 * 1024 * 4096),
        ("falcon-7b.json", "falcon", 6_921_720_704, 32 * 1024 * 128),
        ("phi-2.json", "phi", 2_779_683_840, 32 * 1024 * 5120),
        (
            "starcoder2-3b.json",
            "starcoder2",
            3_030_371_328,
            30 * 1024 * 512,
        ),
        ("olmo-1b.json", "olmo", 1_176_764_416, 16 * 1024 * 4096),
        ("olmo-2-1b.json", "olmo2", 1_484_916_736, 16 * 1024 * 4096),
        // The 1000-token prompt is longer than the 512 window: right after the prefill every
        // layer holds all of it (more than 4 global × 1024 + 22 local × 512 at the end).
        ("gemma-3-1b.json", "gemma3", 999_885_952, 26 * 1000 * 512),
        // MLA: the 512-wide latent and the 64-wide rotary key (transformers ≥ 5.15).
        (
            "deepseek-v2-lite.json",
            "deepseek_v2",
            15_706_484_224,
            27 * 1024 * 576,
        ),
        (
            "deepseek-v3.json",
            "deepseek_v3",
            671_026_404_352,
            61 * 1024 * 576,
        ),
        (
            "llama-4-scout-text.json",
            "llama4",
            107_769_861_120,
            48 * 1024 * 2048,
        ),
    ];
    for (config, family, params, layer_token_elements) in cases {
        let path = model(&format!("configs/{config}"));
        let path = path.to_str().expect("utf-8");
        let infer = json_of(&mut estimate(&[
            path,
            "--infer",
            "--batch",
            "4",
            "--seq",
            "1000",
            "--gen",
            "24",
            "--precision",
            "bf16",
            "--json",
        ]));
        assert_eq!(infer["model"]["architecture"]["family"], family, "{config}");
        assert_eq!(infer["model"]["params"], params, "{config}");
        assert_eq!(kv_bytes(&infer), 2 * 4 * layer_token_elements, "{config}");
        let weights = infer["terms"][0]["bytes"].as_u64().expect("weights");
        assert_eq!(weights, 2 * params, "{config}: bf16 weights");
        let train = json_of(&mut estimate(&[
            path,
            "--train",
            "--batch",
            "1",
            "--seq",
            "512",
            "--precision",
            "amp-bf16",
            "--json",
        ]));
        let total = train["total_bytes"].as_u64().expect("total");
        // fp32 weights, gradients and two AdamW states at least.
        assert!(total > 16 * params, "{config}: {total}");
        let replayed = train["terms"]
            .as_array()
            .expect("terms")
            .iter()
            .find(|t| t["name"] == "allocator overhead")
            .expect("an allocator term");
        assert!(
            replayed["note"]
                .as_str()
                .is_some_and(|n| n.contains("replayed")),
            "{config}: {replayed}"
        );
    }
}

/// The tables of a hybrid-attention, an MLA and an MQA model: the KV note says how the
/// cache is counted.
#[test]
fn new_family_tables_say_how_their_kv_cache_is_counted() {
    for (name, config, extra) in [
        (
            "estimate_gemma3_infer_table",
            "configs/gemma-3-1b.json",
            &["--infer", "--batch", "8", "--seq", "256", "--gen", "768"][..],
        ),
        (
            "estimate_deepseek_v2_lite_infer_table",
            "configs/deepseek-v2-lite.json",
            &["--infer", "--batch", "4", "--seq", "2048", "--gen", "256"][..],
        ),
        (
            "estimate_falcon_7b_train_table",
            "configs/falcon-7b.json",
            &[
                "--train",
                "--batch",
                "2",
                "--seq",
                "1024",
                "--precision",
                "amp-bf16",
            ][..],
        ),
    ] {
        let path = model(config);
        let mut args = vec![path.to_str().expect("utf-8")];
        args.extend_from_slice(extra);
        let out = stdout_of(&mut estimate(&args));
        redactions().bind(|| insta::assert_snapshot!(name, out));
    }
}

/// Issue 34, round 4: the flags for jobs the old ones could not describe reach the JSON
/// (only when given), and `--target-seq` on a model with one sequence is a usage error.
#[test]
fn round4_flags_reach_the_job_and_target_seq_needs_t5() {
    let t5 = model("configs/t5-small.json");
    let doc = json_of(&mut estimate(&[
        t5.to_str().expect("utf-8"),
        "--train",
        "--batch",
        "16",
        "--seq",
        "512",
        "--target-seq",
        "128",
        "--optimizer",
        "adamw-fused",
        "--json",
    ]));
    assert_eq!(doc["job"]["target_seq"], 128);
    assert_eq!(doc["job"]["optimizer"], "adamw-fused");
    assert!(
        doc["terms"]
            .as_array()
            .expect("terms")
            .iter()
            .all(|t| t["name"] != "optimizer step temporary" || t["bytes"] == 0)
    );
    let llama = model("configs/tinyllama-1.1b.json");
    let doc = json_of(&mut estimate(&[
        llama.to_str().expect("utf-8"),
        "--train",
        "--precision",
        "bf16",
        "--lora-rank",
        "16",
        "--lora-targets",
        "all-linear",
        "--lora-dropout",
        "--cast-from-fp32",
        "--json",
    ]));
    assert_eq!(doc["job"]["lora"]["targets"], "all-linear");
    assert_eq!(doc["job"]["lora"]["dropout"], true);
    assert_eq!(doc["job"]["cast_from_fp32"], true);
    let plain = json_of(&mut estimate(&[
        llama.to_str().expect("utf-8"),
        "--train",
        "--json",
    ]));
    assert!(plain["job"].get("target_seq").is_none());
    assert!(plain["job"].get("cast_from_fp32").is_none());
    let out = estimate(&[
        llama.to_str().expect("utf-8"),
        "--train",
        "--target-seq",
        "128",
    ])
    .output()
    .expect("ran");
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_line(&out).contains("--target-seq is for an encoder-decoder"));
}
