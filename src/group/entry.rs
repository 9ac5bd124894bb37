//! Typed store entries: a key and the type of its value, so that a value
//! is encoded and decoded in one place and a foreign value is named.
//!
//! A program lists its keys as functions returning [`Entry<T>`]
//! (`simple_write::protocol`, `ep::keys`); the group reads and writes
//! only through them. Values implement [`Value`]: raw bytes where an
//! upstream format is given (NIXL metadata, `nixlSerDes` descriptor
//! lists), JSON otherwise ([`json_value!`](crate::json_value)), so a person
//! can read them with any store client.

use std::marker::PhantomData;

use serde::{Serialize, de::DeserializeOwned};

use crate::nixl::net::PeerCard;
use crate::nixl::serdes::DescList;

/// A value that cannot be decoded: the other side speaks another version
/// of the protocol, or something else wrote the key.
#[derive(Debug, thiserror::Error)]
#[error(
    "the value of {key} is not a {what}: {why} (another version of this program, or another program on this port?)"
)]
pub struct ProtocolError {
    pub key: String,
    pub what: &'static str,
    pub why: String,
}

/// How a value is written to and read from the store.
pub trait Value: Sized {
    /// What it is, for messages.
    const WHAT: &'static str;
    fn encode(&self) -> Vec<u8>;
    fn decode(bytes: &[u8]) -> Result<Self, String>;
}

/// A key whose value has type `T`: the only way to read or write the store.
#[derive(Debug)]
pub struct Entry<T> {
    key: String,
    _value: PhantomData<fn() -> T>,
}

impl<T> Clone for Entry<T> {
    fn clone(&self) -> Self {
        Self::new(self.key.clone())
    }
}

impl<T> Entry<T> {
    /// The entry at `key`, the whole key as stored (prefix included).
    pub fn new(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            _value: PhantomData,
        }
    }

    /// The key as stored (without the `/` the TCP client adds on the wire).
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl<T: Value> Entry<T> {
    /// The value's bytes.
    pub fn encode(&self, v: &T) -> Vec<u8> {
        v.encode()
    }

    /// The value, or why the bytes are not one.
    pub fn decode(&self, bytes: &[u8]) -> Result<T, ProtocolError> {
        T::decode(bytes).map_err(|why| ProtocolError {
            key: self.key.clone(),
            what: T::WHAT,
            why,
        })
    }
}

/// A key whose presence is the message (an empty value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Marker;

/// `getLocalMD()` bytes: opaque, passed to the peer's `loadRemoteMD`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentMetadata(pub Vec<u8>);

/// Bytes of a fixed format the caller checks (an NCCL unique id, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bytes(pub Vec<u8>);

impl Value for Marker {
    const WHAT: &'static str = "marker";
    fn encode(&self) -> Vec<u8> {
        Vec::new()
    }
    fn decode(_: &[u8]) -> Result<Self, String> {
        Ok(Marker)
    }
}

impl Value for AgentMetadata {
    const WHAT: &'static str = "NIXL agent metadata blob";
    fn encode(&self) -> Vec<u8> {
        self.0.clone()
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.is_empty() {
            return Err("empty".into());
        }
        Ok(Self(bytes.to_vec()))
    }
}

impl Value for Bytes {
    const WHAT: &'static str = "byte string";
    fn encode(&self) -> Vec<u8> {
        self.0.clone()
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        Ok(Self(bytes.to_vec()))
    }
}

impl Value for PeerCard {
    const WHAT: &'static str = "agent metadata and window";
    fn encode(&self) -> Vec<u8> {
        PeerCard::encode(self)
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        PeerCard::decode(bytes)
    }
}

impl Value for DescList {
    const WHAT: &'static str = "nixlSerDes descriptor list";
    fn encode(&self) -> Vec<u8> {
        DescList::encode(self)
    }
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        DescList::decode(bytes).map_err(|e| e.to_string())
    }
}

/// Implements [`Value`] as JSON for each `Type => "what it is"`.
#[macro_export]
macro_rules! json_value {
    ($($t:ty => $what:literal),* $(,)?) => {$(
        impl $crate::group::entry::Value for $t {
            const WHAT: &'static str = $what;
            fn encode(&self) -> Vec<u8> {
                $crate::group::entry::json_encode(self)
            }
            fn decode(bytes: &[u8]) -> Result<Self, String> {
                $crate::group::entry::json_decode(bytes)
            }
        }
    )*};
}

/// JSON bytes of a value ([`json_value!`](crate::json_value)'s encoder).
pub fn json_encode(v: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(v).expect("protocol values always serialize")
}

/// A value from JSON bytes ([`json_value!`](crate::json_value)'s decoder).
pub fn json_decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| e.to_string())
}

json_value!(super::Abort => "abort message", Vec<usize> => "list of ranks");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn foreign_bytes_are_named_with_the_key() {
        let e: Entry<super::super::Abort> = Entry::new("p/abort");
        let err = e.decode(b"ok 123").unwrap_err().to_string();
        assert!(
            err.contains("p/abort") && err.contains("abort message"),
            "{err}"
        );
    }
}
