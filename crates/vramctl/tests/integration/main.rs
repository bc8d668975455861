//! The one integration-test binary: drives the real `vramctl` binary against the fake NVML
//! library and real processes. Each module covers one command.

mod harness;
mod info;
mod status;
mod top;
mod usage;
