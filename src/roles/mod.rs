//! The two roles of `simple_write`, and what they share: store keys, the
//! run plan, and the store as each side sees it.

pub mod baseline;
pub mod connection;
pub mod initiator;
pub mod keys;
pub mod peer;
pub mod plan;
pub mod target;
