//! The NIXL side: loading the library, agents, descriptor lists, memory,
//! memory views.

pub mod agent;
pub mod host_agent;
pub mod memory;
pub mod runtime;
pub mod serdes;
pub mod view;
pub mod xfer;
