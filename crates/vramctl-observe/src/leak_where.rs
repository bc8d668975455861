//! A leak's "where": the allocation sites whose live bytes grew between two allocator
//! snapshots of the leaking process, taken by its agent some time apart (issue 35).
//!
//! Blocks carry their allocation stack only while the allocator records its history, so a
//! probe first starts the recording (unless it already runs), waits `spacing` so that the
//! blocks a training step frees and allocates again carry stacks in both snapshots, takes
//! snapshot A, waits `spacing` again, takes B, and stops the recording it started. Live
//! blocks are grouped by the first frame of user code that allocated them
//! (`vramctl_snapshot::diff::diff_by`, `By::Frame`); the sites whose live bytes grew the
//! most are the leak's where. Blocks allocated before the recording started have no stack
//! and are never named.
//!
//! Cost, to the process: while recording (2 × `spacing`) each allocation records its
//! Python stack; each snapshot waits for the allocator's lock and pickles under the GIL
//! (round 2 measured 7.8 s for 400,000 history entries on the H200; a fresh recording
//! holds far fewer). So a probe runs only when asked (`leaks --watch --where`) and only for
//! a process judged `leak` whose agent answers, once per process. To vramctl: the files
//! are read within [`MAX_SNAPSHOT_BYTES`] (the OOM observer's bound) and each exchange
//! within [`SNAPSHOT_TIMEOUT`], on one worker thread, so the watch's ticks never wait.
//!
//! The snapshots are written by the agent, as the process's user, under
//! `/tmp/vramctl-where-PID-…` (checked creatable first, `allocator_snapshot::take`), read
//! back without following a symlink, and removed.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

use serde::Serialize;
use vramctl_agent::agent_client::{
    AgentClient, FALLBACK_BASE, HistoryRecord, SnapshotOptions, Timeouts,
};
use vramctl_agent::allocator_snapshot::{self, SnapshotRequest};
use vramctl_snapshot::top::{By, NO_STACK};

pub use crate::agent_ooms::{MAX_SNAPSHOT_BYTES, SNAPSHOT_TIMEOUT};

/// Time between starting the recording and snapshot A, and between A and B, by default:
/// a leak of 2 MB/s (the smallest the leak rules aim at, docs/leaks.md) adds 20 MB, tens
/// of blocks, in it; a training step is well inside it, so its transient blocks carry
/// stacks in both snapshots.
pub const DEFAULT_SPACING: Duration = Duration::from_secs(10);

/// Sites shown, by default.
pub const DEFAULT_SITES: usize = 3;

/// The history ring buffer of a recording a probe starts: `vramctl snapshot --record`'s
/// default (`docs/agent.md`), ample for 2 × spacing of allocations.
const MAX_HISTORY_ENTRIES: u32 = 100_000;

/// One allocation site whose live bytes grew.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GrowingSite {
    /// The first frame of user code (`function (file:line)`), or the folded stack when
    /// there is none.
    pub site: String,
    /// Live bytes it gained from A to B.
    pub grew_bytes: u64,
    /// Live blocks it gained (may be negative: fewer, larger blocks).
    pub grew_blocks: i64,
    /// Its live bytes in B.
    pub live_bytes: u64,
}

/// What a probe found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeakWhere {
    /// The process.
    pub pid: u32,
    /// When snapshots A and B were asked for, on the caller's time line (the watch's: the
    /// wall clock until it steps), ms.
    pub from_unix_ms: i64,
    /// See `from_unix_ms`.
    pub to_unix_ms: i64,
    /// Σ live bytes of B minus A, all sites (with those without a stack).
    pub live_grew_bytes: i64,
    /// The sites whose live bytes grew the most, largest first.
    pub sites: Vec<GrowingSite>,
    /// The probe started (and stopped) the allocator's history recording; `false`: it
    /// was already on, and left on.
    pub started_recording: bool,
    /// Time the process's agent spent on the probe's requests (the cost to the process).
    pub agent_ms: u64,
}

/// A probe's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The growing sites.
    Found(LeakWhere),
    /// No where: the reason (no agent, nothing to snapshot, a refused file, a timeout).
    Failed {
        /// The process.
        pid: u32,
        /// One line.
        reason: String,
    },
}

/// The bounds of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeLimits {
    /// Between starting the recording and A, and between A and B (the caller's time).
    pub spacing: Duration,
    /// Sites kept.
    pub sites: usize,
}

impl Default for ProbeLimits {
    fn default() -> Self {
        Self {
            spacing: DEFAULT_SPACING,
            sites: DEFAULT_SITES,
        }
    }
}

/// What the worker thread is asked.
enum Job {
    Start { pid: u32 },
    Take { pid: u32, stage: Stage },
    Stop { pid: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    A,
    B,
}

/// What the worker answers.
enum Done {
    Started {
        pid: u32,
        started_recording: bool,
        agent_ms: u64,
    },
    Taken {
        pid: u32,
        stage: Stage,
        snapshot: Box<vramctl_snapshot::Snapshot>,
        agent_ms: u64,
    },
    Failed {
        pid: u32,
        reason: String,
    },
    /// The recording a probe started was stopped (or could not be: nothing more to do).
    Stopped,
}

/// One probe's progress.
struct Probe {
    /// When the next step is due, on the caller's time line (`None`: waiting for the
    /// worker).
    due_ms: Option<i64>,
    next: Option<Stage>,
    /// When the step under way was sent, on the caller's time line.
    sent_at_ms: i64,
    started_recording: bool,
    agent_ms: u64,
    a: Option<(Box<vramctl_snapshot::Snapshot>, i64)>,
}

/// The probes of a watch: at most one per process, steps scheduled on the caller's time
/// line (the watch's ticks, so a simulated clock drives them too), the agent's work on one
/// worker thread.
pub struct WhereProbes {
    limits: ProbeLimits,
    jobs: Sender<Job>,
    done: Receiver<Done>,
    probes: HashMap<u32, Probe>,
    /// Processes already probed (or being probed): never twice.
    asked: std::collections::HashSet<u32>,
    finished: VecDeque<Outcome>,
}

impl std::fmt::Debug for WhereProbes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhereProbes")
            .field("limits", &self.limits)
            .field("probes", &self.probes.len())
            .finish_non_exhaustive()
    }
}

impl WhereProbes {
    /// Probes within `limits`, with their worker thread.
    ///
    /// # Errors
    /// When the thread cannot be started.
    pub fn new(limits: ProbeLimits) -> anyhow::Result<Self> {
        let (jobs, job_rx) = channel::<Job>();
        let (done_tx, done) = channel::<Done>();
        std::thread::Builder::new()
            .name("vramctl-where".into())
            .spawn(move || {
                for job in job_rx {
                    if done_tx.send(work(job)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| anyhow::anyhow!("cannot start the snapshot thread: {e}"))?;
        Ok(Self {
            limits,
            jobs,
            done,
            probes: HashMap::new(),
            asked: std::collections::HashSet::new(),
            finished: VecDeque::new(),
        })
    }

    /// Starts a probe of `pid` (judged `leak`, with an agent that answers) at `now_ms`;
    /// a process already probed is not probed again.
    pub fn want(&mut self, pid: u32) {
        if !self.asked.insert(pid) {
            return;
        }
        if self.jobs.send(Job::Start { pid }).is_ok() {
            self.probes.insert(
                pid,
                Probe {
                    due_ms: None,
                    next: Some(Stage::A),
                    sent_at_ms: 0,
                    started_recording: false,
                    agent_ms: 0,
                    a: None,
                },
            );
        }
    }

    /// Whether a probe is under way.
    pub fn busy(&self) -> bool {
        !self.probes.is_empty()
    }

    /// Takes the worker's answers and sends the steps due at `now_ms`; returns the probes
    /// that ended.
    pub fn poll(&mut self, now_ms: i64) -> Vec<Outcome> {
        let spacing_ms = i64::try_from(self.limits.spacing.as_millis()).unwrap_or(i64::MAX);
        while let Ok(done) = self.done.try_recv() {
            self.on_done(done, now_ms, spacing_ms);
        }
        for (&pid, probe) in &mut self.probes {
            if probe.due_ms.is_some_and(|due| now_ms >= due)
                && let Some(stage) = probe.next
            {
                probe.due_ms = None;
                probe.sent_at_ms = now_ms;
                if self.jobs.send(Job::Take { pid, stage }).is_err() {
                    self.finished.push_back(Outcome::Failed {
                        pid,
                        reason: "the snapshot thread stopped".into(),
                    });
                }
            }
        }
        self.finished.drain(..).collect()
    }

    /// Waits up to `deadline` for the probes under way to end (the watch is ending: no
    /// more ticks), their time going on from `now_ms`, the last tick's, on the wall clock:
    /// a step is sent once its spacing has passed in real time.
    pub fn finish(&mut self, now_ms: i64, deadline: Duration) -> Vec<Outcome> {
        let started = Instant::now();
        let mut out = Vec::new();
        let base = now_ms;
        while self.busy() && started.elapsed() < deadline {
            let now = base + i64::try_from(started.elapsed().as_millis()).unwrap_or(0);
            out.extend(self.poll(now));
            std::thread::sleep(Duration::from_millis(20));
        }
        out
    }

    fn on_done(&mut self, done: Done, now_ms: i64, spacing_ms: i64) {
        match done {
            Done::Stopped => {}
            Done::Failed { pid, reason } => {
                if let Some(p) = self.probes.remove(&pid) {
                    if p.started_recording {
                        let _ = self.jobs.send(Job::Stop { pid });
                    }
                    self.finished.push_back(Outcome::Failed { pid, reason });
                }
            }
            Done::Started {
                pid,
                started_recording,
                agent_ms,
            } => {
                if let Some(p) = self.probes.get_mut(&pid) {
                    p.started_recording = started_recording;
                    p.agent_ms += agent_ms;
                    p.due_ms = Some(now_ms.saturating_add(spacing_ms));
                }
            }
            Done::Taken {
                pid,
                stage: Stage::A,
                snapshot,
                agent_ms,
            } => {
                if let Some(p) = self.probes.get_mut(&pid) {
                    p.agent_ms += agent_ms;
                    p.a = Some((snapshot, p.sent_at_ms));
                    p.next = Some(Stage::B);
                    p.due_ms = Some(now_ms.saturating_add(spacing_ms));
                }
            }
            Done::Taken {
                pid,
                stage: Stage::B,
                snapshot,
                agent_ms,
            } => {
                let Some(p) = self.probes.remove(&pid) else {
                    return;
                };
                if p.started_recording {
                    // Left as it was found; the answer is not waited for.
                    let _ = self.jobs.send(Job::Stop { pid });
                }
                let Some((a, from_unix_ms)) = p.a else {
                    return;
                };
                self.finished.push_back(Outcome::Found(growing_sites(
                    pid,
                    (&a, from_unix_ms),
                    (&snapshot, p.sent_at_ms),
                    p.started_recording,
                    p.agent_ms + agent_ms,
                    self.limits.sites,
                )));
            }
        }
    }
}

/// The sites of `b` whose live bytes grew since `a`, by the first user frame, largest
/// first; blocks without a stack (allocated before the recording) are never a site.
pub fn growing_sites(
    pid: u32,
    (a, from_unix_ms): (&vramctl_snapshot::Snapshot, i64),
    (b, to_unix_ms): (&vramctl_snapshot::Snapshot, i64),
    started_recording: bool,
    agent_ms: u64,
    keep: usize,
) -> LeakWhere {
    let diff = vramctl_snapshot::diff::diff_by(a, b, By::Frame);
    let mut sites: Vec<GrowingSite> = diff
        .rows
        .iter()
        .filter(|r| r.delta_bytes > 0 && r.stack != NO_STACK)
        .map(|r| GrowingSite {
            site: r.stack.clone(),
            grew_bytes: u64::try_from(r.delta_bytes).unwrap_or(u64::MAX),
            grew_blocks: i64::try_from(r.b_blocks).unwrap_or(i64::MAX)
                - i64::try_from(r.a_blocks).unwrap_or(i64::MAX),
            live_bytes: r.b_bytes,
        })
        .collect();
    // The diff's rows are by |delta|: the grown ones keep that order.
    sites.truncate(keep);
    LeakWhere {
        pid,
        from_unix_ms,
        to_unix_ms,
        live_grew_bytes: i64::try_from(diff.delta_bytes).unwrap_or(i64::MAX),
        sites,
        started_recording,
        agent_ms,
    }
}

fn timeouts() -> Timeouts {
    Timeouts {
        quick: SNAPSHOT_TIMEOUT,
        reclaim: SNAPSHOT_TIMEOUT,
    }
}

fn elapsed_ms(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Does one job on the worker thread.
fn work(job: Job) -> Done {
    match job {
        Job::Start { pid } => {
            let t = Instant::now();
            match start_recording(pid) {
                Ok(started_recording) => Done::Started {
                    pid,
                    started_recording,
                    agent_ms: elapsed_ms(t),
                },
                Err(reason) => Done::Failed { pid, reason },
            }
        }
        Job::Take { pid, stage } => match take(pid, stage) {
            Ok((snapshot, agent_ms)) => Done::Taken {
                pid,
                stage,
                snapshot: Box::new(snapshot),
                agent_ms,
            },
            Err(reason) => Done::Failed { pid, reason },
        },
        Job::Stop { pid } => {
            let _ = AgentClient::connect(pid, timeouts()).and_then(|mut c| {
                c.snapshot(
                    &SnapshotOptions {
                        path: None,
                        record: Some(HistoryRecord::Stop),
                    },
                    SNAPSHOT_TIMEOUT,
                )
            });
            Done::Stopped
        }
    }
}

/// Starts the allocator's history recording unless it runs; `true` when this started it.
fn start_recording(pid: u32) -> Result<bool, String> {
    let mut client = AgentClient::connect(pid, timeouts()).map_err(|e| e.to_string())?;
    // `hello` says whether the agent's recording runs (its `history`; the typed answer
    // leaves it out): one started by the user is left as it is.
    let hello = client
        .request("hello", serde_json::Map::new(), SNAPSHOT_TIMEOUT)
        .map_err(|e| e.to_string())?;
    let recording = hello
        .get("history")
        .and_then(|h| h.get("recording"))
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    if recording {
        return Ok(false);
    }
    client
        .snapshot(
            &SnapshotOptions {
                path: None,
                record: Some(HistoryRecord::Start {
                    max_entries: MAX_HISTORY_ENTRIES,
                    all_stacks: false,
                }),
            },
            SNAPSHOT_TIMEOUT,
        )
        .map_err(|e| format!("cannot start recording allocation stacks: {e}"))?;
    Ok(true)
}

/// One snapshot of `pid`, written by its agent under /tmp, read back and removed; with the
/// time the agent took to write it.
fn take(pid: u32, stage: Stage) -> Result<(vramctl_snapshot::Snapshot, u64), String> {
    let name = format!(
        "vramctl-where-{pid}-{}-{}.pickle",
        std::process::id(),
        match stage {
            Stage::A => "a",
            Stage::B => "b",
        }
    );
    let path = Path::new(FALLBACK_BASE).join(name);
    let asked = Instant::now();
    let report = allocator_snapshot::take(&SnapshotRequest {
        pid,
        output: Some(path),
        record: None,
        timeout: SNAPSHOT_TIMEOUT,
    })
    .map_err(|e| e.to_string())?;
    let agent_ms = elapsed_ms(asked);
    let local = report.local_path.ok_or("the agent wrote no snapshot")?;
    let read = read_bounded(&local);
    // Removed whatever the read said: the file is ours to clean up (unlink follows no
    // symlink).
    let _ = std::fs::remove_file(&local);
    Ok((read?, agent_ms))
}

/// Reads a snapshot file without following a symlink and without waiting on what is not a
/// regular file (the process's user could put a symlink or a FIFO in its place: opened with
/// `O_NOFOLLOW | O_NONBLOCK`, then checked a regular file), within [`MAX_SNAPSHOT_BYTES`].
fn read_bounded(path: &PathBuf) -> Result<vramctl_snapshot::Snapshot, String> {
    use rustix::fs::{FileType, Mode, OFlags};
    let cannot =
        |e: &dyn std::fmt::Display| format!("cannot read the snapshot '{}': {e}", path.display());
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| cannot(&e))?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| cannot(&e))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(cannot(&"not a regular file"));
    }
    let file = std::fs::File::from(fd);
    let limits = vramctl_snapshot::Limits {
        max_total_bytes: MAX_SNAPSHOT_BYTES,
        ..vramctl_snapshot::Limits::default()
    };
    vramctl_snapshot::model::read_streamed(
        std::io::BufReader::new(file.take(MAX_SNAPSHOT_BYTES)),
        limits,
        vramctl_snapshot::TraceStacks::Skip,
    )
    .map_err(|e| cannot(&e))
}

#[cfg(test)]
mod tests {
    use vramctl_snapshot::model::Snapshot;

    use super::*;

    /// One segment of live blocks `(size, stack)`: stack 1 allocated at `train.py:12`,
    /// stack 2 at `data.py:40`, stack 0 before the recording (no stack).
    fn snap(blocks: &[(u64, u32)]) -> Snapshot {
        vramctl_snapshot::testing::live_blocks(
            blocks,
            &[("/w/train.py", 12, "step"), ("/w/data.py", 40, "step")],
        )
    }

    #[test]
    fn the_site_whose_live_bytes_grew_is_named_first_and_unrecorded_blocks_never() {
        const MIB: u64 = 1 << 20;
        // A: the leak's 2 blocks, a batch, 8 MiB from before the recording.
        let a = snap(&[(16 * MIB, 1), (16 * MIB, 1), (4 * MIB, 2), (8 * MIB, 0)]);
        // B: 3 more leaked blocks; the batch freed and made again; the group without a
        // stack larger (a block split after the recording started): never a site.
        let b = snap(&[
            (16 * MIB, 1),
            (16 * MIB, 1),
            (16 * MIB, 1),
            (16 * MIB, 1),
            (16 * MIB, 1),
            (4 * MIB, 2),
            (72 * MIB, 0),
        ]);
        let w = growing_sites(7, (&a, 1_000), (&b, 11_000), true, 5, 3);
        assert_eq!(w.sites.len(), 1, "{w:?}");
        let site = &w.sites[0];
        assert!(site.site.contains("train.py:12"), "{w:?}");
        assert_eq!(site.grew_bytes, 48 * MIB);
        assert_eq!(site.grew_blocks, 3);
        assert_eq!(site.live_bytes, 80 * MIB);
        assert_eq!(w.live_grew_bytes, i64::try_from(112 * MIB).unwrap());
    }
}
