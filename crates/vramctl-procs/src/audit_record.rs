//! What `kill` and `reap` write down before they signal anything.
//!
//! The record is written (durably) *before* the signal is sent, with outcome
//! [`AuditOutcome::Pending`], and its outcome is updated afterwards; a crash between the two
//! leaves a pending row that says a signal may have been sent. The store persists these
//! (`synchronous=FULL`); this module only defines them, so the signalling code does not depend
//! on the store.

use serde::{Deserialize, Serialize};

use crate::procinfo::ProcessIdentity;

/// One signal vramctl decided to send (or refused to), or one reclaim through a process's
/// agent (`action` `reclaim`, `signal` `none`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// When the decision was made, ms since the Unix epoch.
    pub at_unix_ms: i64,
    /// Real uid of the vramctl process that acted.
    pub actor_uid: u32,
    /// Its user name, when known.
    pub actor_user: Option<String>,
    /// `kill` or `reap`.
    pub action: String,
    /// The target's identity.
    pub target: ProcessIdentity,
    /// The target's command line at decision time.
    pub target_command: String,
    /// The target's user, when known.
    pub target_user: Option<String>,
    /// Signal name, e.g. `SIGTERM`.
    pub signal: String,
    /// Why: the user's command, or the policy and its evidence.
    pub reason: String,
    /// What happened.
    pub outcome: AuditOutcome,
}

/// The outcome of an audited signal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "detail")]
#[non_exhaustive]
pub enum AuditOutcome {
    /// Written before the signal; not updated yet.
    Pending,
    /// The signal was delivered.
    Sent,
    /// vramctl refused to signal, and why.
    Refused(String),
    /// The signal could not be delivered, and why.
    Failed(String),
    /// The process exited; bytes of GPU memory freed and how long that took.
    Exited {
        /// GPU memory released, summed over devices.
        freed_bytes: u64,
        /// From the first signal to memory gone, in milliseconds.
        after_ms: u64,
    },
    /// `reclaim`: the process's agent returned its framework's cache (no signal).
    Reclaimed {
        /// What the framework says it released (0: nothing could be).
        released_bytes: u64,
    },
}
