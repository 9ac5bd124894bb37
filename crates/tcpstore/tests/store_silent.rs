//! A frozen store must not freeze its clients: against a store that
//! handshakes and then goes silent (a process stopped with SIGSTOP keeps its
//! sockets open, so nothing ever fails by itself), every request of both
//! clients we drive — ours, and torch's `c10d::TCPStore` with the `libtorch`
//! feature — fails within its deadline with [`StoreError::NoReply`] naming
//! the store's address, the operation and the key; shorter deadlines
//! through [`Store::with_deadline`] work; callers queued behind a stuck
//! request give up too; and no thread is left behind.
//!
//! The tests take turns (one lock): the thread counts they assert on are
//! the whole process's.

mod silent_server;

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use silent_server::SilentStore;
use tcpstore::native::TcpStore;
use tcpstore::{Stalled, Store, StoreError, StoreOptions};

/// The store timeout (the binaries' `--timeout`) of most tests here.
const TIMEOUT: Duration = Duration::from_secs(1);

/// How far past its deadline a request may still be failing: scheduling on
/// a loaded CI machine, never a wait of its own.
const MARGIN: Duration = Duration::from_secs(2);

/// How long the threads of finished connections may take to end.
const SETTLE_WITHIN: Duration = Duration::from_secs(15);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn opts(port: u16, timeout: Duration) -> StoreOptions {
    StoreOptions {
        host: "127.0.0.1".into(),
        port,
        is_server: false,
        num_workers: None,
        wait_workers: false,
        timeout,
    }
}

/// Opens a client of one backend.
type Open = fn(&StoreOptions) -> Result<Box<dyn Store>, StoreError>;

fn native(o: &StoreOptions) -> Result<Box<dyn Store>, StoreError> {
    Ok(Box::new(TcpStore::open(o)?))
}

#[cfg(feature = "libtorch")]
fn torch(o: &StoreOptions) -> Result<Box<dyn Store>, StoreError> {
    Ok(Box::new(tcpstore::libtorch::TorchStore::open(o)?))
}

/// The threads of this process that this test started, directly or not,
/// by id: a thread inherits its creator's name, and the test harness names
/// each test's thread after the test (first 15 bytes, unique in this file).
/// Counting all threads would race with the harness starting the next
/// test's thread.
fn our_threads() -> BTreeSet<u64> {
    let name =
        |path: &std::path::Path| std::fs::read_to_string(path.join("comm")).unwrap_or_default();
    let me = name(std::path::Path::new("/proc/thread-self"));
    std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .filter_map(|e| {
            let e = e.ok()?;
            (name(&e.path()) == me).then(|| e.file_name().to_str()?.parse().ok())?
        })
        .collect()
}

/// This thread's id (`/proc/thread-self` links to `<pid>/task/<tid>`).
fn own_tid() -> u64 {
    let link = std::fs::read_link("/proc/thread-self").expect("read /proc/thread-self");
    let tid = link
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse().ok());
    tid.expect("a thread id in /proc/thread-self")
}

/// Waits until every thread this test started after `before` was taken has
/// ended. The test's own thread is never one of them: reading
/// `/proc/self/task` while other threads of the process start and exit can
/// skip entries, so `before` may lack it.
fn assert_threads_settle(before: &BTreeSet<u64>, after: &str) {
    let start = Instant::now();
    let me = own_tid();
    loop {
        let left: Vec<u64> = (our_threads().difference(before).copied())
            .filter(|&t| t != me)
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < SETTLE_WITHIN,
            "after {after}: threads {left:?} were left behind"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// One operation of the [`Store`] trait, as a test runs it.
struct Op {
    /// The wire name the error must give.
    name: &'static str,
    /// The keys the error must name.
    keys: &'static [&'static str],
    /// The longest it may take against a silent store, deadline included:
    /// `get` and `multi_get` first wait out the timeout for their keys.
    bound: fn(Duration) -> Duration,
    run: fn(&dyn Store) -> Result<(), StoreError>,
}

fn one_deadline(d: Duration) -> Duration {
    d + MARGIN
}

fn wait_then_deadline(d: Duration) -> Duration {
    2 * d + MARGIN
}

/// Every operation that expects an answer (SET has none: see
/// [`set_into_full_buffers`]).
fn answered_ops() -> Vec<Op> {
    vec![
        Op {
            name: "GET",
            keys: &["k"],
            bound: wait_then_deadline,
            run: |s| s.get("k").map(drop),
        },
        Op {
            name: "WAIT",
            keys: &["k"],
            bound: wait_then_deadline,
            run: |s| s.wait(&["k"], Duration::from_millis(200)),
        },
        Op {
            name: "CHECK",
            keys: &["a", "b"],
            bound: one_deadline,
            run: |s| s.check(&["a", "b"]).map(drop),
        },
        Op {
            name: "ADD",
            keys: &["n"],
            bound: one_deadline,
            run: |s| s.add("n", 1).map(drop),
        },
        Op {
            name: "COMPARE_SET",
            keys: &["c"],
            bound: one_deadline,
            run: |s| s.compare_set("c", b"", b"x").map(drop),
        },
        Op {
            name: "MULTI_GET",
            keys: &["a", "b"],
            bound: wait_then_deadline,
            run: |s| s.multi_get(&["a", "b"]).map(drop),
        },
        Op {
            name: "DELETE_KEY",
            keys: &["d"],
            bound: one_deadline,
            run: |s| s.delete_key("d").map(drop),
        },
        Op {
            name: "GETNUMKEYS",
            keys: &[],
            bound: one_deadline,
            run: |s| s.num_keys().map(drop),
        },
    ]
}

/// Asserts `res` is the [`StoreError::NoReply`] for `op` on the store at
/// `addr`, and that its message names the store, the request and the fix.
fn assert_no_reply<T: std::fmt::Debug>(
    res: Result<T, StoreError>,
    addr: &str,
    op: &str,
    keys: &[&str],
    stalled: Stalled,
    after: Duration,
) {
    let err = res.expect_err(&format!("{op} {keys:?} against a silent store succeeded"));
    match &err {
        StoreError::NoReply {
            addr: a,
            op: o,
            keys: k,
            after: d,
            stalled: s,
        } => {
            assert_eq!(
                (a.as_str(), *o, *s, *d),
                (addr, op, stalled, after),
                "{err}"
            );
            assert_eq!(k, keys, "{err}");
        }
        other => panic!("{op} {keys:?}: expected NoReply, got {other:?}: {other}"),
    }
    let msg = err.to_string();
    // The store's words name no program's flags (the programs add them).
    assert!(!msg.contains("--"), "{msg}");
    for part in [addr, op, "frozen", "SIGSTOP", "longer deadline"] {
        assert!(msg.contains(part), "{part:?} missing from: {msg}");
    }
    for key in keys {
        assert!(
            msg.contains(&format!("{key:?}")),
            "key {key:?} missing from: {msg}"
        );
    }
}

/// Against a store silent right after the handshake, each operation (on a
/// fresh connection) fails within its bound with NoReply naming it; a later
/// request on the same connection fails at once with the same error.
fn every_op_fails_when_silent(open: Open) {
    let _serial = serial();
    let before = our_threads();
    let silent = SilentStore::start(0);
    for op in answered_ops() {
        let store = open(&opts(silent.port(), TIMEOUT)).expect("handshake with the silent store");
        let start = Instant::now();
        let res = (op.run)(store.as_ref());
        let took = start.elapsed();
        assert_no_reply(
            res,
            &silent.addr(),
            op.name,
            op.keys,
            Stalled::Replying,
            TIMEOUT,
        );
        assert!(
            took <= (op.bound)(TIMEOUT),
            "{} took {took:.2?}, bound {:.2?}",
            op.name,
            (op.bound)(TIMEOUT)
        );
        // The connection is out of step now: the next request must not wait.
        let start = Instant::now();
        let again = store.add("after", 1);
        assert_no_reply(
            again,
            &silent.addr(),
            op.name,
            op.keys,
            Stalled::Replying,
            TIMEOUT,
        );
        assert!(
            start.elapsed() < TIMEOUT,
            "a broken connection waited again"
        );
    }
    drop(silent);
    assert_threads_settle(&before, "every op against a silent store");
}

/// The store answers the first requests (relayed to a real server), then
/// goes silent: the answered ones succeed, the next one is NoReply.
fn silent_after_some_replies(open: Open) {
    let _serial = serial();
    let before = our_threads();
    // SET, ADD, GET (= WAIT + GET), CHECK: five requests answered.
    let silent = SilentStore::start(5);
    let store = open(&opts(silent.port(), TIMEOUT)).expect("handshake");
    store.set("a", b"1").expect("SET before the silence");
    assert_eq!(store.add("n", 2).expect("ADD before the silence"), 2);
    assert_eq!(store.get("a").expect("GET before the silence"), b"1");
    assert!(store.check(&["a", "n"]).expect("CHECK before the silence"));
    let start = Instant::now();
    let res = store.add("n", 1);
    assert_no_reply(
        res,
        &silent.addr(),
        "ADD",
        &["n"],
        Stalled::Replying,
        TIMEOUT,
    );
    assert!(start.elapsed() <= one_deadline(TIMEOUT));
    drop(store);
    drop(silent);
    assert_threads_settle(&before, "a store silent after some replies");
}

/// A store opened with a long timeout; probes through `with_deadline`
/// give up after their own short deadline.
fn short_deadline_probes(open: Open) {
    let _serial = serial();
    let before = our_threads();
    let silent = SilentStore::start(0);
    let probe = Duration::from_millis(500);
    let long = Duration::from_secs(60);
    for op in answered_ops() {
        let store = open(&opts(silent.port(), long)).expect("handshake");
        let bounded = store.with_deadline(probe);
        assert_eq!(bounded.timeout(), probe);
        let start = Instant::now();
        let res = (op.run)(bounded.as_ref());
        let took = start.elapsed();
        assert_no_reply(
            res,
            &silent.addr(),
            op.name,
            op.keys,
            Stalled::Replying,
            probe,
        );
        assert!(took <= (op.bound)(probe), "{} took {took:.2?}", op.name);
    }
    drop(silent);
    assert_threads_settle(&before, "short deadlines");
}

/// While one request waits for a silent store (holding the connection), a
/// second caller gives up after its own deadline, naming its request as
/// queued; the first then fails after its deadline.
fn queued_caller_is_bounded(open: Open) {
    let _serial = serial();
    let before = our_threads();
    let silent = SilentStore::start(0);
    let store = open(&opts(silent.port(), Duration::from_secs(60))).expect("handshake");
    let (stuck_for, probe) = (Duration::from_secs(5), Duration::from_millis(500));
    thread::scope(|s| {
        let stuck = s.spawn(|| {
            let start = Instant::now();
            (
                store.with_deadline(stuck_for).add("stuck", 1),
                start.elapsed(),
            )
        });
        // Long enough for the first request to hold the connection.
        thread::sleep(Duration::from_millis(500));
        let start = Instant::now();
        let res = store.with_deadline(probe).check(&["k"]);
        let took = start.elapsed();
        assert_no_reply(res, &silent.addr(), "CHECK", &["k"], Stalled::Queued, probe);
        assert!(took <= probe + MARGIN, "queued CHECK took {took:.2?}");
        let (res, took) = stuck.join().unwrap();
        assert_no_reply(
            res,
            &silent.addr(),
            "ADD",
            &["stuck"],
            Stalled::Replying,
            stuck_for,
        );
        assert!(took <= stuck_for + MARGIN, "stuck ADD took {took:.2?}");
    });
    drop(store);
    drop(silent);
    assert_threads_settle(&before, "a queued caller");
}

/// SET has no reply, so a small one succeeds against a silent store (as
/// with any store); but writing one blocks once a store that stopped
/// reading has full socket buffers, and that write has the deadline too.
fn set_into_full_buffers(open: Open) {
    let _serial = serial();
    let before = our_threads();
    let silent = SilentStore::start(0);
    let store = open(&opts(silent.port(), TIMEOUT)).expect("handshake");
    store
        .set("small", b"fits in any buffer")
        .expect("a small SET");
    // Under the server's 8 MiB value limit; loopback buffers hold a few MiB.
    let value = vec![7u8; 8 << 20];
    let (res, took) = (0..32)
        .find_map(|_| {
            let start = Instant::now();
            let res = store.set("big", &value);
            res.is_err().then(|| (res, start.elapsed()))
        })
        .expect("32 SETs of 8 MiB all fitted into the socket buffers");
    assert_no_reply(
        res,
        &silent.addr(),
        "SET",
        &["big"],
        Stalled::Sending,
        TIMEOUT,
    );
    assert!(took <= one_deadline(TIMEOUT), "SET took {took:.2?}");
    drop(store);
    drop(silent);
    assert_threads_settle(&before, "SETs into full buffers");
}

/// A store that accepts the connection but never answers the PING (frozen
/// before the peer started): opening fails with NoReply for the PING.
fn silent_handshake(open: Open, bound: Duration) {
    let _serial = serial();
    let before = our_threads();
    let mute = SilentStore::mute();
    let start = Instant::now();
    let res = open(&opts(mute.port(), TIMEOUT)).map(drop);
    let took = start.elapsed();
    let err = res.expect_err("opening a store that never answers the PING succeeded");
    match &err {
        StoreError::NoReply { addr, op, keys, .. } => {
            assert_eq!(
                (addr.as_str(), *op),
                (mute.addr().as_str(), "PING"),
                "{err}"
            );
            assert!(keys.is_empty(), "{err}");
        }
        other => panic!("expected NoReply for the PING, got {other:?}: {other}"),
    }
    assert!(took <= bound, "open took {took:.2?}, bound {bound:.2?}");
    drop(mute);
    assert_threads_settle(&before, "a silent handshake");
}

/// A participant counting itself in (`wait_workers`) against a store that
/// goes silent after the handshake: opening fails with NoReply for the
/// `init/` counter within `bound`.
fn silent_before_joining(open: Open, bound: Duration) {
    let _serial = serial();
    let before = our_threads();
    let silent = SilentStore::start(0);
    let joining = StoreOptions {
        num_workers: Some(2),
        wait_workers: true,
        ..opts(silent.port(), TIMEOUT)
    };
    let start = Instant::now();
    let err = open(&joining)
        .map(drop)
        .expect_err("joining a silent store succeeded");
    let took = start.elapsed();
    match &err {
        StoreError::NoReply { addr, op, keys, .. } => {
            assert_eq!(
                (addr.as_str(), *op),
                (silent.addr().as_str(), "ADD"),
                "{err}"
            );
            assert_eq!(keys, &["init/"], "{err}");
        }
        other => panic!("expected NoReply for init/, got {other:?}: {other}"),
    }
    assert!(took <= bound, "open took {took:.2?}, bound {bound:.2?}");
    drop(silent);
    assert_threads_settle(&before, "a silent join");
}

#[test]
fn native_every_op_fails_when_silent() {
    every_op_fails_when_silent(native);
}

#[test]
fn native_silent_after_some_replies() {
    silent_after_some_replies(native);
}

#[test]
fn native_short_deadline_probes() {
    short_deadline_probes(native);
}

#[test]
fn native_queued_caller_is_bounded() {
    queued_caller_is_bounded(native);
}

#[test]
fn native_set_into_full_buffers() {
    set_into_full_buffers(native);
}

#[test]
fn native_silent_handshake() {
    silent_handshake(native, TIMEOUT + MARGIN);
}

#[test]
fn native_silent_before_joining() {
    silent_before_joining(native, TIMEOUT + MARGIN);
}

#[test]
fn message_names_the_store_the_request_and_the_fix() {
    let err = StoreError::NoReply {
        addr: "10.0.0.2:9998".into(),
        op: "ADD",
        keys: vec!["NIXL_2PROC/heartbeat".into()],
        after: Duration::from_secs(10),
        stalled: Stalled::Replying,
    };
    assert_eq!(
        err.to_string(),
        "the store at 10.0.0.2:9998 did not answer ADD \"NIXL_2PROC/heartbeat\" within 10.0s. \
         The process hosting the store, or the store itself, is frozen or overloaded \
         (stopped with SIGSTOP or Ctrl-Z, paused in a debugger, in a paused container): \
         check that process, or give requests a longer deadline if it is only slow"
    );
}

#[cfg(feature = "libtorch")]
#[test]
fn torch_every_op_fails_when_silent() {
    every_op_fails_when_silent(torch);
}

#[cfg(feature = "libtorch")]
#[test]
fn torch_silent_after_some_replies() {
    silent_after_some_replies(torch);
}

#[cfg(feature = "libtorch")]
#[test]
fn torch_short_deadline_probes() {
    short_deadline_probes(torch);
}

#[cfg(feature = "libtorch")]
#[test]
fn torch_queued_caller_is_bounded() {
    queued_caller_is_bounded(torch);
}

#[cfg(feature = "libtorch")]
#[test]
fn torch_set_into_full_buffers() {
    set_into_full_buffers(torch);
}

#[cfg(feature = "libtorch")]
#[test]
fn torch_silent_handshake() {
    // The shim's watchdog: torch's connect window and retry delay, then the
    // timeout again for the PING.
    silent_handshake(torch, 2 * TIMEOUT + Duration::from_secs(1) + MARGIN);
}

#[cfg(feature = "libtorch")]
#[test]
fn torch_silent_before_joining() {
    silent_before_joining(torch, TIMEOUT + MARGIN);
}
