//! The kill flow: from the key press to the result — checking the target, the
//! confirmation, the signal in flight, waiting for the driver to stop listing the process,
//! and the outcome (in the dialog, or in the footer when the dialog was put away).
//!
//! The flow only asks ([`Effect::Plan`], [`Effect::Kill`], [`Effect::MemoryOutcome`]); the
//! action worker does ([`crate::kill`]). Whether memory was released is judged here,
//! from the samples that follow the exit.

use ratatui::crossterm::event::{KeyCode, KeyEvent};
use ratatui::layout::{Position, Rect};

use super::effect::{Effect, Reply};
use crate::format;
use crate::kill::{GpuMemory, KillOutcome, KillPlan, KillTarget, READONLY_REASON};
use crate::table::Row;
use vramctl_observe::observation::Observation;

/// Samples to wait, after a process exited, for the driver to stop listing it.
pub const VERIFY_SAMPLES: u32 = 5;

/// What became of a kill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillResult {
    /// It exited and the driver no longer lists it: this memory was released.
    Freed {
        /// Per GPU, as held just before.
        per_gpu: Vec<GpuMemory>,
        /// Sum of what is known.
        total_bytes: u64,
        /// Whether it took `SIGKILL`.
        escalated: bool,
    },
    /// It exited, but the driver still lists it after [`VERIFY_SAMPLES`] samples.
    StillListed,
    /// Still running.
    StillRunning {
        /// Whether `SIGKILL` was sent.
        escalated: bool,
        /// Its state letter.
        state: Option<char>,
    },
    /// Refused, with the reason.
    Refused(String),
    /// The signal could not be sent.
    Failed(String),
}

impl KillResult {
    /// One line for the result (the dialog's, or the footer's).
    pub fn text(&self) -> String {
        match self {
            Self::Freed {
                per_gpu,
                total_bytes,
                escalated,
            } => {
                let how = if *escalated { " (after SIGKILL)" } else { "" };
                let parts: Vec<String> = per_gpu
                    .iter()
                    .map(|m| format!("{} {}", m.label, format::opt_bytes(m.used_bytes)))
                    .collect();
                if parts.is_empty() {
                    format!("exited{how}; the driver no longer lists it")
                } else {
                    format!(
                        "exited{how}; freed {} ({})",
                        format::bytes(*total_bytes),
                        parts.join(", ")
                    )
                }
            }
            Self::StillListed => {
                "exited, but the driver still lists its memory (it may be released late)".to_owned()
            }
            Self::StillRunning { escalated, state } => {
                let sent = if *escalated { "SIGKILL" } else { "SIGTERM" };
                match state {
                    Some('D') => format!(
                        "still running after {sent}: in uninterruptible sleep (D), likely inside the driver"
                    ),
                    Some(s) => format!("still running after {sent} (state {s})"),
                    None => format!("still running after {sent}"),
                }
            }
            Self::Refused(reason) => format!("refused: {reason}"),
            Self::Failed(reason) => format!("failed: {reason}"),
        }
    }
}

/// The kill dialog, from the key press to the result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KillDialog {
    /// The worker checks the target.
    Planning(KillTarget),
    /// Waiting for the user to confirm.
    Confirm {
        /// What will be done.
        plan: KillPlan,
        /// The focus is on the kill button (the cancel button is the default).
        kill_focused: bool,
    },
    /// Signalled, waiting for it to exit.
    InProgress(KillPlan),
    /// Exited; waiting for the driver to stop listing it.
    Verifying {
        /// The plan.
        plan: KillPlan,
        /// Whether it took `SIGKILL`.
        escalated: bool,
        /// Samples seen since.
        samples: u32,
    },
    /// Done.
    Finished {
        /// The target.
        target: KillTarget,
        /// What happened.
        result: KillResult,
    },
}

/// What the kill flow reacts to.
#[derive(Debug, Clone, PartialEq)]
pub enum KillEvent<'a> {
    /// The kill key, on the selected process (`None`: nothing is selected).
    Ask(Option<KillTarget>),
    /// A key while the dialog is on screen.
    Key(KeyEvent),
    /// A click while the dialog is on screen; `buttons`: where the confirmation's kill
    /// and cancel buttons are.
    Click {
        /// Where.
        at: Position,
        /// The kill and cancel buttons.
        buttons: Option<(Rect, Rect)>,
    },
    /// The worker checked the target.
    Planned(Result<KillPlan, String>),
    /// The worker carried out the kill; `latest`: the observation on screen.
    Finished {
        /// The kill.
        plan: KillPlan,
        /// What happened.
        outcome: KillOutcome,
        /// The observation on screen.
        latest: Option<&'a Observation>,
    },
    /// A new live sample.
    Observed(&'a Observation),
}

/// The kill flow's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KillFlow {
    /// `--readonly`: no kills.
    readonly: bool,
    /// A replay shows the past: no kills.
    replay: bool,
    /// The kill dialog.
    pub dialog: Option<KillDialog>,
    /// The dialog of a kill in flight was put away (`Esc`); its result goes to the footer.
    pub hidden: bool,
}

impl KillFlow {
    /// A flow that refuses every kill when `readonly` or in a `replay`.
    pub fn new(readonly: bool, replay: bool) -> Self {
        Self {
            readonly,
            replay,
            dialog: None,
            hidden: false,
        }
    }

    /// `--readonly`.
    pub fn readonly(&self) -> bool {
        self.readonly
    }

    /// Whether the dialog is on screen.
    pub fn shown(&self) -> bool {
        self.dialog.is_some() && !self.hidden
    }

    /// Whether the confirmation (with its buttons) is on screen.
    pub fn confirming(&self) -> bool {
        !self.hidden && matches!(self.dialog, Some(KillDialog::Confirm { .. }))
    }

    /// Takes in one event; returns what the action worker must do and what to say.
    pub fn update(&mut self, event: KillEvent<'_>) -> Reply {
        match event {
            KillEvent::Ask(target) => self.ask(target),
            KillEvent::Key(key) => self.key(&key),
            KillEvent::Click { at, buttons } => self.click(at, buttons),
            KillEvent::Planned(result) => {
                self.planned(result);
                Reply::done()
            }
            KillEvent::Finished {
                plan,
                outcome,
                latest,
            } => self.finished(plan, outcome, latest),
            KillEvent::Observed(obs) => self.verify(Some(obs)),
        }
    }

    fn ask(&mut self, target: Option<KillTarget>) -> Reply {
        if self.replay {
            return Reply::say("actions are disabled while replaying a recording");
        }
        if self.readonly {
            return Reply::say(READONLY_REASON);
        }
        if self.dialog.is_some() {
            return Reply::say("a kill is still in progress; wait for its result");
        }
        let Some(target) = target else {
            return Reply::say("select a process first");
        };
        self.dialog = Some(KillDialog::Planning(target.clone()));
        Reply::effects(vec![Effect::Plan(target)])
    }

    fn key(&mut self, key: &KeyEvent) -> Reply {
        let Some(dialog) = &mut self.dialog else {
            return Reply::done();
        };
        match dialog {
            KillDialog::Confirm { plan, kill_focused } => match key.code {
                KeyCode::Char('y' | 'Y') => return self.confirm(),
                KeyCode::Enter if *kill_focused => return self.confirm(),
                KeyCode::Tab | KeyCode::BackTab | KeyCode::Left | KeyCode::Right => {
                    *kill_focused = !*kill_focused;
                }
                KeyCode::Enter | KeyCode::Esc | KeyCode::Char('n' | 'N' | 'q') => {
                    let pid = plan.target.pid;
                    self.dialog = None;
                    return Reply::say(format!("process {pid} was not signalled"));
                }
                _ => {}
            },
            KillDialog::Finished { .. } => self.dialog = None,
            KillDialog::Planning(_) => {
                if matches!(key.code, KeyCode::Esc | KeyCode::Char('q' | 'n')) {
                    // Nothing was sent; the plan's answer is dropped when it comes.
                    self.dialog = None;
                }
            }
            KillDialog::InProgress(_) | KillDialog::Verifying { .. } => {
                if matches!(key.code, KeyCode::Esc | KeyCode::Char('q')) {
                    // The kill goes on; its result lands in the footer.
                    self.hidden = true;
                }
            }
        }
        Reply::done()
    }

    fn click(&mut self, at: Position, buttons: Option<(Rect, Rect)>) -> Reply {
        match (&self.dialog, buttons) {
            (Some(KillDialog::Confirm { .. }), Some((kill, cancel))) => {
                if kill.contains(at) {
                    return self.confirm();
                }
                if cancel.contains(at) {
                    self.dialog = None;
                }
            }
            (Some(KillDialog::Finished { .. }), _) => self.dialog = None,
            _ => {}
        }
        Reply::done()
    }

    fn confirm(&mut self) -> Reply {
        let Some(KillDialog::Confirm { plan, .. }) = self.dialog.take() else {
            return Reply::done();
        };
        if self.readonly {
            // Not reachable through the keys; checked here too, and again by the worker.
            return Reply::say(READONLY_REASON);
        }
        self.dialog = Some(KillDialog::InProgress(plan.clone()));
        Reply::effects(vec![Effect::Kill(plan)])
    }

    fn planned(&mut self, result: Result<KillPlan, String>) {
        let Some(KillDialog::Planning(target)) = &self.dialog else {
            return;
        };
        self.dialog = Some(match result {
            Ok(plan) if plan.target.pid == target.pid => KillDialog::Confirm {
                plan,
                kill_focused: false,
            },
            Ok(plan) => KillDialog::Finished {
                target: target.clone(),
                result: KillResult::Refused(format!(
                    "the plan named process {} instead of {}",
                    plan.target.pid, target.pid
                )),
            },
            Err(reason) => KillDialog::Finished {
                target: target.clone(),
                result: KillResult::Refused(reason),
            },
        });
    }

    fn finished(
        &mut self,
        plan: KillPlan,
        outcome: KillOutcome,
        latest: Option<&Observation>,
    ) -> Reply {
        let pid = plan.target.pid;
        let ours = matches!(&self.dialog, Some(KillDialog::InProgress(p)) if p.target.pid == pid);
        if !ours {
            return Reply::done();
        }
        let next = match outcome {
            KillOutcome::Exited { escalated, .. } => KillDialog::Verifying {
                plan,
                escalated,
                samples: 0,
            },
            KillOutcome::AlreadyGone => KillDialog::Verifying {
                plan,
                escalated: false,
                samples: 0,
            },
            KillOutcome::StillRunning { escalated, state } => KillDialog::Finished {
                target: plan.target,
                result: KillResult::StillRunning { escalated, state },
            },
            KillOutcome::Refused { reason } => KillDialog::Finished {
                target: plan.target,
                result: KillResult::Refused(reason),
            },
            KillOutcome::Failed { reason } => KillDialog::Finished {
                target: plan.target,
                result: KillResult::Failed(reason),
            },
        };
        self.dialog = Some(next);
        let mut reply = self.verify(latest);
        if let Some(message) = self.footer_if_hidden() {
            reply.message = Some(message);
        }
        reply
    }

    /// A finished kill whose dialog was put away: its result, for the footer.
    fn footer_if_hidden(&mut self) -> Option<String> {
        if !self.hidden {
            return None;
        }
        let Some(KillDialog::Finished { target, result }) = &self.dialog else {
            return None;
        };
        let message = format!("kill {}: {}", target.pid, result.text());
        self.dialog = None;
        self.hidden = false;
        Some(message)
    }

    /// After the process exited: once the driver no longer lists it in `latest`, its
    /// memory is free. Answers the outcome for the killer's audit record once it is known.
    fn verify(&mut self, latest: Option<&Observation>) -> Reply {
        let Some(KillDialog::Verifying {
            plan,
            escalated,
            samples,
        }) = &mut self.dialog
        else {
            return Reply::done();
        };
        let pid = plan.target.pid;
        let listed = latest.is_some_and(|obs| {
            obs.snapshot.devices.iter().any(|d| {
                d.reading()
                    .and_then(|r| r.processes.as_ref())
                    .is_some_and(|ps| ps.iter().any(|p| p.pid == pid))
            })
        });
        let plan = plan.clone();
        let mut reply = if !listed {
            let per_gpu = plan.target.memory.clone();
            let total_bytes = per_gpu.iter().filter_map(|m| m.used_bytes).sum();
            self.dialog = Some(KillDialog::Finished {
                target: plan.target.clone(),
                result: KillResult::Freed {
                    per_gpu,
                    total_bytes,
                    escalated: *escalated,
                },
            });
            Reply::effects(vec![Effect::MemoryOutcome {
                plan,
                freed_bytes: Some(total_bytes),
            }])
        } else if *samples >= VERIFY_SAMPLES {
            self.dialog = Some(KillDialog::Finished {
                target: plan.target.clone(),
                result: KillResult::StillListed,
            });
            Reply::effects(vec![Effect::MemoryOutcome {
                plan,
                freed_bytes: None,
            }])
        } else {
            *samples += 1;
            Reply::done()
        };
        reply.message = self.footer_if_hidden();
        reply
    }
}

/// The process of `row` as a kill target, with its memory on every GPU of `obs`.
pub fn target_of(row: &Row, obs: &Observation) -> KillTarget {
    let pid = row.key.pid;
    let host = obs.hosts.get(&pid);
    let mut memory = Vec::new();
    for device in &obs.snapshot.devices {
        for p in device
            .reading()
            .and_then(|r| r.processes.as_ref())
            .into_iter()
            .flatten()
            .filter(|p| p.pid == pid)
        {
            let mut label = format!("GPU {}", device.info.index);
            if let Some(gi) = p.gpu_instance_id {
                label.push_str(&format!(" MIG GI {gi}"));
            }
            memory.push(GpuMemory {
                label,
                uuid: device.info.uuid.clone(),
                used_bytes: p.used_bytes,
            });
        }
    }
    KillTarget {
        pid,
        start_time_ticks: host.and_then(|h| h.start_time_ticks),
        started_at_unix_ms: host.and_then(|h| h.started_at_unix_ms),
        user: row.user.clone(),
        command: row.command.clone(),
        memory,
    }
}

#[cfg(test)]
mod tests {
    use ratatui::crossterm::event::{KeyEventKind, KeyEventState, KeyModifiers};

    use super::*;
    use crate::fixtures::{GIB, gpu, host, obs};
    use crate::kill::{Killer, RecordingKiller};
    use crate::table::{Flags, RowKey};

    fn target(pid: u32) -> KillTarget {
        KillTarget {
            pid,
            start_time_ticks: Some(1010),
            started_at_unix_ms: None,
            user: Some("alice".into()),
            command: "python train.py".into(),
            memory: vec![GpuMemory {
                label: "GPU 0".into(),
                uuid: "GPU-0".into(),
                used_bytes: Some(3 * GIB),
            }],
        }
    }

    fn plan(pid: u32) -> KillPlan {
        RecordingKiller::new(KillOutcome::AlreadyGone)
            .plan(&target(pid))
            .unwrap()
    }

    fn key(flow: &mut KillFlow, code: KeyCode) -> Reply {
        flow.update(KillEvent::Key(KeyEvent {
            code,
            modifiers: KeyModifiers::NONE,
            kind: KeyEventKind::Press,
            state: KeyEventState::NONE,
        }))
    }

    /// A flow waiting for the user to confirm the kill of 101.
    fn confirming(readonly: bool) -> KillFlow {
        let mut flow = KillFlow::new(false, false);
        let _ = flow.update(KillEvent::Ask(Some(target(101))));
        let _ = flow.update(KillEvent::Planned(Ok(plan(101))));
        flow.readonly = readonly;
        flow
    }

    /// A flow whose kill of 101 was sent.
    fn in_flight() -> KillFlow {
        let mut flow = confirming(false);
        let _ = key(&mut flow, KeyCode::Char('y'));
        flow
    }

    /// A sample where the GPU lists `pids`.
    fn listing(t_s: i64, pids: &[u32]) -> std::sync::Arc<Observation> {
        let procs: Vec<(u32, u64)> = pids.iter().map(|&p| (p, GIB)).collect();
        obs(t_s, vec![gpu(0, 140 * GIB, GIB, &procs)], vec![])
    }

    fn finished(flow: &mut KillFlow, outcome: KillOutcome, latest: &Observation) -> Reply {
        flow.update(KillEvent::Finished {
            plan: plan(101),
            outcome,
            latest: Some(latest),
        })
    }

    #[test]
    fn ask_refuses_in_a_replay_when_readonly_while_a_kill_runs_and_without_a_selection() {
        let cases = [
            (
                KillFlow::new(true, true),
                "actions are disabled while replaying a recording",
            ),
            (KillFlow::new(true, false), READONLY_REASON),
            (
                in_flight(),
                "a kill is still in progress; wait for its result",
            ),
        ];
        for (mut flow, said) in cases {
            let before = flow.dialog.clone();
            let reply = flow.update(KillEvent::Ask(Some(target(202))));
            assert_eq!(reply, Reply::say(said));
            assert_eq!(flow.dialog, before);
        }
        let mut flow = KillFlow::new(false, false);
        assert_eq!(
            flow.update(KillEvent::Ask(None)),
            Reply::say("select a process first")
        );
        let reply = flow.update(KillEvent::Ask(Some(target(101))));
        assert_eq!(reply.effects, [Effect::Plan(target(101))]);
        assert!(matches!(flow.dialog, Some(KillDialog::Planning(_))));
    }

    #[test]
    fn the_confirmation_defaults_to_cancel_and_tab_moves_the_focus() {
        let mut flow = confirming(false);
        assert!(flow.confirming());
        let mut cancelled = flow.clone();
        assert_eq!(
            key(&mut cancelled, KeyCode::Enter),
            Reply::say("process 101 was not signalled")
        );
        assert_eq!(cancelled.dialog, None);
        for code in [KeyCode::Esc, KeyCode::Char('n'), KeyCode::Char('q')] {
            let mut cancelled = flow.clone();
            assert!(key(&mut cancelled, code).effects.is_empty(), "{code:?}");
            assert_eq!(cancelled.dialog, None, "{code:?}");
        }
        let _ = key(&mut flow, KeyCode::Tab);
        assert!(matches!(
            flow.dialog,
            Some(KillDialog::Confirm {
                kill_focused: true,
                ..
            })
        ));
        assert_eq!(
            key(&mut flow, KeyCode::Enter).effects,
            [Effect::Kill(plan(101))]
        );
        assert!(matches!(flow.dialog, Some(KillDialog::InProgress(_))));
    }

    #[test]
    fn a_confirmation_that_got_there_when_readonly_still_does_not_kill() {
        for code in [KeyCode::Char('y'), KeyCode::Char('Y')] {
            let mut flow = confirming(true);
            assert_eq!(key(&mut flow, code), Reply::say(READONLY_REASON));
            assert_eq!(flow.dialog, None);
        }
        let mut flow = confirming(true);
        let (kill, cancel) = (Rect::new(10, 5, 12, 1), Rect::new(30, 5, 12, 1));
        let reply = flow.update(KillEvent::Click {
            at: Position::new(11, 5),
            buttons: Some((kill, cancel)),
        });
        assert_eq!(reply, Reply::say(READONLY_REASON));
    }

    #[test]
    fn a_plan_is_taken_only_for_the_process_asked_about() {
        let mut flow = KillFlow::new(false, false);
        let _ = flow.update(KillEvent::Ask(Some(target(101))));
        let _ = flow.update(KillEvent::Planned(Ok(plan(202))));
        let Some(KillDialog::Finished { result, .. }) = &flow.dialog else {
            panic!("{:?}", flow.dialog);
        };
        assert_eq!(
            result.text(),
            "refused: the plan named process 202 instead of 101"
        );
        // A refusal from the worker ends it with the reason.
        let mut flow = KillFlow::new(false, false);
        let _ = flow.update(KillEvent::Ask(Some(target(101))));
        let _ = flow.update(KillEvent::Planned(Err("process 101 is not yours".into())));
        assert!(matches!(
            &flow.dialog,
            Some(KillDialog::Finished { result: KillResult::Refused(r), .. }) if r == "process 101 is not yours"
        ));
    }

    #[test]
    fn checking_can_be_cancelled_and_its_late_answer_is_dropped() {
        let mut flow = KillFlow::new(false, false);
        let _ = flow.update(KillEvent::Ask(Some(target(101))));
        let _ = key(&mut flow, KeyCode::Char('x'));
        assert!(matches!(flow.dialog, Some(KillDialog::Planning(_))));
        let _ = key(&mut flow, KeyCode::Esc);
        assert_eq!(flow.dialog, None);
        let _ = flow.update(KillEvent::Planned(Ok(plan(101))));
        assert_eq!(flow.dialog, None, "no confirmation for a cancelled check");
    }

    #[test]
    fn an_exit_is_freed_once_the_driver_stops_listing_it() {
        let mut flow = in_flight();
        let reply = finished(
            &mut flow,
            KillOutcome::Exited {
                escalated: true,
                after_ms: 10_000,
            },
            &listing(0, &[101]),
        );
        assert_eq!(reply, Reply::done());
        assert!(matches!(
            flow.dialog,
            Some(KillDialog::Verifying { samples: 1, .. })
        ));
        let reply = flow.update(KillEvent::Observed(&listing(1, &[202])));
        assert_eq!(
            reply.effects,
            [Effect::MemoryOutcome {
                plan: plan(101),
                freed_bytes: Some(3 * GIB)
            }]
        );
        let Some(KillDialog::Finished { result, .. }) = &flow.dialog else {
            panic!("{:?}", flow.dialog);
        };
        assert_eq!(
            result.text(),
            "exited (after SIGKILL); freed 3.0G (GPU 0 3.0G)"
        );
        // Any key closes the result.
        let _ = key(&mut flow, KeyCode::Char('x'));
        assert_eq!(flow.dialog, None);
    }

    #[test]
    fn a_process_the_driver_keeps_listing_is_reported_after_the_samples_allowed() {
        let mut flow = in_flight();
        let still = listing(0, &[101]);
        let _ = finished(&mut flow, KillOutcome::AlreadyGone, &still);
        for _ in 1..VERIFY_SAMPLES {
            assert_eq!(flow.update(KillEvent::Observed(&still)), Reply::done());
        }
        let reply = flow.update(KillEvent::Observed(&still));
        assert_eq!(
            reply.effects,
            [Effect::MemoryOutcome {
                plan: plan(101),
                freed_bytes: None
            }]
        );
        assert!(matches!(
            flow.dialog,
            Some(KillDialog::Finished {
                result: KillResult::StillListed,
                ..
            })
        ));
    }

    #[test]
    fn outcomes_without_an_exit_end_the_dialog_with_what_happened() {
        let cases = [
            (
                KillOutcome::StillRunning {
                    escalated: true,
                    state: Some('D'),
                },
                "still running after SIGKILL: in uninterruptible sleep (D), likely inside the driver",
            ),
            (
                KillOutcome::StillRunning {
                    escalated: false,
                    state: Some('S'),
                },
                "still running after SIGTERM (state S)",
            ),
            (
                KillOutcome::Refused {
                    reason: "PID 1".into(),
                },
                "refused: PID 1",
            ),
            (
                KillOutcome::Failed {
                    reason: "EPERM".into(),
                },
                "failed: EPERM",
            ),
        ];
        for (outcome, said) in cases {
            let mut flow = in_flight();
            let reply = finished(&mut flow, outcome, &listing(0, &[101]));
            assert!(reply.effects.is_empty(), "no memory outcome: {said}");
            let Some(KillDialog::Finished { result, .. }) = &flow.dialog else {
                panic!("{:?}", flow.dialog);
            };
            assert_eq!(result.text(), said);
        }
    }

    #[test]
    fn a_result_for_another_kill_is_ignored() {
        let mut flow = in_flight();
        let reply = flow.update(KillEvent::Finished {
            plan: plan(202),
            outcome: KillOutcome::AlreadyGone,
            latest: None,
        });
        assert_eq!(reply, Reply::done());
        assert!(matches!(flow.dialog, Some(KillDialog::InProgress(_))));
    }

    #[test]
    fn a_hidden_kill_reports_in_the_footer_and_frees_the_dialog() {
        let mut flow = in_flight();
        let _ = key(&mut flow, KeyCode::Esc);
        assert!(!flow.shown() && flow.hidden);
        // The outcome is not an exit: said at once.
        let reply = finished(
            &mut flow,
            KillOutcome::Failed {
                reason: "EPERM".into(),
            },
            &listing(0, &[101]),
        );
        assert_eq!(reply.message.as_deref(), Some("kill 101: failed: EPERM"));
        assert_eq!((flow.dialog.clone(), flow.hidden), (None, false));
        // An exit: said once the driver no longer lists it.
        let mut flow = in_flight();
        let _ = key(&mut flow, KeyCode::Char('q'));
        let _ = finished(&mut flow, KillOutcome::AlreadyGone, &listing(0, &[101]));
        let reply = flow.update(KillEvent::Observed(&listing(1, &[])));
        assert_eq!(reply.effects.len(), 1);
        assert_eq!(
            reply.message.as_deref(),
            Some("kill 101: exited; freed 3.0G (GPU 0 3.0G)")
        );
        assert_eq!(flow.dialog, None);
    }

    #[test]
    fn clicks_on_the_buttons_kill_or_cancel_and_a_result_closes() {
        let (kill, cancel) = (Rect::new(10, 5, 12, 1), Rect::new(30, 5, 12, 1));
        let click = |flow: &mut KillFlow, x: u16| {
            flow.update(KillEvent::Click {
                at: Position::new(x, 5),
                buttons: Some((kill, cancel)),
            })
        };
        let mut flow = confirming(false);
        assert_eq!(click(&mut flow, 0), Reply::done());
        assert!(flow.confirming());
        let mut cancelled = flow.clone();
        let _ = click(&mut cancelled, 31);
        assert_eq!(cancelled.dialog, None);
        assert_eq!(click(&mut flow, 11).effects, [Effect::Kill(plan(101))]);
        let mut done = KillFlow::new(false, false);
        done.dialog = Some(KillDialog::Finished {
            target: target(101),
            result: KillResult::StillListed,
        });
        let _ = click(&mut done, 0);
        assert_eq!(done.dialog, None);
    }

    #[test]
    fn a_target_holds_the_processs_memory_on_every_gpu() {
        let mut mig = gpu(1, 140 * GIB, 2 * GIB, &[(101, 2 * GIB)]);
        if let vramctl_core::types::DeviceState::Ok(r) = &mut mig.state {
            r.processes.as_mut().unwrap()[0].gpu_instance_id = Some(3);
        }
        let o = obs(
            0,
            vec![gpu(0, 140 * GIB, GIB, &[(101, GIB), (202, GIB)]), mig],
            vec![host(101, 1, "alice", "python train.py")],
        );
        let row = Row {
            key: RowKey {
                pid: 101,
                uuid: Some(o.snapshot.devices[0].info.uuid.clone()),
            },
            gpu: "0".into(),
            gpu_index: Some(0),
            user: Some("alice".into()),
            used_bytes: Some(GIB),
            allocated_bytes: None,
            cached_bytes: None,
            delta_per_min: None,
            cpu_percent: None,
            idle: None,
            flags: Flags::default(),
            command: "python train.py".into(),
            tree_prefix: String::new(),
        };
        let t = target_of(&row, &o);
        assert_eq!(t.start_time_ticks, Some(1010));
        let memory: Vec<(&str, Option<u64>)> = t
            .memory
            .iter()
            .map(|m| (m.label.as_str(), m.used_bytes))
            .collect();
        assert_eq!(
            memory,
            [("GPU 0", Some(GIB)), ("GPU 1 MIG GI 3", Some(2 * GIB))]
        );
    }

    #[test]
    fn a_freed_result_without_memory_says_only_that_the_driver_let_go() {
        let result = KillResult::Freed {
            per_gpu: vec![],
            total_bytes: 0,
            escalated: false,
        };
        assert_eq!(result.text(), "exited; the driver no longer lists it");
        assert_eq!(
            KillResult::StillListed.text(),
            "exited, but the driver still lists its memory (it may be released late)"
        );
    }
}
