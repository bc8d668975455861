//! `vramctl top`: the live terminal UI, and the browser of a recording (`--replay`): the
//! state machine ([`app::App`]), the drawing ([`view`]) and the seams the binary fills
//! (history and replay sources, judges, the killer and the reclaimer).
//!
//! It stands on `vramctl-core`, `vramctl-store` and `vramctl-observe` and must not depend on
//! the `vramctl` package: the binary's `cmd/top.rs` checks the flags, opens the sampler and
//! the audit sink, and runs the loop over this crate.
//!
//! State, events and drawing are kept apart (the ratatui "Elm" pattern, as gitui and bottom
//! do it):
//!
//! - [`event`]: one [`Event`](event::Event) enum for everything the UI reacts to — keys,
//!   mouse, resize, ticks, a new [`Observation`](vramctl_observe::observation::Observation) from the sampler
//!   thread, history and replay frames, kill results — and the threads that produce them.
//!   The sampler thread owns the NVML backend; nothing else calls it.
//! - [`app`]: the state, changed only by [`App::update`](app::App::update), which returns
//!   the [`Effect`](app::Effect)s (kill, seek, load history) for the loop to carry out.
//!   `App` routes each event to the parts of the state, each with its own `update`:
//!   [`app::process_table`], [`app::charts`], [`app::transport`] (replay),
//!   [`app::history_paging`] (live) and [`app::kill_flow`].
//! - [`layout`]: the screen's geometry, which the state (pages, clicks) and the view both
//!   use, so the state never depends on the view.
//! - [`view`]: pure drawing from `&App` into a ratatui buffer; no I/O, no clock.
//!
//! The seams (see each module): [`memory_series::HistorySource`] (the store's long history for
//! the charts) and [`replay::ReplaySource`] (a recording to browse), both served by
//! [`store::StoreSource`] over the history store; [`vramctl_observe::verdict::Judge`] (leak and idle
//! verdicts: [`vramctl_observe::verdict::AnalysisJudge`] runs the live analysis on the sampler thread) and
//! [`vramctl_observe::verdict::ReplayJudge`] (verdicts at a replay's cursor); and [`kill::Killer`] (the safe
//! kill path: [`kill::SignalKiller`], `vramctl kill`'s signalling and audit, on the action
//! thread).

pub mod app;
pub mod event;
pub mod format;
pub mod kill;
pub mod layout;
pub mod memory_series;
pub mod reclaim;
pub mod replay;
pub mod store;
pub mod table;
pub mod terminal;
pub mod theme;
pub mod view;

/// Opens the audit sink at the first kill or reclaim (the binary's
/// `audit_sink::open_sink`, the sink `vramctl kill` writes to); its error is one line.
/// Here, not in `kill`, so that `reclaim` names it without naming `kill`'s file, which
/// names `reclaim`'s.
pub type SinkOpener =
    Box<dyn FnMut() -> Result<Box<dyn vramctl_procs::signal::AuditSink + Send>, String> + Send>;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod frames;
