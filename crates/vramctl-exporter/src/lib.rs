//! The Prometheus exporter behind `vramctl serve`: the collector (sampler thread, process
//! labels, error and peak statistics), the metric rendering, the HTTP(S) server with its web
//! config (TLS, basic auth) and connection limits, the live leak and idle verdicts, and the
//! history recording of `serve --record`.
//!
//! Main types: [`collector::Collector`] (its [`collector::CollectorConfig`]), [`cache::Cache`]
//! (what a scrape copies), [`server::serve`]'s [`server::ServerSettings`],
//! [`webconfig::WebConfig`], [`live_verdicts::LiveAnalysis`], [`recording::HistoryRecorder`].
//! Built on `vramctl-observe` (the live loop, the daemon's socket) and `vramctl-history` (the
//! recorder); it must not depend on the `vramctl` package (its command line, clap, exit
//! codes): `vramctl serve` parses the flags and hands this crate typed settings.
//!
//! ```text
//!  sampler thread (std)                         HTTP thread (tokio, current-thread)
//!  ┌──────────────────────────────┐            ┌─────────────────────────────────┐
//!  │ NvmlSource::sample           │            │ accept ─▶ TLS? ─▶ hyper http1    │
//!  │   (init with backoff, tick)  │            │   /metrics: auth, then the       │
//!  │ MetadataCache (/proc)        │  publish   │   cached bytes + the sample age  │
//!  │ Stats (errors, peaks)        │ ─────────▶ │   /healthz: sampler heartbeat    │
//!  │ render() × 2 formats         │   Cache    │ never calls NVML                 │
//!  └──────────────────────────────┘            └─────────────────────────────────┘
//! ```
//!
//! Why this shape: a scrape must never wait on the driver (a hung NVML call would hang
//! Prometheus' scrape too), so the sampler runs on its own interval and renders the
//! exposition text once per tick; a scrape copies cached bytes and appends one dynamic
//! line, the age of that sample, so a stuck sampler is visible. The async runtime stays in
//! this crate (`server`); the rest of vramctl is threads and channels.
//!
//! Consumers of a tick (see [`collector`]): the leak and idle analysis ([`live_verdicts`]: fills
//! the verdicts the renderer exports) and the history recorder (`serve --record`,
//! [`recording`]); `vramctl serve` adds the web view's live feed (`vramctl-web`).
//!
//! Other paths than `/metrics` and `/healthz` are answered through [`routes::Routes`], the
//! seam a crate above implements (`vramctl-web`: the page, its assets and API, its event
//! stream); this crate names no page.

pub mod auth;
pub mod cache;
pub mod collector;
pub mod connections;
pub mod live_verdicts;
pub mod metadata;
pub mod oom_causes;
pub mod owner_series;
pub mod recording;
pub mod render;
pub mod routes;
pub mod server;
pub mod source;
pub mod stats;
pub mod timed_io;
pub mod webconfig;
