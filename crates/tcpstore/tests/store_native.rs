//! The native TCPStore: Rust client against Rust server.

#[path = "store_suite.rs"]
mod suite;

use std::net::{Ipv4Addr, TcpListener};
use std::thread;
use std::time::{Duration, Instant};

use suite::{Raw, f, free_port, joining, opts};
use tcpstore::native::wire::{self, Request};
use tcpstore::native::{TcpStore, TcpStoreServer};
use tcpstore::{Store, StoreError};

/// A hosting store on an ephemeral port, and a second client of it.
fn server_and_client(timeout: Duration) -> (TcpStore, TcpStore) {
    let host = TcpStore::open(&opts(0, true, timeout)).unwrap();
    let client = TcpStore::open(&opts(host.port(), false, timeout)).unwrap();
    (host, client)
}

#[test]
fn store_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<TcpStore>();
    assert_send_sync::<TcpStoreServer>();
}

#[test]
fn native_client_and_server_pass_the_suite() {
    let (host, client) = server_and_client(Duration::from_millis(500));
    suite::run_all("native", &host, &client);
}

#[test]
fn ephemeral_port_is_reported() {
    let server = TcpStoreServer::bind(0).unwrap();
    assert_ne!(server.port(), 0);
    assert_eq!(server.local_addr().port(), server.port());
    let client = TcpStore::open(&opts(server.port(), false, Duration::from_secs(2))).unwrap();
    assert_eq!(client.port(), server.port());
    assert!(client.server().is_none());
    client.set("x", b"y").unwrap();
}

#[test]
fn two_workers_join() {
    let port = free_port();
    let t = Instant::now();
    let host = thread::spawn(move || TcpStore::open(&joining(port, true, Duration::from_secs(10))));
    thread::sleep(Duration::from_millis(100));
    let peer = TcpStore::open(&joining(port, false, Duration::from_secs(10))).unwrap();
    let host = host.join().unwrap().unwrap();
    assert!(t.elapsed() < Duration::from_secs(5));
    // The only key is torch's worker counter, unprefixed, at "2".
    assert_eq!(host.num_keys().unwrap(), 1);
    let mut raw = Raw::validated(port);
    raw.send(&Request::Get { key: f("init/") });
    assert_eq!(raw.read_field(), [&1u64.to_le_bytes()[..], b"2"].concat());
    peer.set("hello", b"world").unwrap();
    assert_eq!(host.get("hello").unwrap(), b"world");
}

#[test]
fn join_without_peer_times_out() {
    let port = free_port();
    let t = Instant::now();
    let err = TcpStore::open(&joining(port, true, Duration::from_millis(300)))
        .err()
        .expect("no peer came");
    let took = t.elapsed();
    match &err {
        StoreError::WorkersTimeout {
            joined,
            expected,
            after,
            ..
        } => {
            assert_eq!((*joined, *expected), (1, 2));
            assert!(*after >= Duration::from_millis(300));
        }
        other => panic!("expected WorkersTimeout, got {other:?}"),
    }
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(err.to_string().contains("1 of 2"), "{err}");
    // The failed store released its port.
    TcpStoreServer::bind(port).unwrap();
}

#[test]
fn port_in_use_is_a_bind_error() {
    let first = TcpStoreServer::bind(0).unwrap();
    let err = TcpStore::open(&opts(first.port(), true, Duration::from_secs(1)))
        .err()
        .expect("port taken");
    match &err {
        StoreError::Bind { addr, source } => {
            assert!(addr.contains(&first.port().to_string()), "{addr}");
            assert_eq!(source.kind(), std::io::ErrorKind::AddrInUse);
        }
        other => panic!("expected Bind, got {other:?}"),
    }
    // The store's words name the port and no program's flags.
    let msg = err.to_string();
    assert!(
        msg.contains(&first.port().to_string()) && !msg.contains("--"),
        "{msg}"
    );
    // Also against a plain IPv4 listener of another program.
    let other = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).unwrap();
    let port = other.local_addr().unwrap().port();
    assert!(matches!(
        TcpStoreServer::bind(port),
        Err(StoreError::Bind { .. })
    ));
}

#[test]
fn nobody_listening_is_unreachable_within_the_timeout() {
    let port = free_port();
    let t = Instant::now();
    let err = TcpStore::open(&opts(port, false, Duration::from_millis(400)))
        .err()
        .expect("nobody listens");
    let took = t.elapsed();
    match &err {
        StoreError::Unreachable { addr, waited } => {
            assert_eq!(addr, &format!("127.0.0.1:{port}"));
            assert!(*waited >= Duration::from_millis(400));
        }
        other => panic!("expected Unreachable, got {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(2),
        "took {took:?}"
    );
}

#[test]
fn client_started_first_finds_a_late_server() {
    let port = free_port();
    let client = thread::spawn(move || TcpStore::open(&opts(port, false, Duration::from_secs(10))));
    thread::sleep(Duration::from_millis(300));
    let host = TcpStore::open(&opts(port, true, Duration::from_secs(10))).unwrap();
    let client = client.join().unwrap().unwrap();
    client.set("k", b"v").unwrap();
    assert_eq!(host.get("k").unwrap(), b"v");
}

#[test]
fn server_dropped_while_client_waits_is_an_error_not_a_hang() {
    let server = TcpStoreServer::bind(0).unwrap();
    let client = TcpStore::open(&opts(server.port(), false, Duration::from_secs(30))).unwrap();
    let t = Instant::now();
    thread::scope(|s| {
        let waiter = s.spawn(|| client.wait(&["never"], Duration::from_secs(30)));
        thread::sleep(Duration::from_millis(200));
        let dropping = Instant::now();
        drop(server);
        assert!(
            dropping.elapsed() < Duration::from_secs(2),
            "drop took {:?}",
            dropping.elapsed()
        );
        let res = waiter.join().unwrap();
        assert!(matches!(res, Err(StoreError::Io(_))), "{res:?}");
    });
    assert!(t.elapsed() < Duration::from_secs(5));
    // Later calls fail fast too.
    assert!(matches!(client.get("k"), Err(StoreError::Io(_))));
    assert!(matches!(client.set("k", b"v"), Err(StoreError::Io(_))));
}

#[test]
fn server_drop_closes_idle_connections_and_joins() {
    let server = TcpStoreServer::bind(0).unwrap();
    let port = server.port();
    let mut raws: Vec<Raw> = (0..5).map(|_| Raw::validated(port)).collect();
    let _client = TcpStore::open(&opts(port, false, Duration::from_secs(2))).unwrap();
    let t = Instant::now();
    drop(server);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "drop took {:?}",
        t.elapsed()
    );
    for raw in &mut raws {
        assert!(raw.is_closed());
    }
    // And the port is free again.
    TcpStoreServer::bind(port).unwrap();
}

#[test]
fn raw_protocol_transcript() {
    let server = TcpStoreServer::bind(0).unwrap();
    let t = suite::raw_transcript(server.port());
    let get = |name: &str| {
        t.iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{name}"))
            .1
            .clone()
    };
    let field = |v: &[u8]| [&(v.len() as u64).to_le_bytes()[..], v].concat();
    let i64le = |v: i64| v.to_le_bytes().to_vec();
    assert_eq!(get("ping"), 0x0102_0304u32.to_le_bytes());
    assert_eq!(get("list_keys"), [i64le(1), field(b"/a")].concat());
    assert_eq!(get("get"), field(b"1"));
    assert_eq!(get("get_missing_is_empty"), field(b""));
    assert_eq!(get("add_new"), i64le(5));
    assert_eq!(get("add_more"), i64le(-2));
    assert_eq!(get("counter_is_ascii"), field(b"-2"));
    assert_eq!(get("check_ready"), [wire::CHECK_READY]);
    assert_eq!(get("check_not_ready"), [wire::CHECK_NOT_READY]);
    assert_eq!(get("wait_ready"), [wire::WAIT_STOP_WAITING]);
    assert_eq!(get("wait_nothing"), [wire::WAIT_STOP_WAITING]);
    assert_eq!(get("cancel_without_wait"), [wire::WAIT_CANCELED]);
    assert_eq!(get("num_keys"), i64le(2));
    assert_eq!(get("delete"), i64le(1));
    assert_eq!(get("delete_again"), i64le(0));
    assert_eq!(get("append"), field(b"xyz"));
    assert_eq!(
        get("multi_get"),
        [field(b"one"), field(b""), field(b""), field(b"xyz")].concat()
    );
    assert_eq!(get("cas_missing_nonempty"), field(b"exp"));
    assert_eq!(
        get("cas_missing_nonempty_stores_nothing"),
        [wire::CHECK_NOT_READY]
    );
    assert_eq!(get("cas_missing_empty"), field(b"first"));
    assert_eq!(get("cas_match"), field(b"second"));
    assert_eq!(get("cas_mismatch"), field(b"second"));
    assert_eq!(get("queue_len_empty"), i64le(0));
    assert_eq!(get("queue_len"), i64le(2));
    assert_eq!(get("check_sees_queue"), [wire::CHECK_READY]);
    assert_eq!(get("queue_pop"), [i64le(2), field(b"a")].concat());
    assert_eq!(get("queue_pop_second"), [i64le(1), field(b"bb")].concat());
    assert_eq!(get("queue_pop_empty"), i64le(0));
    assert_eq!(get("wait_not_early"), [0]);
    assert_eq!(get("wait_woken"), [wire::WAIT_STOP_WAITING]);
    assert_eq!(get("wait_cancelled"), [wire::WAIT_CANCELED]);
    assert_eq!(get("wait_woken_by_failed_cas"), [wire::WAIT_STOP_WAITING]);
    assert_eq!(get("quirk_key_still_missing"), [wire::CHECK_NOT_READY]);
    assert_eq!(get("cancel_after_wake"), [wire::WAIT_CANCELED]);
}

#[test]
fn bad_clients_are_disconnected_without_affecting_others() {
    let (host, client) = server_and_client(Duration::from_secs(2));
    client.set("before", b"1").unwrap();
    let outcome = suite::raw_violations(host.port());
    for (name, closed) in &outcome {
        let expect_closed = *name != "valid_control";
        assert_eq!(*closed, expect_closed, "{name}: closed={closed}");
    }
    // A client that never validates is dropped too (torch would only stall it).
    let mut r = Raw::connect(host.port());
    r.send(&Request::Ping { nonce: 1 });
    assert!(r.is_closed());
    // A truncated frame followed by a hang-up leaves the server fine.
    let mut r = Raw::validated(host.port());
    r.send_bytes(&[1, 200, 0, 0, 0, 0, 0, 0, 0, b'/']);
    drop(r);
    // Everyone else carries on.
    assert_eq!(client.get("before").unwrap(), b"1");
    host.set("after", b"2").unwrap();
    assert_eq!(client.get("after").unwrap(), b"2");
}

#[test]
fn a_client_that_never_reads_does_not_stall_the_server() {
    let (host, client) = server_and_client(Duration::from_secs(5));
    let big = suite::pattern(4 << 20, 7);
    host.set("big", &big).unwrap();
    // 100 GETs of 4 MiB without reading a byte of the replies.
    let mut greedy = Raw::validated(host.port());
    let mut burst = Vec::new();
    for _ in 0..100 {
        Request::Get { key: f("/big") }.encode(&mut burst);
    }
    greedy.send_bytes(&burst);
    thread::sleep(Duration::from_millis(200));
    let t = Instant::now();
    for i in 0..20 {
        client.set("k", format!("{i}").as_bytes()).unwrap();
        suite::synced(&client);
        assert_eq!(host.get("k").unwrap(), format!("{i}").as_bytes());
    }
    assert!(client.get("big").unwrap() == big);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
    drop(greedy);
}

#[test]
fn values_up_to_the_torch_limit_and_client_side_limits() {
    let (host, client) = server_and_client(Duration::from_secs(5));
    let max = suite::pattern(8 << 20, 3);
    client.set("max", &max).unwrap();
    assert!(host.get("max").unwrap() == max);
    let over = vec![0u8; (8 << 20) + 1];
    assert!(matches!(
        client.set("over", &over),
        Err(StoreError::Invalid(_))
    ));
    let long_key = "k".repeat(8 * 1024);
    assert!(matches!(
        client.set(&long_key, b"v"),
        Err(StoreError::Invalid(_))
    ));
    let at_limit = "k".repeat(8 * 1024 - 1);
    client.set(&at_limit, b"v").unwrap();
    assert_eq!(host.get(&at_limit).unwrap(), b"v");
    // The refused requests were never sent: the connection is fine.
    assert_eq!(client.get("max").unwrap().len(), 8 << 20);
}

#[test]
fn many_clients_at_once() {
    let server = TcpStoreServer::bind(0).unwrap();
    let port = server.port();
    thread::scope(|s| {
        for i in 0..16 {
            s.spawn(move || {
                let c = TcpStore::open(&opts(port, false, Duration::from_secs(10))).unwrap();
                for _ in 0..20 {
                    c.add("counter", 1).unwrap();
                }
                c.set(&format!("done/{i}"), b"").unwrap();
                let all: Vec<String> = (0..16).map(|j| format!("done/{j}")).collect();
                let refs: Vec<&str> = all.iter().map(String::as_str).collect();
                c.wait(&refs, Duration::from_secs(10)).unwrap();
                assert_eq!(c.get("counter").unwrap(), b"320");
            });
        }
    });
}

#[test]
fn one_store_shared_by_threads() {
    let (host, client) = server_and_client(Duration::from_secs(5));
    let client = &client;
    thread::scope(|s| {
        for i in 0..8 {
            s.spawn(move || {
                for j in 0..20 {
                    let k = format!("t{i}/{j}");
                    client.set(&k, k.as_bytes()).unwrap();
                    assert_eq!(client.get(&k).unwrap(), k.as_bytes());
                }
            });
        }
    });
    assert_eq!(host.num_keys().unwrap(), 160);
}
