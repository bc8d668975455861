//! What the state asks of the loop ([`Effect`]), and what one part of the state hands back
//! to the `App` from its `update` ([`Reply`]).
//!
//! Each part of the state (the process table, the charts' past, the replay transport, the
//! kill flow) has its own `update` that takes its own events and returns a [`Reply`];
//! `App::update` routes each [`Event`](crate::event::Event) to the parts it concerns,
//! puts the replies' footer lines on screen and hands the effects to the loop. As gitui's
//! components answer whether they consumed an event, a reply says when its part did not
//! take a key ([`Reply::ignored`]), so the next part may.

use crate::event::HistoryRequest;
use crate::kill::{KillPlan, KillTarget};
use crate::reclaim::ReclaimTarget;
use crate::replay::Seek;

/// Something the loop must do for the state.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Leave.
    Quit,
    /// Check this kill target (action worker).
    Plan(KillTarget),
    /// Carry out this kill (action worker).
    Kill(KillPlan),
    /// Ask this process's agent to release its cache (action worker).
    Reclaim(ReclaimTarget),
    /// Tell the killer (for its audit record) whether the memory was released:
    /// `Some(bytes)` freed, `None` still listed by the driver (action worker).
    MemoryOutcome {
        /// The kill.
        plan: KillPlan,
        /// Bytes the process held that the driver no longer lists.
        freed_bytes: Option<u64>,
    },
    /// Move the replay cursor (replay thread).
    Seek(Seek),
    /// Load older history (history loader).
    LoadHistory(HistoryRequest),
}

/// What one part of the state answers to one of its events.
#[derive(Debug, Clone, Default, PartialEq)]
#[must_use]
pub struct Reply {
    /// For the loop to carry out, in order.
    pub effects: Vec<Effect>,
    /// A line for the footer (it replaces the one there).
    pub message: Option<String>,
    /// The event (a key) is not this part's: the App offers it to the next.
    pub ignored: bool,
}

impl Reply {
    /// Taken, nothing to do.
    pub fn done() -> Self {
        Self::default()
    }

    /// Not this part's event.
    pub fn ignored() -> Self {
        Self {
            ignored: true,
            ..Self::default()
        }
    }

    /// Taken, with these effects.
    pub fn effects(effects: Vec<Effect>) -> Self {
        Self {
            effects,
            ..Self::default()
        }
    }

    /// Taken, with this line for the footer.
    pub fn say(message: impl Into<String>) -> Self {
        Self {
            message: Some(message.into()),
            ..Self::default()
        }
    }
}
