//! The fake's own time `t`, in seconds since the scenario was loaded.
//!
//! Tests drive it instead of sleeping: a fixed time, a time read from a file that a test
//! harness rewrites, a step per sample, or the control symbols `fakeNvmlSetTime` /
//! `fakeNvmlAdvanceTime`.

use std::path::PathBuf;
use std::time::Instant;

use crate::scenario::{ClockMode, ClockSpec};

#[derive(Debug, Clone)]
pub enum Clock {
    /// Seconds since `start`.
    Wall { start: Instant },
    /// Always `t`.
    Fixed { t: f64 },
    /// Read from `path` at each call that needs the time; `last` is kept for a file that
    /// holds no number (e.g. caught half-written).
    File { path: PathBuf, last: f64 },
    /// `step_s * (calls - 1)` after `calls` calls of `nvmlDeviceGetCount_v2`: the first
    /// sample a consumer takes sees t = 0, the next t = step_s, and so on.
    Step { step_s: f64, calls: u64 },
}

/// Overrides from the environment, applied at load: `FAKE_NVML_TIME` wins over
/// `FAKE_NVML_CLOCK_FILE`, which wins over the scenario's `[clock]`.
#[derive(Debug, Clone, Default)]
pub struct ClockEnv {
    pub time: Option<f64>,
    pub file: Option<PathBuf>,
}

impl Clock {
    pub fn new(spec: &ClockSpec, env: &ClockEnv) -> Clock {
        if let Some(t) = env.time {
            return Clock::Fixed { t };
        }
        if let Some(path) = &env.file {
            return Clock::File {
                path: path.clone(),
                last: 0.0,
            };
        }
        match spec.mode {
            ClockMode::Wall => Clock::Wall {
                start: Instant::now(),
            },
            ClockMode::Fixed => Clock::Fixed {
                t: spec.at_s.unwrap_or(0.0),
            },
            ClockMode::File => Clock::File {
                path: PathBuf::from(spec.path.as_deref().unwrap_or("")),
                last: 0.0,
            },
            ClockMode::Step => Clock::Step {
                step_s: spec.step_s.unwrap_or(1.0),
                calls: 0,
            },
        }
    }

    /// The current time. `&mut` because file mode remembers the last good reading.
    pub fn now(&mut self) -> f64 {
        match self {
            Clock::Wall { start } => start.elapsed().as_secs_f64(),
            Clock::Fixed { t } => *t,
            Clock::File { path, last } => {
                match std::fs::read_to_string(&*path) {
                    // A missing clock file means the harness has not started time yet.
                    Err(_) => 0.0,
                    Ok(text) => {
                        let text = text.trim();
                        if text.is_empty() {
                            0.0
                        } else {
                            if let Some(t) = text
                                .parse::<f64>()
                                .ok()
                                .filter(|t| t.is_finite() && *t >= 0.0)
                            {
                                *last = t;
                            }
                            *last
                        }
                    }
                }
            }
            Clock::Step { step_s, calls } => *step_s * calls.saturating_sub(1) as f64,
        }
    }

    /// Called by `nvmlDeviceGetCount_v2`, which vramctl calls once per sample.
    pub fn on_device_count(&mut self) {
        if let Clock::Step { calls, .. } = self {
            *calls = calls.saturating_add(1);
        }
    }

    /// `fakeNvmlSetTime`: from now on the clock stands at `t`.
    pub fn set(&mut self, t: f64) {
        *self = Clock::Fixed { t: t.max(0.0) };
    }

    /// `fakeNvmlAdvanceTime`: stand `dt` seconds later than now.
    pub fn advance(&mut self, dt: f64) {
        let t = self.now() + dt;
        self.set(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(mode: ClockMode) -> ClockSpec {
        ClockSpec {
            mode,
            ..ClockSpec::default()
        }
    }

    #[test]
    fn wall_starts_near_zero_and_grows() {
        let mut c = Clock::new(&spec(ClockMode::Wall), &ClockEnv::default());
        let a = c.now();
        assert!((0.0..1.0).contains(&a));
        assert!(c.now() >= a);
    }

    #[test]
    fn fixed() {
        let mut s = spec(ClockMode::Fixed);
        assert_eq!(Clock::new(&s, &ClockEnv::default()).now(), 0.0);
        s.at_s = Some(42.5);
        let mut c = Clock::new(&s, &ClockEnv::default());
        assert_eq!(c.now(), 42.5);
        c.on_device_count();
        assert_eq!(c.now(), 42.5, "GetCount does not move a fixed clock");
    }

    #[test]
    fn step() {
        let mut s = spec(ClockMode::Step);
        s.step_s = Some(5.0);
        let mut c = Clock::new(&s, &ClockEnv::default());
        assert_eq!(c.now(), 0.0, "before any sample");
        c.on_device_count();
        assert_eq!(c.now(), 0.0, "first sample");
        c.on_device_count();
        assert_eq!(c.now(), 5.0);
        c.on_device_count();
        assert_eq!(c.now(), 10.0);
        let mut default_step = Clock::new(&spec(ClockMode::Step), &ClockEnv::default());
        default_step.on_device_count();
        default_step.on_device_count();
        assert_eq!(default_step.now(), 1.0);
    }

    #[test]
    fn file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("clock");
        let mut s = spec(ClockMode::File);
        s.path = Some(path.to_string_lossy().into_owned());
        let mut c = Clock::new(&s, &ClockEnv::default());
        assert_eq!(c.now(), 0.0, "missing file");
        std::fs::write(&path, "").expect("write");
        assert_eq!(c.now(), 0.0, "empty file");
        std::fs::write(&path, "12.5\n").expect("write");
        assert_eq!(c.now(), 12.5);
        std::fs::write(&path, "garbage").expect("write");
        assert_eq!(c.now(), 12.5, "unparsable keeps the last value");
        std::fs::write(&path, "30").expect("write");
        assert_eq!(c.now(), 30.0);
    }

    #[test]
    fn env_overrides() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("t");
        std::fs::write(&path, "7").expect("write");
        let mut step = spec(ClockMode::Step);
        step.step_s = Some(1.0);
        let env = ClockEnv {
            time: Some(99.0),
            file: Some(path.clone()),
        };
        assert_eq!(Clock::new(&step, &env).now(), 99.0, "FAKE_NVML_TIME wins");
        let env = ClockEnv {
            time: None,
            file: Some(path),
        };
        assert_eq!(
            Clock::new(&step, &env).now(),
            7.0,
            "then FAKE_NVML_CLOCK_FILE"
        );
    }

    #[test]
    fn set_and_advance() {
        let mut s = spec(ClockMode::Step);
        s.step_s = Some(10.0);
        let mut c = Clock::new(&s, &ClockEnv::default());
        c.on_device_count();
        c.on_device_count();
        c.advance(2.5);
        assert_eq!(c.now(), 12.5);
        c.on_device_count();
        assert_eq!(c.now(), 12.5, "set/advance switch to fixed mode");
        c.set(3.0);
        assert_eq!(c.now(), 3.0);
        c.set(-1.0);
        assert_eq!(c.now(), 0.0);
    }
}
