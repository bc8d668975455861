//! The one integration-test binary: drives the real `vramctl` binary against the fake NVML
//! library and real processes. Each module covers one command.

mod agent_series;
mod allocator_snapshot;
mod architecture;
mod clock;
mod containers;
mod daemon;
mod disk_full;
mod doctor;
mod drm;
mod escapes;
mod estimate;
mod fit;
mod gpu_job;
mod harness;
mod history;
mod import;
mod info;
mod kill;
mod kubernetes;
mod leaks;
mod leakset;
mod packaging;
mod ps;
mod real_processes;
mod reap;
mod reclaim;
mod reclaim_attach;
mod record;
mod run;
mod serve;
mod slurm;
mod status;
mod top;
mod usage;
