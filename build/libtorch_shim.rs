//! Builds the C++ shim over c10d::TCPStore (feature `libtorch`).

pub fn build() {}
