//! One observation of the machine and the loop that paces it.
//!
//! [`observation::Observation`] is a moment: the GPUs' snapshot joined once with what the
//! process catalog knows of their processes (identity, user, command), the agents' figures
//! and the verdicts. The one [`observation::Observer`] produces it (each frontend builds
//! one, never a process catalog, agent poll or leak tracker of its own); [`live_loop`]
//! opens the backend and paces the ticks on an injected clock; [`live_source`] answers from
//! a running daemon ([`daemon_socket`]) or from NVML here. [`owners`] totals memory per user,
//! container or pod. [`gpu_selection`] is the one `--gpu`
//! matcher, [`units`] the one formatter of bytes, rates and durations.

pub mod agent_ooms;
pub mod daemon_socket;
pub mod gpu_holdings;
pub mod gpu_selection;
pub mod kubernetes;
pub mod leak_where;
pub mod live_loop;
pub mod live_source;
pub mod observation;
pub mod owners;
pub mod pattern;
pub mod pid_view;
pub mod units;
pub mod verdict;
