//! The read-only web view of `vramctl serve`: one page with a mode switch, its assets
//! embedded in the binary, a JSON API under `/api/`, and a Server-Sent Events stream of the
//! live ticks. It answers on `serve`'s own listener through the exporter's seam
//! ([`vramctl_exporter::routes::Routes`]): same TLS, basic auth, connection limits and
//! configured headers as `/metrics`. This crate depends on `vramctl-exporter` (for the seam
//! and the tick consumer), never the other way round.
//!
//! # Adding a mode (the contract)
//!
//! A mode is **one module + one asset + one line of registration**:
//! 1. a module `src/<name>_mode.rs` with a type implementing [`Mode`]: its [`Mode::name`]
//!    (`fleet`: the tab's id, `#fleet` in the address, its script `/assets/fleet.js`), its
//!    tab label, its script (`include_str!("../assets/fleet.js")`) and its API
//!    ([`Mode::api`]: answer the paths under `/api/<name>/` with [`Reply`], `None` for any
//!    other path). Answers run on the server's blocking pool: bound their time and size;
//!    never write anything (only GET and HEAD reach here); every text from a user
//!    (commands, names, files) is data, shipped as JSON strings, never markup;
//! 2. the asset `assets/<name>.js`, which calls `vramctl.registerMode("<name>", {mount,
//!    unmount})` (see `assets/app.js`: `mount(root, params)` gets an empty element it owns
//!    until `unmount()`, and the address's parameters, `#<name>?a=1`; `vramctl.setParams`
//!    writes them back; build nodes with `vramctl.el` and `textContent`, never `innerHTML`;
//!    `vramctl.api(path)` fetches JSON); no inline script or style, no other origin: the
//!    page's CSP ([`CONTENT_SECURITY_POLICY`]) refuses them;
//! 3. one line in [`modes`] constructing it from [`WebSettings`] (add a field there for
//!    what it needs, e.g. a Prometheus URL or snapshot files).
//!
//! The page (`/`) lists the registered modes as tabs, in [`modes`]' order, and loads each
//! mode's script; `/assets/<name>.js` is served from [`Mode::script`].
//!
//! Modules: [`assets`] (embedded files, the page, caching), [`live_feed`] (the tick consumer:
//! the latest tick as JSON, a short replay buffer, the event streams), [`history_series`]
//! (the history store downsampled per bucket, min and max, for a chart), [`live_mode`] (the
//! live/history mode and its API), [`fleet_mode`] (the fleet through Prometheus, with
//! `serve --prometheus`), [`snapshot_mode`] (allocator snapshots given on the command
//! line: their timeline, states and OOMs), [`reply`] (JSON and error answers, query
//! parsing).

pub mod assets;
pub mod fleet_mode;
pub mod history_series;
pub mod live_feed;
pub mod live_mode;
pub mod reply;
pub mod snapshot_mode;

use std::path::PathBuf;
use std::sync::Arc;

use vramctl_exporter::routes::{RouteRequest, RouteResponse, Routes};

pub use reply::{Query, Reply};

/// The page's Content-Security-Policy: only this origin's scripts, styles and connections,
/// no inline script or style element, no plugins, no framing, no forms.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
     object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'";

/// One mode of the page (a tab): see the crate's docs for the contract.
pub trait Mode: Send + Sync {
    /// Its id: lowercase ASCII letters (`live`, `fleet`, `snapshot`).
    fn name(&self) -> &'static str;
    /// Its tab's label.
    fn title(&self) -> &'static str;
    /// Its script, served as `/assets/<name>.js`.
    fn script(&self) -> &'static str;
    /// The answer to `request` (a path under `/api/`), or `None` when the path is not this
    /// mode's.
    fn api(&self, request: &RouteRequest, query: &Query) -> Option<Reply>;
}

/// What the modes need from `serve`'s command line.
#[derive(Debug, Clone)]
pub struct WebSettings {
    /// The history database (`serve --record`), read for the charts; `None`: only what
    /// this server has seen since it started (the live feed's buffer).
    pub history_db: Option<PathBuf>,
    /// The sampler's interval, in milliseconds (how late a tick may be).
    pub interval_ms: u64,
    /// `serve --prometheus URL`: the Prometheus the fleet mode reads; `None`: no fleet tab.
    pub prometheus: Option<vramctl_fleet::prom_client::PrometheusClient>,
    /// The leak analysis' thresholds (`serve`'s `--min-idle-mem`, …), for the leak onsets
    /// marked on the recorded history.
    pub leak: vramctl_leaks::analysis::LeakConfig,
    /// Allocator snapshots given on the command line (`serve --snapshot FILE`, `snapshot
    /// view FILE`), opened and indexed: the snapshot mode's files.
    pub snapshots: Vec<Arc<vramctl_snapshot::view::SnapshotView>>,
}

/// The registered modes, in tab order. Adding a mode is one line here.
fn modes(settings: &WebSettings, feed: &Arc<live_feed::LiveFeed>) -> Vec<Box<dyn Mode>> {
    let mut modes: Vec<Box<dyn Mode>> = vec![Box::new(live_mode::LiveMode::new(
        settings,
        Arc::clone(feed),
    ))];
    if let Some(client) = &settings.prometheus {
        modes.push(Box::new(fleet_mode::FleetMode::new(client.clone())));
    }
    // Only when snapshot files were given: an empty tab would be noise.
    if !settings.snapshots.is_empty() {
        modes.push(Box::new(snapshot_mode::SnapshotMode::new(settings)));
    }
    modes
}

/// The web view: implements the exporter's [`Routes`].
pub struct WebView {
    modes: Vec<Box<dyn Mode>>,
    assets: assets::Assets,
}

impl WebView {
    /// The view with its modes; `feed` is the tick consumer the collector must be given
    /// ([`live_feed::LiveFeed::consumer`]).
    pub fn new(settings: &WebSettings, feed: &Arc<live_feed::LiveFeed>) -> Self {
        Self::with_modes(modes(settings, feed))
    }

    /// The view of `vramctl snapshot view`: the snapshot mode alone (no sampler, no live
    /// feed).
    pub fn snapshots_only(files: Vec<Arc<vramctl_snapshot::view::SnapshotView>>) -> Self {
        Self::with_modes(vec![Box::new(snapshot_mode::SnapshotMode::from_files(
            files,
        ))])
    }

    fn with_modes(modes: Vec<Box<dyn Mode>>) -> Self {
        let scripts: Vec<(&'static str, &'static str, &'static str)> = modes
            .iter()
            .map(|m| (m.name(), m.title(), m.script()))
            .collect();
        Self {
            assets: assets::Assets::new(&scripts),
            modes,
        }
    }
}

impl Routes for WebView {
    fn serves(&self, path: &str) -> bool {
        path == "/" || path.starts_with("/assets/") || path.starts_with("/api/")
    }

    fn respond(&self, request: &RouteRequest) -> RouteResponse {
        if request.path.starts_with("/api/") {
            let query = Query::parse(&request.query);
            let reply = self
                .modes
                .iter()
                .find_map(|mode| mode.api(request, &query))
                .unwrap_or_else(|| Reply::error(404, "no such API route"));
            return reply.into_response();
        }
        self.assets.respond(request)
    }
}
