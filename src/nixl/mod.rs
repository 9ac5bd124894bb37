//! The NIXL side: loading the library, agents, descriptor lists, memory.

pub mod agent;
pub mod memory;
pub mod runtime;
pub mod serdes;
