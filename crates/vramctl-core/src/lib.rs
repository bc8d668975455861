//! vramctl's core: the project's types, the GPU backend seam and its NVML implementation,
//! the sampler, /proc enrichment and safe signalling.
//!
//! Data flows one way (see `ARCHITECTURE.md`):
//!
//! ```text
//! backend ──▶ sampler ──▶ store ──▶ analysis ──▶ frontends
//! ```
//!
//! Only [`backend::nvml`] names `nvml_wrapper`; [`backend::drm`] reads AMD and Intel GPUs
//! from sysfs and DRM fdinfo, [`backend::combined`] shows both in one run; everything else speaks [`types`]. A value a
//! device cannot report is `None`, never 0. Time is injected through [`clock::Clock`] so that
//! nothing above the backend needs a wall clock in tests.
#![warn(missing_docs)]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod agent_client;
pub mod agent_package;
pub mod agent_poll;
pub mod allocator_snapshot;
pub mod analysis;
pub mod audit_record;
pub mod backend;
pub mod clock;
pub mod command_line;
pub mod duration;
pub mod local_socket;
pub mod process_catalog;
pub mod procinfo;
pub mod reclaim;
pub mod remote_exec;
pub mod sampler;
pub mod sanity;
pub mod signal;
pub mod types;
pub mod untrusted;
pub mod wall_time;

pub use backend::combined::CombinedBackend;
pub use backend::drm::DrmBackend;
pub use backend::nvml::NvmlBackend;
pub use backend::{Backend, DeviceError, InitError};
pub use sampler::Sampler;
