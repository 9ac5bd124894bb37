//! The semantic test suite every `Store` implementation must pass, shared by
//! the native, libtorch, interop and memory tests (`#[path]`-included there;
//! compiled on its own it has no tests).
//!
//! Each check takes two handles, `a` and `b`, onto the same store: for TCP
//! stores two separate connections (possibly of different implementations),
//! so one can set a key while the other waits for it. Checks use their own
//! key namespace and only relative key counts, so they can share one store.
#![allow(dead_code)]

use std::thread;
use std::time::{Duration, Instant};

use std::net::{Ipv4Addr, TcpListener};

use tcpstore::{Store, StoreError, StoreOptions};

/// Options for a store at 127.0.0.1:`port` (the server's when
/// `is_server`) that does not count workers.
pub fn opts(port: u16, is_server: bool, timeout: Duration) -> StoreOptions {
    StoreOptions {
        host: "127.0.0.1".into(),
        port,
        is_server,
        num_workers: None,
        wait_workers: false,
        timeout,
    }
}

/// [`opts`] for one of two workers that wait for each other.
pub fn joining(port: u16, is_server: bool, timeout: Duration) -> StoreOptions {
    StoreOptions {
        num_workers: Some(2),
        wait_workers: true,
        ..opts(port, is_server, timeout)
    }
}

/// A port nobody listens on (just released by us).
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A deterministic, non-repeating-looking byte pattern of `len` bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Returns once every earlier request of `s` has been applied. SET has no
/// reply in the c10d protocol, so a set on one connection and a read on
/// another race unless the setter makes one round trip in between.
pub fn synced(s: &dyn Store) {
    s.check(&[]).unwrap();
}

/// Runs every check; `label` names the combination in failure messages.
/// The stores' own `timeout()` should be short (≤ 2 s): one check waits it out.
pub fn run_all(label: &str, a: &dyn Store, b: &dyn Store) {
    let t0 = Instant::now();
    set_get_overwrite(a, b, &format!("{label}/setget"));
    empty_and_unusual_keys(a, b, &format!("{label}/keys"));
    get_times_out(a, &format!("{label}/gettimeout"));
    wait_succeeds_when_peer_sets_later(a, b, &format!("{label}/waitlate"));
    wait_times_out_and_connection_survives(a, &format!("{label}/waittimeout"));
    wait_for_several_keys(a, b, &format!("{label}/waitmany"));
    check_reports_presence(a, b, &format!("{label}/check"));
    try_get_never_waits(a, b, &format!("{label}/tryget"));
    try_multi_get_never_waits(a, b, &format!("{label}/trymultiget"));
    add_stores_decimal_ascii(a, b, &format!("{label}/add"));
    concurrent_adds_are_atomic(a, b, &format!("{label}/addrace"));
    delete_key_reports_existence(a, b, &format!("{label}/delete"));
    delete_keys_deletes_every_key(a, b, &format!("{label}/delete_many"));
    compare_set_all_cases(a, b, &format!("{label}/cas"));
    multi_get_in_order_and_waits(a, b, &format!("{label}/multiget"));
    num_keys_counts_changes(a, b, &format!("{label}/numkeys"));
    large_values_both_ways(a, b, &format!("{label}/large"));
    eprintln!("suite {label}: ok in {:.2?}", t0.elapsed());
}

pub fn set_get_overwrite(a: &dyn Store, b: &dyn Store, ns: &str) {
    let k = format!("{ns}/k");
    a.set(&k, b"first").unwrap();
    assert_eq!(b.get(&k).unwrap(), b"first");
    b.set(&k, b"second").unwrap();
    synced(b);
    assert_eq!(a.get(&k).unwrap(), b"second");
    let binary = [0u8, 255, 10, 13, 0, 1];
    a.set(&k, &binary).unwrap();
    synced(a);
    assert_eq!(b.get(&k).unwrap(), binary);
}

pub fn empty_and_unusual_keys(a: &dyn Store, b: &dyn Store, ns: &str) {
    let k = format!("{ns}/empty-value");
    a.set(&k, b"").unwrap();
    synced(a);
    assert!(
        b.check(&[&k]).unwrap(),
        "an empty value still makes the key exist"
    );
    assert_eq!(b.get(&k).unwrap(), b"");
    for key in [
        format!("{ns}/with space"),
        format!("{ns}/ünïcødé/ключ"),
        format!("{ns}/a/b/c/"),
        format!("{ns}\n"),
    ] {
        a.set(&key, key.as_bytes()).unwrap();
        assert_eq!(b.get(&key).unwrap(), key.as_bytes(), "{key:?}");
    }
    // The empty key is legal (on the wire it is just "/").
    a.set("", b"root").unwrap();
    synced(a);
    assert_eq!(b.get("").unwrap(), b"root");
    assert!(b.delete_key("").unwrap());
}

pub fn get_times_out(a: &dyn Store, ns: &str) {
    let k = format!("{ns}/never");
    let timeout = a.timeout();
    assert!(
        timeout <= Duration::from_secs(2),
        "open suite stores with a short timeout"
    );
    let t = Instant::now();
    match a.get(&k) {
        Err(StoreError::Timeout { keys, after, .. }) => {
            assert_eq!(keys, vec![k.clone()]);
            assert_eq!(after, timeout);
        }
        other => panic!("get of a missing key: {other:?}"),
    }
    let took = t.elapsed();
    assert!(
        took >= timeout.mul_f32(0.9) && took < timeout + Duration::from_secs(2),
        "took {took:?}"
    );
    // Still usable afterwards.
    a.set(&k, b"late").unwrap();
    assert_eq!(a.get(&k).unwrap(), b"late");
}

pub fn wait_succeeds_when_peer_sets_later(a: &dyn Store, b: &dyn Store, ns: &str) {
    let k = format!("{ns}/k");
    let t = Instant::now();
    thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(150));
            b.set(&k, b"now").unwrap();
        });
        a.wait(&[&k], Duration::from_secs(10)).unwrap();
    });
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(140) && took < Duration::from_secs(5),
        "took {took:?}"
    );
    assert_eq!(a.get(&k).unwrap(), b"now");
    // A key that already exists is waited for instantly; so is no key at all.
    let t = Instant::now();
    a.wait(&[&k], Duration::from_secs(10)).unwrap();
    a.wait(&[], Duration::from_secs(10)).unwrap();
    assert!(t.elapsed() < Duration::from_secs(1));
}

pub fn wait_times_out_and_connection_survives(a: &dyn Store, ns: &str) {
    let k = format!("{ns}/never");
    let timeout = Duration::from_millis(200);
    let t = Instant::now();
    match a.wait(&[&k], timeout) {
        Err(StoreError::Timeout { keys, after, .. }) => {
            assert_eq!(keys, vec![k.clone()]);
            assert_eq!(after, timeout);
        }
        other => panic!("wait for a missing key: {other:?}"),
    }
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(190) && took < Duration::from_secs(3),
        "took {took:?}"
    );
    // The cancelled wait left nothing behind on the connection.
    for i in 0..3 {
        a.set(&k, format!("v{i}").as_bytes()).unwrap();
        assert_eq!(a.get(&k).unwrap(), format!("v{i}").as_bytes());
    }
    assert!(a.check(&[&k]).unwrap());
    assert!(a.delete_key(&k).unwrap());
}

pub fn wait_for_several_keys(a: &dyn Store, b: &dyn Store, ns: &str) {
    let keys: Vec<String> = (0..3).map(|i| format!("{ns}/k{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    b.set(refs[0], b"0").unwrap();
    thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(50));
            b.set(refs[1], b"1").unwrap();
            thread::sleep(Duration::from_millis(50));
            b.set(refs[2], b"2").unwrap();
        });
        a.wait(&refs, Duration::from_secs(10)).unwrap();
    });
    assert!(a.check(&refs).unwrap());
    // One missing key among present ones still times out, naming all keys.
    let missing = format!("{ns}/missing");
    let err = a
        .wait(&[refs[0], &missing], Duration::from_millis(100))
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Timeout { keys, .. } if keys.len() == 2),
        "{err:?}"
    );
}

pub fn check_reports_presence(a: &dyn Store, b: &dyn Store, ns: &str) {
    let (k1, k2) = (format!("{ns}/one"), format!("{ns}/two"));
    assert!(!a.check(&[&k1]).unwrap());
    b.set(&k1, b"x").unwrap();
    synced(b);
    assert!(a.check(&[&k1]).unwrap());
    assert!(!a.check(&[&k1, &k2]).unwrap());
    b.set(&k2, b"y").unwrap();
    synced(b);
    assert!(a.check(&[&k1, &k2]).unwrap());
    assert!(a.check(&[]).unwrap(), "no keys: all present");
}

/// `try_get`: a missing key is `None` at once (no wait for it, however
/// long the store's timeout), a value and an empty value come back as set,
/// a deleted key is `None` again.
pub fn try_get_never_waits(a: &dyn Store, b: &dyn Store, ns: &str) {
    let (k, e) = (format!("{ns}/k"), format!("{ns}/empty"));
    let t0 = Instant::now();
    assert_eq!(a.try_get(&k).unwrap(), None);
    assert!(t0.elapsed() < a.timeout(), "try_get waited for the key");
    b.set(&k, b"v").unwrap();
    b.set(&e, b"").unwrap();
    synced(b);
    assert_eq!(a.try_get(&k).unwrap().as_deref(), Some(&b"v"[..]));
    assert_eq!(a.try_get(&e).unwrap().as_deref(), Some(&b""[..]));
    assert!(b.delete_key(&k).unwrap());
    assert_eq!(a.try_get(&k).unwrap(), None);
}

/// `try_multi_get`: missing keys are `None` at once (no wait for them),
/// values and an empty value come back in order, a deleted key is `None`
/// again, and no keys read as none.
pub fn try_multi_get_never_waits(a: &dyn Store, b: &dyn Store, ns: &str) {
    let (k, e, m) = (
        format!("{ns}/k"),
        format!("{ns}/empty"),
        format!("{ns}/missing"),
    );
    let t0 = Instant::now();
    assert_eq!(a.try_multi_get(&[&k, &m]).unwrap(), [None, None]);
    assert!(t0.elapsed() < a.timeout(), "try_multi_get waited for a key");
    b.set(&k, b"v").unwrap();
    b.set(&e, b"").unwrap();
    synced(b);
    let got = a.try_multi_get(&[&k, &m, &e]).unwrap();
    assert_eq!(got, [Some(b"v".to_vec()), None, Some(Vec::new())]);
    assert!(b.delete_key(&k).unwrap());
    assert_eq!(
        a.try_multi_get(&[&k, &e]).unwrap(),
        [None, Some(Vec::new())]
    );
    assert_eq!(a.try_multi_get(&[]).unwrap(), Vec::<Option<Vec<u8>>>::new());
}

pub fn add_stores_decimal_ascii(a: &dyn Store, b: &dyn Store, ns: &str) {
    let k = format!("{ns}/ctr");
    assert_eq!(a.add(&k, 5).unwrap(), 5, "a missing counter starts at 0");
    assert_eq!(b.add(&k, -2).unwrap(), 3);
    assert_eq!(a.get(&k).unwrap(), b"3", "stored as decimal ASCII");
    assert_eq!(b.add(&k, 0).unwrap(), 3);
    assert_eq!(a.add(&k, -10).unwrap(), -7);
    assert_eq!(b.get(&k).unwrap(), b"-7");
    // A counter can start from a value set by hand, as torch parses it with stoll.
    let k2 = format!("{ns}/preset");
    a.set(&k2, b"40").unwrap();
    synced(a);
    assert_eq!(b.add(&k2, 2).unwrap(), 42);
    assert_eq!(a.get(&k2).unwrap(), b"42");
    let big = format!("{ns}/big");
    assert_eq!(a.add(&big, i64::MAX).unwrap(), i64::MAX);
    assert_eq!(b.get(&big).unwrap(), i64::MAX.to_string().as_bytes());
    // add wakes waiters like set does.
    let k3 = format!("{ns}/waited");
    thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(50));
            b.add(&k3, 1).unwrap();
        });
        a.wait(&[&k3], Duration::from_secs(10)).unwrap();
    });
}

pub fn concurrent_adds_are_atomic(a: &dyn Store, b: &dyn Store, ns: &str) {
    let k = format!("{ns}/ctr");
    thread::scope(|s| {
        s.spawn(|| (0..100).for_each(|_| assert!(a.add(&k, 1).unwrap() > 0)));
        s.spawn(|| (0..100).for_each(|_| assert!(b.add(&k, 1).unwrap() > 0)));
    });
    assert_eq!(a.get(&k).unwrap(), b"200");
}

pub fn delete_key_reports_existence(a: &dyn Store, b: &dyn Store, ns: &str) {
    let k = format!("{ns}/k");
    assert!(!a.delete_key(&k).unwrap(), "deleting a missing key");
    b.set(&k, b"v").unwrap();
    synced(b);
    assert!(a.delete_key(&k).unwrap());
    assert!(!b.check(&[&k]).unwrap());
    assert!(!b.delete_key(&k).unwrap());
    // A deleted key can be set again.
    a.set(&k, b"again").unwrap();
    assert_eq!(b.get(&k).unwrap(), b"again");
}

/// More keys than one pipelined batch, some missing: every one is gone,
/// the count says how many existed, and the connection still answers.
pub fn delete_keys_deletes_every_key(a: &dyn Store, b: &dyn Store, ns: &str) {
    let n = tcpstore::DELETE_BATCH * 2 + 3;
    let keys: Vec<String> = (0..n).map(|i| format!("{ns}/k{i}")).collect();
    for k in keys.iter().step_by(2) {
        b.set(k, b"v").unwrap();
    }
    synced(b);
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(a.delete_keys(&refs).unwrap(), n.div_ceil(2));
    assert!(refs.iter().all(|k| !b.check(&[k]).unwrap()));
    assert_eq!(a.delete_keys(&[]).unwrap(), 0);
    a.set(&keys[0], b"again").unwrap();
    assert_eq!(b.get(&keys[0]).unwrap(), b"again");
}

pub fn compare_set_all_cases(a: &dyn Store, b: &dyn Store, ns: &str) {
    // Missing key, empty expected: the key is created.
    let k = format!("{ns}/k");
    assert_eq!(a.compare_set(&k, b"", b"v1").unwrap(), b"v1");
    assert_eq!(b.get(&k).unwrap(), b"v1");
    // Present, expected matches: swapped, the new value is returned.
    assert_eq!(b.compare_set(&k, b"v1", b"v2").unwrap(), b"v2");
    assert_eq!(a.get(&k).unwrap(), b"v2");
    // Present, expected differs: unchanged, the current value is returned.
    assert_eq!(a.compare_set(&k, b"nope", b"v3").unwrap(), b"v2");
    assert_eq!(b.get(&k).unwrap(), b"v2");
    // Present, empty expected that does not match: unchanged.
    assert_eq!(a.compare_set(&k, b"", b"v4").unwrap(), b"v2");
    // Missing key, non-empty expected: nothing is stored and torch answers
    // with `expected` itself.
    let m = format!("{ns}/missing");
    assert_eq!(b.compare_set(&m, b"exp", b"des").unwrap(), b"exp");
    assert!(!a.check(&[&m]).unwrap());
}

pub fn multi_get_in_order_and_waits(a: &dyn Store, b: &dyn Store, ns: &str) {
    let keys: Vec<String> = (0..4).map(|i| format!("{ns}/k{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    for (i, k) in refs.iter().enumerate().take(3) {
        b.set(k, format!("value-{i}").as_bytes()).unwrap();
    }
    thread::scope(|s| {
        s.spawn(|| {
            thread::sleep(Duration::from_millis(100));
            b.set(refs[3], b"value-3").unwrap();
        });
        let got = a
            .multi_get(&[refs[3], refs[0], refs[2], refs[1], refs[0]])
            .unwrap();
        let want: Vec<&[u8]> = vec![b"value-3", b"value-0", b"value-2", b"value-1", b"value-0"];
        assert_eq!(got, want);
    });
    assert_eq!(a.multi_get(&[]).unwrap(), Vec::<Vec<u8>>::new());
}

pub fn num_keys_counts_changes(a: &dyn Store, b: &dyn Store, ns: &str) {
    let n0 = a.num_keys().unwrap();
    b.set(&format!("{ns}/x"), b"1").unwrap();
    b.set(&format!("{ns}/y"), b"2").unwrap();
    b.set(&format!("{ns}/x"), b"3").unwrap();
    synced(b);
    assert_eq!(a.num_keys().unwrap(), n0 + 2);
    assert!(a.delete_key(&format!("{ns}/x")).unwrap());
    assert_eq!(b.num_keys().unwrap(), n0 + 1);
}

pub fn large_values_both_ways(a: &dyn Store, b: &dyn Store, ns: &str) {
    let one = pattern((1 << 20) + 17, 1);
    let three = pattern(3 << 20, 2);
    a.set(&format!("{ns}/one"), &one).unwrap();
    b.set(&format!("{ns}/three"), &three).unwrap();
    assert!(
        b.get(&format!("{ns}/one")).unwrap() == one,
        "1 MiB value corrupted a → b"
    );
    assert!(
        a.get(&format!("{ns}/three")).unwrap() == three,
        "3 MiB value corrupted b → a"
    );
    let both = a
        .multi_get(&[&format!("{ns}/three"), &format!("{ns}/one")])
        .unwrap();
    assert!(
        both[0] == three && both[1] == one,
        "multi_get of large values"
    );
}

// ---------------------------------------------------------------------------
// Raw protocol access, to compare servers byte for byte.

use std::borrow::Cow;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;

use tcpstore::native::wire::{self, Request, VALIDATION_MAGIC};

/// A bare TCP connection to a store server, speaking frames by hand.
pub struct Raw {
    pub stream: TcpStream,
}

/// A borrowed wire field from a string.
pub fn f(s: &str) -> Cow<'_, [u8]> {
    Cow::Borrowed(s.as_bytes())
}

impl Raw {
    /// Connects to 127.0.0.1:`port`; reads time out after 5 s.
    pub fn connect(port: u16) -> Raw {
        let stream =
            TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect to the store server");
        stream.set_nodelay(true).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        Raw { stream }
    }

    /// Connects and sends VALIDATE, as every torch client does first.
    pub fn validated(port: u16) -> Raw {
        let mut raw = Raw::connect(port);
        raw.send(&Request::Validate {
            magic: VALIDATION_MAGIC,
        });
        raw
    }

    pub fn send(&mut self, request: &Request<'_>) {
        let mut frame = Vec::new();
        request.encode(&mut frame);
        self.stream.write_all(&frame).unwrap();
    }

    pub fn send_bytes(&mut self, bytes: &[u8]) {
        // The peer may already have hung up: that is what some tests check.
        let _ = self.stream.write_all(bytes);
    }

    pub fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut buf = vec![0u8; n];
        self.stream.read_exact(&mut buf).unwrap();
        buf
    }

    /// One `bytes` field, returned with its length header.
    pub fn read_field(&mut self) -> Vec<u8> {
        let mut out = self.read_n(8);
        let len = u64::from_le_bytes(out[..8].try_into().unwrap()) as usize;
        out.extend(self.read_n(len));
        out
    }

    /// Whether anything arrives within `within`.
    pub fn has_data(&mut self, within: Duration) -> bool {
        self.stream.set_read_timeout(Some(within)).unwrap();
        let mut b = [0u8; 1];
        let got = matches!(self.stream.peek(&mut b), Ok(n) if n > 0);
        self.stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        got
    }

    /// True once the server has closed the connection (EOF or reset),
    /// false if it still answers or stays silent for 10 s. Every server
    /// here answers or hangs up at once; the long limit is for a loaded
    /// two-core CI machine, where a 3 s limit once saw torch's server
    /// neither answer nor drop a client with the wrong magic.
    pub fn is_closed(&mut self) -> bool {
        self.stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut b = [0u8; 64];
        match self.stream.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted | ErrorKind::BrokenPipe
            ),
        }
    }
}

/// Runs a fixed script of raw requests against a fresh server on `port`
/// and returns each step's reply bytes. Both servers (native and torch's)
/// must produce the same transcript.
pub fn raw_transcript(port: u16) -> Vec<(&'static str, Vec<u8>)> {
    let mut t: Vec<(&'static str, Vec<u8>)> = Vec::new();
    let mut r = Raw::validated(port);
    let mut r2 = Raw::validated(port);

    r.send(&Request::Ping { nonce: 0x0102_0304 });
    t.push(("ping", r.read_n(4)));
    r.send(&Request::Set {
        key: f("/a"),
        value: f("1"),
    });
    r.send(&Request::ListKeys);
    let mut listed = r.read_n(8);
    listed.extend(r.read_field());
    t.push(("list_keys", listed));
    r.send(&Request::Get { key: f("/a") });
    t.push(("get", r.read_field()));
    r.send(&Request::Get { key: f("/nope") });
    t.push(("get_missing_is_empty", r.read_field()));
    r.send(&Request::Add {
        key: f("/n"),
        delta: 5,
    });
    t.push(("add_new", r.read_n(8)));
    r.send(&Request::Add {
        key: f("/n"),
        delta: -7,
    });
    t.push(("add_more", r.read_n(8)));
    r.send(&Request::Get { key: f("/n") });
    t.push(("counter_is_ascii", r.read_field()));
    r.send(&Request::Check {
        keys: vec![f("/a"), f("/n")],
    });
    t.push(("check_ready", r.read_n(1)));
    r.send(&Request::Check {
        keys: vec![f("/a"), f("/zz")],
    });
    t.push(("check_not_ready", r.read_n(1)));
    r.send(&Request::Wait {
        keys: vec![f("/a")],
    });
    t.push(("wait_ready", r.read_n(1)));
    r.send(&Request::Wait { keys: vec![] });
    t.push(("wait_nothing", r.read_n(1)));
    r.send(&Request::CancelWait);
    t.push(("cancel_without_wait", r.read_n(1)));
    r.send(&Request::GetNumKeys);
    t.push(("num_keys", r.read_n(8)));
    r.send(&Request::DeleteKey { key: f("/a") });
    t.push(("delete", r.read_n(8)));
    r.send(&Request::DeleteKey { key: f("/a") });
    t.push(("delete_again", r.read_n(8)));
    r.send(&Request::Append {
        key: f("/b"),
        value: f("x"),
    });
    r.send(&Request::Append {
        key: f("/b"),
        value: f("yz"),
    });
    r.send(&Request::Get { key: f("/b") });
    t.push(("append", r.read_field()));
    r.send(&Request::MultiSet {
        pairs: vec![(f("/m1"), f("one")), (f("/m2"), f(""))],
    });
    r.send(&Request::MultiGet {
        keys: vec![f("/m1"), f("/missing"), f("/m2"), f("/b")],
    });
    let mut multi = Vec::new();
    (0..4).for_each(|_| multi.extend(r.read_field()));
    t.push(("multi_get", multi));
    r.send(&Request::CompareSet {
        key: f("/c"),
        expected: f("exp"),
        desired: f("des"),
    });
    t.push(("cas_missing_nonempty", r.read_field()));
    r.send(&Request::Check {
        keys: vec![f("/c")],
    });
    t.push(("cas_missing_nonempty_stores_nothing", r.read_n(1)));
    r.send(&Request::CompareSet {
        key: f("/c"),
        expected: f(""),
        desired: f("first"),
    });
    t.push(("cas_missing_empty", r.read_field()));
    r.send(&Request::CompareSet {
        key: f("/c"),
        expected: f("first"),
        desired: f("second"),
    });
    t.push(("cas_match", r.read_field()));
    r.send(&Request::CompareSet {
        key: f("/c"),
        expected: f("zzz"),
        desired: f("third"),
    });
    t.push(("cas_mismatch", r.read_field()));
    r.send(&Request::QueueLen { key: f("/q") });
    t.push(("queue_len_empty", r.read_n(8)));
    r.send(&Request::QueuePush {
        key: f("/q"),
        value: f("a"),
    });
    r.send(&Request::QueuePush {
        key: f("/q"),
        value: f("bb"),
    });
    r.send(&Request::QueueLen { key: f("/q") });
    t.push(("queue_len", r.read_n(8)));
    r.send(&Request::Check {
        keys: vec![f("/q")],
    });
    t.push(("check_sees_queue", r.read_n(1)));
    r.send(&Request::GetNumKeys);
    t.push(("num_keys_ignores_queues", r.read_n(8)));
    for step in ["queue_pop", "queue_pop_second"] {
        r.send(&Request::QueuePop { key: f("/q") });
        let mut popped = r.read_n(8);
        popped.extend(r.read_field());
        t.push((step, popped));
    }
    r.send(&Request::QueuePop { key: f("/q") });
    t.push(("queue_pop_empty", r.read_n(8)));

    // A WAIT is answered only once its last key appears, set by anyone.
    r.send(&Request::Wait {
        keys: vec![f("/late1"), f("/late2")],
    });
    r2.send(&Request::Set {
        key: f("/late1"),
        value: f("1"),
    });
    t.push((
        "wait_not_early",
        vec![u8::from(r.has_data(Duration::from_millis(150)))],
    ));
    r2.send(&Request::Add {
        key: f("/late2"),
        delta: 1,
    });
    t.push(("add_from_peer", r2.read_n(8)));
    t.push(("wait_woken", r.read_n(1)));
    // A WAIT cancelled before its key came.
    r.send(&Request::Wait {
        keys: vec![f("/never")],
    });
    thread::sleep(Duration::from_millis(50));
    r.send(&Request::CancelWait);
    t.push(("wait_cancelled", r.read_n(1)));
    // torch's quirk: a compare_set that stores nothing still wakes waiters.
    r.send(&Request::Wait {
        keys: vec![f("/quirk")],
    });
    thread::sleep(Duration::from_millis(50));
    r2.send(&Request::CompareSet {
        key: f("/quirk"),
        expected: f("x"),
        desired: f("y"),
    });
    t.push(("cas_reply_to_peer", r2.read_field()));
    t.push(("wait_woken_by_failed_cas", r.read_n(1)));
    r.send(&Request::Check {
        keys: vec![f("/quirk")],
    });
    t.push(("quirk_key_still_missing", r.read_n(1)));
    // A wait that completed and a cancel after it: only the cancel reply.
    r.send(&Request::CancelWait);
    t.push(("cancel_after_wake", r.read_n(1)));
    // A key exactly at the 8 KiB limit is fine.
    let long_key = format!("/{}", "k".repeat(wire::Limits::LIBUV.max_key_len - 1));
    r.send(&Request::Set {
        key: f(&long_key),
        value: f("v"),
    });
    r.send(&Request::Get { key: f(&long_key) });
    t.push(("key_at_limit", r.read_field()));
    r.send(&Request::GetNumKeys);
    t.push(("num_keys_end", r.read_n(8)));
    t
}

/// Sends each kind of bad request on its own fresh connection, followed by
/// a PING, and reports whether the server then hung up (`true`) or answered.
pub fn raw_violations(port: u16) -> Vec<(&'static str, bool)> {
    let ping = {
        let mut p = Vec::new();
        Request::Ping { nonce: 9 }.encode(&mut p);
        p
    };
    let frame = |req: Request<'_>| {
        let mut b = Vec::new();
        req.encode(&mut b);
        b
    };
    let huge_len = |op: u8| {
        let mut b = vec![op];
        wire::put_u64(&mut b, u64::MAX);
        b
    };
    let mut over_value = vec![1u8];
    wire::put_bytes(&mut over_value, b"/k");
    wire::put_u64(&mut over_value, (8 << 20) + 1);
    let mut over_key = vec![3u8];
    wire::put_u64(&mut over_key, 8 * 1024 + 1);
    let cases: Vec<(&'static str, bool, Vec<u8>)> = vec![
        ("valid_control", true, Vec::new()),
        (
            "wrong_magic",
            false,
            frame(Request::Validate { magic: 0x1234_5678 }),
        ),
        (
            "validate_twice",
            true,
            frame(Request::Validate {
                magic: VALIDATION_MAGIC,
            }),
        ),
        ("opcode_18", true, vec![18]),
        ("opcode_255", true, vec![255]),
        ("key_over_8k", true, over_key),
        ("key_len_u64_max", true, huge_len(3)),
        ("value_over_8m", true, over_value),
        ("wait_count_u64_max", true, huge_len(6)),
        ("check_count_u64_max", true, huge_len(5)),
        ("multi_get_count_u64_max", true, huge_len(10)),
        ("multi_set_count_u64_max", true, huge_len(11)),
        (
            "add_on_text",
            true,
            [
                frame(Request::Set {
                    key: f("/t"),
                    value: f("abc"),
                }),
                frame(Request::Add {
                    key: f("/t"),
                    delta: 1,
                }),
            ]
            .concat(),
        ),
    ];
    cases
        .into_iter()
        .map(|(name, validate, bad)| {
            let mut r = if validate {
                Raw::validated(port)
            } else {
                Raw::connect(port)
            };
            r.send_bytes(&bad);
            // Separate packets: torch only re-examines a stalled connection
            // when new data arrives.
            thread::sleep(Duration::from_millis(50));
            r.send_bytes(&ping);
            (name, r.is_closed())
        })
        .collect()
}
