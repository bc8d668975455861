//! Leak analysis on labeled traces: the synthetic workloads (a model of the caching
//! allocator driven like `scripts/workloads/*.py`) and the real H200 fixture.

mod labeled;
mod readers;
mod sweep;
mod synth;
mod workloads;
