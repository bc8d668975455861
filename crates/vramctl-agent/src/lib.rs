//! vramctl's in-process agent, seen from outside the process: the local sockets'
//! convention ([`local_socket`]), the agent's client ([`agent_client`]) and many agents
//! polled within a budget ([`agent_poll`]), its Python sources ([`agent_package`]),
//! releasing a live process's cached memory ([`reclaim`]), its allocator snapshots
//! ([`allocator_snapshot`]), and attaching to a Python 3.14+ process without one
//! ([`remote_exec`]). `docs/agent.md`, `docs/socket.md`.
#![warn(missing_docs)]
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod agent_client;
pub mod agent_package;
pub mod agent_poll;
pub mod allocator_snapshot;
pub mod local_socket;
pub mod reclaim;
pub mod remote_exec;
