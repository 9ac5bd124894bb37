//! An in-process store for single-process examples.
