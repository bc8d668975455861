//! Freeing GPU memory safely.
//!
//! - [`policy`]: who `reap` may end (named policies from a TOML file, or the filter flags,
//!   given as [`policy::PolicyFlags`]);
//! - `evidence` (private): the idle evidence from the recorded history;
//! - [`decide`]: the pure decision, a process and a policy → a candidate or the rule it fails;
//! - [`engine`]: one pass of `reap` (observe → evidence → decide → act → audit), its effects
//!   taken through [`engine::ReapExecutor`] and its wall clock injected, so it is tested
//!   without GPUs or signals; [`engine::RoundReport`] is what a pass did;
//! - [`memory_release`]: after a kill or a reclaim, whether the memory came back (shared
//!   with `kill`);
//! - [`owner_targets`]: `kill --job/--pod/--container`, the processes an owner selects.
//!
//! It must not depend on the command line (clap types), on the binary's exit codes or on its
//! audit log: the binary settles its arguments into [`engine::ReapConfig`] and passes the
//! audit sink in through the executor.

pub mod decide;
pub mod engine;
mod evidence;
pub mod memory_release;
pub mod owner_targets;
pub mod policy;
