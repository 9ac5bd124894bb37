//! `simple_write` as a user meets it: argument errors (clap, exit 2), and
//! on a machine that cannot run it (no GPU, no device kernels) one clear
//! message and exit 1 before any network activity.

use std::process::{Command, Output};

fn simple_write(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_simple_write"))
        .args(args)
        .output()
        .expect("running simple_write")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn help_documents_the_options() {
    let o = simple_write(&["--help"]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    for opt in [
        "--mode",
        "--size",
        "--level",
        "--iters",
        "--warmup",
        "--gpu",
        "--host",
        "--port",
        "--timeout",
        "--blocks",
        "--threads",
        "--json",
        "--floor",
        "--no-floor",
        "--hbm",
        "--slots",
        "ll:",
    ] {
        assert!(text.contains(opt), "--help lacks {opt}");
    }
}

#[test]
fn bad_arguments_exit_2_with_a_reason() {
    for (args, needle) in [
        (&["--size", "0"][..], "at least 1 byte"),
        (&["--size", "12X"][..], "suffix"),
        (&["--size=-4"][..], "byte count"),
        (&["--level", "grid"][..], "grid"),
        (&["--mode", "server"][..], "server"),
        (&["--port", "0"][..], "port"),
        (&["--timeout=-1"][..], "timeout"),
        (&["--timeout", "abc"][..], "seconds"),
        (&["--threads", "2048"][..], "threads"),
        (&["--blocks", "0"][..], "blocks"),
        (
            &["--threads", "48", "--level", "warp"][..],
            "multiple of 32",
        ),
        (
            &["--threads", "16", "--level", "block"][..],
            "multiple of 32",
        ),
        (&["--pingpong", "--blocks", "4"][..], "one block"),
        (
            &["--min-size", "1M", "--max-size", "8"][..],
            "larger than --max-size",
        ),
        (&["--size", "1G", "--level", "thread"][..], "thread level"),
        (
            &["--size", "8", "--min-size", "8"][..],
            "cannot be used with",
        ),
        (&["--step-factor", "1", "-b", "8"][..], "step-factor"),
        // The floor's bare flag is a row of --floor, not a data path.
        (&["--path", "flag"][..], "flag"),
        (&["--fence-scope", "cta"][..], "fence scope"),
        (
            &["--hbm", "--path", "store,ll"][..],
            "put and store paths only",
        ),
        (
            &["--slots", "16", "--path", "ll"][..],
            "put and store paths only",
        ),
        (
            &["--hbm", "--path", "put,ll128"][..],
            "an ll128 target finds the data by polling it",
        ),
        // One thread cannot store an LL128 line (eight lanes of a warp do).
        (
            &["--path", "ll128", "--level", "thread"][..],
            "eight lanes of one warp store",
        ),
        (&["--slots", "16", "--hbm"][..], "cannot be used with"),
    ] {
        let o = simple_write(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(needle),
            "{args:?}: stderr lacks {needle:?}: {}",
            stderr(&o)
        );
    }
}

#[test]
fn a_machine_that_cannot_run_it_says_why_and_exits_1() {
    let has_driver = nixl_examples::gpu::context::driver_present();
    let has_kernels = nixl_examples::gpu::kernels::availability().is_ok();
    if has_driver && has_kernels {
        eprintln!("SKIP cannot-run test: this machine has a GPU driver and the kernels are built");
        return;
    }
    for mode in ["initiator", "target"] {
        // A port nobody listens on: the check must fail before any network wait.
        let start = std::time::Instant::now();
        let o = simple_write(&["--mode", mode, "--port", "1", "--timeout", "60"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            start.elapsed().as_secs() < 20,
            "took {:?}: it waited on the network",
            start.elapsed()
        );
        assert!(err.contains("cannot run simple_write"), "{err}");
        if !has_driver {
            assert!(err.contains("no NVIDIA driver"), "{err}");
            assert!(
                err.contains("two_proc"),
                "the message should point at the host-API example: {err}"
            );
        }
        if !has_kernels {
            assert!(err.contains("built without the device kernels"), "{err}");
            assert!(
                err.contains("NIXL_PREFIX") || err.contains("nvcc") || err.contains("UCX"),
                "names no fix: {err}"
            );
        }
    }
}

#[test]
fn a_busy_port_is_a_usage_error_before_anything_else() {
    let busy = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = busy.local_addr().unwrap().port().to_string();
    let o = simple_write(&["--mode", "initiator", "--port", &port]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("already in use"), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("For more information, try '--help'."),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_privileged_port_is_a_usage_error_for_non_root() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc_geteuid() } == 0 {
        eprintln!("SKIP privileged-port test: running as root, which may listen on any port");
        return;
    }
    let o = simple_write(&["--mode", "initiator", "--port", "80"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("privileged"), "{}", stderr(&o));
}

unsafe extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

#[test]
fn ucx_tls_without_cuda_ipc_is_named() {
    let o = Command::new(env!("CARGO_BIN_EXE_simple_write"))
        .args(["--port", "1"])
        .env("UCX_TLS", "^cuda_ipc")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("UCX_TLS=^cuda_ipc leaves out cuda_ipc"),
        "{}",
        stderr(&o)
    );
    let o = Command::new(env!("CARGO_BIN_EXE_simple_write"))
        .args(["--port", "1"])
        .env("UCX_TLS", "tcp,cuda_copy")
        .output()
        .unwrap();
    assert!(stderr(&o).contains("leaves out cuda_ipc"), "{}", stderr(&o));
}

/// Starts `simple_write --mode initiator --check-connection` in the
/// background, stdout and stderr captured.
fn spawn_connection_initiator(port: &str, timeout: &str) -> std::process::Child {
    connection_initiator(port, timeout).spawn().unwrap()
}

/// `simple_write --mode initiator --check-connection` on `port`, not started.
fn connection_initiator(port: &str, timeout: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_simple_write"));
    c.args([
        "--mode",
        "initiator",
        "--check-connection",
        "--port",
        port,
        "--timeout",
        timeout,
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    c
}

fn free_port() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string()
}

/// The store exchange between two real processes of the real binary: the
/// initiator hosts (numWorkers=2, waitWorkers), the target joins and claims
/// its role, both wire up NIXL agents from each other's metadata.
#[test]
fn two_processes_meet_through_the_store_without_a_gpu() {
    let port = free_port();
    let init = spawn_connection_initiator(&port, "20");
    let t = simple_write(&[
        "--mode",
        "target",
        "--check-connection",
        "--port",
        &port,
        "--timeout",
        "20",
    ]);
    let i = init.wait_with_output().unwrap();
    assert!(t.status.success(), "target: {}", stderr(&t));
    assert!(i.status.success(), "initiator: {}", stderr(&i));
    assert!(String::from_utf8_lossy(&t.stdout).contains("[target] Connected to initiator"));
    assert!(String::from_utf8_lossy(&i.stdout).contains("[initiator] Connected to target"));
}

/// `--mode pair` runs this program again for each role, with the pair's
/// own arguments and then the role's: the children must take their role
/// and the pair's store (not host their own, nor recurse), and flags
/// meant for one role must not trip the other.
#[test]
fn the_pairs_children_take_their_roles_and_meet_without_a_gpu() {
    let json = std::env::temp_dir().join(format!("sw-pair-{}.json", std::process::id()));
    let o = simple_write(&[
        "-m",
        "pair",
        "--check-connection",
        "--timeout",
        "20",
        "-g",
        "3",
        "--target-gpu",
        "4",
        "-s",
        "1M",
        "--level",
        "warp",
        "--wait",
        "stream",
        "--json",
        json.to_str().unwrap(),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", stderr(&o));
    assert!(out.contains("[initiator] Connected to target"), "{out}");
    assert!(out.contains("[target] Connected to initiator"), "{out}");
}

#[test]
fn a_target_without_initiator_names_the_address_and_the_fix() {
    let port = free_port();
    let start = std::time::Instant::now();
    let o = simple_write(&[
        "--mode",
        "target",
        "--check-connection",
        "--port",
        &port,
        "--timeout",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("no initiator at 127.0.0.1:{port} after 2s")),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("--mode initiator"), "{}", stderr(&o));
    assert!(start.elapsed().as_secs() < 15);
}

#[test]
fn an_initiator_without_target_says_the_target_did_not_join() {
    let port = free_port();
    let o = simple_write(&[
        "--mode",
        "initiator",
        "--check-connection",
        "--port",
        &port,
        "--timeout",
        "2",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the target did not join the store"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn sigint_while_waiting_for_the_peer_exits_130_promptly() {
    let port = free_port();
    // A terminal's Ctrl-C: SIGINT at its default disposition. A shell that
    // starts this suite in the background without job control hands every
    // child SIGINT ignored, which the initiator would rightly keep ignoring
    // until it installs its own handler.
    let mut cmd = connection_initiator(&port, "30");
    // SAFETY: signal(2) is async-signal-safe, called between fork and exec.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        })
    };
    let mut init = cmd.spawn().unwrap();
    // Let the target join, then interrupt the initiator while it waits for
    // the target's metadata... here the target never starts, so the
    // initiator is still waiting for the join: a plain SIGINT ends it.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let start = std::time::Instant::now();
    // SAFETY: kill(2) with a pid we spawned.
    unsafe { kill(init.id() as i32, 2) };
    let status = init.wait().unwrap();
    assert!(start.elapsed().as_secs() < 5, "took {:?}", start.elapsed());
    // Before resources exist the default action (termination by SIGINT) is right.
    use std::os::unix::process::ExitStatusExt;
    assert!(
        status.signal() == Some(2) || status.code() == Some(130),
        "{status:?}"
    );
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// Once the store is up, Ctrl-C unwinds instead of killing: the initiator
/// tells the peer (ABORT key) and exits 130; SIGTERM gives 143.
#[test]
fn interrupting_a_joined_run_unwinds_tells_the_peer_and_exits_128_plus_signal() {
    use nixl_examples::store::{Store, StoreOptions, native::TcpStore};
    for (sig, code) in [(2, 130), (15, 143)] {
        let port = free_port();
        let init = spawn_connection_initiator(&port, "30");
        // Join as the second participant with the library's client, then
        // never publish target metadata: the initiator waits for it.
        let peer = TcpStore::open(&StoreOptions {
            host: "127.0.0.1".into(),
            port: port.parse().unwrap(),
            is_server: false,
            num_workers: Some(2),
            wait_workers: true,
            timeout: std::time::Duration::from_secs(10),
        })
        .unwrap();
        peer.wait(
            &["NIXL_2PROC/initiator_meta"],
            std::time::Duration::from_secs(10),
        )
        .unwrap();
        // SAFETY: kill(2) with a pid we spawned.
        unsafe { kill(init.id() as i32, sig) };
        // The initiator hosts the store, so its abort message and its exit
        // race: a peer sees the message, or the store closing, or (GET after
        // WAIT) an empty value: the key deleted in the host's cleanup between
        // the two requests.
        let abort = peer
            .wait(&["NIXL_2PROC/abort"], std::time::Duration::from_secs(5))
            .and_then(|_| peer.get("NIXL_2PROC/abort"));
        let out = init.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "signal {sig}: {err}");
        assert!(err.contains("interrupted by"), "{err}");
        match abort {
            Ok(msg) if msg.is_empty() => {}
            Ok(msg) => assert!(
                String::from_utf8_lossy(&msg).contains("interrupted"),
                "{}",
                String::from_utf8_lossy(&msg)
            ),
            Err(e) => assert!(e.to_string().contains("lost the connection"), "{e}"),
        }
    }
}
