//! Wire compatibility with the real thing, both ways:
//! - libtorch's `c10d::TCPStore` (cargo feature `libtorch`), in-process
//!   through the shim: every client/server combination runs the shared
//!   suite, the two servers give byte-identical replies to a raw script, and
//!   the two clients send byte-identical requests;
//! - Python's `torch.distributed.TCPStore` in a child process, where a full
//!   torch is importable (else the tests say SKIP and pass).

#[path = "store_suite.rs"]
mod suite;

use suite::{free_port, joining};

use std::time::Duration;

use tcpstore::Store;

/// The value each side publishes in the two-party scenario: 1.5 MiB + 3,
/// a pattern Python rebuilds with the same formula.
fn big(seed: usize) -> Vec<u8> {
    (0..(3 << 19) + 3)
        .map(|i| ((i * 131 + seed) % 256) as u8)
        .collect()
}

fn seed_of(name: &str) -> usize {
    if name == "py" { 7 } else { 11 }
}

/// One side of the two-party scenario; `PY_PEER` below is the other side,
/// line for line. Both must run it at once. Parties are named "py" and "rs"
/// whoever implements them; "py" sets first in the wait steps.
fn peer_scenario(store: &dyn Store, me: &str, other: &str) {
    use std::time::Instant;
    let k = |owner: &str, name: &str| format!("{owner}/{name}");
    // Large values both ways.
    store.set(&k(me, "big"), &big(seed_of(me))).unwrap();
    assert!(
        store.get(&k(other, "big")).unwrap() == big(seed_of(other)),
        "{other}'s big value arrived corrupted"
    );
    // A wait that succeeds: each side sets a key while the other waits.
    for setter in ["py", "rs"] {
        let key = k(setter, "late");
        if me == setter {
            std::thread::sleep(Duration::from_millis(300));
            store.set(&key, b"late").unwrap();
        } else {
            store.wait(&[&key], Duration::from_secs(10)).unwrap();
            assert_eq!(store.get(&key).unwrap(), b"late");
        }
    }
    // A wait that times out.
    let t = Instant::now();
    let err = store
        .wait(&[&k(me, "never")], Duration::from_millis(200))
        .unwrap_err();
    assert!(
        matches!(err, tcpstore::StoreError::Timeout { .. }),
        "{err:?}"
    );
    assert!(t.elapsed() >= Duration::from_millis(150) && t.elapsed() < Duration::from_secs(5));
    // add, seen from the other side as decimal ASCII.
    assert_eq!(store.add(&k(me, "ctr"), 5).unwrap(), 5);
    assert_eq!(store.add(&k(me, "ctr"), -2).unwrap(), 3);
    store.add("shared/ctr", 1).unwrap();
    store.set(&k(me, "added"), b"1").unwrap();
    store
        .wait(&[&k(other, "added")], Duration::from_secs(10))
        .unwrap();
    assert_eq!(store.get(&k(other, "ctr")).unwrap(), b"3");
    // check.
    assert!(store.check(&[&k(me, "big"), &k(other, "big")]).unwrap());
    assert!(!store.check(&[&k(me, "nope")]).unwrap());
    // compare_set.
    assert_eq!(store.compare_set(&k(me, "cas"), b"", b"v1").unwrap(), b"v1");
    assert_eq!(
        store.compare_set(&k(me, "cas"), b"v1", b"v2").unwrap(),
        b"v2"
    );
    assert_eq!(
        store.compare_set(&k(me, "cas"), b"zz", b"v3").unwrap(),
        b"v2"
    );
    // delete, seen from the other side.
    assert!(store.delete_key(&k(me, "late")).unwrap());
    assert!(!store.delete_key(&k(me, "late")).unwrap());
    store.set(&k(me, "deleted"), b"1").unwrap();
    store
        .wait(&[&k(other, "deleted")], Duration::from_secs(10))
        .unwrap();
    assert!(!store.check(&[&k(other, "late")]).unwrap());
    assert_eq!(store.get(&k(other, "cas")).unwrap(), b"v2");
    // Done: neither side leaves before the other has finished.
    store.set(&k(me, "done"), b"1").unwrap();
    store
        .wait(&[&k(other, "done")], Duration::from_secs(10))
        .unwrap();
    assert_eq!(store.get("shared/ctr").unwrap(), b"2");
    // The last word: a side that hosts the server waits for it before it
    // exits, so the other side's last read never meets a closed server.
    store.set(&k(me, "bye"), b"1").unwrap();
}

#[cfg(feature = "libtorch")]
mod libtorch {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpStream};
    use std::sync::{Arc, Mutex};
    use std::thread;
    use std::time::{Duration, Instant};

    use tcpstore::libtorch::TorchStore;
    use tcpstore::native::{TcpStore, TcpStoreServer};
    use tcpstore::{Store, StoreError};

    use super::suite::opts;
    use super::{free_port, joining, peer_scenario, suite};

    const SUITE_TIMEOUT: Duration = Duration::from_millis(500);

    #[test]
    fn libtorch_alone_passes_the_suite() {
        // The baseline: proves the suite asserts torch's own behaviour.
        let host = TorchStore::open(&opts(0, true, SUITE_TIMEOUT)).unwrap();
        let client = TorchStore::open(&opts(host.port(), false, SUITE_TIMEOUT)).unwrap();
        suite::run_all("torch-torch", &host, &client);
    }

    #[test]
    fn native_clients_against_libtorch_server() {
        let host = TorchStore::open(&opts(0, true, SUITE_TIMEOUT)).unwrap();
        let a = TcpStore::open(&opts(host.port(), false, SUITE_TIMEOUT)).unwrap();
        let b = TcpStore::open(&opts(host.port(), false, SUITE_TIMEOUT)).unwrap();
        suite::run_all("native-clients@torch", &a, &b);
        // The torch side sees what the native clients stored.
        assert_eq!(host.get("native-clients@torch/add/ctr").unwrap(), b"-7");
    }

    #[test]
    fn libtorch_clients_against_native_server() {
        let server = TcpStoreServer::bind(0).unwrap();
        let a = TorchStore::open(&opts(server.port(), false, SUITE_TIMEOUT)).unwrap();
        let b = TorchStore::open(&opts(server.port(), false, SUITE_TIMEOUT)).unwrap();
        suite::run_all("torch-clients@native", &a, &b);
    }

    #[test]
    fn mixed_clients_against_either_server() {
        let server = TcpStoreServer::bind(0).unwrap();
        let native = TcpStore::open(&opts(server.port(), false, SUITE_TIMEOUT)).unwrap();
        let torch = TorchStore::open(&opts(server.port(), false, SUITE_TIMEOUT)).unwrap();
        suite::run_all("torch+native@native", &torch, &native);
        let host = TorchStore::open(&opts(0, true, SUITE_TIMEOUT)).unwrap();
        let native = TcpStore::open(&opts(host.port(), false, SUITE_TIMEOUT)).unwrap();
        suite::run_all("native+torch@torch", &native, &host);
    }

    #[test]
    fn servers_reply_byte_for_byte_alike() {
        let torch = TorchStore::open(&opts(0, true, Duration::from_secs(5))).unwrap();
        let native = TcpStoreServer::bind(0).unwrap();
        let (want, got) = thread::scope(|s| {
            let want = s.spawn(|| suite::raw_transcript(torch.port()));
            let got = s.spawn(|| suite::raw_transcript(native.port()));
            (want.join().unwrap(), got.join().unwrap())
        });
        assert_eq!(want.len(), got.len());
        for ((step, torch_reply), (_, native_reply)) in want.iter().zip(&got) {
            assert_eq!(
                native_reply, torch_reply,
                "step {step}: native server differs from torch's"
            );
        }
    }

    #[test]
    fn servers_drop_bad_clients_alike() {
        let torch = TorchStore::open(&opts(0, true, Duration::from_secs(5))).unwrap();
        let native = TcpStoreServer::bind(0).unwrap();
        let (want, got) = thread::scope(|s| {
            let want = s.spawn(|| suite::raw_violations(torch.port()));
            let got = s.spawn(|| suite::raw_violations(native.port()));
            (want.join().unwrap(), got.join().unwrap())
        });
        for ((case, torch_closed), (_, native_closed)) in want.iter().zip(&got) {
            assert_eq!(
                native_closed, torch_closed,
                "{case}: torch closed={torch_closed}, native closed={native_closed}"
            );
        }
        // Both servers still serve after all that.
        let check = TorchStore::open(&opts(native.port(), false, Duration::from_secs(2))).unwrap();
        check.set("k", b"v").unwrap();
        assert_eq!(
            TcpStore::open(&opts(torch.port(), false, Duration::from_secs(2)))
                .unwrap()
                .get("t")
                .unwrap(),
            b"abc"
        );
    }

    /// Runs `script` against a native server through a proxy and returns
    /// every byte the client sent.
    fn record_client(script: impl FnOnce(u16)) -> Vec<u8> {
        let server = TcpStoreServer::bind(0).unwrap();
        let proxy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy_port = proxy.local_addr().unwrap().port();
        let upstream_port = server.port();
        let recorded = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&recorded);
        let relay = thread::spawn(move || {
            let (mut client, _) = proxy.accept().unwrap();
            let mut upstream = TcpStream::connect(("127.0.0.1", upstream_port)).unwrap();
            let (mut client_rx, mut upstream_tx) =
                (client.try_clone().unwrap(), upstream.try_clone().unwrap());
            let back = thread::spawn(move || {
                let _ = std::io::copy(&mut upstream, &mut client);
                let _ = client.shutdown(Shutdown::Both);
            });
            let mut buf = [0u8; 65536];
            loop {
                match client_rx.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        log.lock().unwrap().extend_from_slice(&buf[..n]);
                        if upstream_tx.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = upstream_tx.shutdown(Shutdown::Both);
            back.join().unwrap();
        });
        script(proxy_port);
        relay.join().unwrap();
        recorded.lock().unwrap().clone()
    }

    fn client_script(store: &dyn Store) {
        store.set("a", b"1").unwrap();
        store.get("a").unwrap();
        store.add("n", 3).unwrap();
        store.add("n", -1).unwrap();
        store.check(&["a", "n"]).unwrap();
        store.check(&["zz"]).unwrap();
        store.wait(&["a"], Duration::from_secs(1)).unwrap();
        assert!(
            store
                .wait(&["never", "a"], Duration::from_millis(100))
                .is_err()
        );
        store.compare_set("c", b"", b"x").unwrap();
        store.compare_set("c", b"x", b"y").unwrap();
        store.multi_get(&["a", "c"]).unwrap();
        store.delete_key("a").unwrap();
        store.num_keys().unwrap();
        // Over torch's 1440-byte send watermark: same bytes, however split.
        store.set("big", &suite::pattern(5000, 9)).unwrap();
        store.get("big").unwrap();
    }

    #[test]
    fn clients_send_byte_for_byte_alike() {
        let torch = record_client(|port| {
            client_script(&TorchStore::open(&opts(port, false, Duration::from_secs(5))).unwrap())
        });
        let native = record_client(|port| {
            client_script(&TcpStore::open(&opts(port, false, Duration::from_secs(5))).unwrap())
        });
        // VALIDATE then PING with the pid (same process, same nonce) first.
        assert_eq!(&torch[..5], [0, 0xCE, 0xF7, 0x85, 0x3C]);
        assert_eq!(torch[5], 13);
        assert_eq!(&torch[6..10], std::process::id().to_le_bytes());
        assert_eq!(
            native.len(),
            torch.len(),
            "request streams differ in length"
        );
        if let Some(at) = native.iter().zip(&torch).position(|(n, t)| n != t) {
            panic!(
                "request streams differ at byte {at}: native {:?} vs torch {:?}",
                &native[at..],
                &torch[at..]
            );
        }
    }

    #[test]
    fn libtorch_client_joins_native_server() {
        let port = free_port();
        let host =
            thread::spawn(move || TcpStore::open(&joining(port, true, Duration::from_secs(10))));
        thread::sleep(Duration::from_millis(100));
        let peer = TorchStore::open(&joining(port, false, Duration::from_secs(10))).unwrap();
        let host = host.join().unwrap().unwrap();
        assert_eq!(host.num_keys().unwrap(), 1, "only torch's init/ counter");
        peer.set("from-torch", &suite::pattern(2 << 20, 5)).unwrap();
        assert!(host.get("from-torch").unwrap() == suite::pattern(2 << 20, 5));
        host.set("from-native", b"hi").unwrap();
        assert_eq!(peer.get("from-native").unwrap(), b"hi");
    }

    #[test]
    fn native_client_joins_libtorch_server() {
        let port = free_port();
        let host =
            thread::spawn(move || TorchStore::open(&joining(port, true, Duration::from_secs(10))));
        thread::sleep(Duration::from_millis(100));
        let peer = TcpStore::open(&joining(port, false, Duration::from_secs(10))).unwrap();
        let host = host.join().unwrap().unwrap();
        assert_eq!(peer.num_keys().unwrap(), 1, "only torch's init/ counter");
        thread::scope(|s| {
            let host = &host;
            s.spawn(move || peer_scenario(host, "py", "rs"));
            peer_scenario(&peer, "rs", "py");
        });
    }

    #[test]
    fn libtorch_join_without_peer_is_workers_timeout() {
        let t = Instant::now();
        let err = TorchStore::open(&joining(0, true, Duration::from_millis(300)))
            .err()
            .expect("no peer");
        assert!(
            matches!(
                err,
                StoreError::WorkersTimeout {
                    joined: 1,
                    expected: 2,
                    ..
                }
            ),
            "{err:?}"
        );
        // torch counts elapsed time in whole seconds, so 300 ms means ~1 s.
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "took {:?}",
            t.elapsed()
        );
    }

    #[test]
    fn libtorch_errors_map_to_store_errors() {
        let taken = TcpStoreServer::bind(0).unwrap();
        let err = TorchStore::open(&opts(taken.port(), true, Duration::from_secs(1)))
            .err()
            .expect("port taken");
        assert!(
            matches!(&err, StoreError::Bind { source, .. } if source.kind() == std::io::ErrorKind::AddrInUse),
            "{err:?}"
        );

        let port = free_port();
        let t = Instant::now();
        let err = TorchStore::open(&opts(port, false, Duration::from_millis(300)))
            .err()
            .expect("nobody listens");
        assert!(matches!(err, StoreError::Unreachable { .. }), "{err:?}");
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "took {:?}",
            t.elapsed()
        );

        let client = TorchStore::open(&opts(taken.port(), false, Duration::from_secs(1))).unwrap();
        client.set("text", b"abc").unwrap();
        // The server drops a client that adds to text; torch's client sees EOF.
        assert!(matches!(client.add("text", 1), Err(StoreError::Io(_))));
    }

    #[test]
    fn server_gone_while_waiting_is_an_error_on_both_sides() {
        // torch client, native server dropped.
        let server = TcpStoreServer::bind(0).unwrap();
        let client =
            TorchStore::open(&opts(server.port(), false, Duration::from_secs(30))).unwrap();
        thread::scope(|s| {
            let waiter = s.spawn(|| client.wait(&["never"], Duration::from_secs(30)));
            thread::sleep(Duration::from_millis(200));
            drop(server);
            let res = waiter.join().unwrap();
            assert!(matches!(res, Err(StoreError::Io(_))), "{res:?}");
        });
        // native client, torch server dropped.
        let host = TorchStore::open(&opts(0, true, Duration::from_secs(30))).unwrap();
        let client = TcpStore::open(&opts(host.port(), false, Duration::from_secs(30))).unwrap();
        let t = Instant::now();
        thread::scope(|s| {
            let waiter = s.spawn(|| client.wait(&["never"], Duration::from_secs(30)));
            thread::sleep(Duration::from_millis(200));
            drop(host);
            let res = waiter.join().unwrap();
            assert!(matches!(res, Err(StoreError::Io(_))), "{res:?}");
        });
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}

/// Python's `torch.distributed.TCPStore` in a child process.
mod python {
    use std::io::Read;
    use std::path::PathBuf;
    use std::process::{Child, Command, ExitStatus, Stdio};
    use std::thread::{self, JoinHandle};
    use std::time::{Duration, Instant};

    use tcpstore::native::TcpStore;

    use super::{free_port, joining, peer_scenario};

    /// The other side of `peer_scenario`, for Python's TCPStore.
    const PY_PEER: &str = r#"
import datetime, sys, time, traceback
import torch.distributed as dist

def big(seed):
    n = (3 << 19) + 3
    return bytes((i * 131 + seed) % 256 for i in range(n))

def seed_of(name):
    return 7 if name == "py" else 11

def expect(cond, what):
    if not cond:
        raise AssertionError(what)

def scenario(store, me, other):
    k = lambda owner, name: f"{owner}/{name}"
    secs = lambda s: datetime.timedelta(seconds=s)
    store.set(k(me, "big"), big(seed_of(me)))
    expect(store.get(k(other, "big")) == big(seed_of(other)), f"{other}'s big value arrived corrupted")
    for setter in ("py", "rs"):
        key = k(setter, "late")
        if me == setter:
            time.sleep(0.3)
            store.set(key, b"late")
        else:
            store.wait([key], secs(10))
            expect(store.get(key) == b"late", "late value")
    t0 = time.monotonic()
    try:
        store.wait([k(me, "never")], datetime.timedelta(milliseconds=200))
        raise AssertionError("wait for a missing key did not time out")
    except AssertionError:
        raise
    except Exception as e:
        expect("timeout" in str(e).lower(), f"unexpected wait error: {e!r}")
    elapsed = time.monotonic() - t0
    expect(0.15 <= elapsed < 5, f"wait timeout took {elapsed:.3f}s")
    expect(store.add(k(me, "ctr"), 5) == 5, "add new")
    expect(store.add(k(me, "ctr"), -2) == 3, "add more")
    store.add("shared/ctr", 1)
    store.set(k(me, "added"), b"1")
    store.wait([k(other, "added")], secs(10))
    expect(store.get(k(other, "ctr")) == b"3", "other's counter as decimal ASCII")
    expect(store.check([k(me, "big"), k(other, "big")]), "check present")
    expect(not store.check([k(me, "nope")]), "check missing")
    expect(store.compare_set(k(me, "cas"), b"", b"v1") == b"v1", "cas create")
    expect(store.compare_set(k(me, "cas"), b"v1", b"v2") == b"v2", "cas swap")
    expect(store.compare_set(k(me, "cas"), b"zz", b"v3") == b"v2", "cas mismatch")
    expect(store.delete_key(k(me, "late")), "delete")
    expect(not store.delete_key(k(me, "late")), "delete again")
    store.set(k(me, "deleted"), b"1")
    store.wait([k(other, "deleted")], secs(10))
    expect(not store.check([k(other, "late")]), "other's key deleted")
    expect(store.get(k(other, "cas")) == b"v2", "other's cas")
    store.set(k(me, "done"), b"1")
    store.wait([k(other, "done")], secs(10))
    expect(store.get("shared/ctr") == b"2", "shared counter")
    store.set(k(me, "bye"), b"1")

def main():
    role, port, me, other = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    store = dist.TCPStore("127.0.0.1", port, world_size=2, is_master=(role == "server"),
                          timeout=datetime.timedelta(seconds=30), wait_for_workers=True)
    print("JOINED", flush=True)
    scenario(store, me, other)
    if role == "server":
        # Hosting the store: stay until the client's last read is done.
        store.wait([f"{other}/bye"], datetime.timedelta(seconds=10))
    print("PY OK", flush=True)

try:
    main()
except BaseException:
    traceback.print_exc()
    sys.exit(1)
"#;

    fn python() -> PathBuf {
        if let Some(p) = std::env::var_os("PYTHON") {
            return PathBuf::from(p);
        }
        // The workspace's venv (this crate is crates/tcpstore).
        let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
        if venv.exists() {
            venv
        } else {
            PathBuf::from("python3")
        }
    }

    /// The interpreter, if it can import torch.distributed.TCPStore;
    /// otherwise prints the SKIP line and returns None.
    fn torch_python() -> Option<PathBuf> {
        let py = python();
        let ok = Command::new(&py)
            .args(["-c", "import torch.distributed as d; d.TCPStore"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!(
                "SKIP python-torch interop: torch.distributed not importable in {} (run scripts/setup.sh --full-torch)",
                py.display()
            );
        }
        ok.then_some(py)
    }

    /// A running Python peer; killed if the test fails before it exits.
    struct PyPeer {
        child: Child,
        stdout: Option<JoinHandle<String>>,
        stderr: Option<JoinHandle<String>>,
    }

    impl PyPeer {
        fn start(py: &PathBuf, role: &str, port: u16) -> PyPeer {
            let mut child = Command::new(py)
                .args(["-c", PY_PEER, role, &port.to_string(), "py", "rs"])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start python");
            let collect = |mut r: Box<dyn Read + Send>| {
                thread::spawn(move || {
                    let mut s = String::new();
                    let _ = r.read_to_string(&mut s);
                    s
                })
            };
            let stdout = Some(collect(Box::new(child.stdout.take().unwrap())));
            let stderr = Some(collect(Box::new(child.stderr.take().unwrap())));
            PyPeer {
                child,
                stdout,
                stderr,
            }
        }

        /// Waits up to `limit` for the peer to exit; its status and output.
        fn finish(mut self, limit: Duration) -> (ExitStatus, String, String) {
            let deadline = Instant::now() + limit;
            let status = loop {
                if let Some(status) = self.child.try_wait().unwrap() {
                    break status;
                }
                assert!(
                    Instant::now() < deadline,
                    "python peer still running after {limit:?}"
                );
                thread::sleep(Duration::from_millis(20));
            };
            let out = self.stdout.take().unwrap().join().unwrap();
            let err = self.stderr.take().unwrap().join().unwrap();
            (status, out, err)
        }
    }

    impl Drop for PyPeer {
        fn drop(&mut self) {
            if self.child.try_wait().ok().flatten().is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }

    fn assert_ok(peer: PyPeer) {
        let (status, out, err) = peer.finish(Duration::from_secs(60));
        assert!(
            status.success() && out.contains("PY OK"),
            "python peer failed ({status}):\n{out}\n{err}"
        );
    }

    #[test]
    fn python_server_native_client() {
        let Some(py) = torch_python() else { return };
        let port = free_port();
        let peer = PyPeer::start(&py, "server", port);
        // Generous: the Python side first imports torch.
        let store = TcpStore::open(&joining(port, false, Duration::from_secs(60))).unwrap();
        peer_scenario(&store, "rs", "py");
        assert_ok(peer);
    }

    #[test]
    fn python_client_native_server() {
        let Some(py) = torch_python() else { return };
        let port = free_port();
        let peer = PyPeer::start(&py, "client", port);
        let store = TcpStore::open(&joining(port, true, Duration::from_secs(60))).unwrap();
        peer_scenario(&store, "rs", "py");
        assert_ok(peer);
    }
}
