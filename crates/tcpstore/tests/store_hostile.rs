//! Hostile input to the native TCPStore server, from raw TCP sockets: cut
//! frames, absurd lengths, unknown opcodes, garbage before VALIDATE, values
//! over the limit, a slowloris client, a client that never reads, thousands
//! of connections. After each abuse the server must still be up and serve a
//! well-behaved client (ours, and torch's with the `libtorch` feature)
//! promptly, its memory must stay bounded (the server runs in this test
//! process, so `/proc/self/status` is its memory), and every thread it
//! started for a connection must end once that connection is gone.
//!
//! The tests take turns (one lock): the RSS and thread counts they assert
//! on are the whole process's.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use tcpstore::native::wire::{self, Request, VALIDATION_MAGIC};
use tcpstore::native::{TcpStore, TcpStoreServer};
use tcpstore::{Store, StoreError, StoreOptions};

/// How fast a well-behaved client's SET + GET must be after an abuse. Far
/// above the microseconds it takes, so a loaded CI machine still passes.
const PROMPT: Duration = Duration::from_secs(1);

/// How much the process's resident memory may grow while hostile clients
/// announce lengths they never send (MiB).
const RSS_GROWTH_LIMIT_MIB: u64 = 64;

/// How long the server may take to hang up on a client that broke the
/// protocol, or to let a finished connection's threads end.
const HANG_UP_WITHIN: Duration = Duration::from_secs(5);
const SETTLE_WITHIN: Duration = Duration::from_secs(15);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn opts(port: u16) -> StoreOptions {
    StoreOptions {
        host: "127.0.0.1".into(),
        port,
        is_server: false,
        num_workers: None,
        wait_workers: false,
        timeout: Duration::from_secs(5),
    }
}

/// A field of `/proc/self/status` ("VmRSS", "Threads"): its number, in the
/// file's unit (kB for sizes).
fn proc_status(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

/// Resident memory of this process (server included), MiB.
fn rss_mib() -> u64 {
    proc_status("VmRSS") / 1024
}

/// Threads of this process (server included).
fn threads() -> u64 {
    proc_status("Threads")
}

/// Open file descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, Iterator::count)
}

/// Polls `cond` every 20 ms until it holds or `limit` passes.
fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() > limit {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A well-behaved client (ours, then torch's where compiled in) connects,
/// sets and gets a fresh key; the SET + GET must take under [`PROMPT`].
fn assert_served(port: u16, after: &str) {
    static N: AtomicUsize = AtomicUsize::new(0);
    let key = format!("healthy/{}", N.fetch_add(1, Ordering::Relaxed));
    let native = TcpStore::open(&opts(port)).unwrap_or_else(|e| panic!("after {after}: {e}"));
    assert_set_get_prompt(&native, &key, &format!("native client after {after}"));
    #[cfg(feature = "libtorch")]
    {
        let torch = tcpstore::libtorch::TorchStore::open(&opts(port))
            .unwrap_or_else(|e| panic!("after {after}: torch client: {e}"));
        assert_set_get_prompt(
            &torch,
            &format!("{key}/torch"),
            &format!("torch client after {after}"),
        );
    }
}

fn assert_set_get_prompt(store: &dyn Store, key: &str, what: &str) {
    let start = Instant::now();
    store
        .set(key, b"still here")
        .unwrap_or_else(|e| panic!("{what}: set: {e}"));
    let got = store
        .get(key)
        .unwrap_or_else(|e| panic!("{what}: get: {e}"));
    let took = start.elapsed();
    assert_eq!(got, b"still here", "{what}");
    assert!(took < PROMPT, "{what}: set + get took {took:.2?}");
}

/// Starts a server and checks that it serves; returns it with the thread
/// count once that first client's connection has ended (the baseline for
/// [`assert_threads_settle`]).
fn start() -> (TcpStoreServer, u16, u64) {
    let server = TcpStoreServer::bind(0).unwrap();
    let port = server.port();
    assert_served(port, "start");
    assert_connections_end(&server, "start");
    (server, port, threads())
}

/// Waits until the server has no connection left: every client is gone
/// and both threads of each connection have ended.
fn assert_connections_end(server: &TcpStoreServer, after: &str) {
    assert!(
        eventually(SETTLE_WITHIN, || server.open_connections() == 0),
        "after {after}: {} connections still open",
        server.open_connections()
    );
}

/// Waits until the server has no connection left and the process is back
/// to at most `threads_before` threads: every thread the server started for
/// a connection has ended.
fn assert_all_end(server: &TcpStoreServer, threads_before: u64, after: &str) {
    assert_connections_end(server, after);
    assert_threads_settle(threads_before, after);
}

/// Waits until the process is back to at most `threads_before` threads.
fn assert_threads_settle(threads_before: u64, after: &str) {
    assert!(
        eventually(SETTLE_WITHIN, || threads() <= threads_before),
        "after {after}: {} threads, {threads_before} before: connection threads did not end",
        threads()
    );
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect to the server");
    let _ = s.set_nodelay(true);
    s
}

fn encode(req: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    req.encode(&mut out);
    out
}

fn validate() -> Vec<u8> {
    encode(&Request::Validate {
        magic: VALIDATION_MAGIC,
    })
}

/// A connection that has sent VALIDATE, as every torch client does first.
fn validated(port: u16) -> TcpStream {
    let mut s = connect(port);
    s.write_all(&validate()).expect("send VALIDATE");
    s
}

/// True once the server has closed `s` (EOF or reset) within
/// [`HANG_UP_WITHIN`]; replies that arrive first are read and dropped.
fn hangs_up(s: &mut TcpStream) -> bool {
    let deadline = Instant::now() + HANG_UP_WITHIN;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                return matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset
                        | ErrorKind::ConnectionAborted
                        | ErrorKind::BrokenPipe
                );
            }
        }
    }
}

/// Sends `bytes` on a fresh connection (after VALIDATE if `validated`) and
/// asserts that the server hangs up.
fn assert_refused(port: u16, validated_first: bool, bytes: &[u8], case: &str) {
    let mut s = if validated_first {
        validated(port)
    } else {
        connect(port)
    };
    // The server may hang up before it has read everything: ignore errors.
    let _ = s.write_all(bytes);
    assert!(hangs_up(&mut s), "{case}: the server did not hang up");
}

fn b(s: &str) -> wire::Field<'_> {
    s.as_bytes().into()
}

/// One valid request of each of the 18 opcodes.
fn every_request() -> Vec<Request<'static>> {
    vec![
        Request::Validate {
            magic: VALIDATION_MAGIC,
        },
        Request::Set {
            key: b("/k"),
            value: b("value"),
        },
        Request::CompareSet {
            key: b("/k"),
            expected: b("value"),
            desired: b("other"),
        },
        Request::Get { key: b("/k") },
        Request::Add {
            key: b("/n"),
            delta: 7,
        },
        Request::Check {
            keys: vec![b("/k"), b("/n")],
        },
        Request::Wait {
            keys: vec![b("/k")],
        },
        Request::GetNumKeys,
        Request::DeleteKey { key: b("/gone") },
        Request::Append {
            key: b("/k"),
            value: b("+"),
        },
        Request::MultiGet {
            keys: vec![b("/k"), b("/n")],
        },
        Request::MultiSet {
            pairs: vec![(b("/a"), b("1")), (b("/b"), b("22"))],
        },
        Request::CancelWait,
        Request::Ping { nonce: 0x0102_0304 },
        Request::QueuePush {
            key: b("/q"),
            value: b("item"),
        },
        Request::QueuePop { key: b("/q") },
        Request::QueueLen { key: b("/q") },
        Request::ListKeys,
    ]
}

/// Every proper prefix of every request, then the client closes: the
/// server must notice the cut frame, hang up, and end the connection's
/// threads.
#[test]
fn truncated_frames_then_close() {
    let _serial = serial();
    let (server, port, threads_before) = start();
    let mut cuts = 0;
    for req in every_request() {
        let frame = encode(&req);
        for cut in 1..frame.len() {
            // VALIDATE is also cut as a connection's very first frame.
            let first = req.op() == wire::Op::Validate;
            let mut s = if first {
                connect(port)
            } else {
                validated(port)
            };
            s.write_all(&frame[..cut]).unwrap();
            // Half-close: the server reads EOF mid-frame and must hang up.
            s.shutdown(Shutdown::Write).unwrap();
            assert!(
                hangs_up(&mut s),
                "{:?} cut after {cut} of {} bytes: the server did not hang up",
                req.op(),
                frame.len()
            );
            cuts += 1;
        }
        // The same cut frames, closed outright without waiting for the
        // server, all at once.
        let conns: Vec<TcpStream> = (1..frame.len())
            .map(|cut| {
                let mut s = validated(port);
                s.write_all(&frame[..cut]).unwrap();
                s
            })
            .collect();
        drop(conns);
    }
    eprintln!("{cuts} cut frames");
    assert_served(port, "truncated frames");
    assert_all_end(&server, threads_before, "truncated frames");
}

/// `str`/`bytes` lengths and key counts no server could honour
/// (u64::MAX, 2^63, 2^40) and lengths one over the limits, in every field
/// that has one: the server hangs up without allocating them. Then 200
/// connections announce an 8 MiB value (legal) but send 16 bytes of it and
/// stay open: memory grows only with what actually arrived.
#[test]
fn absurd_lengths_do_not_allocate() {
    let _serial = serial();
    let (server, port, threads_before) = start();
    let rss_before = rss_mib();
    let key_over = (wire::Limits::LIBUV.max_key_len + 1) as u64;
    let value_over = (wire::Limits::LIBUV.max_value_len + 1) as u64;
    let count_over = (wire::Limits::LIBUV.max_key_count + 1) as u64;
    let frame = |op: wire::Op, head: &[&[u8]], len: u64| {
        let mut f = vec![op as u8];
        head.iter().for_each(|field| wire::put_bytes(&mut f, field));
        wire::put_u64(&mut f, len);
        f
    };
    use wire::Op::*;
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for huge in [u64::MAX, 1 << 63, 1 << 40] {
        for op in [
            Set, CompareSet, Get, Add, DeleteKey, Append, QueuePush, QueuePop, QueueLen,
        ] {
            cases.push((format!("{op:?} key length {huge}"), frame(op, &[], huge)));
        }
        for op in [Set, Append, QueuePush, CompareSet] {
            cases.push((
                format!("{op:?} value length {huge}"),
                frame(op, &[b"/k"], huge),
            ));
        }
        cases.push((
            format!("CompareSet desired length {huge}"),
            frame(CompareSet, &[b"/k", b""], huge),
        ));
        for op in [Check, Wait, MultiGet, MultiSet] {
            cases.push((format!("{op:?} key count {huge}"), frame(op, &[], huge)));
            let mut f = vec![op as u8];
            wire::put_u64(&mut f, 1);
            wire::put_u64(&mut f, huge);
            cases.push((format!("{op:?} first key length {huge}"), f));
        }
        let mut f = vec![MultiSet as u8];
        wire::put_u64(&mut f, 1);
        wire::put_bytes(&mut f, b"/k");
        wire::put_u64(&mut f, huge);
        cases.push((format!("MultiSet value length {huge}"), f));
    }
    cases.push(("Get key one over 8 KiB".into(), frame(Get, &[], key_over)));
    cases.push((
        "Set value one over 8 MiB".into(),
        frame(Set, &[b"/k"], value_over),
    ));
    cases.push((
        "Check count one over 128 Ki".into(),
        frame(Check, &[], count_over),
    ));
    for (case, bytes) in &cases {
        assert_refused(port, true, bytes, case);
    }
    assert_served(port, "absurd lengths");
    let rss_after_refusals = rss_mib();

    // Legal lengths that lie: the server must wait for the data without
    // reserving it all up front.
    let liars: Vec<TcpStream> = (0..200)
        .map(|_| {
            let mut s = validated(port);
            let mut f = frame(Set, &[b"/liar"], 8 << 20);
            f.extend_from_slice(&[0xAB; 16]);
            s.write_all(&f).unwrap();
            s
        })
        .collect();
    assert_served(port, "200 connections announcing 8 MiB values");
    let rss_with_liars = rss_mib();
    eprintln!(
        "RSS: {rss_before} MiB before, {rss_after_refusals} MiB after {} refusals, \
         {rss_with_liars} MiB with 200 lying connections open",
        cases.len()
    );
    let grown = rss_after_refusals
        .max(rss_with_liars)
        .saturating_sub(rss_before);
    assert!(
        grown < RSS_GROWTH_LIMIT_MIB,
        "resident memory grew by {grown} MiB (limit {RSS_GROWTH_LIMIT_MIB} MiB)"
    );
    drop(liars);
    assert_served(port, "lying connections closed");
    assert_all_end(&server, threads_before, "absurd lengths");
}

/// Opcodes 18..=255 do not exist: the server hangs up, whether they come
/// after VALIDATE or instead of it.
#[test]
fn unknown_opcodes() {
    let _serial = serial();
    let (server, port, threads_before) = start();
    for op in 18..=255u8 {
        let mut bytes = vec![op];
        bytes.extend_from_slice(&[op; 16]);
        assert_refused(port, true, &bytes, &format!("opcode {op} after VALIDATE"));
        assert_refused(port, false, &bytes, &format!("opcode {op} before VALIDATE"));
    }
    assert_served(port, "unknown opcodes");
    assert_all_end(&server, threads_before, "unknown opcodes");
}

/// Anything but VALIDATE with the magic as a connection's first bytes:
/// port scanners, TLS, HTTP, random bytes, requests that skip VALIDATE. The
/// server hangs up at once, without waiting for a frame whose length the
/// garbage announced, and answers nothing (not even a PING).
#[test]
fn garbage_before_validate() {
    let _serial = serial();
    let (server, port, threads_before) = start();
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut random = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect()
    };
    // A SET that skips VALIDATE and announces an 8 MiB value it never
    // sends: refused at its first byte, not after 8 MiB that never come.
    let mut set_no_validate = vec![wire::Op::Set as u8];
    wire::put_bytes(&mut set_no_validate, b"/k");
    wire::put_u64(&mut set_no_validate, 8 << 20);
    let mut cases: Vec<(String, Vec<u8>)> = vec![
        ("HTTP".into(), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        (
            "TLS ClientHello".into(),
            vec![
                0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03,
            ],
        ),
        ("SSH banner".into(), b"SSH-2.0-OpenSSH_9.6\r\n".to_vec()),
        (
            "wrong magic".into(),
            encode(&Request::Validate { magic: 0xDEAD_BEEF }),
        ),
        (
            "magic big-endian".into(),
            [vec![0], VALIDATION_MAGIC.to_be_bytes().to_vec()].concat(),
        ),
        ("PING first".into(), encode(&Request::Ping { nonce: 5 })),
        ("SET first, 8 MiB announced".into(), set_no_validate),
        ("zero bytes".into(), vec![0; 64]),
    ];
    for len in [1, 7, 100, 4096, 65536] {
        let mut g = random(len);
        // Random, but never a VALIDATE: those are tested above.
        if g[0] == 0 {
            g[0] = 0xFF;
        }
        cases.push((format!("{len} random bytes"), g));
    }
    for (case, bytes) in &cases {
        let mut s = connect(port);
        let _ = s.write_all(bytes);
        // Nothing is answered: the first bytes the server sends, if any,
        // would be an answer (a PING echo, a GET value).
        s.set_read_timeout(Some(HANG_UP_WITHIN)).unwrap();
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => {}
            Ok(n) => panic!("{case}: the server answered {:?}", &buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => panic!("{case}: the server did not hang up ({e})"),
        }
    }
    assert_served(port, "garbage before VALIDATE");
    assert_all_end(&server, threads_before, "garbage before VALIDATE");
}

/// Values and keys over the limits (8 MiB, 8 KiB) with the bytes actually
/// streamed: refused after the length, not after buffering the value. A
/// value of exactly 8 MiB is accepted and read back. Our client refuses an
/// oversized value itself and its connection stays usable.
#[test]
fn values_over_the_limit() {
    let _serial = serial();
    let (server, port, threads_before) = start();
    let max_value = wire::Limits::LIBUV.max_value_len;
    let max_key = wire::Limits::LIBUV.max_key_len;
    let rss_before = rss_mib();

    // Over the limit, streamed in full from a second thread while we watch
    // for the hang-up.
    let big = vec![0x5Au8; max_value + 1];
    let over: Vec<(&str, Vec<u8>)> = vec![
        (
            "SET value 8 MiB + 1",
            encode(&Request::Set {
                key: b("/big"),
                value: big.as_slice().into(),
            }),
        ),
        (
            "APPEND value 8 MiB + 1",
            encode(&Request::Append {
                key: b("/big"),
                value: big.as_slice().into(),
            }),
        ),
        (
            "COMPARE_SET desired 8 MiB + 1",
            encode(&Request::CompareSet {
                key: b("/big"),
                expected: b(""),
                desired: big.as_slice().into(),
            }),
        ),
        (
            "QUEUE_PUSH value 8 MiB + 1",
            encode(&Request::QueuePush {
                key: b("/big"),
                value: big.as_slice().into(),
            }),
        ),
        (
            "MULTI_SET second value 8 MiB + 1",
            encode(&Request::MultiSet {
                pairs: vec![(b("/ok"), b("1")), (b("/big"), big.as_slice().into())],
            }),
        ),
        (
            "GET key 8 KiB + 1",
            encode(&Request::Get {
                key: vec![b'k'; max_key + 1].into(),
            }),
        ),
    ];
    drop(big);
    for (case, bytes) in &over {
        let mut s = validated(port);
        let mut writer = s.try_clone().unwrap();
        thread::scope(|scope| {
            scope.spawn(move || {
                let _ = writer.write_all(bytes);
            });
            assert!(hangs_up(&mut s), "{case}: the server did not hang up");
        });
    }
    drop(over);
    let rss_refused = rss_mib();

    // Exactly at the limits: accepted, and read back intact.
    let at_limit = vec![0xA5u8; max_value];
    let key_at_limit = vec![b'k'; max_key];
    let mut s = validated(port);
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(&encode(&Request::Set {
        key: key_at_limit.as_slice().into(),
        value: at_limit.as_slice().into(),
    }))
    .unwrap();
    s.write_all(&encode(&Request::Get {
        key: key_at_limit.as_slice().into(),
    }))
    .unwrap();
    let len = wire::read_u64(&mut s).unwrap();
    assert_eq!(len, max_value as u64);
    let mut back = vec![0u8; max_value];
    s.read_exact(&mut back).unwrap();
    assert!(back == at_limit, "the 8 MiB value came back changed");
    drop(s);

    // Our client refuses, before sending, what the server would hang up on.
    let client = TcpStore::open(&opts(port)).unwrap();
    let over = vec![0u8; max_value + 1];
    assert!(matches!(
        client.set("over", &over),
        Err(StoreError::Invalid(_))
    ));
    assert_set_get_prompt(
        &client,
        "after-refusal",
        "our client after refusing 8 MiB + 1",
    );
    drop(client);

    eprintln!(
        "RSS: {rss_before} MiB before, {rss_refused} MiB after {} refused 8 MiB frames",
        6
    );
    let grown = rss_refused.saturating_sub(rss_before);
    assert!(
        grown < RSS_GROWTH_LIMIT_MIB,
        "refusing oversized values grew resident memory by {grown} MiB"
    );
    assert_served(port, "values over the limit");
    assert_all_end(&server, threads_before, "values over the limit");
}

/// Slowloris: 20 clients dribble VALIDATE + SET one byte per 100 ms. The
/// server keeps answering a well-behaved client promptly meanwhile, and
/// assembles every dribbled frame correctly.
#[test]
fn slowloris_does_not_block_others() {
    let _serial = serial();
    let (server, port, threads_before) = start();
    let client = TcpStore::open(&opts(port)).unwrap();
    const SLOW: usize = 20;
    let dribbled = |i: usize| {
        let mut f = validate();
        f.extend(encode(&Request::Set {
            key: format!("/slow/{i}").into_bytes().into(),
            value: b("v"),
        }));
        f
    };
    let frame_len = dribbled(0).len();
    thread::scope(|scope| {
        for i in 0..SLOW {
            scope.spawn(move || {
                let mut s = connect(port);
                for byte in dribbled(i) {
                    s.write_all(&[byte]).unwrap();
                    thread::sleep(Duration::from_millis(100));
                }
                // Stay connected a little: the SET has no reply to wait for.
                thread::sleep(Duration::from_millis(300));
            });
        }
        // Meanwhile: a well-behaved client, every 100 ms.
        let start = Instant::now();
        let mut rounds = 0;
        while start.elapsed() < Duration::from_millis(100 * frame_len as u64) {
            assert_set_get_prompt(&client, &format!("during/{rounds}"), "during slowloris");
            rounds += 1;
            thread::sleep(Duration::from_millis(100));
        }
        eprintln!("{rounds} prompt rounds during {SLOW} slowloris clients of {frame_len} bytes");
    });
    for i in 0..SLOW {
        assert_eq!(
            client.get(&format!("slow/{i}")).unwrap(),
            b"v",
            "slow SET {i}"
        );
    }
    drop(client);
    assert_served(port, "slowloris");
    assert_all_end(&server, threads_before, "slowloris");
}

/// A client that sends GETs of a 1 MiB value and never reads the replies:
/// the server stops reading from it once its replies back up (replies
/// share the stored value, they are not copies), keeps serving others,
/// and ends both of its threads once the client goes away.
#[test]
fn client_that_never_reads() {
    let _serial = serial();
    let (server, port, threads_before) = start();
    let client = TcpStore::open(&opts(port)).unwrap();
    client.set("mib", &vec![1u8; 1 << 20]).unwrap();
    assert_eq!(client.get("mib").unwrap().len(), 1 << 20);
    let rss_before = rss_mib();
    let mut s = validated(port);
    let get = encode(&Request::Get { key: b("/mib") });
    let gets: Vec<u8> = get.iter().copied().cycle().take(get.len() * 2000).collect();
    // The server stops reading once replies back up, so this write would
    // block: a short timeout ends it; what matters is that it is bounded.
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = s.write_all(&gets);
    assert_served(port, "a client that never reads");
    let grown = rss_mib().saturating_sub(rss_before);
    eprintln!("RSS grew {grown} MiB with 2000 unread 1 MiB replies queued");
    assert!(
        grown < RSS_GROWTH_LIMIT_MIB,
        "unread replies grew resident memory by {grown} MiB"
    );
    drop(s);
    drop(client);
    assert_served(port, "the non-reader left");
    assert_all_end(&server, threads_before, "a client that never reads");

    // Dropping the server while a non-reader holds its writer blocked must
    // not hang: the drop shuts every connection down and waits for both of
    // its threads.
    let mut s = validated(port);
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = s.write_all(&gets);
    // Time to read the GETs and fill the socket with replies.
    thread::sleep(Duration::from_millis(300));
    let (done, dropped) = std::sync::mpsc::channel();
    thread::spawn(move || {
        drop(server);
        let _ = done.send(());
    });
    assert!(
        dropped.recv_timeout(Duration::from_secs(10)).is_ok(),
        "dropping the server hung on a client that never reads"
    );
    assert!(
        hangs_up(&mut s),
        "the dropped server left the non-reader connected"
    );
    assert_threads_settle(threads_before, "dropping the server");
}

/// Raises this process's soft limit on open files to `want` (at most the
/// hard limit); returns the soft limit now in force.
fn raise_nofile(want: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < want {
            let raised = libc::rlimit {
                rlim_cur: want.min(lim.rlim_max),
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim = raised;
            }
        }
    }
    lim.rlim_cur
}

/// `net.core.somaxconn`: the kernel's cap on any listen backlog.
fn somaxconn() -> usize {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// 2000 connections at once (a third idle, a third validated, a third in
/// the middle of a frame), as when a few thousand ranks start together:
/// - no connect stalls on an overflowing accept queue (each overflow costs
///   the client a 1 s SYN retransmit: std's backlog of 128 did that);
/// - the server accepts them all, still serves a new well-behaved client
///   promptly, and each connection costs at most 2 threads, 1 descriptor,
///   1.5 MiB of address space and 256 KiB resident;
/// - once they close, every thread, descriptor and thread stack is given
///   back without waiting for another connection to arrive.
#[test]
fn thousands_of_connections() {
    const CONNS: usize = 2000;
    let _serial = serial();
    // Both ends of every connection live in this process, plus slack.
    let want = (CONNS * 2 + 1024) as u64;
    let have = raise_nofile(want);
    if have < want {
        eprintln!(
            "SKIP thousands_of_connections: needs {want} open files, RLIMIT_NOFILE allows {have}"
        );
        return;
    }
    let (server, port, threads_before) = start();
    let fds_before = open_fds();
    let rss_before = rss_mib();
    let vm_before = proc_status("VmSize") / 1024;
    let start = Instant::now();
    let mut set = vec![wire::Op::Set as u8];
    wire::put_bytes(&mut set, b"/half");
    let mut slowest = Duration::ZERO;
    let conns: Vec<TcpStream> = (0..CONNS)
        .map(|i| {
            let t = Instant::now();
            let mut s = connect(port);
            slowest = slowest.max(t.elapsed());
            match i % 3 {
                0 => {}
                1 => s.write_all(&validate()).unwrap(),
                _ => s.write_all(&[validate(), set.clone()].concat()).unwrap(),
            }
            s
        })
        .collect();
    // Connected is not yet accepted: wait until the server holds them all.
    let all_in = eventually(Duration::from_secs(60), || {
        server.open_connections() == CONNS
    });
    let took = start.elapsed();
    let (threads_held, fds_held) = (threads(), open_fds());
    let (rss_held, vm_held) = (rss_mib(), proc_status("VmSize") / 1024);
    eprintln!(
        "{CONNS} connections in {took:.2?} (slowest connect {slowest:.2?}): \
         threads {threads_before} -> {threads_held}, fds {fds_before} -> {fds_held}, \
         RSS {rss_before} -> {rss_held} MiB, address space {vm_before} -> {vm_held} MiB"
    );
    assert!(
        all_in,
        "the server did not accept {CONNS} connections in 60 s"
    );
    if somaxconn() >= CONNS {
        assert!(
            slowest < Duration::from_millis(900),
            "a connect took {slowest:.2?}: the accept queue overflowed"
        );
    } else {
        eprintln!(
            "net.core.somaxconn is {}: connect stalls not checked",
            somaxconn()
        );
    }
    assert_served(port, &format!("{CONNS} open connections"));
    let per_conn_threads = (threads_held - threads_before) as f64 / CONNS as f64;
    assert!(
        per_conn_threads <= 2.05,
        "{per_conn_threads:.2} threads per idle connection"
    );
    // Ours and the server's end of each connection.
    let per_conn_fds = (fds_held - fds_before) as f64 / CONNS as f64;
    assert!(
        per_conn_fds <= 2.05,
        "{:.2} server descriptors per connection",
        per_conn_fds - 1.0
    );
    let per_conn_kib = (rss_held.saturating_sub(rss_before) * 1024) as f64 / CONNS as f64;
    assert!(
        per_conn_kib < 256.0,
        "{per_conn_kib:.0} KiB resident per idle connection"
    );
    let per_conn_vm_kib = (vm_held.saturating_sub(vm_before) * 1024) as f64 / CONNS as f64;
    assert!(
        per_conn_vm_kib < 1536.0,
        "{per_conn_vm_kib:.0} KiB of address space per idle connection"
    );
    drop(conns);
    assert_all_end(
        &server,
        threads_before,
        &format!("closing {CONNS} connections"),
    );
    assert!(
        eventually(SETTLE_WITHIN, || open_fds() <= fds_before),
        "{} descriptors open after closing {CONNS} connections, {fds_before} before",
        open_fds()
    );
    // Thread stacks are unmapped as their threads end, not when the next
    // connection arrives (none has yet).
    let rss_after = rss_mib();
    eprintln!("RSS {rss_after} MiB after closing them");
    assert!(
        rss_after < rss_before + RSS_GROWTH_LIMIT_MIB,
        "RSS {rss_after} MiB after closing {CONNS} connections, {rss_before} MiB before"
    );
    assert_served(port, &format!("{CONNS} connections closed"));
}

/// Over its connection limit the server hangs up on newcomers at once
/// (saying so on stderr) and keeps serving the connections it has; a freed
/// slot goes to the next client, whose `open` retries until then.
#[test]
fn connections_over_the_limit_are_refused() {
    const MAX: usize = 16;
    let _serial = serial();
    let server = TcpStoreServer::bind_with_max_connections(0, MAX).unwrap();
    let port = server.port();
    assert_eq!(server.max_connections(), MAX);
    // As `start` does: the clients' own lazily started threads (torch's)
    // exist before the baseline is taken.
    assert_served(port, "start");
    assert_connections_end(&server, "start");
    let threads_before = threads();
    let mut held: Vec<TcpStream> = (0..MAX).map(|_| validated(port)).collect();
    assert!(
        eventually(SETTLE_WITHIN, || server.open_connections() == MAX),
        "{} of {MAX} connections accepted",
        server.open_connections()
    );
    let ping = encode(&Request::Ping { nonce: 77 });
    for _ in 0..3 {
        assert_refused(port, true, &ping, "a connection over the limit");
    }
    // Those it holds are still served.
    held[0].write_all(&ping).unwrap();
    held[0].set_read_timeout(Some(HANG_UP_WITHIN)).unwrap();
    assert_eq!(wire::read_u32(&mut held[0]).unwrap(), 77);
    thread::scope(|scope| {
        let waiter = scope.spawn(|| TcpStore::open(&opts(port)));
        thread::sleep(Duration::from_millis(300));
        drop(held.pop());
        let store = waiter.join().unwrap().expect("open once a slot is free");
        assert_set_get_prompt(&store, "let-in", "a client let in after a slot freed");
    });
    // torch's client retries a refused connection the same way.
    #[cfg(feature = "libtorch")]
    thread::scope(|scope| {
        use tcpstore::libtorch::TorchStore;
        // Full again: the client above has gone.
        assert!(eventually(SETTLE_WITHIN, || server.open_connections() < MAX));
        held.push(validated(port));
        assert!(eventually(SETTLE_WITHIN, || server.open_connections() == MAX));
        assert_refused(port, true, &ping, "a connection over the limit");
        let waiter = scope.spawn(|| TorchStore::open(&opts(port)));
        thread::sleep(Duration::from_millis(300));
        drop(held.pop());
        let store = waiter
            .join()
            .unwrap()
            .expect("torch: open once a slot is free");
        assert_set_get_prompt(&store, "let-in-torch", "torch let in after a slot freed");
    });
    drop(held);
    assert_all_end(&server, threads_before, "connections over the limit");

    // The default: 4096, or half the open-file limit if less, at least 64.
    let default = TcpStoreServer::bind(0).unwrap().max_connections();
    assert!(
        (64..=tcpstore::native::MAX_CONNECTIONS).contains(&default),
        "default limit {default}"
    );
}
