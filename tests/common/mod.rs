//! Helpers shared by the example tests: finding and running the example
//! binaries, free ports, a store server, and a real etcd server of our own.

// Each test file uses a different subset of these helpers.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nixl_examples::exchange::etcd::Etcd;
use nixl_examples::store::StoreOptions;
use nixl_examples::store::native::TcpStore;

/// The built example `name` (cargo builds examples before integration tests).
pub fn example(name: &str) -> PathBuf {
    // Integration tests live in target/<profile>/deps; examples one level up.
    let mut p = std::env::current_exe().unwrap();
    p.pop();
    p.pop();
    p.push("examples");
    p.push(name);
    assert!(
        p.exists(),
        "{} not built (run `cargo build --features libtorch --examples` first)",
        p.display()
    );
    p
}

/// Runs example `name` with `args` to completion.
pub fn run(name: &str, args: &[&str]) -> Output {
    Command::new(example(name))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {name}: {e}"))
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Both streams, for assertion messages.
pub fn both(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        stdout(o),
        stderr(o)
    )
}

/// A TCP port held closed for as long as this lives: bound by a socket
/// that never listens, so a connect is refused, and no other socket (a
/// server another test starts on port 0) can be handed it meanwhile. A
/// port from [`free_port`] is free only when asked; a test that needs
/// nobody there for seconds holds one of these.
pub struct ClosedPort {
    fd: libc::c_int,
    pub port: u16,
}

impl ClosedPort {
    pub fn new() -> Self {
        // SAFETY: plain socket calls on a descriptor this struct owns; the
        // sockaddr is a zeroed sockaddr_in of the size passed.
        unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
            let mut addr: libc::sockaddr_in = std::mem::zeroed();
            addr.sin_family = libc::AF_INET as libc::sa_family_t;
            addr.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            let at = &mut addr as *mut libc::sockaddr_in as *mut libc::sockaddr;
            assert_eq!(
                libc::bind(fd, at, len),
                0,
                "bind: {}",
                std::io::Error::last_os_error()
            );
            let mut got = len;
            assert_eq!(
                libc::getsockname(fd, at, &mut got),
                0,
                "getsockname: {}",
                std::io::Error::last_os_error()
            );
            Self {
                fd,
                port: u16::from_be(addr.sin_port),
            }
        }
    }
}

impl Drop for ClosedPort {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.fd) };
    }
}

/// A TCP port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Our TCPStore server, for tests that start the roles by hand.
pub fn store_server() -> TcpStore {
    TcpStore::open(&StoreOptions {
        host: "127.0.0.1".into(),
        port: 0,
        is_server: true,
        num_workers: None,
        wait_workers: false,
        timeout: Duration::from_secs(10),
    })
    .expect("starting a TCPStore server")
}

/// A child process killed (and reaped) when dropped, so a failing test
/// leaves nothing running.
pub struct Reaped(Option<Child>);

impl Reaped {
    /// Takes charge of `child`: killed and reaped when dropped.
    pub fn new(child: Child) -> Self {
        Self(Some(child))
    }

    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().unwrap()
    }

    /// Waits for the process to exit, at most `limit` (then kills it and
    /// panics), collecting its output meanwhile so it never blocks on a
    /// full pipe.
    pub fn wait_output(mut self, limit: Duration) -> Output {
        let mut c = self.0.take().unwrap();
        let read = |mut r: Box<dyn std::io::Read + Send>| {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = r.read_to_end(&mut v);
                v
            })
        };
        let out = c.stdout.take().map(|s| read(Box::new(s)));
        let err = c.stderr.take().map(|s| read(Box::new(s)));
        let start = Instant::now();
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > limit {
                let _ = c.kill();
                let _ = c.wait();
                panic!("process still running after {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let join = |h: Option<std::thread::JoinHandle<Vec<u8>>>| {
            h.map(|h| h.join().unwrap()).unwrap_or_default()
        };
        Output {
            status,
            stdout: join(out),
            stderr: join(err),
        }
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Spawns example `name` with `args`, output captured.
pub fn spawn(name: &str, args: &[&str]) -> Reaped {
    Reaped(Some(
        Command::new(example(name))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {name}: {e}")),
    ))
}

/// A real etcd server on loopback, on free ports, with a fresh data
/// directory; killed and its directory removed when dropped.
pub struct EtcdServer {
    child: Child,
    dir: PathBuf,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
}

impl EtcdServer {
    /// Starts `etcd` (`ETCD_BIN`, else `etcd` on PATH, else /usr/bin/etcd)
    /// and waits until it answers. Panics with the fix when etcd is missing.
    pub fn start() -> Self {
        let bin = std::env::var("ETCD_BIN").unwrap_or_else(|_| {
            if Command::new("etcd").arg("--version").output().is_ok() {
                "etcd".into()
            } else {
                "/usr/bin/etcd".into()
            }
        });
        let mut last = String::new();
        // The free ports may be taken between choosing and binding: retry.
        for attempt in 0..3 {
            let (client, peer) = (free_port(), free_port());
            let dir = std::env::temp_dir().join(format!(
                "nixl-examples-etcd-{}-{client}-{attempt}",
                std::process::id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
            let endpoint = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let child = Command::new(&bin)
                .args(["--name", "test", "--data-dir"])
                .arg(dir.join("data"))
                .args(["--listen-client-urls", &endpoint, "--advertise-client-urls", &endpoint])
                .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("test={peer_url}"), "--log-level", "error"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {bin}: {e}. Install etcd-server (scripts/setup.sh does) or set ETCD_BIN"));
            let mut server = Self {
                child,
                dir,
                endpoint,
            };
            let client = Etcd::from_endpoints(&server.endpoint, Duration::from_secs(1)).unwrap();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(15) {
                if client.version().is_ok() {
                    return server;
                }
                if let Ok(Some(_)) = server.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            last = std::fs::read_to_string(server.dir.join("etcd.log")).unwrap_or_default();
            let _ = server.child.kill();
        }
        panic!("etcd did not come up:\n{last}");
    }

    pub fn client(&self) -> Etcd {
        Etcd::from_endpoints(&self.endpoint, Duration::from_secs(5)).unwrap()
    }

    /// Every key under `/nixl/` (where NIXL keeps agent metadata).
    pub fn nixl_keys(&self) -> Vec<String> {
        self.client().keys_with_prefix("/nixl/").unwrap()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A program whose stdout and stderr lines arrive on a channel as they are
/// written (a launcher's ranks share its pipes); killed when dropped.
pub struct Streamed {
    child: Option<Child>,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Streamed {
    pub fn start(mut command: Command) -> Self {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the program");
        let (tx, lines) = std::sync::mpsc::channel();
        let pipes: [Box<dyn std::io::Read + Send>; 2] = [
            Box::new(child.stdout.take().unwrap()),
            Box::new(child.stderr.take().unwrap()),
        ];
        for pipe in pipes {
            let tx = tx.clone();
            std::thread::spawn(move || {
                use std::io::BufRead;
                for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        Self {
            child: Some(child),
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (at most `limit`) until `n` lines satisfy `pred`; returns the last.
    pub fn until(&mut self, n: usize, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        let mut found = Vec::new();
        for l in self.seen.iter().filter(|l| pred(l)) {
            found.push(l.clone());
        }
        while found.len() < n {
            let left = limit.saturating_sub(start.elapsed());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if pred(&l) {
                        found.push(l.clone());
                    }
                    self.seen.push(l);
                }
                Err(_) => panic!(
                    "only {} of {n} lines after {limit:?}:\n{}",
                    found.len(),
                    self.seen.join("\n")
                ),
            }
        }
        found.pop().unwrap()
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// Waits (at most `limit`) for the launcher's exit; every line it and
    /// the ranks wrote.
    pub fn finish(mut self, limit: Duration) -> (Option<i32>, String) {
        let mut c = self.child.take().unwrap();
        let start = Instant::now();
        let status = loop {
            if let Some(s) = c.try_wait().unwrap() {
                break s;
            }
            assert!(
                start.elapsed() < limit,
                "the launcher still runs after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push(l);
        }
        (status.code(), self.seen.join("\n"))
    }
}

impl Drop for Streamed {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `cmd` with `args` must exit 2 (a usage error) and say `needle` on
/// stderr.
pub fn usage_error(mut cmd: Command, args: &[&str], needle: &str) {
    let o = cmd.args(args).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{args:?}: {}", both(&o));
    assert!(
        stderr(&o).contains(needle),
        "{args:?} does not say '{needle}': {}",
        both(&o)
    );
}

/// An N-rank program started as a torchrun rank whose WORLD_SIZE (2)
/// disagrees with its `--ranks 3` must refuse with exit 2.
pub fn refuses_a_world_that_disagrees(mut cmd: Command) {
    let o = cmd
        .args(["--ranks", "3"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env("MASTER_PORT", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", both(&o));
}

/// `--ranks N --check-connection` succeeded and every rank said it reached
/// the other N - 1.
pub fn assert_all_connected(o: &Output, ranks: u32) {
    assert!(o.status.success(), "{}", both(o));
    let out = stdout(o);
    for r in 0..ranks {
        let line = format!("[rank {r}] connected to all {} other rank(s)", ranks - 1);
        assert!(out.contains(&line), "rank {r}: {}", both(o));
    }
}

/// `bin` as a launcher: none of torchrun's variables (nor `ep`'s
/// incarnation) inherited from the test's environment, which would make it
/// a rank.
pub fn launcher(bin: &str) -> Command {
    let mut c = Command::new(bin);
    for v in [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_USE_AGENT_STORE",
        "NIXL_EP_INCARNATION",
    ] {
        c.env_remove(v);
    }
    c
}

/// Starts `launcher` (a program's launcher running 4 ranks), waits until
/// it started rank `victim` and all 4 ranks connected, then `delay` later
/// sends `victim` signal `sig` by pid; returns the run's exit status and
/// every line (at most `limit` for the run).
pub fn kill_rank_once_connected(
    launcher: Command,
    victim: u32,
    sig: i32,
    delay: Duration,
    limit: Duration,
) -> (Option<i32>, String) {
    let tag = launcher
        .get_program()
        .to_string_lossy()
        .rsplit('/')
        .next()
        .unwrap()
        .to_string();
    let mut run = Streamed::start(launcher);
    let started = format!("[{tag}] started rank {victim} (pid ");
    let line = run.until(1, Duration::from_secs(120), |l| l.starts_with(&started));
    let pid: i32 = line[started.len()..].trim_end_matches(')').parse().unwrap();
    run.until(4, Duration::from_secs(120), |l| {
        l.contains("] connected to all 3 other")
    });
    std::thread::sleep(delay);
    // SAFETY: kill(2) on a rank process of the launcher we started.
    unsafe { kill(pid, sig) };
    run.finish(limit)
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}
