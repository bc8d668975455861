//! Reading PyTorch CUDA caching-allocator snapshots (`torch.cuda.memory._dump_snapshot()`,
//! `torch.cuda.memory_snapshot()`) and summarizing them: [`pickle`] reads the file without
//! executing anything, [`model`] turns it into typed segments, blocks and trace entries
//! across torch versions, [`summary`] computes what `vramctl snapshot FILE` prints, [`top`] who holds
//! the live memory (also as collapsed stacks), [`diff`] what changed between two snapshots,
//! [`replay`] the state at any event of the trace and [`timeline`] live memory over it.

pub mod diff;
pub mod model;
pub mod pickle;
pub mod replay;
mod size_text;
pub mod summary;
pub mod timeline;
pub mod top;

pub use model::{Snapshot, SnapshotError, TraceStacks, open, open_with};
pub use pickle::{Limits, PickleError};
pub use summary::{Summary, summarize};
