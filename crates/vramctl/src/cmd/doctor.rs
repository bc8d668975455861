//! `vramctl doctor`: collect the facts, judge them (`vramctl_doctor`), print the findings.

use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use serde::Serialize;
use vramctl_core::untrusted::Untrusted;
use vramctl_doctor::{
    DriverFacts, Facts, Finding, HolderFacts, NoDriver, Status, collect, python_env,
};
use vramctl_gpu::InitError;
use vramctl_observe::gpu_selection::GpuFilter;

use super::open_sampler;
use crate::cli::{DoctorArgs, GlobalArgs};
use crate::exit::Exit;
use crate::output::emit::{Format, Lines, emit};
use crate::output::style::{Styles, paint};

#[derive(Debug, Serialize)]
struct Report<'a> {
    schema: u32,
    /// Whether NVML started (`false`: exit 3).
    driver_usable: bool,
    /// How long collecting and judging took.
    elapsed_ms: u64,
    counts: Counts,
    checks: &'a [Finding],
}

#[derive(Debug, Default, Serialize)]
struct Counts {
    ok: usize,
    warn: usize,
    fail: usize,
    skipped: usize,
}

/// Runs `doctor`.
pub fn run(global: &GlobalArgs, args: &DoctorArgs) -> anyhow::Result<Exit> {
    let started = Instant::now();
    let (driver, all_gpus, gpus, pairs) = match open_sampler(global) {
        Ok(mut sampler) => {
            let filter = GpuFilter::new(&args.gpu.selectors, sampler.devices())?;
            let (ready, all, gpus, pairs) = collect::nvml(&mut sampler, &filter);
            (DriverFacts::Ready(ready), all, gpus, pairs)
        }
        Err(err) => match err.chain().find_map(|c| c.downcast_ref::<InitError>()) {
            // No driver: diagnose it and go on with the checks that need none.
            Some(init) => (
                DriverFacts::Unusable(NoDriver {
                    code: init.code(),
                    reason: init.to_string(),
                    hint: init.hint(),
                    kernel_module_version: collect::kernel_module_version(),
                }),
                Vec::new(),
                Vec::new(),
                Vec::new(),
            ),
            None => return Err(err),
        },
    };
    let sources = if args.python.is_empty() {
        python_env::PythonSources {
            named: Vec::new(),
            virtual_env: std::env::var_os("VIRTUAL_ENV").map(Into::into),
            conda_prefix: std::env::var_os("CONDA_PREFIX").map(Into::into),
            path_python: true,
        }
    } else {
        python_env::PythonSources {
            named: args.python.clone(),
            ..python_env::PythonSources::default()
        }
    };
    let holders = if cfg!(target_os = "linux") {
        collect::holders()
    } else {
        HolderFacts::default()
    };
    // NVML's PIDs are the host's: their parents mean something only there.
    let parents = if holders.initial_pid_namespace {
        collect::parents(&gpus)
    } else {
        Default::default()
    };
    let facts = Facts {
        driver,
        gpus,
        all_gpus,
        holders,
        pairs,
        parents,
        kernel_log: collect::kernel_log(args.kernel_log.as_deref()),
        python: python_env::collect(&sources),
        env: collect::env(),
        host: collect::host(),
        view: vramctl_doctor::container_view::collect(),
    };
    let findings = vramctl_doctor::judge(&facts);
    let no_driver = matches!(facts.driver, DriverFacts::Unusable(_));
    let mut counts = Counts::default();
    for f in &findings {
        match f.status {
            Status::Ok => counts.ok += 1,
            Status::Warn => counts.warn += 1,
            Status::Fail => counts.fail += 1,
            Status::Skipped => counts.skipped += 1,
        }
    }
    let report = Report {
        schema: vramctl_doctor::SCHEMA,
        driver_usable: !no_driver,
        elapsed_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        counts,
        checks: &findings,
    };
    let mut out = std::io::stdout().lock();
    // The findings' lines are styled here; what they quote (paths, process names) was
    // escaped where each finding was written.
    emit(
        &mut out,
        Format::from_json_flag(args.json, Format::JsonPretty),
        || &report,
        || Lines::Styled(render(&report, &Styles::for_stdout(global.color))),
    )?;
    out.flush().context("cannot write to stdout")?;
    Ok(if no_driver {
        Exit::NoDriver
    } else if vramctl_doctor::any_failed(&findings) {
        Exit::ConditionHolds
    } else {
        Exit::Ok
    })
}

/// The widest subject that gets a column of its own.
const SUBJECT_COLUMN_MAX: usize = 16;

/// One line per finding (status, check, subject, summary), its fix on the next; a count
/// at the end.
fn render(report: &Report<'_>, styles: &Styles) -> Vec<String> {
    let checks = report.checks;
    let id_width = checks.iter().map(|f| f.id.len()).max().unwrap_or(5).max(5);
    // `host`, `GPU 12`: a column. A site-packages path is longer than any column should
    // be; it stands alone and its summary follows on the next line.
    let subject_width = checks
        .iter()
        .map(|f| f.subject.chars().count())
        .filter(|&n| n <= SUBJECT_COLUMN_MAX)
        .max()
        .unwrap_or(7)
        .max(7);
    let mut lines = vec![paint(
        styles.heading,
        &format!(
            "{:<8} {:<id_width$} {:<subject_width$} SUMMARY",
            "STATUS", "CHECK", "SUBJECT"
        ),
    )];
    for f in checks {
        // A finding quotes what it found: process names, kernel log lines, package
        // metadata; escaped (the styles are ours, added after).
        let (subject, summary) = (Untrusted(&f.subject), Untrusted(&f.summary));
        let status = format!("{:<8}", f.status.as_str());
        let status = match f.status {
            Status::Fail => paint(styles.bad, &status),
            Status::Warn => paint(styles.warn, &status),
            Status::Skipped => paint(styles.dim, &status),
            Status::Ok => status,
        };
        if f.subject.chars().count() > subject_width {
            lines.push(format!("{status} {:<id_width$} {subject}", f.id));
            lines.push(format!("{:8} {summary}", ""));
        } else {
            lines.push(format!(
                "{status} {:<id_width$} {subject:<subject_width$} {summary}",
                f.id
            ));
        }
        if let Some(fix) = &f.fix {
            lines.push(format!(
                "{:8} {}",
                "",
                paint(styles.dim, &format!("fix: {}", Untrusted(fix)))
            ));
        }
    }
    let c = &report.counts;
    lines.push(String::new());
    lines.push(format!(
        "{} fail, {} warn, {} ok, {} skipped{}",
        c.fail,
        c.warn,
        c.ok,
        c.skipped,
        if report.driver_usable {
            String::new()
        } else {
            " · no usable NVIDIA driver (exit 3)".to_owned()
        }
    ));
    lines
}
