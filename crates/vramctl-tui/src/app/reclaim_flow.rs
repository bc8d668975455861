//! The reclaim key: from the key press to the outcome in the footer. No confirmation:
//! `empty_cache` frees only cache no tensor uses, the process goes on as it was (unlike a
//! kill). Refused in a replay and a `--readonly` session, as a kill is (and the action
//! worker refuses again at the point of action, `tui::kill::Actions`).

use super::effect::{Effect, Reply};
use crate::kill::READONLY_REASON;
use crate::reclaim::{ReclaimOutcome, ReclaimTarget};

/// What the reclaim flow reacts to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReclaimEvent {
    /// The reclaim key, on the selected process (`None`: nothing is selected or the row
    /// is a parent that holds no GPU memory).
    Ask(Option<ReclaimTarget>),
    /// The action worker carried it out.
    Finished {
        /// The process.
        target: ReclaimTarget,
        /// What happened.
        outcome: ReclaimOutcome,
    },
}

/// The reclaim in flight, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReclaimFlow {
    readonly: bool,
    replay: bool,
    /// The process being reclaimed.
    pub in_flight: Option<ReclaimTarget>,
}

impl ReclaimFlow {
    /// A flow that refuses every reclaim when `readonly` or in a `replay`.
    pub fn new(readonly: bool, replay: bool) -> Self {
        Self {
            readonly,
            replay,
            in_flight: None,
        }
    }

    /// Takes in one event; returns what the action worker must do and what to say.
    pub fn update(&mut self, event: ReclaimEvent) -> Reply {
        match event {
            ReclaimEvent::Ask(target) => self.ask(target),
            ReclaimEvent::Finished { target, outcome } => {
                if self.in_flight.as_ref() != Some(&target) {
                    return Reply::done();
                }
                self.in_flight = None;
                Reply::say(outcome.text(target.pid))
            }
        }
    }

    fn ask(&mut self, target: Option<ReclaimTarget>) -> Reply {
        if self.replay {
            return Reply::say("actions are disabled while replaying a recording");
        }
        if self.readonly {
            return Reply::say(READONLY_REASON);
        }
        if let Some(running) = &self.in_flight {
            return Reply::say(format!(
                "the reclaim of PID {} is still in progress; wait for its result",
                running.pid
            ));
        }
        let Some(target) = target else {
            return Reply::say("select a GPU process first");
        };
        self.in_flight = Some(target.clone());
        Reply {
            effects: vec![Effect::Reclaim(target.clone())],
            message: Some(format!(
                "reclaiming the cache of PID {} (asking its agent)…",
                target.pid
            )),
            ignored: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(pid: u32) -> ReclaimTarget {
        ReclaimTarget {
            pid,
            start_time_ticks: Some(1010),
            command: "python train.py".into(),
        }
    }

    #[test]
    fn a_reclaim_is_refused_in_a_replay_when_readonly_and_without_a_selection() {
        for (readonly, replay, said) in [
            (true, false, READONLY_REASON),
            (
                false,
                true,
                "actions are disabled while replaying a recording",
            ),
        ] {
            let mut flow = ReclaimFlow::new(readonly, replay);
            let reply = flow.update(ReclaimEvent::Ask(Some(target(101))));
            assert!(reply.effects.is_empty());
            assert_eq!(reply.message.as_deref(), Some(said));
            assert_eq!(flow.in_flight, None);
        }
        let mut flow = ReclaimFlow::new(false, false);
        let reply = flow.update(ReclaimEvent::Ask(None));
        assert!(reply.effects.is_empty());
        assert_eq!(reply.message.as_deref(), Some("select a GPU process first"));
    }

    #[test]
    fn one_reclaim_at_a_time_and_its_outcome_goes_to_the_footer() {
        let mut flow = ReclaimFlow::new(false, false);
        let reply = flow.update(ReclaimEvent::Ask(Some(target(101))));
        assert_eq!(reply.effects, [Effect::Reclaim(target(101))]);
        let second = flow.update(ReclaimEvent::Ask(Some(target(202))));
        assert!(second.effects.is_empty());
        assert!(
            second
                .message
                .unwrap()
                .contains("PID 101 is still in progress")
        );
        // An answer for another process (not asked here) changes nothing.
        let stray = flow.update(ReclaimEvent::Finished {
            target: target(202),
            outcome: ReclaimOutcome::NoAgent("no agent".into()),
        });
        assert_eq!(stray, Reply::done());
        let done = flow.update(ReclaimEvent::Finished {
            target: target(101),
            outcome: ReclaimOutcome::Released {
                released_bytes: 4 << 30,
                cached_after_bytes: 1 << 30,
            },
        });
        assert_eq!(
            done.message.as_deref(),
            Some(
                "PID 101: released 4.0G of cache (1.0G left); NVML's figure follows at the next samples"
            )
        );
        assert_eq!(flow.in_flight, None);
    }
}
