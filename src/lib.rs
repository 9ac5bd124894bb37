//! Reference examples for NVIDIA NIXL's GPU device API, in Rust.
//!
//! The crate is layered; each layer uses only the ones below it.
//!
//! | layer | modules | what it is |
//! |---|---|---|
//! | programs | `src/bin`, `examples/` | `simple_write`, `ep`, the example ladder |
//! | roles | [`simple_write`], [`ep`] | the initiator and target of `simple_write`: phases, the typed protocol between them, its kernels' interface, the report; `ep`'s ranks, kernels, routing and report |
//! | example support | [`group`], [`exchange`], [`slots`], [`launch`], [`machine`], [`cli`], [`results`] | the members of a run meeting over the store (heartbeats, probes, aborts, barriers, cleanup), how the host-API examples swap metadata, the streaming ring, running roles as processes, whether this machine can run a program, exit codes, the run environment and CSV beside every result |
//! | the three sides | [`store`], [`nixl`], [`gpu`] | the metadata store (PyTorch's TCPStore protocol), NIXL (agents, descriptors, memory views), the GPU (context, memory, kernels) |
//! | base | [`deadline`], [`logging`], [`interrupt`], [`stall`], [`pattern`], [`stats`] | waiting with a deadline, diagnostics, Ctrl-C, the stall watchdog, the data pattern, percentiles |
//!
//! Read `examples/` in the order README.md's "Learn" section gives; the
//! device-API pattern itself is in `examples/put_and_signal.rs` and
//! `cuda/put_and_signal.cu`, and KERNEL_GUIDE.md walks through it.

pub mod cli;
pub mod collectives;
pub mod deadline;
pub mod ep;
pub mod exchange;
pub mod gpu;
pub mod group;
pub mod interrupt;
pub mod launch;
pub mod logging;
pub mod machine;
pub mod nixl;
pub mod pattern;
pub mod pipeline;
pub mod ranks;
pub mod results;
pub mod rng;
pub mod simple_write;
pub mod slots;
pub mod stall;
pub mod stats;
/// The metadata store: the `tcpstore` crate (crates/tcpstore), under the
/// name every call site uses.
pub use tcpstore as store;
