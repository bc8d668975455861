//! `leaks --watch` with real agents (issue 35): python3 with the agent and the stand-in
//! torch (`reclaim::Py`), listed by the fake NVML. The stand-in's allocator is the only
//! double: the agent reads its `memory_stats`, its history recording and its `_snapshot`.

use crate::harness::vramctl_std;
use crate::reclaim::{GIB, Py};

const MIB: u64 = 1 << 20;
const T0: i64 = 1_764_441_091_000;

/// Two agents on one GPU, on the fake's step clock (1 s per sample). The leaker holds a
/// 20 GiB cache and leaks 16 MiB of live tensors each time its agent is asked for its
/// figures (once per sample: `leaks --watch` asks at the interval), from `leaky_step` in
/// `workload.py`; NVML shows it flat at 22 GiB. The cache-grower keeps 3 GiB of live
/// tensors while NVML shows it growing 16 MiB per second (its cache).
fn leaker_and_cache_grower() -> (Py, Py, std::path::PathBuf) {
    let mut leaker = Py::agent(20 * GIB, GIB);
    leaker.exec(&format!(
        "kept_leak = []\n\
         def leaky_step():\n\
         \x20   kept_leak.append(torch.empty({}, dtype=torch.uint8, device='cuda'))\n\
         _stats = torch.cuda.memory_stats\n\
         def _leaking_stats(device=None):\n\
         \x20   leaky_step()\n\
         \x20   return _stats(device)\n\
         torch.cuda.memory_stats = _leaking_stats",
        16 * MIB
    ));
    let grower = Py::agent(0, 3 * GIB);
    let scenario = two_holders(&leaker, &grower);
    (leaker, grower, scenario)
}

/// The scenario of both tests: `leaker` flat at 22 GiB on NVML, `grower` rising 16 MiB a
/// second from 4 GiB (one step a second of the fake's clock), both busy.
fn two_holders(leaker: &Py, grower: &Py) -> std::path::PathBuf {
    let growing: Vec<String> = (0..400)
        .map(|i| format!("\"{} MiB\"", 4096 + 16 * i))
        .collect();
    let text = format!(
        "[clock]\nmode = \"step\"\nstep_s = 1.0\n\n\
         [[gpu]]\nname = \"NVIDIA H200\"\nuuid = \"GPU-8cca1523-521a-59dd-48fa-95c44bc1b100\"\n\
         memory_total = \"140 GiB\"\nmemory_reserved = \"615 MiB\"\nutilization_gpu = 80\n\
         [[gpu.process]]\npid = {}\nreal = true\nmemory = \"22 GiB\"\nsm_util = 50\n\
         [[gpu.process]]\npid = {}\nreal = true\nsm_util = 50\n\
         memory = {{ steps = {{ values = [{}], every_s = 1.0 }} }}\n",
        leaker.pid(),
        grower.pid(),
        growing.join(", ")
    );
    let scenario = leaker.dir.path().join("scenario.toml");
    std::fs::write(&scenario, text).expect("scenario");
    scenario
}

fn watch(scenario: &std::path::Path, extra: &[&str]) -> Vec<serde_json::Value> {
    let out = vramctl_std(scenario)
        .env_remove("FAKE_NVML_TIME")
        .args([
            "leaks",
            "--watch",
            "--json",
            "--interval",
            "1s",
            "--count",
            "240",
        ])
        .args(["--simulated-clock", &T0.to_string()])
        .args(extra)
        .output()
        .expect("leaks --watch runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object a line"))
        .collect()
}

#[test]
fn leaks_watch_judges_live_tensors_where_an_agent_answers_and_names_the_growing_site() {
    let (leaker, grower, scenario) = leaker_and_cache_grower();
    let events = watch(&scenario, &["--where", "--where-after", "5s"]);
    let verdicts = |pid: u32| -> Vec<&serde_json::Value> {
        events
            .iter()
            .filter(|e| e["event"] == "verdict" && e["pid"] == pid)
            .collect()
    };
    // NVML flat, live tensors growing: a leak, judged on them, and the reason says so.
    let leak = verdicts(leaker.pid())
        .into_iter()
        .find(|e| e["verdict"] == "leak")
        .unwrap_or_else(|| panic!("no leak verdict: {events:#?}"));
    assert_eq!(leak["basis"], "allocated", "{leak}");
    let why = leak["explanation"].as_str().unwrap_or_default();
    assert!(
        why.contains("judged on live tensors from the agent"),
        "{why}"
    );
    // NVML growing, live tensors flat: the cache, never a leak.
    let grower_verdicts = verdicts(grower.pid());
    assert!(!grower_verdicts.is_empty(), "{events:#?}");
    assert!(
        grower_verdicts.iter().all(|e| e["verdict"] != "leak"),
        "{grower_verdicts:#?}"
    );
    // The where: the line that allocates the leaked tensors, 16 MiB per sample.
    let found = events
        .iter()
        .find(|e| e["event"] == "where")
        .unwrap_or_else(|| panic!("no where event: {events:#?}"));
    let w = &found["where"];
    assert_eq!(w["pid"], leaker.pid(), "{found}");
    assert!(w.get("error").is_none(), "{found}");
    let site = &w["sites"][0];
    let name = site["site"].as_str().unwrap_or_default();
    assert!(
        name.contains("workload.py") && name.contains("leaky_step"),
        "{found}"
    );
    let grew = site["grew_bytes"].as_u64().unwrap_or_default();
    assert!(grew >= 5 * 16 * MIB && grew % (16 * MIB) == 0, "{found}");
    assert_eq!(w["started_recording"], true, "{found}");
    // Only the leaking process is probed.
    assert_eq!(
        events.iter().filter(|e| e["event"] == "where").count(),
        1,
        "{events:#?}"
    );
}

#[test]
fn leaks_watch_without_agents_judges_nvml_and_takes_no_snapshot() {
    // The same scenario, no agent in either process: NVML's memory alone; the grower's
    // cache is then a leak by NVML's figures (what the agent's figures correct), and the
    // leaker is flat.
    let leaker = Py::start();
    let grower = Py::start();
    let scenario = two_holders(&leaker, &grower);
    let events = watch(&scenario, &["--where"]);
    let last = |pid: u32| {
        events
            .iter()
            .rfind(|e| e["event"] == "verdict" && e["pid"] == pid)
            .cloned()
            .unwrap_or_default()
    };
    assert_eq!(last(grower.pid())["verdict"], "leak", "{events:#?}");
    assert_eq!(last(grower.pid())["basis"], "reserved");
    assert_ne!(last(leaker.pid())["verdict"], "leak");
    assert!(events.iter().all(|e| e["event"] != "where"), "{events:#?}");
}

#[test]
fn leaks_on_a_history_judges_the_live_tensors_record_stored() {
    // `record` asks agents every 10 s (its poll's cadence) and stores their allocated
    // bytes; `leaks` on that history judges the leaker on them. Each answer of the leaker's
    // agent here keeps 160 MiB more (16 MiB/s on average, in 10 s steps).
    let (mut leaker, grower, scenario) = leaker_and_cache_grower();
    leaker.exec(&format!(
        "def leaky_step():\n\
         \x20   kept_leak.append(torch.empty({}, dtype=torch.uint8, device='cuda'))",
        160 * MIB
    ));
    let db = leaker.dir.path().join("history.db");
    let recorded = vramctl_std(&scenario)
        .env_remove("FAKE_NVML_TIME")
        .arg("--db")
        .arg(&db)
        .args(["record", "--interval", "1s", "--ticks", "240"])
        .args(["--simulated-clock", &T0.to_string()])
        .output()
        .expect("record runs");
    assert!(
        recorded.status.success(),
        "{}",
        String::from_utf8_lossy(&recorded.stderr)
    );
    let out = vramctl_std(&scenario)
        .arg("--db")
        .arg(&db)
        .args(["leaks", "--json", "--since", "all"])
        .output()
        .expect("leaks runs");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let series = |pid: u32| {
        json["series"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["pid"] == pid).cloned())
            .unwrap_or_default()
    };
    let leak = series(leaker.pid());
    assert_eq!(leak["verdict"], "leak", "{json:#}");
    assert_eq!(leak["basis"], "allocated", "{leak:#}");
    assert!(
        leak["explanation"]
            .as_str()
            .unwrap_or_default()
            .contains("judged on live tensors from the agent"),
        "{leak:#}"
    );
    let cache = series(grower.pid());
    assert_ne!(cache["verdict"], "leak", "{cache:#}");
    assert_eq!(cache["basis"], "allocated", "{cache:#}");
    assert_eq!(cache["reserved_verdict"], "leak", "{cache:#}");
}
