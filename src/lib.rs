//! Reference examples for NVIDIA NIXL's GPU device API, in Rust.
//!
//! The crate reads like the architecture of the examples:
//!
//! - [`store`]: the exchange — a PyTorch-compatible TCPStore (and an
//!   in-memory one) through which the processes swap agent metadata and
//!   descriptors;
//! - [`nixl`]: the NIXL side — finding the library at run time, agents with
//!   the UCX backend, NIXL's descriptor-list wire format, memory views;
//! - [`gpu`]: the GPU side — context, device buffers, the kernels and how
//!   they are run;
//! - [`roles`]: the initiator and the target of `simple_write`;
//! - [`pattern`] and [`report`]: what is sent and how it is checked, and
//!   what is printed;
//! - [`exchange`]: how the two-process examples swap agent metadata and
//!   descriptors (our TCPStore, or NIXL's own etcd / TCPStore clients), with
//!   [`etcd`] to check and clean an etcd server;
//! - [`slots`]: the slot ring of the streaming example (DRAM or VRAM);
//! - [`supervise`]: running an example's roles as child processes.

pub mod cli;
pub mod ep;
pub mod etcd;
pub mod exchange;
pub mod gpu;
pub mod interrupt;
pub mod nixl;
pub mod pattern;
pub mod report;
pub mod roles;
pub mod slots;
pub mod stats;
pub mod store;
pub mod supervise;
