//! `vramctl run` and `vramctl fit` below their command lines.
//!
//! - [`job`]: one command under supervision — spawned with its signals passed on, kept in a
//!   cgroup scope (else the subreaper's tree) so stopping it reaches every process, its
//!   tree's memory curve per GPU, OOM lines from its output, the Python agent injected for
//!   the framework's peaks; [`job::run_job`] gives a [`job::JobReport`].
//! - [`fit_search`]: fit's search, a pure state machine choosing the next value from the
//!   trials' outcomes and peaks.
//! - [`fit_trace`]: fit's trace predictor, the edge from two trials' allocator traces
//!   replayed through `vramctl-model`'s allocator at candidate values (pure).
//! - [`fit_trials`]: fit's trial loop, [`fit_trials::run_trials`], over a
//!   [`fit_trials::TrialRunner`] (the real one, [`fit_trials::SupervisedTrials`], runs
//!   each trial as a supervised job), so the loop is tested with scripted trials.
//!
//! It reads the machine through `vramctl-observe`'s live sampler and must not depend on
//! the command line, the store or any frontend.

pub mod fit_search;
pub mod fit_trace;
pub mod fit_trials;
pub mod job;
