//! `vramctl_oom_total{cause}`: the OOMs the processes' agents report, by cause (issue 33).
//!
//! The observer tracks them (`vramctl_observe::agent_ooms`: each process's OOM count from
//! its agent, and its first OOM classified by the snapshot classifier on the snapshot the
//! agent kept, on the observer's own thread); this module only counts what the
//! observations say. A process's first OOM is counted by its cause once classified; the
//! agent keeps one snapshot per process, so its later OOMs, and any that cannot be
//! classified (no snapshot, an agent that stopped answering, a full queue, a process gone
//! before its snapshot was read), count as `unknown`.

use std::collections::{BTreeMap, HashMap};

use vramctl_observe::agent_ooms::{AgentOoms, OomState};

/// The label values, every one exported from 0 (so `increase()` sees the first).
pub const CAUSES: [&str; 7] = [
    "shortage",
    "fragmentation",
    "other-process",
    "process-limit",
    "cached-elsewhere",
    "leak",
    "unknown",
];

/// What was counted of one process's OOMs.
#[derive(Debug)]
struct Counted {
    /// When its first OOM was seen: who the process is (another at its PID has another).
    seen_at_unix_ms: i64,
    count: u64,
    /// Its first OOM was counted (by cause): once classified, or found unclassifiable.
    first_counted: bool,
}

/// The counts by cause.
#[derive(Debug)]
pub struct OomCauses {
    counted: HashMap<u32, Counted>,
    totals: BTreeMap<&'static str, u64>,
}

impl Default for OomCauses {
    fn default() -> Self {
        Self {
            counted: HashMap::new(),
            totals: CAUSES.iter().map(|c| (*c, 0)).collect(),
        }
    }
}

impl OomCauses {
    /// Counts what `ooms` (an observation's) adds to what was counted so far.
    pub fn update(&mut self, ooms: &AgentOoms) {
        let totals = &mut self.totals;
        let mut add = |cause: &str, n: u64| {
            let key = CAUSES
                .iter()
                .find(|c| **c == cause)
                .copied()
                .unwrap_or("unknown");
            *totals.entry(key).or_insert(0) += n;
        };
        // Gone (or replaced) before its first OOM was classified: that one is unknown.
        self.counted.retain(|pid, c| {
            let same = ooms
                .get(*pid)
                .is_some_and(|o| o.seen_at_unix_ms == c.seen_at_unix_ms);
            if !same && !c.first_counted {
                add("unknown", 1);
            }
            same
        });
        for (pid, oom) in ooms.iter() {
            let c = self.counted.entry(pid).or_insert(Counted {
                seen_at_unix_ms: oom.seen_at_unix_ms,
                count: 0,
                first_counted: false,
            });
            // All but the first, which waits for its cause.
            let later_before = c.count.saturating_sub(1);
            let later_now = oom.count.saturating_sub(1);
            add("unknown", later_now.saturating_sub(later_before));
            c.count = c.count.max(oom.count);
            if !c.first_counted && oom.state != OomState::Classifying {
                add(oom.cause.as_deref().unwrap_or("unknown"), 1);
                c.first_counted = true;
            }
        }
    }

    /// The counts by cause.
    pub fn totals(&self) -> &BTreeMap<&'static str, u64> {
        &self.totals
    }
}

#[cfg(test)]
mod tests {
    use vramctl_observe::agent_ooms::ProcessOoms;

    use super::*;

    fn oom(count: u64, seen: i64, state: OomState, cause: Option<&str>) -> ProcessOoms {
        ProcessOoms {
            count,
            seen_at_unix_ms: seen,
            state,
            cause: cause.map(str::to_owned),
            fix: None,
            why: None,
            oom_at_unix_ms: None,
            device: None,
            others_when_seen: Vec::new(),
        }
    }

    fn ooms(entries: &[(u32, ProcessOoms)]) -> AgentOoms {
        let mut out = AgentOoms::default();
        for (pid, o) in entries {
            out.insert(*pid, o.clone());
        }
        out
    }

    #[test]
    fn a_process_s_first_oom_counts_by_its_cause_and_later_ones_as_unknown() {
        use OomState::{Classified, Classifying, Unclassified};
        let mut causes = OomCauses::default();
        causes.update(&AgentOoms::default());
        assert_eq!(causes.totals().len(), CAUSES.len());
        assert!(causes.totals().values().all(|n| *n == 0));
        // 10: three OOMs, 20: one, both classifying; 30: one that cannot be classified.
        causes.update(&ooms(&[
            (10, oom(3, 1000, Classifying, None)),
            (20, oom(1, 1000, Classifying, None)),
            (30, oom(1, 1000, Unclassified, None)),
        ]));
        assert_eq!(
            causes.totals()["unknown"],
            3,
            "10's two later ones and 30's"
        );
        causes.update(&ooms(&[
            (10, oom(3, 1000, Classified, Some("fragmentation"))),
            (20, oom(1, 1000, Classified, Some("other-process"))),
            (30, oom(1, 1000, Unclassified, None)),
        ]));
        let totals = causes.totals();
        assert_eq!(
            (
                totals["fragmentation"],
                totals["other-process"],
                totals["unknown"]
            ),
            (1, 1, 3)
        );
        // Unchanged, nothing more; two more OOMs of 10's are unknown.
        causes.update(&ooms(&[
            (10, oom(5, 1000, Classified, Some("fragmentation"))),
            (20, oom(1, 1000, Classified, Some("other-process"))),
        ]));
        assert_eq!(causes.totals()["unknown"], 5);
        // A new process at PID 10 has its own first OOM; 20 gone while counted: nothing.
        causes.update(&ooms(&[(10, oom(1, 9000, Classifying, None))]));
        causes.update(&ooms(&[(
            10,
            oom(1, 9000, Classified, Some("fragmentation")),
        )]));
        assert_eq!(causes.totals()["fragmentation"], 2);
        assert_eq!(causes.totals()["unknown"], 5);
        // One gone before its cause was found: unknown.
        causes.update(&ooms(&[(40, oom(1, 9500, Classifying, None))]));
        causes.update(&AgentOoms::default());
        assert_eq!(causes.totals()["unknown"], 6);
    }
}
