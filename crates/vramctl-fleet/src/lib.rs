//! The fleet view of `vramctl serve --prometheus URL`: many hosts' `vramctl_*` series read
//! from a Prometheus server's HTTP API (PromQL), not from a home-made aggregator.
//!
//! - [`prom_client`]: the HTTP(S) client of `/api/v1/query` and `/api/v1/query_range`,
//!   bounded in time and size.
//! - [`prom_response`]: the API's JSON answers, parsed and bounded (series, labels, points).
//! - [`promql`]: every query this crate sends, and the quoting of label values.
//! - [`fleet_model`]: hosts × GPUs, the biggest holders, the leak and idle verdicts, one
//!   host's drill-down; pure builders from answers, and the async fetchers.
//!
//! It names no other vramctl crate: it reads what `vramctl serve` exports (docs/metrics.md)
//! through Prometheus; the web page's crate serves what it builds as JSON.

pub mod fleet_model;
pub mod prom_client;
pub mod prom_response;
pub mod promql;
