//! The NIXL side: loading the library, agents, descriptor lists (NIXL's
//! own wire format), host memory, memory views, one rank's window and
//! rank-indexed views ([`net`]), and host-API transfers.
//! Depends on nothing above it.

pub mod agent;
pub mod memory;
pub mod net;
pub mod runtime;
pub mod serdes;
pub mod view;
pub mod xfer;
