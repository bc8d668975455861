//! vramctl's GPU backends and the sampler.
//!
//! [`backend::Backend`] is everything a frontend asks a GPU source; [`backend::nvml`] is
//! the only module that names `nvml_wrapper`, [`backend::drm`] reads AMD and Intel GPUs from
//! sysfs and DRM fdinfo, [`backend::combined`] shows both in one run. [`sampler::Sampler`]
//! turns a backend into one `Snapshot` per tick with per-device fault isolation.
#![warn(missing_docs)]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod backend;
pub mod sampler;

pub use backend::combined::CombinedBackend;
pub use backend::drm::DrmBackend;
pub use backend::nvml::NvmlBackend;
pub use backend::{Backend, DeviceError, InitError};
pub use sampler::Sampler;
