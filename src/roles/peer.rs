//! The store as seen by one role: waits that notice when the peer gave up.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::keys;
use crate::store::{Store, StoreError};

/// One side's handle on the shared store.
pub struct Peer<'a> {
    pub store: &'a dyn Store,
    /// Our role, for messages ("initiator" / "target").
    pub me: &'static str,
    /// The other role.
    pub peer: &'static str,
    pub timeout: Duration,
}

impl<'a> Peer<'a> {
    /// Waits for `key` and returns its value. Fails early if the peer
    /// published an abort, and names the peer when it never comes.
    pub fn get(&self, key: &str, what: &str) -> Result<Vec<u8>> {
        let start = Instant::now();
        let slice = Duration::from_millis(200).min(self.timeout);
        loop {
            match self.store.wait(&[key], slice) {
                Ok(()) => return Ok(self.store.get(key)?),
                Err(StoreError::Timeout { .. }) => {}
                Err(e) => bail!("waiting for the {} {what}: {e}", self.peer),
            }
            self.check_abort()?;
            if start.elapsed() >= self.timeout {
                bail!(
                    "the {} did not publish its {what} (key {key}) within {:?}: is it running, on the same --host/--port? \
                     (raise --timeout if it is just slow)",
                    self.peer,
                    self.timeout
                );
            }
        }
    }

    /// `Err` with the peer's message if it published an abort.
    pub fn check_abort(&self) -> Result<()> {
        if self.store.check(&[keys::ABORT]).unwrap_or(false) {
            let why = self.store.get(keys::ABORT).unwrap_or_default();
            bail!("the {} gave up: {}", self.peer, String::from_utf8_lossy(&why));
        }
        Ok(())
    }

    /// For kernel watching: a reason to cancel, if the peer aborted or the
    /// store (and so, usually, the peer) is gone.
    pub fn probe(&self) -> Option<String> {
        match self.store.check(&[keys::ABORT]) {
            Ok(false) => None,
            Ok(true) => Some(self.check_abort().err().map(|e| e.to_string()).unwrap_or_default()),
            Err(e) => Some(format!("lost the store while the kernel ran ({e}): the {} probably exited", self.peer)),
        }
    }

    /// Tells the peer we failed, best effort.
    pub fn abort(&self, why: &str) {
        let _ = self.store.set(keys::ABORT, format!("{}: {why}", self.me).as_bytes());
    }

    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        Ok(self.store.set(key, value)?)
    }

    /// Deletes keys, ignoring errors (cleanup).
    pub fn delete(&self, keys: &[&str]) {
        for k in keys {
            let _ = self.store.delete_key(k);
        }
    }
}
