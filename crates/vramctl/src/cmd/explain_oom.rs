//! `vramctl explain-oom`: a thin shell over `vramctl_snapshot::oom_message` (read the
//! message, explain it) and the history store (who held the GPU at the OOM's time).

use std::io::Read;

use anyhow::{Context, bail};
use serde::Serialize;
use vramctl_core::wall_time::{self, When};
use vramctl_snapshot::oom_message::{self, HeldThen, Holder, MessageVerdict, OomMessage};
use vramctl_store::replay::{MomentLookup, RecordedMoment};

use crate::cli::{ExplainOomArgs, GlobalArgs};
use crate::exit::Exit;
use crate::output::emit::{Format, Lines, emit};
use vramctl_observe::units;

/// `--json`'s document (docs/json.md, "explain-oom").
#[derive(Serialize)]
struct Document<'a> {
    schema: u32,
    message: &'a OomMessage,
    #[serde(flatten)]
    verdict: &'a MessageVerdict,
    /// Who held the GPU at the time, from the history; absent without one.
    held_then: Option<&'a HeldThen>,
}

pub fn run(global: &GlobalArgs, args: &ExplainOomArgs) -> anyhow::Result<Exit> {
    let text = match &args.message {
        Some(m) => m.clone(),
        None => read_stdin()?,
    };
    if text.len() > oom_message::MAX_MESSAGE_BYTES {
        bail!(
            "the message is longer than {} KiB; paste the OOM error and the lines around it",
            oom_message::MAX_MESSAGE_BYTES / 1024
        );
    }
    let Some(message) = oom_message::parse(&text) else {
        bail!(
            "no out-of-memory message found (PyTorch's 'CUDA out of memory. Tried to allocate', \
             XLA's 'RESOURCE_EXHAUSTED: Out of memory', TensorFlow's 'OOM when allocating tensor')"
        );
    };
    let then = held_then(global, args, &message)?;
    let verdict = oom_message::explain(&message, then.as_ref());
    let mut out = std::io::stdout().lock();
    emit(
        &mut out,
        args.print.format(Format::JsonLine),
        || Document {
            schema: 1,
            message: &message,
            verdict: &verdict,
            held_then: then.as_ref(),
        },
        || Lines::Untrusted(lines(&message, &verdict, then.as_ref())),
    )?;
    Ok(Exit::Ok)
}

/// Stdin, to one byte past the bound (so that a longer input is told apart).
fn read_stdin() -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(oom_message::MAX_MESSAGE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .context("cannot read the message from stdin")?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The history's moment at the OOM's time: `--history` must open; the default store is
/// used only when it exists.
fn held_then(
    global: &GlobalArgs,
    args: &ExplainOomArgs,
    message: &OomMessage,
) -> anyhow::Result<Option<HeldThen>> {
    let path = match &args.history {
        Some(p) => p.clone(),
        None => match super::db_path(global) {
            Ok(p) if p.is_file() => p,
            _ => return Ok(None),
        },
    };
    let mut store = super::open_history(&path)?;
    let tz = wall_time::zone(args.tz.as_deref())?;
    let now = jiff::Timestamp::now().as_millisecond();
    let asked = match &args.at {
        Some(at) => Some(at.resolve(now, &tz).context("--at")?),
        None => message
            .figures
            .logged_at
            .as_deref()
            // Log lines carry microseconds; the time parser takes whole seconds.
            .and_then(|t| t.split('.').next())
            .and_then(|t| t.parse::<When>().ok())
            .and_then(|w| w.resolve(now, &tz).ok()),
    };
    let moment: Option<RecordedMoment> = match store.moment_near(asked)? {
        MomentLookup::Found(m) => Some(*m),
        MomentLookup::Empty | MomentLookup::BeforeFirst { .. } => None,
        MomentLookup::AfterLast { .. } | MomentLookup::InGap { .. } => {
            store.moment_at_or_before(asked.unwrap_or(i64::MAX))?
        }
    };
    let Some(moment) = moment else {
        return Ok(None);
    };
    let device = message.figures.device.unwrap_or(0);
    let Some(dev) = moment.devices.iter().find(|d| d.info.index == device) else {
        return Ok(None);
    };
    let reading = dev.reading();
    let holders = reading
        .and_then(|r| r.processes.as_ref())
        .map(|ps| {
            ps.iter()
                .filter_map(|p| {
                    let bytes = p.used_bytes?;
                    let rec = moment.processes.get(&p.pid);
                    Some(Holder {
                        pid: p.pid,
                        bytes,
                        user: rec.and_then(|r| r.record.meta.user.clone()),
                        command: rec.and_then(|r| r.record.meta.command.clone()),
                        container: rec.and_then(|r| r.record.meta.container_id.clone()),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Some(HeldThen {
        at_unix_ms: moment.at_unix_ms,
        device_total_bytes: reading.and_then(|r| r.memory.map(|m| m.total_bytes)),
        holders,
    }))
}

fn lines(m: &OomMessage, v: &MessageVerdict, then: Option<&HeldThen>) -> Vec<String> {
    let mut out = vec![format!(
        "{}: {} — fix: {}",
        match m.framework {
            oom_message::Framework::Pytorch => "pytorch",
            oom_message::Framework::Jax => "jax",
            oom_message::Framework::Tensorflow => "tensorflow",
        },
        v.cause.map_or("cause unknown", |c| c.as_str()),
        v.fix.as_deref().unwrap_or("none")
    )];
    out.push(format!("  why: {}", v.why));
    for c in &v.cannot_tell {
        out.push(format!("  cannot tell: {c}"));
    }
    if let Some(t) = then {
        out.push(format!(
            "on the GPU at {} (the history):",
            vramctl_store::format::rfc3339(t.at_unix_ms)
        ));
        if t.holders.is_empty() {
            out.push("  no process".to_owned());
        }
        for h in &t.holders {
            out.push(format!(
                "  PID {} {} {}{}: {}",
                h.pid,
                h.user.as_deref().unwrap_or("?"),
                h.command.as_deref().unwrap_or("?"),
                h.container
                    .as_deref()
                    .map(|c| format!(" (container {c})"))
                    .unwrap_or_default(),
                units::bytes(h.bytes)
            ));
        }
    }
    out
}
