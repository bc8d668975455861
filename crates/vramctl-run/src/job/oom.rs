//! Out-of-memory errors as frameworks print them on stderr.
//!
//! A GPU job that runs out of memory usually exits 1, which says nothing by itself; the
//! message on stderr says which allocator failed. Each pattern is a substring a framework
//! (or the CUDA runtime under it) prints for a device allocation that failed, taken from
//! their sources and issue trackers (`research-round2.md` §2.4, §3), not fitted to data.
//! Host memory errors (`MemoryError`, the kernel's OOM killer) are deliberately not here:
//! `run` reports those as what they are (an exit status, a signal).

use serde::Serialize;

/// Which allocator ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum OomSource {
    /// PyTorch's caching allocator (`torch.OutOfMemoryError: CUDA out of memory`).
    Pytorch,
    /// JAX / XLA (`RESOURCE_EXHAUSTED: Out of memory`).
    Jax,
    /// TensorFlow (`ResourceExhaustedError`, `OOM when allocating tensor`).
    Tensorflow,
    /// The CUDA runtime or driver, or a CUDA library (cuBLAS, cuDNN).
    Cuda,
}

impl OomSource {
    /// The name people know it by.
    pub fn label(self) -> &'static str {
        match self {
            Self::Pytorch => "PyTorch",
            Self::Jax => "JAX/XLA",
            Self::Tensorflow => "TensorFlow",
            Self::Cuda => "CUDA",
        }
    }
}

/// Substrings, checked in order (the first that matches names the source).
const PATTERNS: &[(&str, OomSource)] = &[
    ("CUDA out of memory", OomSource::Pytorch),
    ("torch.OutOfMemoryError", OomSource::Pytorch),
    ("torch.cuda.OutOfMemoryError", OomSource::Pytorch),
    ("RESOURCE_EXHAUSTED: Out of memory", OomSource::Jax),
    ("ResourceExhaustedError", OomSource::Tensorflow),
    ("OOM when allocating tensor", OomSource::Tensorflow),
    ("cudaErrorMemoryAllocation", OomSource::Cuda),
    ("CUDA_ERROR_OUT_OF_MEMORY", OomSource::Cuda),
    ("CUBLAS_STATUS_ALLOC_FAILED", OomSource::Cuda),
    ("CUDNN_STATUS_ALLOC_FAILED", OomSource::Cuda),
    ("CUDA error: out of memory", OomSource::Cuda),
];

/// The source of an out-of-memory error `line` reports, if it reports one.
pub fn match_line(line: &str) -> Option<OomSource> {
    // JAX's newer message: "RESOURCE_EXHAUSTED: ... Out of memory while trying to allocate".
    if line.contains("RESOURCE_EXHAUSTED") && line.contains("memory") {
        return Some(OomSource::Jax);
    }
    PATTERNS
        .iter()
        .find(|(needle, _)| line.contains(needle))
        .map(|&(_, source)| source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_framework_s_message_is_recognised() {
        let cases = [
            (
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB",
                OomSource::Pytorch,
            ),
            (
                "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity)",
                OomSource::Pytorch,
            ),
            (
                "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.",
                OomSource::Jax,
            ),
            (
                "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[1024,1024]",
                OomSource::Tensorflow,
            ),
            (
                "CUDA runtime error: cudaErrorMemoryAllocation (2) out of memory",
                OomSource::Cuda,
            ),
            (
                "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
                OomSource::Cuda,
            ),
        ];
        for (line, source) in cases {
            assert_eq!(match_line(line), Some(source), "{line}");
        }
    }

    #[test]
    fn host_memory_errors_and_ordinary_lines_are_not_gpu_oom() {
        for line in [
            "MemoryError",
            "Killed",
            "step 3 loss 2.31",
            "ValueError: unknown optimizer 'adamw2'",
            "warning: host out of memory, swapping",
        ] {
            assert_eq!(match_line(line), None, "{line}");
        }
    }
}
