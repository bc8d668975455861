//! The supervised command as a process: started with its standard streams passed through
//! (stderr copied byte for byte while its lines are scanned for out-of-memory errors),
//! signals forwarded, its exit status collected. Where its processes are kept, and how they
//! are stopped, is [`super::scope`].

use std::ffi::OsString;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use regex::Regex;
use rustix::process::{Pid, Signal, WaitOptions};

use super::oom::{self, OomSource};
use super::scope::JobScope;

/// Where the command's output goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// To ours, unchanged (`run`): stdin and stdout are the command's own, stderr is copied
    /// as it comes.
    PassThrough,
    /// Kept (the last lines of each stream, for the report) and not shown (`fit`'s trials):
    /// stdin is `/dev/null`, the command runs in its own process group.
    Captured,
}

/// What the stream readers and the signal thread tell the supervisor.
#[derive(Debug, Clone)]
pub enum ChildEvent {
    /// A line on stderr (or stdout) reported an out-of-memory error.
    OutOfMemory {
        /// When the line was read.
        at: Instant,
        /// Which allocator.
        source: OomSource,
        /// The line (at most [`MAX_LINE_SHOWN`] characters).
        line: String,
    },
    /// `--until-line` matched a line of stdout.
    UntilLine {
        /// When.
        at: Instant,
    },
    /// A signal came to the supervisor.
    Signal {
        /// Its number.
        signal: i32,
        /// Whether it was passed on to the command (not when the terminal sent it to the
        /// command's process group already).
        forwarded: bool,
    },
}

/// Characters of a matched line kept for the report.
pub const MAX_LINE_SHOWN: usize = 400;
/// Bytes of each stream kept for the report.
const TAIL_BYTES: usize = 16 * 1024;

/// The last bytes of a stream.
#[derive(Debug, Default)]
pub struct Tail {
    bytes: Vec<u8>,
}

impl Tail {
    fn push(&mut self, chunk: &[u8]) {
        self.bytes.extend_from_slice(chunk);
        if self.bytes.len() > 2 * TAIL_BYTES {
            let cut = self.bytes.len() - TAIL_BYTES;
            self.bytes.drain(..cut);
        }
    }

    /// The last `n` lines, as text.
    pub fn last_lines(&self, n: usize) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.bytes);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(n)..]
            .iter()
            .map(|l| (*l).to_string())
            .collect()
    }
}

/// The signals `run` passes on to the command. SIGINT, SIGQUIT and SIGHUP from the
/// terminal reach the command directly (it is in the terminal's foreground process group
/// with `run`), so those are passed on only when another process sent them.
pub const FORWARDED: [i32; 6] = [
    libc_signal::SIGINT,
    libc_signal::SIGTERM,
    libc_signal::SIGHUP,
    libc_signal::SIGQUIT,
    libc_signal::SIGUSR1,
    libc_signal::SIGUSR2,
];

/// Signal numbers as `i32`, the form signal-hook and wait statuses use (rustix's values).
pub mod libc_signal {
    use rustix::process::Signal;

    /// Interrupt.
    pub const SIGINT: i32 = Signal::INT.as_raw();
    /// Hang-up.
    pub const SIGHUP: i32 = Signal::HUP.as_raw();
    /// Quit.
    pub const SIGQUIT: i32 = Signal::QUIT.as_raw();
    /// Kill.
    pub const SIGKILL: i32 = Signal::KILL.as_raw();
    /// User 1.
    pub const SIGUSR1: i32 = Signal::USR1.as_raw();
    /// User 2.
    pub const SIGUSR2: i32 = Signal::USR2.as_raw();
    /// Terminate.
    pub const SIGTERM: i32 = Signal::TERM.as_raw();
}

/// The signal thread: installed once per command, pointed at each job in turn.
#[derive(Debug)]
pub struct SignalForwarder {
    /// PID of the job to forward to (0: none now).
    target: Arc<AtomicU32>,
    /// 1 when the job has its own process group (signal the group), else 0.
    own_group: Arc<AtomicI32>,
    events: Receiver<ChildEvent>,
    handle: signal_hook::iterator::backend::Handle,
}

impl SignalForwarder {
    /// Installs the handlers for [`FORWARDED`].
    ///
    /// # Errors
    /// The handlers or the thread cannot be set up.
    pub fn install() -> std::io::Result<Self> {
        use signal_hook::iterator::SignalsInfo;
        use signal_hook::iterator::exfiltrator::WithOrigin;
        use signal_hook::low_level::siginfo::Cause;

        let mut signals = SignalsInfo::<WithOrigin>::new(FORWARDED)?;
        let handle = signals.handle();
        let target = Arc::new(AtomicU32::new(0));
        let own_group = Arc::new(AtomicI32::new(0));
        let (tx, events) = std::sync::mpsc::channel();
        let (t, g) = (Arc::clone(&target), Arc::clone(&own_group));
        std::thread::Builder::new()
            .name("vramctl-run-signals".into())
            .spawn(move || {
                for origin in signals.forever() {
                    let pid = t.load(Ordering::SeqCst);
                    let group = g.load(Ordering::SeqCst) == 1;
                    // From the terminal (the kernel) to a job in our process group: it has
                    // it already. A job in its own group never gets the terminal's.
                    let from_terminal = matches!(origin.cause, Cause::Kernel);
                    let forwarded = pid != 0 && (group || !from_terminal);
                    if forwarded {
                        send(pid, group, origin.signal);
                    }
                    let event = ChildEvent::Signal {
                        signal: origin.signal,
                        forwarded,
                    };
                    if tx.send(event).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Self {
            target,
            own_group,
            events,
            handle,
        })
    }

    fn point_at(&self, pid: u32, own_group: bool) {
        self.own_group.store(i32::from(own_group), Ordering::SeqCst);
        self.target.store(pid, Ordering::SeqCst);
    }

    /// Forwards nothing more: the job's command has exited and been reaped, so its PID may
    /// name another process by now.
    pub fn release(&self) {
        self.target.store(0, Ordering::SeqCst);
    }

    /// The signals that came since the last call.
    pub fn drain(&self) -> Vec<ChildEvent> {
        self.events.try_iter().collect()
    }
}

impl Drop for SignalForwarder {
    fn drop(&mut self) {
        self.handle.close();
    }
}

/// `signal` to `pid`, or to its process group.
fn send(pid: u32, group: bool, signal: i32) {
    let (Some(pid), Some(sig)) = (
        i32::try_from(pid).ok().and_then(Pid::from_raw),
        Signal::from_named_raw(signal),
    ) else {
        return;
    };
    let sent = if group {
        rustix::process::kill_process_group(pid, sig)
    } else {
        rustix::process::kill_process(pid, sig)
    };
    if let Err(err) = sent {
        tracing::debug!(pid = pid.as_raw_nonzero().get(), signal, %err, "Could not pass a signal on.");
    }
}

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// It exited with this code.
    Code(i32),
    /// A signal ended it.
    Signal(i32),
}

impl ExitStatus {
    /// The shell's convention: the code, or 128 + the signal.
    pub fn shell_code(self) -> i32 {
        match self {
            Self::Code(c) => c,
            Self::Signal(s) => 128 + s,
        }
    }
}

/// Why a command could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// No such program.
    #[error("cannot run '{program}': no such file or command on PATH")]
    NotFound {
        /// As typed.
        program: String,
    },
    /// Not executable.
    #[error("cannot run '{program}': permission denied (is it executable?)")]
    NotExecutable {
        /// As typed.
        program: String,
    },
    /// Anything else.
    #[error("cannot run '{program}': {source}")]
    Other {
        /// As typed.
        program: String,
        /// Why.
        source: std::io::Error,
    },
}

impl SpawnError {
    /// The shell's code for it: 127 not found, 126 not executable.
    pub fn shell_code(&self) -> i32 {
        match self {
            Self::NotFound { .. } => 127,
            Self::NotExecutable { .. } | Self::Other { .. } => 126,
        }
    }
}

/// The started command.
#[derive(Debug)]
pub struct RunningChild {
    pid: u32,
    reap_orphans: bool,
    events: Receiver<ChildEvent>,
    stdout_tail: Arc<Mutex<Tail>>,
    stderr_tail: Arc<Mutex<Tail>>,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

/// What to start.
#[derive(Debug)]
pub struct ChildSpec<'a> {
    /// Program and arguments.
    pub argv: &'a [OsString],
    /// Variables added to (or replacing in) our environment.
    pub env: &'a [(OsString, OsString)],
    /// Where its output goes.
    pub output: Output,
    /// Stop when a line of stdout matches.
    pub until_line: Option<&'a Regex>,
    /// `run` is a child subreaper: reap every child that comes to it, not only this one.
    pub reap_orphans: bool,
    /// Where its processes are kept: the command joins it before `exec`.
    pub scope: &'a JobScope,
}

/// Starts the command and points `signals` at it.
///
/// # Errors
/// It cannot be started.
pub fn spawn(spec: &ChildSpec<'_>, signals: &SignalForwarder) -> Result<RunningChild, SpawnError> {
    use std::os::unix::process::CommandExt;

    let program = spec.argv.first().cloned().unwrap_or_default();
    let shown = program.to_string_lossy().into_owned();
    let mut command = Command::new(&program);
    command.args(&spec.argv[1..]).envs(spec.env.iter().cloned());
    let captured = spec.output == Output::Captured;
    let pipe_stdout = captured || spec.until_line.is_some();
    command.stderr(Stdio::piped());
    command.stdout(if pipe_stdout {
        Stdio::piped()
    } else {
        Stdio::inherit()
    });
    command.stdin(if captured {
        Stdio::null()
    } else {
        Stdio::inherit()
    });
    if captured {
        // Its own group: stopping a trial stops every process of it, and the terminal's
        // Ctrl-C comes to us first (the trial has no terminal input anyway).
        command.process_group(0);
    }
    spec.scope.prepare(&mut command);
    let mut child = command.spawn().map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => SpawnError::NotFound {
            program: shown.clone(),
        },
        std::io::ErrorKind::PermissionDenied => SpawnError::NotExecutable {
            program: shown.clone(),
        },
        _ => SpawnError::Other {
            program: shown.clone(),
            source,
        },
    })?;
    let pid = child.id();
    signals.point_at(pid, captured);
    let (tx, events) = std::sync::mpsc::channel();
    let stdout_tail = Arc::new(Mutex::new(Tail::default()));
    let stderr_tail = Arc::new(Mutex::new(Tail::default()));
    let mut readers = Vec::new();
    if let Some(stderr) = child.stderr.take() {
        let sink = (!captured).then(|| Box::new(std::io::stderr()) as Box<dyn Write + Send>);
        readers.push(reader(
            "vramctl-run-stderr",
            stderr,
            sink,
            Arc::clone(&stderr_tail),
            None,
            tx.clone(),
        ));
    }
    if let Some(stdout) = child.stdout.take() {
        let sink = (!captured).then(|| Box::new(std::io::stdout()) as Box<dyn Write + Send>);
        readers.push(reader(
            "vramctl-run-stdout",
            stdout,
            sink,
            Arc::clone(&stdout_tail),
            spec.until_line.cloned(),
            tx,
        ));
    }
    // The std handle is dropped without waiting: `poll_exit` collects the status, since a
    // subreaper must reap with waitpid(-1) anyway.
    drop(child);
    Ok(RunningChild {
        pid,
        reap_orphans: spec.reap_orphans,
        events,
        stdout_tail,
        stderr_tail,
        readers,
        status: None,
    })
}

/// A thread that copies one stream to `sink` as it comes, keeps its tail and scans its
/// lines (out-of-memory messages on both streams; `until` on stdout).
fn reader(
    name: &str,
    mut stream: impl Read + Send + 'static,
    mut sink: Option<Box<dyn Write + Send>>,
    tail: Arc<Mutex<Tail>>,
    until: Option<Regex>,
    tx: Sender<ChildEvent>,
) -> JoinHandle<()> {
    let spawned = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let mut buf = vec![0u8; 8192];
            let mut line: Vec<u8> = Vec::new();
            let mut until_seen = false;
            loop {
                let n = match stream.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                };
                let chunk = &buf[..n];
                if let Some(out) = sink.as_mut() {
                    // A closed stderr of ours must not stop the command: drop the copy.
                    if out.write_all(chunk).and_then(|()| out.flush()).is_err() {
                        sink = None;
                    }
                }
                if let Ok(mut t) = tail.lock() {
                    t.push(chunk);
                }
                for &byte in chunk {
                    if byte == b'\n' || line.len() >= 64 * 1024 {
                        scan(&line, until.as_ref(), &mut until_seen, &tx);
                        line.clear();
                    }
                    if byte != b'\n' {
                        line.push(byte);
                    }
                }
            }
            if !line.is_empty() {
                scan(&line, until.as_ref(), &mut until_seen, &tx);
            }
        });
    match spawned {
        Ok(handle) => handle,
        Err(err) => {
            tracing::warn!(%err, "Could not start a stream reader; the command's output is lost.");
            std::thread::spawn(|| {})
        }
    }
}

fn scan(line: &[u8], until: Option<&Regex>, until_seen: &mut bool, tx: &Sender<ChildEvent>) {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches('\r');
    if let Some(source) = oom::match_line(text) {
        let _ = tx.send(ChildEvent::OutOfMemory {
            at: Instant::now(),
            source,
            line: text.chars().take(MAX_LINE_SHOWN).collect(),
        });
    }
    if !*until_seen && until.is_some_and(|re| re.is_match(text)) {
        *until_seen = true;
        let _ = tx.send(ChildEvent::UntilLine { at: Instant::now() });
    }
}

impl RunningChild {
    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Events from its streams since the last call.
    pub fn drain(&self) -> Vec<ChildEvent> {
        self.events.try_iter().collect()
    }

    /// Its exit status once it has exited (and reaps orphans that came to us meanwhile).
    pub fn poll_exit(&mut self) -> Option<ExitStatus> {
        if self.status.is_some() {
            return self.status;
        }
        let me = i32::try_from(self.pid).ok().and_then(Pid::from_raw)?;
        loop {
            // `waitpid(None)` is pid 0, this process group only; `wait` is -1, any child
            // (a trial has its own group).
            let waited = if self.reap_orphans {
                rustix::process::wait(WaitOptions::NOHANG)
            } else {
                rustix::process::waitpid(Some(me), WaitOptions::NOHANG)
            };
            match waited {
                Ok(Some((pid, status))) => {
                    if pid == me {
                        self.status = status
                            .exit_status()
                            .map(ExitStatus::Code)
                            .or_else(|| status.terminating_signal().map(ExitStatus::Signal));
                        return self.status;
                    }
                    // An orphan of the tree, re-parented to us: reaped, look again.
                }
                Ok(None) => return None,
                Err(err) => {
                    tracing::debug!(%err, "waitpid failed");
                    return None;
                }
            }
        }
    }

    /// Reaps the children that exited since, the command's orphans that came to us among
    /// them (a subreaper only: otherwise `wait(-1)` could take a status that is not ours).
    pub fn reap_orphans(&mut self) {
        if !self.reap_orphans {
            return;
        }
        let me = i32::try_from(self.pid).ok().and_then(Pid::from_raw);
        while let Ok(Some((pid, status))) = rustix::process::wait(WaitOptions::NOHANG) {
            if Some(pid) == me && self.status.is_none() {
                self.status = status
                    .exit_status()
                    .map(ExitStatus::Code)
                    .or_else(|| status.terminating_signal().map(ExitStatus::Signal));
            }
        }
    }

    /// Waits for the stream readers to finish (the streams close when the last process
    /// holding them exits; a descendant still running keeps them open, so this waits at
    /// most `limit`).
    pub fn finish_streams(&mut self, limit: std::time::Duration) {
        let deadline = Instant::now() + limit;
        while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        for reader in std::mem::take(&mut self.readers) {
            if reader.is_finished() {
                let _ = reader.join();
            }
        }
    }

    /// The last `n` lines of stderr.
    pub fn stderr_lines(&self, n: usize) -> Vec<String> {
        self.stderr_tail
            .lock()
            .map(|t| t.last_lines(n))
            .unwrap_or_default()
    }

    /// The last `n` lines of stdout (captured only).
    pub fn stdout_lines(&self, n: usize) -> Vec<String> {
        self.stdout_tail
            .lock()
            .map(|t| t.last_lines(n))
            .unwrap_or_default()
    }
}
