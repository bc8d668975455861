//! Slurm jobs, for real: Debian's `slurm-wlm` (slurmctld and slurmd on this one machine,
//! with munged) runs `sbatch` jobs whose programs announce themselves as GPU processes
//! through the fake NVML's process directory, and vramctl names each process's job, step,
//! user and partition with no prolog script.
//!
//! The cluster needs root (slurmd starts jobs as their users) and the packages `slurm-wlm`
//! and `munge`. Without them the tests are skipped with a line saying so, unless
//! `VRAMCTL_TEST_STRICT=1` (CI), which makes that a failure. `scripts/test.sh` installs the
//! packages as root.
//!
//! The cluster tracks processes with `proctrack/cgroup` where slurmd can use the cgroups
//! (cgroup v1 controllers, or a cgroup v2 tree it may write with `IgnoreSystemd=yes`), else
//! with `proctrack/linuxproc`, where only the environment names a job; each test checks
//! the source vramctl reports against the one the cluster runs with.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{json_of, vramctl};
use crate::real_processes::Scenario;

const MIB: u64 = 1 << 20;
/// The user jobs run as (Debian's `nobody`).
const JOB_UID: u32 = 65534;

/// How the cluster tracks a job's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proctrack {
    /// `proctrack/cgroup`: each step's processes in the step's cgroup.
    Cgroup,
    /// `proctrack/linuxproc`: the process tree only; no cgroup names the job.
    Linuxproc,
}

/// Where Slurm's programs are.
struct Programs {
    munged: PathBuf,
    slurmctld: PathBuf,
    slurmd: PathBuf,
    sbatch: PathBuf,
    sinfo: PathBuf,
    squeue: PathBuf,
    scancel: PathBuf,
}

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

impl Programs {
    fn find() -> Result<Self, String> {
        let get = |name: &str| find_program(name).ok_or_else(|| format!("{name} is not installed"));
        Ok(Self {
            munged: get("munged")?,
            slurmctld: get("slurmctld")?,
            slurmd: get("slurmd")?,
            sbatch: get("sbatch")?,
            sinfo: get("sinfo")?,
            squeue: get("squeue")?,
            scancel: get("scancel")?,
        })
    }
}

/// Whether to skip a Slurm test (and why, printed): not root, or the packages missing.
/// Under `VRAMCTL_TEST_STRICT=1` either is a failure instead (unless `VRAMCTL_SKIP_SLURM=1`
/// says to skip).
fn skip_without_slurm() -> bool {
    let why = if !is_root() {
        "the tests are not running as root (slurmd must)".to_owned()
    } else {
        match Programs::find() {
            Ok(_) => return false,
            Err(e) => format!("{e} (apt-get install slurm-wlm munge; scripts/test.sh does)"),
        }
    };
    // scripts/test.sh sets VRAMCTL_SKIP_SLURM=1 when it could not install the packages.
    assert!(
        std::env::var("VRAMCTL_TEST_STRICT").as_deref() != Ok("1")
            || std::env::var("VRAMCTL_SKIP_SLURM").as_deref() == Ok("1"),
        "the Slurm tests cannot run: {why}, and VRAMCTL_TEST_STRICT=1"
    );
    eprintln!("skipped: the Slurm tests need a real Slurm: {why}");
    true
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// A free TCP port on 127.0.0.1 (closed again; Slurm binds it a moment later).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn wait_until(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    ready()
}

/// munged, slurmctld and slurmd on localhost, their files in a temporary directory; all
/// stopped (jobs cancelled first) when dropped, also when a test panics.
pub struct SlurmCluster {
    dir: tempfile::TempDir,
    programs: Programs,
    conf: PathBuf,
    /// The node's name (unique per cluster: Slurm's cgroup v1 root is `slurm_<node>`).
    pub node: String,
    /// The one partition.
    pub partition: String,
    /// How this cluster tracks processes.
    pub proctrack: Proctrack,
    daemons: Vec<(&'static str, Child)>,
}

impl SlurmCluster {
    /// Starts a cluster with `proctrack/cgroup`, or, where slurmd cannot use cgroups here,
    /// with `proctrack/linuxproc`.
    pub fn start() -> Self {
        Self::start_with_conf("")
    }

    fn start_with(proctrack: Proctrack) -> Result<Self, String> {
        Self::start_configured(proctrack, "")
    }

    /// As [`start`](Self::start), with `extra` lines in slurm.conf (an `Epilog=`).
    pub fn start_with_conf(extra: &str) -> Self {
        match Self::start_configured(Proctrack::Cgroup, extra) {
            Ok(cluster) => cluster,
            Err(why) => {
                eprintln!("proctrack/cgroup does not work here ({why}); using proctrack/linuxproc");
                Self::start_configured(Proctrack::Linuxproc, extra)
                    .unwrap_or_else(|why| panic!("{why}"))
            }
        }
    }

    fn start_configured(proctrack: Proctrack, extra: &str) -> Result<Self, String> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let programs = Programs::find()?;
        let dir = tempfile::tempdir_in("/tmp").map_err(|e| format!("a temp dir: {e}"))?;
        // munged and slurm's clients (run as the job's user) need to reach the socket and
        // read slurm.conf; the key stays in a 0700 directory.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
        let keys = dir.path().join("keys");
        for sub in ["keys", "state", "spool", "log"] {
            std::fs::create_dir(dir.path().join(sub)).map_err(|e| e.to_string())?;
        }
        std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| e.to_string())?;
        let mut key = vec![0u8; 1024];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut key))
            .map_err(|e| e.to_string())?;
        let key_file = keys.join("munge.key");
        std::fs::write(&key_file, &key).map_err(|e| e.to_string())?;
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o400))
            .map_err(|e| e.to_string())?;

        let node = format!(
            "vt{}n{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map_err(|e| e.to_string())?
            .trim()
            .to_owned();
        let mut cluster = Self {
            conf: dir.path().join("slurm.conf"),
            dir,
            programs,
            node,
            partition: "gpuq".to_owned(),
            proctrack,
            daemons: Vec::new(),
        };
        let d = cluster.dir.path().to_owned();
        let socket = d.join("munge.sock");
        let mut munged = Command::new(&cluster.programs.munged);
        munged
            .arg("--foreground")
            .arg(format!("--key-file={}", key_file.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", keys.join("munged.pid").display()))
            .arg(format!(
                "--seed-file={}",
                keys.join("munged.seed").display()
            ))
            .arg(format!("--log-file={}", d.join("log/munged.log").display()));
        cluster.spawn("munged", munged)?;
        if !wait_until(Duration::from_secs(10), || socket.exists()) {
            return Err(cluster.failure("munged made no socket"));
        }

        let (proctrack_type, task_plugin) = match proctrack {
            Proctrack::Cgroup => ("proctrack/cgroup", "task/none"),
            Proctrack::Linuxproc => ("proctrack/linuxproc", "task/none"),
        };
        let conf = format!(
            "ClusterName=vramctltest\n\
             SlurmctldHost={hostname}(127.0.0.1)\n\
             SlurmUser=root\nSlurmdUser=root\n\
             SlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\n\
             AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={socket}\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\n\
             SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd.log\n\
             ProctrackType={proctrack_type}\nTaskPlugin={task_plugin}\n\
             JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
             SchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
             MpiDefault=none\nReturnToService=2\nPlugStackConfig={d}/plugstack.conf\n\
             NodeName={node} NodeHostname={hostname} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN\n\
             PartitionName={partition} Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n{extra}",
            ctld_port = free_port(),
            slurmd_port = free_port(),
            socket = socket.display(),
            d = d.display(),
            node = cluster.node,
            partition = cluster.partition,
        );
        std::fs::write(&cluster.conf, conf).map_err(|e| e.to_string())?;
        // autodetect: cgroup v1 where the controllers are v1 (this is what Debian's 22.05
        // picks on a hybrid host), v2 on a unified host; IgnoreSystemd: no systemd in a
        // container, slurmd makes its cgroup directories itself.
        std::fs::write(
            d.join("cgroup.conf"),
            "CgroupPlugin=autodetect\nIgnoreSystemd=yes\n",
        )
        .map_err(|e| e.to_string())?;
        std::fs::write(d.join("plugstack.conf"), "").map_err(|e| e.to_string())?;
        for file in ["slurm.conf", "cgroup.conf", "plugstack.conf"] {
            std::fs::set_permissions(d.join(file), std::fs::Permissions::from_mode(0o644))
                .map_err(|e| e.to_string())?;
        }

        let mut ctld = Command::new(&cluster.programs.slurmctld);
        ctld.args(["-D", "-i"]);
        cluster.spawn("slurmctld", ctld)?;
        let mut slurmd = Command::new(&cluster.programs.slurmd);
        slurmd.args(["-D", "-N", &cluster.node]);
        cluster.spawn("slurmd", slurmd)?;

        let idle = wait_until(Duration::from_secs(30), || {
            cluster.daemons_alive() && cluster.node_state().as_deref() == Some("idle")
        });
        if !idle {
            return Err(cluster.failure(&format!(
                "the node is not idle after 30 s (state {:?})",
                cluster.node_state()
            )));
        }
        Ok(cluster)
    }

    /// A command of the cluster's with only PATH and SLURM_CONF from the environment.
    fn command(&self, program: &Path) -> Command {
        let mut command = Command::new(program);
        command
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("SLURM_CONF", &self.conf)
            .current_dir(self.dir.path());
        command
    }

    fn spawn(&mut self, name: &'static str, mut command: Command) -> Result<(), String> {
        let d = self.dir.path();
        let log = |suffix: &str| {
            std::fs::File::create(d.join(format!("log/{name}.{suffix}")))
                .map(Stdio::from)
                .map_err(|e| e.to_string())
        };
        command
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
            .env("SLURM_CONF", &self.conf)
            .current_dir(d)
            .stdin(Stdio::null())
            .stdout(log("out")?)
            .stderr(log("err")?);
        let child = command.spawn().map_err(|e| format!("{name}: {e}"))?;
        self.daemons.push((name, child));
        Ok(())
    }

    fn daemons_alive(&mut self) -> bool {
        self.daemons
            .iter_mut()
            .all(|(_, child)| matches!(child.try_wait(), Ok(None)))
    }

    fn node_state(&self) -> Option<String> {
        let out = self
            .command(&self.programs.sinfo)
            .args(["-h", "-n", &self.node, "-o", "%T"])
            .output()
            .ok()?;
        Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// `what`, with the daemons' logs, for a failure message.
    fn failure(&self, what: &str) -> String {
        let mut text = format!("{what}; the logs:\n");
        for name in [
            "munged.log",
            "slurmctld.log",
            "slurmd.log",
            "slurmd.err",
            "slurmctld.err",
        ] {
            let log =
                std::fs::read_to_string(self.dir.path().join("log").join(name)).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            text.push_str(&format!("--- {name}\n"));
            for line in tail.iter().rev() {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    /// A directory (0755) the job's user may read; for scripts.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `sbatch --parsable ARGS` as the job user, with `env` as the job's environment on top
    /// of PATH and SLURM_CONF; the job id.
    pub fn sbatch(&self, env: &[(&str, &Path)], args: &[&str]) -> u32 {
        let out = Command::new(find_program("setpriv").expect("setpriv (util-linux)"))
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("SLURM_CONF", &self.conf)
            .envs(env.iter().copied())
            .current_dir(self.dir.path())
            .args([
                format!("--reuid={JOB_UID}"),
                format!("--regid={JOB_UID}"),
                "--clear-groups".to_owned(),
            ])
            .arg(&self.programs.sbatch)
            .arg("--parsable")
            .args(args)
            .output()
            .expect("run sbatch");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "sbatch failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.failure("sbatch")
        );
        stdout
            .trim()
            .split(';')
            .next()
            .and_then(|id| id.parse().ok())
            .unwrap_or_else(|| panic!("sbatch printed no job id: {stdout:?}"))
    }

    /// The ids of the jobs not yet ended.
    fn jobs(&self) -> Vec<String> {
        self.command(&self.programs.squeue)
            .args(["-h", "-o", "%i"])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Removes the cgroup v1 directories slurmd made for this node (slurmd leaves its root
    /// `slurm_<node>` in each controller); empty ones only, deepest first.
    fn remove_cgroups(&self) {
        fn remove_empty_tree(dir: &Path) {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        remove_empty_tree(&entry.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else {
            return;
        };
        for controller in controllers.flatten() {
            remove_empty_tree(&controller.path().join(format!("slurm_{}", self.node)));
        }
    }
}

impl Drop for SlurmCluster {
    fn drop(&mut self) {
        // Jobs first (their slurmstepd outlives slurmd), then the daemons, newest first.
        let jobs = self.jobs();
        if !jobs.is_empty() {
            let _ = self
                .command(&self.programs.scancel)
                .args(&jobs)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            wait_until(Duration::from_secs(15), || self.jobs().is_empty());
        }
        while let Some((_, mut child)) = self.daemons.pop() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(10) {
                if !matches!(child.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if self.proctrack == Proctrack::Cgroup {
            self.remove_cgroups();
        }
    }
}

/// A directory every user may write (the job's user announces its processes there).
fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir_in("/tmp").expect("a temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777))
        .expect("chmod 1777");
    dir
}

/// The announced processes in `procs`: `(pid, bytes on GPU 0)`.
fn announced(procs: &Path) -> Vec<(u32, u64)> {
    let mut found: Vec<(u32, u64)> = std::fs::read_dir(procs)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| {
                    let pid = e.file_name().to_str()?.parse().ok()?;
                    let text = std::fs::read_to_string(e.path()).ok()?;
                    let bytes = text.trim().split_once(' ')?.1.parse().ok()?;
                    Some((pid, bytes))
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort_unstable();
    found
}

/// `gpu-job.sh` copied where the job's user can run it.
fn job_script(cluster: &SlurmCluster) -> PathBuf {
    let to = cluster.dir().join("gpu-job.sh");
    std::fs::copy(crate::gpu_job::script(), &to).expect("copy gpu-job.sh");
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    to
}

/// The process of `report` with `pid`.
fn process(report: &serde_json::Value, pid: u32) -> &serde_json::Value {
    report["processes"]
        .as_array()
        .and_then(|list| list.iter().find(|p| p["pid"] == pid))
        .unwrap_or_else(|| panic!("no process {pid} in {report:#}"))
}

#[test]
fn every_process_of_a_real_job_carries_its_job_with_no_prolog() {
    if skip_without_slurm() {
        return;
    }
    every_process_carries_its_job(&SlurmCluster::start());
}

#[test]
fn under_proctrack_linuxproc_the_environment_names_the_job() {
    if skip_without_slurm() {
        return;
    }
    let cluster =
        SlurmCluster::start_with(Proctrack::Linuxproc).unwrap_or_else(|why| panic!("{why}"));
    every_process_carries_its_job(&cluster);
}

/// A batch job with a step and a process claiming another job: each is named with its job,
/// step, user and partition, from the source the cluster's process tracking allows.
fn every_process_carries_its_job(cluster: &SlurmCluster) {
    let procs = shared_dir();
    let out = shared_dir();
    let script = job_script(cluster);
    let script = script.display();
    // The batch script starts a step (srun, 1512 MiB), a process that claims another job in
    // its environment (1012 MiB), and becomes itself a GPU process (2512 MiB).
    let wrap =
        format!("srun --quiet {script} 10 & SLURM_JOB_ID=424242 {script} 5 & exec {script} 20");
    let job = cluster.sbatch(
        &[("FAKE_NVML_PROCESS_DIR", procs.path())],
        &[
            "--export=ALL,JOB_STEPS=1,JOB_STEP_S=600",
            "--output",
            &format!("{}/slurm-%j.out", out.path().display()),
            "--chdir",
            &out.path().display().to_string(),
            "--wrap",
            &wrap,
        ],
    );
    assert!(
        wait_until(Duration::from_secs(30), || announced(procs.path()).len()
            == 3),
        "the job's three processes did not announce themselves: {:?}\n{}",
        announced(procs.path()),
        cluster.failure("job")
    );
    let by_bytes = |mib: u64| {
        announced(procs.path())
            .iter()
            .find(|(_, bytes)| *bytes == mib * MIB)
            .map(|(pid, _)| *pid)
            .unwrap_or_else(|| panic!("no process holds {mib} MiB"))
    };
    let (batch, step, claimant) = (by_bytes(2512), by_bytes(1512), by_bytes(1012));

    let scenario = Scenario::new(1, &[]);
    let report = json_of(
        vramctl(scenario.path())
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .args(["ps", "--json", "--cpu-interval", "0"]),
    );
    let source = match cluster.proctrack {
        Proctrack::Cgroup => "cgroup",
        Proctrack::Linuxproc => "environ",
    };
    eprintln!("Slurm tracks processes with {:?}", cluster.proctrack);
    for (pid, step_name) in [(batch, "batch"), (step, "0")] {
        let slurm = &process(&report, pid)["slurm"];
        assert_eq!(slurm["job_id"], job, "{pid}: {slurm:#}");
        assert_eq!(slurm["user"], "nobody", "{slurm:#}");
        assert_eq!(slurm["partition"], cluster.partition, "{slurm:#}");
        assert_eq!(slurm["source"], source, "{slurm:#}");
        // Under linuxproc, the batch script's environment has no step id.
        if source == "cgroup" || step_name != "batch" {
            assert_eq!(slurm["step"], step_name, "{slurm:#}");
        }
    }
    // status --json names the same job for each GPU's processes.
    let status = json_of(
        vramctl(scenario.path())
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .args(["status", "--json"]),
    );
    let in_status = status["devices"][0]["processes"]
        .as_array()
        .and_then(|list| list.iter().find(|p| p["pid"] == batch))
        .unwrap_or_else(|| panic!("no process {batch} in {status:#}"));
    assert_eq!(in_status["slurm"]["job_id"], job, "{in_status:#}");
    assert_eq!(in_status["slurm"]["source"], source, "{in_status:#}");
    // Totals per job: under cgroup tracking the claimant counts in the job it is in.
    let by_job = json_of(
        vramctl(scenario.path())
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .args(["ps", "--by", "job", "--json"]),
    );
    assert_eq!(by_job["by"], "job", "{by_job:#}");
    let (in_job, claimed_mib) = match cluster.proctrack {
        Proctrack::Cgroup => (3, 2512 + 1512 + 1012),
        Proctrack::Linuxproc => (2, 2512 + 1512),
    };
    let job_text = job.to_string();
    let label = format!("{job} (nobody, {})", cluster.partition);
    let owner_of_job = |report: &serde_json::Value| -> serde_json::Value {
        report["owners"]
            .as_array()
            .and_then(|list| list.iter().find(|o| o["owner"] == job_text.as_str()))
            .cloned()
            .unwrap_or_else(|| panic!("job {job} is an owner: {report:#}"))
    };
    let owner = owner_of_job(&by_job);
    assert_eq!(owner["gpu"], 0, "{by_job:#}");
    assert_eq!(owner["label"], label.as_str(), "{by_job:#}");
    assert_eq!(owner["mapped"], true, "{by_job:#}");
    assert_eq!(owner["processes"], in_job, "{by_job:#}");
    assert_eq!(owner["used_bytes"], claimed_mib * MIB, "{by_job:#}");
    let text = crate::harness::stdout_of(
        vramctl(scenario.path())
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .env("COLUMNS", "200")
            .args(["ps", "--by", "job"]),
    );
    assert!(
        text.lines().any(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.first() == Some(&"0")
                && words.get(1) == Some(&in_job.to_string().as_str())
                && l.trim_end().ends_with(&label)
        }),
        "{text}"
    );
    // status --by job: the same rows under the GPU.
    let status_by_job = json_of(
        vramctl(scenario.path())
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .args(["status", "--by", "job", "--json"]),
    );
    assert_eq!(status_by_job["by"], "job", "{status_by_job:#}");
    let in_device = status_by_job["devices"][0]["owners"]
        .as_array()
        .and_then(|list| list.iter().find(|o| o["owner"] == job_text.as_str()))
        .cloned()
        .unwrap_or_else(|| panic!("job {job} is an owner of GPU 0: {status_by_job:#}"));
    assert_eq!(in_device, owner, "{status_by_job:#}");
    let text = crate::harness::stdout_of(
        vramctl(scenario.path())
            .env("FAKE_NVML_PROCESS_DIR", procs.path())
            .env("COLUMNS", "200")
            .args(["status", "--by", "job"]),
    );
    assert!(
        text.lines().any(|l| l.trim_end().ends_with(&label)),
        "{text}"
    );
    let claimed = &process(&report, claimant)["slurm"];
    match cluster.proctrack {
        // The cgroup names the real job; the claim is kept aside, its user and partition
        // not used.
        Proctrack::Cgroup => {
            assert_eq!(claimed["job_id"], job, "{claimed:#}");
            assert_eq!(claimed["environ_conflict"], 424_242, "{claimed:#}");
            assert_eq!(claimed["partition"], serde_json::Value::Null, "{claimed:#}");
        }
        // Only the environment speaks, and it is believed: what `source` says.
        Proctrack::Linuxproc => {
            assert_eq!(claimed["job_id"], 424_242, "{claimed:#}");
            assert_eq!(claimed["source"], "environ", "{claimed:#}");
        }
    }
}

#[test]
fn the_epilog_prints_the_jobs_peak_per_gpu_from_the_recorders_history() {
    if skip_without_slurm() {
        return;
    }
    let work = tempfile::tempdir_in("/tmp").expect("a temp dir");
    std::fs::set_permissions(work.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let db = work.path().join("history.db");
    let reports = work.path().join("reports");
    std::fs::create_dir(&reports).expect("mkdir");
    // The epilog slurmd runs as root when a job ends, with SLURM_JOB_ID set: text and JSON.
    let epilog = work.path().join("epilog.sh");
    let vramctl_bin = assert_cmd::cargo::cargo_bin("vramctl");
    std::fs::write(
        &epilog,
        format!(
            "#!/bin/sh\n\
             {bin} slurm-epilog --db {db} > {r}/$SLURM_JOB_ID.txt 2>&1\n\
             {bin} slurm-epilog --db {db} --json > {r}/$SLURM_JOB_ID.json 2>&1\n\
             exit 0\n",
            bin = vramctl_bin.display(),
            db = db.display(),
            r = reports.display(),
        ),
    )
    .expect("write the epilog");
    std::fs::set_permissions(&epilog, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let cluster = SlurmCluster::start_with_conf(&format!("Epilog={}\n", epilog.display()));

    // The recorder on this node, every 100 ms, sees what the job's processes announce.
    let procs = shared_dir();
    let scenario = Scenario::new(1, &[]);
    let mut recorder = crate::harness::vramctl_std(scenario.path())
        .env("FAKE_NVML_PROCESS_DIR", procs.path())
        .args(["record", "--interval", "100ms", "--db"])
        .arg(&db)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the recorder");
    struct Stop<'a>(&'a mut Child);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.0.id().to_string()])
                .status();
            let _ = self.0.wait();
        }
    }
    let _stop = Stop(&mut recorder);

    // The batch script (2512 MiB) and an srun step (1512 MiB) hold their memory for 4 s
    // together, then the job ends by itself.
    let out = shared_dir();
    let script = job_script(&cluster);
    let script = script.display();
    let job = cluster.sbatch(
        &[("FAKE_NVML_PROCESS_DIR", procs.path())],
        &[
            "--export=ALL,JOB_STEPS=1,JOB_STEP_S=4",
            "--output",
            &format!("{}/slurm-%j.out", out.path().display()),
            "--chdir",
            &out.path().display().to_string(),
            "--wrap",
            &format!("srun --quiet {script} 10 & {script} 20; wait"),
        ],
    );
    let text = reports.join(format!("{job}.txt"));
    let json = reports.join(format!("{job}.json"));
    assert!(
        wait_until(Duration::from_secs(60), || {
            std::fs::read_to_string(&json).is_ok_and(|t| t.ends_with('\n'))
        }),
        "the epilog wrote no report\n{}",
        cluster.failure("epilog")
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("read")).expect("JSON");
    assert_eq!(report["job_id"], job, "{report:#}");
    let gpus = report["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 1, "{report:#}");
    // Both processes at once: what they announced, to the byte.
    assert_eq!(gpus[0]["peak_bytes"], (2512 + 1512) * MIB, "{report:#}");
    assert_eq!(gpus[0]["processes"], 2, "{report:#}");
    assert_eq!(gpus[0]["index"], 0, "{report:#}");
    assert_eq!(
        std::fs::read_to_string(&text).expect("read"),
        format!("job {job} peaked at 3.9 GiB on GPU 0\n")
    );
}

/// `kill --job ID` on a real job: its batch script and its `srun` step (each a GPU process
/// announced to the fake NVML) are planned and ended through kill's safe path; a process of
/// no job on the same GPU is left running.
#[test]
fn kill_by_job_ends_a_real_jobs_gpu_processes() {
    if skip_without_slurm() {
        return;
    }
    let cluster = SlurmCluster::start();
    let procs = shared_dir();
    let out = shared_dir();
    let script = job_script(&cluster);
    let script = script.display();
    let wrap = format!("srun --quiet {script} 10 & exec {script} 20");
    let job = cluster.sbatch(
        &[("FAKE_NVML_PROCESS_DIR", procs.path())],
        &[
            "--export=ALL,JOB_STEPS=1,JOB_STEP_S=600",
            "--output",
            &format!("{}/slurm-%j.out", out.path().display()),
            "--chdir",
            &out.path().display().to_string(),
            "--wrap",
            &wrap,
        ],
    );
    assert!(
        wait_until(Duration::from_secs(30), || announced(procs.path()).len()
            == 2),
        "the job's two processes did not announce themselves: {:?}\n{}",
        announced(procs.path()),
        cluster.failure("job")
    );
    let in_job: Vec<u32> = announced(procs.path())
        .iter()
        .map(|(pid, _)| *pid)
        .collect();
    let bystander = crate::real_processes::sleeper();
    std::fs::write(
        procs.path().join(bystander.pid().to_string()),
        format!("0 {}\n", 100 * MIB),
    )
    .expect("announce");
    let scenario = Scenario::new(1, &[]);
    let job_text = job.to_string();
    let kill = |extra: &[&str]| {
        let mut cmd = crate::harness::vramctl_std(scenario.path());
        cmd.env("FAKE_NVML_PROCESS_DIR", procs.path())
            .env("VRAMCTL_DB", scenario.db())
            .stdin(Stdio::null())
            .args(["kill", "--json", "--job", &job_text, "--timeout", "30s"])
            .args(extra);
        let output = cmd.output().expect("run vramctl kill");
        let report: serde_json::Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stderr)));
        (output.status.code(), report)
    };
    let (code, plan) = kill(&["--dry-run"]);
    let mut planned: Vec<u64> = plan["targets"]
        .as_array()
        .expect("targets")
        .iter()
        .map(|t| t["pid"].as_u64().expect("pid"))
        .collect();
    planned.sort_unstable();
    let mut want: Vec<u64> = in_job.iter().map(|p| u64::from(*p)).collect();
    want.sort_unstable();
    assert_eq!((code, planned), (Some(0), want), "{plan:#}");
    let (code, report) = kill(&["--yes"]);
    assert_eq!(code, Some(0), "{report:#}\n{}", cluster.failure("kill"));
    for pid in &in_job {
        assert!(crate::real_processes::ends(*pid), "{pid} still runs");
    }
    assert!(bystander.alive(), "a process of no job is left alone");
}
