//! Which CUDA builds a driver runs: the compatibility facts `doctor` judges wheels with
//! (`docs/doctor.md`, "CUDA compatibility", with the sources).
//!
//! - A driver runs everything built for its own CUDA version and older (binary backward
//!   compatibility).
//! - From CUDA 11 on, a build for a newer *minor* of the same major runs on an older driver
//!   of that major's branch ("minor version compatibility"), with a limited feature set: no
//!   PTX JIT of newer PTX, and APIs that need the newer driver fail. The driver must be at
//!   least the major's minimum branch ([`MAJORS`]).
//! - A build for a newer *major* does not run at all ("the NVIDIA driver on your system is
//!   too old").

use std::cmp::Ordering;
use std::fmt;

/// A CUDA version, `major.minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion {
    /// Major.
    pub major: u32,
    /// Minor, `None` when only the major is known (`cupy-cuda12x`, `jax-cuda12-plugin`).
    pub minor: Option<u32>,
}

impl CudaVersion {
    /// `12.8`, `13.0`, `12` (major only).
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = match parts.next() {
            Some(m) => Some(m.parse().ok()?),
            None => None,
        };
        Some(Self { major, minor })
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.minor {
            Some(minor) => write!(f, "{}.{minor}", self.major),
            None => write!(f, "{}.x", self.major),
        }
    }
}

/// One CUDA major's driver range (NVIDIA, "CUDA Compatibility", minor version
/// compatibility, Table 1; Linux x86_64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MajorRange {
    /// The CUDA major.
    pub major: u32,
    /// The oldest driver branch that runs builds of every minor of it.
    pub minimum_driver_branch: u32,
    /// The first driver branch of the next major (`None`: the newest major).
    pub next_major_branch: Option<u32>,
}

/// The table, newest first.
pub const MAJORS: &[MajorRange] = &[
    MajorRange {
        major: 13,
        minimum_driver_branch: 580,
        next_major_branch: None,
    },
    MajorRange {
        major: 12,
        minimum_driver_branch: 525,
        next_major_branch: Some(580),
    },
    MajorRange {
        major: 11,
        minimum_driver_branch: 450,
        next_major_branch: Some(525),
    },
];

/// The range of a CUDA major, if known.
pub fn major_range(major: u32) -> Option<&'static MajorRange> {
    MAJORS.iter().find(|m| m.major == major)
}

/// How a build runs on a driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Built for the driver's CUDA or older.
    Runs,
    /// A newer minor of the driver's major: runs through minor version compatibility,
    /// with a limited feature set.
    RunsLimited,
    /// Does not run: `why`.
    DoesNotRun(String),
}

/// Judges a build for `built` on a driver that supports CUDA `driver` (NVML's
/// `cudaDriverVersion`) from driver branch `driver_branch` (`580` of `580.159.04`).
pub fn judge(built: CudaVersion, driver: CudaVersion, driver_branch: Option<u32>) -> Verdict {
    match built.major.cmp(&driver.major) {
        Ordering::Less => Verdict::Runs,
        Ordering::Greater => {
            let needs = major_range(built.major)
                .map(|m| format!(" (driver {} or newer)", m.minimum_driver_branch))
                .unwrap_or_default();
            Verdict::DoesNotRun(format!(
                "built for CUDA {built}, which needs a CUDA {} driver{needs}; this driver supports CUDA {driver}",
                built.major
            ))
        }
        Ordering::Equal => {
            if let (Some(range), Some(branch)) = (major_range(built.major), driver_branch) {
                if branch < range.minimum_driver_branch {
                    return Verdict::DoesNotRun(format!(
                        "CUDA {}.x needs driver {} or newer; this is driver {branch}",
                        built.major, range.minimum_driver_branch
                    ));
                }
            }
            match (built.minor, driver.minor) {
                (Some(b), Some(d)) if b > d => Verdict::RunsLimited,
                _ => Verdict::Runs,
            }
        }
    }
}

/// `580` of `580.159.04`.
pub fn driver_branch(driver_version: &str) -> Option<u32> {
    driver_version.split('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> CudaVersion {
        CudaVersion::parse(text).expect("version")
    }

    #[test]
    fn a_newer_major_does_not_run() {
        let verdict = judge(v("13.0"), v("12.8"), Some(570));
        assert!(
            matches!(&verdict, Verdict::DoesNotRun(why) if why.contains("driver 580 or newer")),
            "{verdict:?}"
        );
    }

    #[test]
    fn a_newer_minor_runs_limited_and_an_older_build_runs() {
        assert_eq!(judge(v("12.8"), v("12.4"), Some(550)), Verdict::RunsLimited);
        assert_eq!(judge(v("12.4"), v("13.0"), Some(580)), Verdict::Runs);
        assert_eq!(judge(v("13.0"), v("13.0"), Some(580)), Verdict::Runs);
        assert_eq!(judge(v("12"), v("12.2"), Some(535)), Verdict::Runs);
    }

    #[test]
    fn a_driver_below_the_majors_branch_does_not_run_it() {
        assert!(matches!(
            judge(v("12.1"), v("12.0"), Some(520)),
            Verdict::DoesNotRun(_)
        ));
    }

    #[test]
    fn branches_and_versions_parse() {
        assert_eq!(driver_branch("580.159.04"), Some(580));
        assert_eq!(v("12").to_string(), "12.x");
        assert_eq!(CudaVersion::parse("twelve"), None);
    }
}
