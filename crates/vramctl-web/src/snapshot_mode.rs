//! The snapshot mode (issue 32): PyTorch allocator snapshots given on the command line
//! (`vramctl snapshot view FILE`, `serve --snapshot FILE`), opened and indexed once at
//! start ([`vramctl_snapshot::view::SnapshotView`]), then asked for what the page draws:
//!
//! - `/api/snapshot/files`: each file's name, size, devices with a trace and summary;
//! - `/api/snapshot/timeline?file=I&device=D[&from=E&to=E][&width=N][&bands=N]`: the
//!   timeline over events `from..to` in at most `width` buckets with the `bands` largest
//!   allocations (the view model's bounds apply);
//! - `/api/snapshot/state?file=I&device=D&event=E`: segments and blocks after event E.
//!
//! A file is named by its index among those given at start, never by a path: no request
//! makes this server open anything.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;
use vramctl_exporter::routes::RouteRequest;
use vramctl_snapshot::view::{FileInfo, QueryError, SnapshotView};

use crate::{Mode, Query, Reply, WebSettings};

/// Buckets of a timeline when the page does not say (a wide screen's pixels).
const DEFAULT_WIDTH: usize = 1600;
/// Bands of a timeline when the page does not say.
const DEFAULT_BANDS: usize = 400;

/// Opens and indexes each file (in order, as the page lists them).
///
/// # Errors
/// A file cannot be read or is not a snapshot (the error names it).
pub fn open_files(paths: &[PathBuf]) -> anyhow::Result<Vec<Arc<SnapshotView>>> {
    paths
        .iter()
        .map(|path| {
            SnapshotView::open(path, vramctl_snapshot::Limits::default())
                .map(Arc::new)
                .with_context(|| format!("cannot read the snapshot '{}'", path.display()))
        })
        .collect()
}

/// The mode: the opened files.
pub struct SnapshotMode {
    files: Vec<Arc<SnapshotView>>,
}

impl SnapshotMode {
    pub fn new(settings: &WebSettings) -> Self {
        Self::from_files(settings.snapshots.clone())
    }

    /// The mode of `files` alone (`vramctl snapshot view`, which has no sampler).
    pub fn from_files(files: Vec<Arc<SnapshotView>>) -> Self {
        Self { files }
    }

    fn file(&self, query: &Query) -> Result<&SnapshotView, Reply> {
        let index = non_negative(query, "file")?.unwrap_or(0);
        usize::try_from(index)
            .ok()
            .and_then(|i| self.files.get(i))
            .map(AsRef::as_ref)
            .ok_or_else(|| {
                Reply::error(
                    404,
                    &format!("no snapshot file {index}: {} given", self.files.len()),
                )
            })
    }

    fn timeline(&self, query: &Query) -> Result<Reply, Reply> {
        let file = self.file(query)?;
        let device = query.int("device")?.unwrap_or(0);
        let from = non_negative(query, "from")?.unwrap_or(0);
        let to = non_negative(query, "to")?;
        let width = non_negative(query, "width")?.map_or(DEFAULT_WIDTH, as_usize);
        let bands = non_negative(query, "bands")?.map_or(DEFAULT_BANDS, as_usize);
        let answer = file
            .timeline(device, from, to, width, bands)
            .map_err(not_found)?;
        Ok(Reply::json(&answer))
    }

    fn state(&self, query: &Query) -> Result<Reply, Reply> {
        let file = self.file(query)?;
        let device = query.int("device")?.unwrap_or(0);
        let event = non_negative(query, "event")?
            .ok_or_else(|| Reply::error(400, "'event' is required"))?;
        let answer = file.state_at(device, event).map_err(not_found)?;
        Ok(Reply::json(&answer))
    }
}

fn as_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn not_found(err: QueryError) -> Reply {
    Reply::error(404, &err.to_string())
}

/// `name` as a whole number ≥ 0.
fn non_negative(query: &Query, name: &str) -> Result<Option<u64>, Reply> {
    match query.int(name)? {
        None => Ok(None),
        Some(n) => u64::try_from(n)
            .map(Some)
            .map_err(|_| Reply::error(400, &format!("'{name}' must not be negative"))),
    }
}

#[derive(Serialize)]
struct Files<'a> {
    files: Vec<FileInfo<'a>>,
}

impl Mode for SnapshotMode {
    fn name(&self) -> &'static str {
        "snapshot"
    }

    fn title(&self) -> &'static str {
        "Snapshot"
    }

    fn script(&self) -> &'static str {
        include_str!("../assets/snapshot.js")
    }

    fn api(&self, request: &RouteRequest, query: &Query) -> Option<Reply> {
        let route = request.path.strip_prefix("/api/snapshot/")?;
        Some(match route {
            "files" => Reply::json(&Files {
                files: self.files.iter().map(|f| f.info()).collect(),
            }),
            "timeline" => self.timeline(query).unwrap_or_else(|e| e),
            "state" => self.state(query).unwrap_or_else(|e| e),
            _ => Reply::error(404, "no such snapshot route"),
        })
    }
}

/// Most requests answered at once by the viewer's own server (one user's browser).
const VIEWER_MAX_REQUESTS: usize = 16;

/// Serves the page with the snapshot mode alone on `listener` until SIGINT/SIGTERM:
/// `vramctl snapshot view`. The exporter's server with no sampler behind it: `/metrics` and
/// `/healthz` answer 503, the page and `/api/snapshot/` answer from `files`.
///
/// # Errors
/// The server cannot start or fails.
pub fn serve_files(
    listener: std::net::TcpListener,
    files: Vec<Arc<SnapshotView>>,
) -> std::io::Result<()> {
    use vramctl_exporter::connections::{
        DEFAULT_MAX_CONNECTIONS, DEFAULT_MAX_CONNECTIONS_PER_PEER, Limits,
    };
    use vramctl_exporter::server::{self, ServerSettings};
    let view = crate::WebView::snapshots_only(files);
    let settings = ServerSettings {
        web: vramctl_exporter::webconfig::WebConfig::plain(),
        max_requests: VIEWER_MAX_REQUESTS,
        stale_after: std::time::Duration::from_secs(10),
        recording: None,
        limits: Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
        },
        io_timeout: server::IO_TIMEOUT,
        routes: Some(Arc::new(view)),
    };
    server::serve(
        listener,
        Arc::new(vramctl_exporter::cache::Cache::new()),
        settings,
        server::termination(),
    )
}
