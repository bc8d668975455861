//! The real trials: the command under `run`'s supervision ([`crate::job::run_job`]) in a
//! fresh process of its own group, its output kept, the value in its arguments and in
//! [`VALUE_ENV`].

use std::ffi::OsString;
use std::time::{Duration, Instant};

use regex::Regex;
use vramctl_observe::daemon_socket::client::AskOptions;
use vramctl_observe::live_loop::LiveSampler;

use super::{DeviceTrace, Measured, TrialOutcome, TrialRunner};
use crate::fit_search::DeviceMeasure;
use crate::fit_trace::{AllocTrace, TRACE_ENV, TraceFile};
use crate::job::child::{Output, SignalForwarder, libc_signal};
use crate::job::ticks::JobTicks;
use crate::job::tree::ProcessTree;
use crate::job::{Ending, FrameworkPeaks, JobReport, JobSpec, RunError, run_job};

/// Where the value goes in the command's arguments.
pub const PLACEHOLDER: &str = "{}";
/// The variable that carries it too.
pub const VALUE_ENV: &str = "VRAMCTL_FIT_VALUE";
/// How long to wait, before a trial, for the last one's memory to come back to the driver.
const SETTLE_LIMIT: Duration = Duration::from_secs(15);

/// Each trial a supervised job of `command` with its `{}` replaced by the value.
pub struct SupervisedTrials<'a> {
    pub sampler: &'a mut LiveSampler,
    pub signals: &'a SignalForwarder,
    /// The command, with [`PLACEHOLDER`]s.
    pub command: Vec<OsString>,
    /// Inject the agent (the framework's peaks).
    pub agent: bool,
    /// A line of output that ends a trial as succeeded.
    pub until_line: Option<Regex>,
    /// Longer than this, a trial is stopped and fails.
    pub timeout: Option<Duration>,
    pub interval: Duration,
    /// Between SIGTERM and SIGKILL when a trial is stopped.
    pub stop_grace: Duration,
    /// Inside a PID namespace of its own, how to ask a host daemon for this namespace's
    /// PIDs ([`crate::job::ticks`]).
    pub daemon: Option<AskOptions>,
    /// Ask the agent for the allocator's trace ([`TrialRunner::set_tracing`]).
    pub tracing: bool,
}

impl TrialRunner for SupervisedTrials<'_> {
    type Error = RunError;

    fn run_trial(
        &mut self,
        value: u64,
        on_tick: &mut dyn FnMut(Duration, u64),
    ) -> Result<TrialOutcome, RunError> {
        settle(self.sampler, self.daemon.clone());
        let mut env: Vec<(OsString, OsString)> = vec![(VALUE_ENV.into(), value.to_string().into())];
        if self.tracing && self.agent {
            env.push((TRACE_ENV.into(), "1".into()));
        }
        let spec = JobSpec {
            argv: with_value(&self.command, value),
            env,
            agent: self.agent,
            output: Output::Captured,
            until_line: self.until_line.clone(),
            timeout: self.timeout,
            interval: self.interval,
            stop_grace: self.stop_grace,
            reap_orphans: true,
            daemon: self.daemon.clone(),
        };
        let started = Instant::now();
        let mut on_tick =
            |_: &vramctl_core::types::Snapshot, curve: &crate::job::memory_curve::MemoryCurve| {
                on_tick(started.elapsed(), curve.peak_bytes());
            };
        let report = run_job(self.sampler, &spec, self.signals, &mut on_tick)?;
        let mut outcome = outcome(&report);
        if let TrialOutcome::Succeeded(m) | TrialOutcome::OutOfMemory(m) = &mut outcome {
            m.traces = if !self.agent {
                Err("the agent is off (--no-agent, or the command is not Python)".to_owned())
            } else if !self.tracing {
                Err("none was asked for".to_owned())
            } else {
                device_traces(report.alloc_traces)
            };
        }
        Ok(outcome)
    }

    fn set_tracing(&mut self, on: bool) {
        self.tracing = on;
    }
}

/// The job's traces per GPU: one process's per GPU (two processes' allocations on one GPU
/// are two pools the replay cannot interleave), or why there are none.
fn device_traces(files: Vec<(u32, Result<TraceFile, String>)>) -> Result<Vec<DeviceTrace>, String> {
    if files.is_empty() {
        return Err(
            "no process wrote one (not PyTorch, or it never allocated on a GPU)".to_owned(),
        );
    }
    let mut out: Vec<DeviceTrace> = Vec::new();
    for (pid, file) in files {
        let file = file.map_err(|e| format!("process {pid}'s trace: {e}"))?;
        for device in &file.devices {
            let trace = AllocTrace::from_file(device).map_err(|e| format!("process {pid}: {e}"))?;
            let uuid = device.uuid.as_deref().map(crate::job::normalize_uuid);
            if out.iter().any(|d| d.uuid == uuid) {
                return Err(format!(
                    "several processes allocated on GPU {}: one pool each, not one trace",
                    uuid.as_deref().unwrap_or("(unknown)")
                ));
            }
            out.push(DeviceTrace { uuid, trace });
        }
    }
    Ok(out)
}

/// The command with every `{}` replaced by `value`.
fn with_value(command: &[OsString], value: u64) -> Vec<OsString> {
    let v = value.to_string();
    command
        .iter()
        .map(|a| match a.to_str() {
            Some(s) if s.contains(PLACEHOLDER) => s.replace(PLACEHOLDER, &v).into(),
            _ => a.clone(),
        })
        .collect()
}

/// Waits until no process of ours is on a GPU any more (the last trial's memory is back
/// with the driver), at most [`SETTLE_LIMIT`]: the next trial's capacity is measured at its
/// start.
fn settle(sampler: &mut LiveSampler, daemon: Option<AskOptions>) {
    let deadline = Instant::now() + SETTLE_LIMIT;
    let mut tree = ProcessTree::new(std::process::id());
    let mut ticks = JobTicks::new(sampler, daemon);
    loop {
        let tick = ticks.tick();
        let ours = tick
            .attributable()
            .devices
            .iter()
            .filter_map(|d| d.reading())
            .flat_map(|r| r.processes.iter().flatten())
            .any(|p| tree.contains(p.pid));
        if !ours || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What the search and the report need from a finished job.
fn outcome(report: &JobReport) -> TrialOutcome {
    let interrupted = report.signals.iter().any(|s| {
        [
            libc_signal::SIGINT,
            libc_signal::SIGTERM,
            libc_signal::SIGHUP,
        ]
        .contains(s)
    });
    if interrupted {
        return TrialOutcome::Interrupted;
    }
    if !report.succeeded() && report.oom.is_none() {
        return failure(report);
    }
    let measured = Measured {
        wall_s: report.wall_s,
        devices: measures(report),
        peak_nvml_bytes: report.peak_bytes(),
        peak_reserved_bytes: highest(report, |f| f.reserved_peak_bytes),
        peak_allocated_bytes: highest(report, |f| f.allocated_peak_bytes),
        capacity_bytes: report.used_devices().filter_map(|d| d.capacity_bytes).min(),
        traces: Err("none was asked for".to_owned()),
    };
    if report.succeeded() {
        TrialOutcome::Succeeded(measured)
    } else {
        TrialOutcome::OutOfMemory(measured)
    }
}

/// What the search needs from a trial, per GPU it used.
fn measures(report: &JobReport) -> Vec<DeviceMeasure> {
    report
        .used_devices()
        .filter_map(|d| {
            Some(DeviceMeasure {
                uuid: d.curve.uuid.clone(),
                capacity_bytes: d.capacity_bytes?,
                nvml_peak_bytes: (d.curve.peak_bytes > 0).then_some(d.curve.peak_bytes),
                reserved_peak_bytes: d.framework.as_ref().and_then(|f| f.reserved_peak_bytes),
                allocated_peak_bytes: d.framework.as_ref().and_then(|f| f.allocated_peak_bytes),
            })
        })
        .collect()
}

fn highest(report: &JobReport, figure: fn(&FrameworkPeaks) -> Option<u64>) -> Option<u64> {
    report
        .devices
        .iter()
        .filter_map(|d| d.framework.as_ref().and_then(figure))
        .max()
}

/// A trial that failed for another reason than memory: how, and its last lines.
fn failure(report: &JobReport) -> TrialOutcome {
    let how = match (report.ending, report.exit_code, report.signal) {
        (Ending::TimedOut, _, _) => "did not finish within --trial-timeout".to_owned(),
        (_, Some(code), _) => format!("exited {code}"),
        (_, None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => "failed".to_owned(),
    };
    let stderr_tail = report
        .stderr_tail
        .iter()
        .rev()
        .take(5)
        .rev()
        .cloned()
        .collect::<Vec<_>>();
    TrialOutcome::Failed { how, stderr_tail }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_are_one_per_gpu_or_the_reason_there_are_none() {
        let file = |uuid: &str| {
            TraceFile::parse(
                format!(
                    r#"{{"version":1,"devices":[{{"index":0,"uuid":"{uuid}","frames":[],
                    "events":[[0,1024,0,4096,-1],[1,0,0,4096,-1]]}}]}}"#
                )
                .as_bytes(),
            )
        };
        let one = device_traces(vec![(7, file("ABC"))]).expect("a trace");
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].uuid.as_deref(), Some("abc"));
        assert_eq!(one[0].trace.allocations(), 1);
        // Two ranks on two GPUs: one trace each.
        assert_eq!(
            device_traces(vec![(7, file("a")), (8, file("b"))])
                .expect("two")
                .len(),
            2
        );
        // Two processes on one GPU, a file that did not parse, none at all.
        let why = device_traces(vec![(7, file("a")), (8, file("GPU-a"))]).expect_err("two");
        assert!(
            why.starts_with("several processes allocated on GPU a"),
            "{why}"
        );
        let why = device_traces(vec![(9, Err("not a trace file: x".to_owned()))])
            .expect_err("unreadable");
        assert_eq!(why, "process 9's trace: not a trace file: x");
        assert!(
            device_traces(Vec::new())
                .expect_err("none")
                .starts_with("no process wrote one")
        );
    }

    #[test]
    fn every_placeholder_gets_the_value() {
        let cmd: Vec<OsString> = ["python", "t.py", "--batch", "{}", "--name=run-{}"]
            .iter()
            .map(OsString::from)
            .collect();
        let got = with_value(&cmd, 48);
        assert_eq!(got[3], "48");
        assert_eq!(got[4], "--name=run-48");
        assert_eq!(got[0], "python");
    }
}
