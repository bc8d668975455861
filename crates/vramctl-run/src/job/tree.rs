//! Which of the PIDs NVML lists belong to the supervised command's process tree.
//!
//! `run` makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so a descendant whose
//! parent exits (a DDP launcher's worker, a daemonised helper) is re-parented to `run`
//! instead of init and stays in the tree. A PID is in the tree when its chain of parents
//! reaches `run`'s own PID. Only PIDs NVML lists are classified (a handful per tick), each
//! once per identity (PID and start time, so a reused PID is classified anew); walking the
//! chain reads one `/proc/<pid>/stat` per ancestor, cached too.
//!
//! Limits: NVML's PIDs are the host's; inside a container with its own PID namespace they
//! may not be this namespace's PIDs, and then nothing is attributed to the tree (`run`
//! still reports the device's memory) — `docs/run.md`.

use std::collections::HashMap;

use vramctl_procs::procinfo;

/// Membership of PIDs in the tree rooted at `root` (the supervisor itself).
#[derive(Debug)]
pub struct ProcessTree {
    root: u32,
    /// PID → (start time in clock ticks, member?).
    known: HashMap<u32, (u64, bool)>,
}

/// How many parents a chain may have before we stop believing it (a loop in /proc while
/// PIDs are reused).
const MAX_DEPTH: usize = 256;

impl ProcessTree {
    /// The tree of every process descending from `root`.
    pub fn new(root: u32) -> Self {
        Self {
            root,
            known: HashMap::new(),
        }
    }

    /// Whether `pid` descends from the root. A PID that cannot be read (gone, another
    /// namespace's) is not a member.
    pub fn contains(&mut self, pid: u32) -> bool {
        let mut chain: Vec<(u32, u64)> = Vec::new();
        let mut current = pid;
        let verdict = loop {
            if current == self.root {
                break true;
            }
            if current <= 1 || chain.len() >= MAX_DEPTH {
                break false;
            }
            let Ok(stat) = procinfo::read_stat(current) else {
                break false;
            };
            if let Some(&(start, member)) = self.known.get(&current)
                && start == stat.start_time_ticks
            {
                break member;
            }
            chain.push((current, stat.start_time_ticks));
            current = stat.ppid;
        };
        for (p, start) in chain {
            self.known.insert(p, (start, verdict));
        }
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grandchild_is_in_the_tree_and_a_stranger_is_not() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 5 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("read the pid");
        let grandchild: u32 = line.trim().parse().expect("a pid");
        let mut tree = ProcessTree::new(me);
        assert!(tree.contains(child.id()));
        assert!(tree.contains(grandchild));
        assert!(!tree.contains(1));
        let mut other = ProcessTree::new(child.id());
        assert!(!other.contains(me), "a parent is not in its child's tree");
        assert!(other.contains(grandchild));
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::process::Command::new("kill")
            .arg(grandchild.to_string())
            .status();
    }
}
