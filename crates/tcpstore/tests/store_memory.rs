//! `MemoryStore` against the shared semantic suite.

#[path = "store_suite.rs"]
mod suite;

use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tcpstore::memory::MemoryStore;
use tcpstore::{Store, StoreError};

#[test]
fn memory_store_passes_the_suite() {
    let store = MemoryStore::new(Duration::from_millis(500));
    suite::run_all("memory", &store, &store);
}

#[test]
fn memory_store_is_shared_between_threads() {
    let store = Arc::new(MemoryStore::new(Duration::from_secs(5)));
    let peer = Arc::clone(&store);
    let t = thread::spawn(move || peer.get("from-main").unwrap());
    store.set("from-main", b"hi").unwrap();
    assert_eq!(t.join().unwrap(), b"hi");
}

#[test]
fn memory_store_add_on_text_is_an_error() {
    let store = MemoryStore::new(Duration::from_secs(1));
    store.set("text", b"abc").unwrap();
    assert!(matches!(store.add("text", 1), Err(StoreError::Protocol(_))));
    store.set("max", i64::MAX.to_string().as_bytes()).unwrap();
    assert!(matches!(store.add("max", 1), Err(StoreError::Protocol(_))));
}
