//! The seam for leak and idle-holder verdicts.
//!
//! The analysis (pure functions in `vramctl_core::analysis`) decides; the UI only shows what
//! it decided, with the numbers behind it. A [`Judge`] runs on the sampler's thread after
//! each observation (the analysis is not free, and drawing must stay cheap) and fills
//! [`Verdicts`]. Until the analysis is wired, [`NoJudge`] leaves them empty and the UI shows
//! no leak or idle flag: it does not guess.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::observe::Observation;

/// What the analysis concluded about one process's memory on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum VerdictKind {
    /// Retained memory keeps growing after warm-up.
    Leak,
    /// Holds memory and has not used the GPU for a while.
    IdleHolder,
    /// Growing, not (yet) a leak.
    Growing,
    /// Not growing.
    Stable,
    /// Allocates and frees in cycles on a stable floor.
    Sawtooth,
}

impl VerdictKind {
    /// The word shown in the detail pane.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Leak => "leak",
            Self::IdleHolder => "idle holder",
            Self::Growing => "growing",
            Self::Stable => "stable",
            Self::Sawtooth => "sawtooth",
        }
    }
}

/// A verdict with its explanation and the numbers that produced it, ready to show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessVerdict {
    /// The conclusion.
    pub kind: VerdictKind,
    /// One line, e.g. `leaks 38 MB/s since 14:02:10 UTC; GPU 0 full in 6 min`.
    pub summary: String,
    /// `(name, value)` pairs: slope, significance, onset, time to full, ...
    pub numbers: Vec<(String, String)>,
}

/// Verdicts by `(pid, device UUID)` (a series is one process on one device, or MIG
/// instance).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdicts {
    by_process: BTreeMap<(u32, String), ProcessVerdict>,
}

impl Verdicts {
    /// Records the verdict on `pid` on the device `uuid`.
    pub fn insert(&mut self, pid: u32, uuid: &str, verdict: ProcessVerdict) {
        self.by_process.insert((pid, uuid.to_owned()), verdict);
    }

    /// The verdict on `pid` on the device `uuid`, if any.
    pub fn get(&self, pid: u32, uuid: &str) -> Option<&ProcessVerdict> {
        self.by_process.get(&(pid, uuid.to_owned()))
    }

    /// Whether there is no verdict at all.
    pub fn is_empty(&self) -> bool {
        self.by_process.is_empty()
    }
}

/// Decides verdicts from the observations it is fed, one at a time, in time order.
///
/// The analysis-backed implementation keeps a tracker per series (it sees every
/// observation) and may read the store for a longer past.
pub trait Judge: Send {
    /// The verdicts as of `observation`.
    fn judge(&mut self, observation: &Observation) -> Verdicts;
}

/// No analysis: no verdicts.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoJudge;

impl Judge for NoJudge {
    fn judge(&mut self, _observation: &Observation) -> Verdicts {
        Verdicts::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_per_process_and_device() {
        let mut v = Verdicts::default();
        assert!(v.is_empty());
        v.insert(
            7,
            "GPU-a",
            ProcessVerdict {
                kind: VerdictKind::Leak,
                summary: "leaks".into(),
                numbers: vec![],
            },
        );
        assert_eq!(v.get(7, "GPU-a").map(|v| v.kind), Some(VerdictKind::Leak));
        assert_eq!(v.get(7, "GPU-b"), None);
        assert_eq!(v.get(8, "GPU-a"), None);
    }
}
