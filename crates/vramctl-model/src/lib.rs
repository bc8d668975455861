//! What a model is and how much GPU memory a job on it needs, before it runs
//! (`vramctl estimate`, `docs/estimate.md`).
//!
//! - [`read_model`]: a Hugging Face model directory, its `config.json`, a `.safetensors`
//!   file or `model.safetensors.index.json`, or a `.gguf` file, into a [`Model`] — the
//!   [`Architecture`] and, where a weights header says so, the exact parameter count and
//!   bytes per dtype. Only headers are read, with bounded lengths: never the weights.
//! - [`synthesize`]: an architecture from a parameter count (`--params 7B --arch llama`).
//! - [`memory_model`]: the estimate as named terms (weights, gradients, optimizer states,
//!   activations, logits, context, allocator overhead, ...) and the largest batch that fits.
//!
//! No NVML, no store: pure functions over files and numbers.

pub mod architecture;
pub mod caching_allocator;
pub mod fit_check;
pub mod generation_step;
pub mod gguf;
pub mod hf_config;
pub mod limited_allocator;
pub mod memory_model;
pub mod model;
pub mod safetensors_header;
pub mod training_step;

pub use architecture::{Architecture, Dtype, Family, SlidingWindow, synthesize};
pub use model::{Model, ModelError, WeightsInfo, read_model};
