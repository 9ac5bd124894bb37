//! A TCPStore server and client speaking torch's c10d wire protocol.

use super::{Store, StoreError, StoreOptions};

/// Client (and, with `is_server`, the server it hosts) of a c10d TCPStore.
pub struct TcpStore {}

impl TcpStore {
    /// Opens the store per `opts`.
    pub fn open(_opts: &StoreOptions) -> Result<Self, StoreError> {
        todo!()
    }
}

impl Store for TcpStore {
    fn set(&self, _key: &str, _value: &[u8]) -> Result<(), StoreError> { todo!() }
    fn get(&self, _key: &str) -> Result<Vec<u8>, StoreError> { todo!() }
    fn wait(&self, _keys: &[&str], _timeout: std::time::Duration) -> Result<(), StoreError> { todo!() }
    fn check(&self, _keys: &[&str]) -> Result<bool, StoreError> { todo!() }
    fn add(&self, _key: &str, _delta: i64) -> Result<i64, StoreError> { todo!() }
    fn compare_set(&self, _key: &str, _expected: &[u8], _desired: &[u8]) -> Result<Vec<u8>, StoreError> { todo!() }
    fn multi_get(&self, _keys: &[&str]) -> Result<Vec<Vec<u8>>, StoreError> { todo!() }
    fn delete_key(&self, _key: &str) -> Result<bool, StoreError> { todo!() }
    fn num_keys(&self) -> Result<i64, StoreError> { todo!() }
    fn timeout(&self) -> std::time::Duration { todo!() }
}
