//! Reference examples for NVIDIA NIXL's GPU device API, in Rust.
//!
//! The crate reads like the architecture of the examples:
//!
//! - [`store`]: the exchange — a PyTorch-compatible TCPStore (and friends)
//!   through which the processes swap agent metadata and descriptors;
//! - [`nixl`]: the NIXL side — finding the library at run time, agents with
//!   the UCX backend, NIXL's descriptor-list wire format, memory views;
//! - [`gpu`]: the GPU side — CUDA context, device buffers, the kernels;
//! - roles and report modules drive `simple_write` (initiator, target) and
//!   print what was measured.

pub mod store;
pub mod nixl;
