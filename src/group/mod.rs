//! The members of a run and how they meet over a store: heartbeats, a
//! probe that tells a waiting member why to stop, abort, barriers, leaving,
//! and cleanup on every path. `simple_write` (two members: initiator and
//! target) and `ep` (N ranks) both run on it.
//!
//! A member's life is one skeleton, [`Member::run`]: its work runs while a
//! heartbeat goes; on failure it publishes an abort (unless the error is
//! wrong data the others already know of); on every path it deletes every
//! key it wrote and counts itself out, and the member that hosts the store
//! waits for the others to be out before its store goes.
//!
//! A wait ([`Member::get`], [`Member::barrier`], [`Member::leave`]) ends
//! early, naming the member, when [`Member::probe`] finds:
//! - this process got SIGINT/SIGTERM ([`crate::interrupt`]);
//! - a member published the abort key (the first abort wins);
//! - a watched member's heartbeat (every other member's, or only those
//!   [`Member::watch_only`] names: an elastic phase's current processes)
//!   stood still for [`SILENT_AFTER`] *and* for
//!   [`SILENT_BEATS`] of our own beats: it was killed or is frozen
//!   (SIGSTOP, a debugger, a paused container), which keeps its sockets
//!   open, so only the silence tells. Counting our own beats makes the limit
//!   stretch with the load: on a machine so busy that our heartbeat thread
//!   runs late, a peer's runs late too, and neither is called dead;
//! - the store did not answer within the reply deadline
//!   ([`Roster::reply_deadline`], about 3 s): the member that hosts it is
//!   frozen or gone. Every request of a member has that deadline; only the
//!   wait for a key to appear takes the run's `--timeout`.
//!
//! The probe costs at most three requests (CHECK the abort key, CHECK and
//! MULTI_GET every heartbeat; a GET more when it finds an abort) and sends
//! them at most every [`PROBE_EVERY`], however often it is called, so N
//! members make O(N) requests a second, not O(N²).
//!
//! No read of a member waits for its key ([`crate::store::Store::try_get`],
//! [`crate::store::Store::try_multi_get`]): keys are deleted while others
//! read them (a member that leaves deletes its heartbeat), and a read that
//! waited for a deleted key would hold the member's one connection for the
//! whole reply deadline, longer than [`SILENT_AFTER`]. Its own heartbeat
//! queues behind that read, so the others would find the reader silent.
//!
//! Keys, all under the run's prefix (`NIXL_2PROC/` for `simple_write`,
//! `nixl_ep/` for `ep`); a member's name is `initiator`/`target` or its
//! rank:
//!
//! | key | value | written by | read by | when |
//! |---|---|---|---|---|
//! | `alive/<name>` | counter (`ADD`) | that member | every other member's probe (one `MULTI_GET`) | every [`BEAT`] while the member runs |
//! | `abort` | [`Abort`] (JSON) | the first member to fail (compare-and-set) | every probe | a member failed: the others stop at once |
//! | `barrier/<b>/<name>` | empty | that member | every member (`WAIT` on all) | arriving at barrier `b` |
//! | `left` | counter | every member | itself (the `ADD` answer) | after the barrier `finished` ([`Member::leave`]) |
//! | `left/all` | empty | the member whose `ADD` made `left` the group's size | every member | everyone passed `finished`: keys may go |
//! | `out/<name>` | empty | that member | the host, which deletes it | teardown, on every path (the host waits for every live member's) |
//! | `out` | counter | every member, when the store lives elsewhere | itself (the `ADD` answer) | teardown: the member that completes it deletes the shared keys |
//!
//! Each member deletes every key it wrote (its heartbeat, its barriers,
//! and the program's own entries) when its work ends, on every path; a
//! last message its reader must still see ([`Member::put_final`]) is
//! deleted by the reader. The shared keys (`abort`, `left`, `left/all`,
//! `out`) are deleted by the host once every member counted itself out, or,
//! when the store lives elsewhere (torchrun's agent), by the member whose
//! `ADD out` completed the count. A run in which a member died leaves the
//! dead member's keys and the shared ones in a store that outlives the run;
//! a store a member hosts goes with it.

pub mod entry;
mod liveness;
mod member;
mod open;
mod watch;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use self::entry::{AgentMetadata, Bytes, Entry, Marker, ProtocolError, Value};
pub use self::member::Member;
pub use self::open::join_store;

/// How often a member bumps its heartbeat.
pub const BEAT: Duration = Duration::from_millis(250);
/// A heartbeat that stood still this long (and [`SILENT_BEATS`] of ours)
/// means the member is dead or frozen.
pub const SILENT_AFTER: Duration = Duration::from_secs(3);
/// How many of our own beats a silent member must have missed: 8 at the
/// nominal pace is 2 s, so [`SILENT_AFTER`] decides on an idle machine and
/// this on a loaded one.
pub const SILENT_BEATS: u64 = 8;
/// The probe's requests go out at most this often.
pub const PROBE_EVERY: Duration = Duration::from_millis(400);
/// How long one store `WAIT` blocks before the probe runs again.
const SLICE: Duration = Duration::from_millis(200);

/// Who hosts the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// A member (by index): its store goes when it exits, so it leaves last.
    Member(usize),
    /// A process outside the group, e.g. `torchrun's agent`.
    Elsewhere(String),
    /// The program's own launcher, which started every member: it outlives
    /// them all, and its store, private to the run, goes with it, so the
    /// members leave the shared keys to it.
    Launcher(String),
}

/// The members of a run: their names in keys and in messages, who hosts
/// the store, and where the keys live.
#[derive(Clone, Debug)]
pub struct Roster {
    /// Prefix of every key, e.g. `NIXL_2PROC/`.
    pub prefix: String,
    /// Each member's name in keys (`initiator`, `3`).
    pub names: Vec<String>,
    /// Each member's name in messages (`the initiator`, `rank 3`).
    pub labels: Vec<String>,
    /// Who hosts the store.
    pub host: Host,
    /// What both sides must agree on to meet, for messages
    /// (`--host/--port`).
    pub place: String,
    /// Whether a data mismatch is already known to every member (published
    /// as a verdict), so it ends the run without an abort.
    pub mismatch_is_published: bool,
}

impl Roster {
    /// `ranks` members named by their rank.
    pub fn ranks(prefix: &str, ranks: u32, host: Host, place: &str) -> Self {
        Self {
            prefix: prefix.to_string(),
            names: (0..ranks).map(|r| r.to_string()).collect(),
            labels: (0..ranks).map(|r| format!("rank {r}")).collect(),
            host,
            place: place.to_string(),
            mismatch_is_published: false,
        }
    }

    /// How many members.
    pub fn size(&self) -> usize {
        self.names.len()
    }

    /// The deadline of every store request of a member: [`SILENT_AFTER`]
    /// plus 50 ms per member (the store serves them all: 6.2 s at 64),
    /// never more than the run's timeout.
    pub fn reply_deadline(&self, timeout: Duration) -> Duration {
        (SILENT_AFTER + Duration::from_millis(50) * self.size() as u32).min(timeout)
    }

    /// The host's name for messages.
    pub fn host_label(&self) -> &str {
        match &self.host {
            Host::Member(h) => &self.labels[*h],
            Host::Elsewhere(what) | Host::Launcher(what) => what,
        }
    }

    /// Why the store stopped answering `me`, naming the process that hosts it.
    pub fn store_lost(&self, me: usize, e: &crate::store::StoreError) -> String {
        match &self.host {
            Host::Member(h) if *h == me => format!("lost our own store ({e})"),
            _ => format!(
                "lost the store, which {host} hosts ({e}): {host} exited, or it is frozen (stopped, in a debugger, a \
                 paused container)",
                host = self.host_label()
            ),
        }
    }

    /// The message for a store that accepted the connection but did not
    /// answer while joining: its host is frozen (or overloaded).
    pub fn host_silent(&self, e: &crate::store::StoreError) -> String {
        format!(
            "{host}, which hosts the store, is frozen (or overloaded): it accepted the connection but did not answer ({e})",
            host = self.host_label()
        )
    }

    fn key(&self, path: impl std::fmt::Display) -> String {
        format!("{}{path}", self.prefix)
    }
}

/// A member's end that the others decided (an elastic group agreed that it
/// is gone): it stops with this error, and [`Member::run`] publishes no
/// abort for it, so the others carry on without it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Dismissed(pub String);

/// A member's failure, so the others stop waiting with the reason.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Abort {
    /// Who failed, as named in messages (`the target`, `rank 2`).
    pub member: String,
    pub message: String,
}
