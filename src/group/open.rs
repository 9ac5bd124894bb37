//! Joining a store that another process hosts, so that a host frozen
//! before we came is named within the reply deadline, not the run's timeout.

use std::time::{Duration, Instant};

use crate::cli::StoreBackend;
use crate::store::{Store, StoreError, StoreOptions};

/// Opens the store at `opts` as a client (`opts.is_server` false): each
/// attempt gets `reply` for every answer (the handshake's PING, the join's
/// `ADD`), and attempts repeat while nothing listens, until `opts.timeout`.
///
/// So a host that listens but never answers (frozen: its sockets stay open
/// and the kernel completes our connection) fails with
/// [`StoreError::NoReply`] after `reply`, and one not started yet is waited
/// for as long as `opts.timeout` ([`StoreError::Unreachable`]). The store
/// returned has `reply` as its [`Store::timeout`]; [`super::Member`] uses
/// its own deadlines.
pub fn join_store(
    backend: StoreBackend,
    opts: &StoreOptions,
    reply: Duration,
) -> Result<Box<dyn Store>, StoreError> {
    let start = Instant::now();
    loop {
        let left = opts.timeout.saturating_sub(start.elapsed());
        let attempt = StoreOptions {
            timeout: reply.min(left).max(Duration::from_millis(1)),
            ..opts.clone()
        };
        match backend.open(&attempt) {
            Err(StoreError::Unreachable { addr, .. }) => {
                if start.elapsed() >= opts.timeout {
                    return Err(StoreError::Unreachable {
                        addr,
                        waited: start.elapsed(),
                    });
                }
            }
            other => return other,
        }
    }
}
