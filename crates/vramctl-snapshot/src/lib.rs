//! Reading PyTorch CUDA caching-allocator snapshots (`torch.cuda.memory._dump_snapshot()`,
//! `torch.cuda.memory_snapshot()`) and summarizing them: [`pickle`] reads the file without
//! executing anything, [`model`] turns it into typed segments, blocks and trace entries
//! across torch versions, [`summary`] computes what `vramctl snapshot FILE` prints, [`top`] who holds
//! the live memory (also as collapsed stacks), [`diff`] what changed between two snapshots,
//! [`replay`] the state at any event of the trace and [`timeline`] live memory over it,
//! [`view`] the browser viewer's model of a file.

pub mod diff;
pub mod model;
pub mod observed_oom;
pub mod oom_cause;
pub mod oom_message;
pub mod pickle;
pub mod replay;
mod size_text;
pub mod summary;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod timeline;
pub mod top;
pub mod view;

pub use model::{Snapshot, SnapshotError, TraceStacks, open, open_with};
pub use pickle::{Limits, PickleError};
pub use summary::{Summary, summarize};
