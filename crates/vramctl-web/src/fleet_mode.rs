//! The fleet mode (`#fleet`, with `serve --prometheus URL`): many hosts' `vramctl_*` series
//! read from a Prometheus server (crate `vramctl-fleet`): hosts × GPUs, the biggest holders
//! and the leak/idle verdicts across hosts, one host's drill-down. Its API:
//!
//! | route | answer |
//! | --- | --- |
//! | `/api/fleet` | the fleet now ([`vramctl_fleet::fleet_model::Fleet`]) with `prometheus` (the URL) and `queried_at_ms` |
//! | `/api/fleet/host?job=&instance=&window=` | one host ([`vramctl_fleet::fleet_model::HostDetail`]) over the last `window` seconds (default 3600) |
//!
//! A Prometheus that fails (down, slow, an error answer) gives `502` with its reason. The
//! fleet's answer is kept [`FLEET_CACHE`] so that several open pages cost Prometheus one
//! round of queries, and one request at a time asks it (the others wait for its answer).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::Serialize;
use vramctl_exporter::routes::RouteRequest;
use vramctl_fleet::fleet_model::{self, Fleet, HostKey};
use vramctl_fleet::prom_client::PrometheusClient;

use crate::{Mode, Query, Reply};

/// How long an answer of `/api/fleet` is reused.
pub const FLEET_CACHE: Duration = Duration::from_secs(2);
/// Longest `job` or `instance` a drill-down takes (the answers' labels are cut there too).
const MAX_LABEL_BYTES: usize = 1024;
/// The drill-down's window when the request gives none, seconds.
const DEFAULT_WINDOW_S: i64 = 3600;

/// The fleet mode.
pub struct FleetMode {
    client: PrometheusClient,
    cache: Mutex<Option<(Instant, Bytes)>>,
}

#[derive(Serialize)]
struct FleetAnswer<'a> {
    prometheus: &'a str,
    queried_at_ms: u128,
    #[serde(flatten)]
    fleet: &'a Fleet,
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
}

/// Runs `future` to completion on a runtime of its own, on a thread of its own: API
/// answers run on the server's blocking pool, inside its runtime's context, where a second
/// runtime may not be entered. The client's own timeout bounds it.
fn block_on<T: Send>(
    future: impl std::future::Future<Output = anyhow::Result<T>> + Send,
) -> anyhow::Result<T> {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| anyhow::anyhow!("cannot start the fleet's HTTP client: {e}"))?
                    .block_on(future)
            })
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the fleet's query thread failed")))
    })
}

impl FleetMode {
    /// The mode reading `client`'s Prometheus.
    pub fn new(client: PrometheusClient) -> Self {
        Self {
            client,
            cache: Mutex::new(None),
        }
    }

    fn fleet(&self) -> Reply {
        // Held while asking: concurrent requests wait and reuse this answer.
        let mut cache = self
            .cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, body)) = cache.as_ref() {
            if at.elapsed() < FLEET_CACHE {
                return Reply::json_bytes(body.clone());
            }
        }
        match block_on(fleet_model::fetch_fleet(&self.client)) {
            Ok(fleet) => {
                let answer = FleetAnswer {
                    prometheus: self.client.url(),
                    queried_at_ms: now_ms(),
                    fleet: &fleet,
                };
                match serde_json::to_vec(&answer) {
                    Ok(json) => {
                        let body = Bytes::from(json);
                        *cache = Some((Instant::now(), body.clone()));
                        Reply::json_bytes(body)
                    }
                    Err(e) => Reply::error(500, &format!("cannot write the fleet as JSON: {e}")),
                }
            }
            Err(e) => Reply::error(502, &format!("{e:#}")),
        }
    }

    fn host(&self, query: &Query) -> Result<Reply, Reply> {
        let label = |name: &str| -> Result<String, Reply> {
            let value = query
                .get(name)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| Reply::error(400, &format!("'{name}' is required")))?;
            if value.len() > MAX_LABEL_BYTES {
                return Err(Reply::error(400, &format!("'{name}' is too long")));
            }
            Ok(value.to_owned())
        };
        let key = HostKey {
            job: label("job")?,
            instance: label("instance")?,
        };
        let window_s = query.int("window")?.unwrap_or(DEFAULT_WINDOW_S);
        if window_s <= 0 {
            return Err(Reply::error(
                400,
                "'window' must be a positive number of seconds",
            ));
        }
        let window = Duration::from_secs(window_s.unsigned_abs());
        match block_on(fleet_model::fetch_host(&self.client, &key, window)) {
            Ok(detail) => Ok(Reply::json(&detail)),
            Err(e) => Err(Reply::error(502, &format!("{e:#}"))),
        }
    }
}

impl Mode for FleetMode {
    fn name(&self) -> &'static str {
        "fleet"
    }

    fn title(&self) -> &'static str {
        "Fleet"
    }

    fn script(&self) -> &'static str {
        include_str!("../assets/fleet.js")
    }

    fn api(&self, request: &RouteRequest, query: &Query) -> Option<Reply> {
        let reply = match request.path.as_str() {
            "/api/fleet" => self.fleet(),
            "/api/fleet/host" => self.host(query).unwrap_or_else(|e| e),
            _ => return None,
        };
        Some(reply)
    }
}

#[cfg(test)]
mod tests {
    use vramctl_fleet::prom_client::ClientSettings;

    use super::*;

    /// A Prometheus that cannot be reached: the API answers 502 with the reason, and a
    /// drill-down without its labels 400, without asking anything.
    #[test]
    fn failures_are_answers_not_panics() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        // Nothing listens there any more: connecting is refused at once.
        let client =
            PrometheusClient::new(ClientSettings::new(&format!("http://127.0.0.1:{port}")))
                .expect("client");
        let mode = FleetMode::new(client);
        let request = |path: &str| RouteRequest {
            path: path.into(),
            ..RouteRequest::default()
        };
        let status = |reply: Reply| reply.into_response().status;
        assert_eq!(
            status(
                mode.api(&request("/api/fleet"), &Query::default())
                    .expect("route")
            ),
            502
        );
        assert_eq!(
            status(
                mode.api(&request("/api/fleet/host"), &Query::parse("job=vramctl"))
                    .expect("route")
            ),
            400
        );
        assert_eq!(
            status(
                mode.api(
                    &request("/api/fleet/host"),
                    &Query::parse("job=a&instance=b&window=-5")
                )
                .expect("route")
            ),
            400
        );
        assert!(mode.api(&request("/api/now"), &Query::default()).is_none());
    }
}
