//! `ep` as users meet it without a GPU: argument errors (exit 2), and the
//! connection check — three ranks meet through the store and wire up their
//! NIXL agents (the real library, over UCX) — started by `ep --ranks 3`, by
//! hand with torchrun's variables, and against a store the test hosts as
//! torchrun's agent would; plus a rank that dies mid-run.

mod common;

use common::both as text;

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn ep() -> Command {
    // The test's own environment must not make the launcher a rank.
    common::launcher(env!("CARGO_BIN_EXE_ep"))
}

/// A child killed and reaped when dropped, so a failing test leaves nothing.
struct Rank(Option<Child>);

impl Rank {
    fn pid(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    /// Reads stdout until a line starts with `prefix`, then drains the rest
    /// in the background (so the pipe never fills).
    fn wait_for_line(&mut self, prefix: &str) {
        use std::io::BufRead;
        let out = self.0.as_mut().unwrap().stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(out).lines();
        let mut seen = Vec::new();
        while let Some(Ok(line)) = lines.next() {
            if line.starts_with(prefix) {
                std::thread::spawn(move || lines.for_each(drop));
                return;
            }
            seen.push(line);
        }
        panic!("never printed {prefix:?}:\n{}", seen.join("\n"));
    }

    /// Waits at most `limit` (then kills it and panics), reading its output.
    fn output(mut self, limit: Duration) -> Output {
        common::Reaped::new(self.0.take().unwrap()).wait_output(limit)
    }
}

impl Drop for Rank {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts rank `r` of `n` by hand, with torchrun's variables.
fn spawn_rank(r: u32, n: u32, port: u16, agent_store: bool, extra: &[&str]) -> Rank {
    spawn_rank_within(r, n, port, agent_store, extra, 20)
}

/// [`spawn_rank`] with `--timeout timeout_s`.
fn spawn_rank_within(
    r: u32,
    n: u32,
    port: u16,
    agent_store: bool,
    extra: &[&str],
    timeout_s: u64,
) -> Rank {
    let mut c = ep();
    c.args(["--check-connection", "--timeout", &timeout_s.to_string()])
        .args(extra)
        .env("RANK", r.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("LOCAL_RANK", r.to_string())
        .env("LOCAL_WORLD_SIZE", n.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("UCX_POSIX_USE_PROC_LINK", "n")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if agent_store {
        c.env("TORCHELASTIC_USE_AGENT_STORE", "True")
            .env("TORCHELASTIC_RESTART_COUNT", "0");
    }
    Rank(Some(c.spawn().expect("starting ep")))
}

fn assert_all_connected(stdout: &str, ranks: u32) {
    for r in 0..ranks {
        for s in (0..ranks).filter(|&s| s != r) {
            assert!(
                stdout.contains(&format!("[rank {r}] connected to rank {s} (ep-rank-{s}.0)")),
                "rank {r} did not connect to {s}:\n{stdout}"
            );
        }
        assert!(
            stdout.contains(&format!(
                "[rank {r}] connected to all {} other rank(s)",
                ranks - 1
            )),
            "{stdout}"
        );
    }
}

#[test]
fn help_documents_the_options() {
    let o = ep().arg("--help").output().unwrap();
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for opt in [
        "--mode",
        "--tokens",
        "--hidden",
        "--topk",
        "--experts",
        "--routing",
        "--path",
        "--iters",
        "--warmup",
        "--timeout",
        "--seed",
        "--ranks",
        "--gpus",
        "--check-connection",
        "--json",
        "--csv",
        "--no-baseline",
        "--plan",
        "--capacity",
        "--kill-signal",
        "--fault-timeout",
        "[[0,1],[0,1,2,3],[0,1,-2,3],[0,3]]",
        "torchrun",
        "TORCHELASTIC_USE_AGENT_STORE",
    ] {
        assert!(help.contains(opt), "--help lacks {opt}");
    }
}

#[test]
fn bad_shapes_and_arguments_exit_2_before_any_network_or_gpu_work() {
    for (args, needle) in [
        (&["--experts", "255"][..], "not divisible by the 2 ranks"),
        (&["--ranks", "3"][..], "not divisible by the 3 ranks"),
        (&["--topk", "300"][..], "distinct experts"),
        (&["--topk", "0"][..], "between 1"),
        (&["--tokens", "0"][..], "--tokens 0"),
        (&["--hidden", "7004"][..], "multiple of 8"),
        (&["--hidden", "0"][..], "multiple of 8"),
        (&["--mode", "fast"][..], "fast"),
        (&["--path", "rdma"][..], "rdma"),
        (&["--iters", "0"][..], "iters"),
        (&["--ranks", "0"][..], "ranks"),
        (&["--timeout=-1"][..], "timeout"),
        (&["--inject", "explode"][..], "--inject"),
        (&["--iters", "2000000", "--tokens", "4096"][..], "31 bits"),
    ] {
        let start = Instant::now();
        let o = ep().args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(needle),
            "{args:?} lacks {needle:?}: {}",
            text(&o)
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{args:?} took {:?}",
            start.elapsed()
        );
    }
    // Under torchrun's variables too, and --ranks must agree with WORLD_SIZE.
    let o = ep()
        .args(["--ranks", "3"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "2")
        .env("MASTER_PORT", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("WORLD_SIZE=2"),
        "{}",
        text(&o)
    );
    let o = ep()
        .env("RANK", "5")
        .env("WORLD_SIZE", "2")
        .env("MASTER_PORT", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

/// A plan file for one test, removed when dropped.
struct PlanFile(std::path::PathBuf);

impl PlanFile {
    fn new(tag: &str, text: &str) -> Self {
        let p = std::env::temp_dir().join(format!("ep-cli-{tag}-{}.json", std::process::id()));
        std::fs::write(&p, text).unwrap();
        Self(p)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for PlanFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Every bad elastic input exits 2 with the reason, before any network or
/// GPU work, as the launcher and under torchrun's variables.
#[test]
fn bad_elastic_arguments_exit_2_with_the_reason() {
    let good = PlanFile::new("good", "[[0,1],[0,1,2,3],[0,1,-2,3],[0,3]]");
    let plans = [
        ("empty-phase", "[[0,1],[]]", "phase 1 is empty"),
        ("no-phase", "[]", "no phase"),
        ("too-many", "[[0,64]]", "names rank 64"),
        ("twice", "[[0,1,1]]", "rank 1 twice"),
        (
            "not-running",
            "[[0,1],[0,1,-2]]",
            "not running when the phase began",
        ),
        (
            "killed-twice",
            "[[0,-1],[0,-1]]",
            "not running when the phase began",
        ),
        ("no-rank", "[[0,1],[-1]]", "leaves no rank"),
        ("all-killed", "[[1,2],[-1,-2]]", "leaves no rank"),
        ("minus-zero", "[[0,1],[-0,1]]", "rank 0 cannot be killed"),
        ("not-json", "[[0,1],", "not a plan"),
        ("not-ints", "[[\"a\"]]", "not a plan"),
    ];
    let files: Vec<(PlanFile, &str)> = (plans.iter())
        .map(|(tag, text, needle)| (PlanFile::new(tag, text), *needle))
        .collect();
    let mut cases: Vec<(Vec<String>, String)> = (files.iter())
        .map(|(f, needle)| (vec!["--plan".into(), f.path().into()], needle.to_string()))
        .collect();
    for (args, needle) in [
        (&["--plan", "/nonexistent/plan.json"][..], "cannot read"),
        (
            &["--plan", good.path(), "--ranks", "4"][..],
            "cannot be used with",
        ),
        (
            &["--plan", good.path(), "--capacity", "3"][..],
            "at least 4",
        ),
        (
            &["--plan", good.path(), "--capacity", "65"][..],
            "between 1 and 64",
        ),
        (
            &["--plan", good.path(), "--capacity", "0"][..],
            "between 1 and 64",
        ),
        (
            &["--plan", good.path(), "--kill-signal", "TERM"][..],
            "TERM",
        ),
        (&["--fault-timeout", "0"][..], "--fault-timeout 0"),
        (&["--fault-timeout", "-5"][..], "--fault-timeout -5"),
        (&["--fault-timeout", "soon"][..], "soon"),
        (&["--ranks", "2", "--capacity", "4"][..], "without --plan"),
    ] {
        cases.push((args.iter().map(|s| s.to_string()).collect(), needle.into()));
    }
    for (args, needle) in &cases {
        for check in [true, false] {
            let mut c = ep();
            c.args(args);
            if check {
                c.arg("--check-connection");
            }
            let o = c.output().unwrap();
            assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains(needle.as_str()),
                "{args:?} lacks {needle:?}: {}",
                text(&o)
            );
        }
    }
    // A plan file's error names the file.
    let o = ep().args(["--plan", files[0].0.path()]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains(files[0].0.path()),
        "{}",
        text(&o)
    );
    // Under torchrun only the first phase runs, and it must be 0..WORLD_SIZE-1.
    let o = ep()
        .args(["--plan", good.path(), "--check-connection"])
        .env("RANK", "0")
        .env("WORLD_SIZE", "3")
        .env("MASTER_PORT", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("only the plan's first phase"),
        "{}",
        text(&o)
    );
}

#[test]
fn three_ranks_connect_under_our_launcher() {
    let o = ep()
        .args(["--ranks", "3", "--check-connection", "--timeout", "20"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_all_connected(&String::from_utf8_lossy(&o.stdout), 3);
}

#[test]
fn three_ranks_connect_with_torchruns_variables_set_by_hand() {
    let port = free_port();
    let ranks: Vec<Rank> = (0..3).map(|r| spawn_rank(r, 3, port, false, &[])).collect();
    let mut stdout = String::new();
    for (r, rank) in ranks.into_iter().enumerate() {
        let o = rank.output(Duration::from_secs(60));
        assert!(o.status.success(), "rank {r}: {}", text(&o));
        stdout += &String::from_utf8_lossy(&o.stdout);
    }
    assert_all_connected(&stdout, 3);
}

/// The store torchrun's agent hosts: torch's own c10d::TCPStore when built
/// with the libtorch feature, else ours (the same wire protocol).
#[test]
fn three_ranks_join_torchruns_agent_store_and_leave_no_key_behind() {
    let opts_port;
    let store: Box<dyn nixl_examples::store::Store>;
    #[cfg(feature = "libtorch")]
    {
        let s =
            nixl_examples::store::libtorch::TorchStore::open(&nixl_examples::store::StoreOptions {
                host: "127.0.0.1".into(),
                port: 0,
                is_server: true,
                num_workers: None,
                wait_workers: false,
                timeout: Duration::from_secs(20),
            })
            .expect("torch's TCPStore server");
        opts_port = s.port();
        store = Box::new(s);
    }
    #[cfg(not(feature = "libtorch"))]
    {
        eprintln!("note: built without the libtorch feature: the agent store is our own server");
        let s = nixl_examples::store::native::TcpStore::open(&nixl_examples::store::StoreOptions {
            host: "127.0.0.1".into(),
            port: 0,
            is_server: true,
            num_workers: None,
            wait_workers: false,
            timeout: Duration::from_secs(20),
        })
        .expect("our TCPStore server");
        opts_port = s.port();
        store = Box::new(s);
    }
    // A key of torch's own in the workers' namespace must survive untouched.
    store.set("/worker/attempt_0/torch_key", b"torch").unwrap();
    let before = store.num_keys().unwrap();
    let ranks: Vec<Rank> = (0..3)
        .map(|r| spawn_rank(r, 3, opts_port, true, &[]))
        .collect();
    let mut stdout = String::new();
    for (r, rank) in ranks.into_iter().enumerate() {
        let o = rank.output(Duration::from_secs(60));
        assert!(o.status.success(), "rank {r}: {}", text(&o));
        stdout += &String::from_utf8_lossy(&o.stdout);
    }
    assert_all_connected(&stdout, 3);
    assert_eq!(
        store.num_keys().unwrap(),
        before,
        "the ranks left keys behind"
    );
    assert_eq!(store.get("/worker/attempt_0/torch_key").unwrap(), b"torch");
    assert!(
        !store
            .check(&["/worker/attempt_0/nixl_ep/rank/0/metadata"])
            .unwrap()
    );
}

#[test]
fn a_rank_that_dies_is_named_by_the_others() {
    let port = free_port();
    let mut ranks: Vec<Rank> = (0..3)
        .map(|r| spawn_rank(r, 3, port, false, &["--inject", "hang-after-connect=2"]))
        .collect();
    // Rank 2 hangs after connecting, its heartbeat still going; the others
    // wait for it at the end. Then it dies.
    ranks[2].wait_for_line("[rank 2] hanging");
    let victim = ranks.pop().unwrap();
    // SAFETY: kill(2) on a child we started and still own.
    unsafe { kill(victim.pid() as i32, 9) };
    drop(victim);
    for (r, rank) in ranks.into_iter().enumerate() {
        let o = rank.output(Duration::from_secs(40));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "rank {r}: {}", text(&o));
        assert!(
            err.contains("rank 2 stopped responding"),
            "rank {r} does not name rank 2: {}",
            text(&o)
        );
    }
}

/// A rank that dies just as the others load its metadata and connect to
/// it: whether NIXL fails there ("UCX endpoint create failed") or the
/// others get through and wait for it later, they name the dead rank.
#[test]
fn a_rank_that_dies_while_the_others_connect_is_named() {
    let port = free_port();
    let ranks: Vec<Rank> = (0..3)
        .map(|r| spawn_rank(r, 3, port, false, &["--inject", "die-before-connect=2"]))
        .collect();
    for (r, rank) in ranks.into_iter().enumerate().take(2) {
        let o = rank.output(Duration::from_secs(40));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "rank {r}: {}", text(&o));
        assert!(
            err.contains("rank 2 stopped responding"),
            "rank {r} does not name rank 2: {}",
            text(&o)
        );
    }
}

/// A rank frozen (SIGSTOP) once connected keeps its sockets open; the
/// others must name it from the silence, long before their --timeout.
fn frozen_rank_is_named(victim: u32, cause: &str) {
    const TIMEOUT_S: u64 = 60;
    let port = free_port();
    let hang = format!("hang-after-connect={victim}");
    let mut ranks: Vec<Option<Rank>> = (0..3)
        .map(|r| {
            Some(spawn_rank_within(
                r,
                3,
                port,
                false,
                &["--inject", &hang],
                TIMEOUT_S,
            ))
        })
        .collect();
    let mut frozen = ranks[victim as usize].take().unwrap();
    frozen.wait_for_line(&format!("[rank {victim}] hanging"));
    // SAFETY: kill(2) on a child we started and still own.
    unsafe { kill(frozen.pid() as i32, 19) }; // SIGSTOP
    let frozen_at = Instant::now();
    for (r, rank) in ranks.into_iter().enumerate() {
        let Some(rank) = rank else { continue };
        let o = rank.output(Duration::from_secs(2 * TIMEOUT_S));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "rank {r}: {}", text(&o));
        assert!(
            err.contains(cause),
            "rank {r} does not say {cause:?}: {}",
            text(&o)
        );
    }
    let took = frozen_at.elapsed();
    assert!(took < Duration::from_secs(TIMEOUT_S / 2), "took {took:?}");
    drop(frozen); // SIGKILL reaches a stopped process
}

#[test]
fn a_frozen_rank_is_named_by_the_others() {
    frozen_rank_is_named(2, "rank 2 stopped responding");
}

/// Rank 0 hosts the store: freezing it freezes the store too.
#[test]
fn a_frozen_rank_0_which_hosts_the_store_is_named_by_the_others() {
    frozen_rank_is_named(0, "lost the store, which rank 0 hosts");
}

/// `ep --ranks 3 --check-connection` with `extra`, its lines on a channel.
fn launched(extra: &[&str]) -> common::Streamed {
    let mut c = ep();
    c.args(["--ranks", "3", "--check-connection", "--timeout", "60"])
        .args(extra);
    common::Streamed::start(c)
}

/// The pid in `[rank R] hanging (injected fault) until stopped or killed (pid N)`.
fn hanging_pid(line: &str) -> i32 {
    let rest = line.split("pid ").nth(1).expect("the line names the pid");
    rest.split(')').next().unwrap().parse().unwrap()
}

/// Under our launcher the store lives in the launcher, not in rank 0: a
/// frozen rank 0 is named by its silence, and the others keep their store.
#[test]
fn a_frozen_rank_0_under_our_launcher_is_named_and_the_store_lives_on() {
    let mut run = launched(&["--inject", "hang-after-connect=0"]);
    let line = run.until(1, Duration::from_secs(60), |l| {
        l.starts_with("[rank 0] hanging")
    });
    let pid = hanging_pid(&line);
    // SAFETY: kill(2) on a process of the launcher we started.
    unsafe { kill(pid, 19) }; // SIGSTOP
    let frozen_at = Instant::now();
    run.until(2, Duration::from_secs(60), |l| {
        l.contains("rank 0 stopped responding")
    });
    let took = frozen_at.elapsed();
    // SAFETY: as above; SIGKILL reaches a stopped process.
    unsafe { kill(pid, 9) };
    let (code, all) = run.finish(Duration::from_secs(60));
    assert_eq!(code, Some(1), "{all}");
    assert!(!all.contains("lost the store"), "{all}");
    assert!(took < Duration::from_secs(30), "took {took:?}: {all}");
}

/// The launcher hosts the store: frozen, every rank names it within the
/// store's reply deadline (a few seconds), not the --timeout of 60 s.
#[test]
fn a_frozen_launcher_which_hosts_the_store_is_named_by_every_rank() {
    let mut run = launched(&["--inject", "hang-after-connect=2"]);
    run.until(1, Duration::from_secs(60), |l| {
        l.starts_with("[rank 2] hanging")
    });
    // SAFETY: kill(2) on a child we started and still own.
    unsafe { kill(run.pid(), 19) }; // SIGSTOP
    let frozen_at = Instant::now();
    let named = |l: &str| l.contains("lost the store, which the ep launcher hosts");
    run.until(3, Duration::from_secs(60), named);
    let took = frozen_at.elapsed();
    // SAFETY: as above; SIGKILL reaches a stopped process.
    unsafe { kill(run.pid(), 9) };
    let (_, all) = run.finish(Duration::from_secs(60));
    for r in 0..3 {
        assert!(
            all.lines()
                .any(|l| l.starts_with(&format!("[rank {r}]")) && named(l)),
            "rank {r} does not name the launcher: {all}"
        );
    }
    assert!(took < Duration::from_secs(30), "took {took:?}: {all}");
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

#[test]
fn a_machine_that_cannot_run_it_says_why_and_exits_1() {
    if nixl_examples::gpu::context::driver_present()
        && nixl_examples::ep::kernels::availability().is_ok()
    {
        eprintln!(
            "SKIP ep cannot-run test: this machine has a GPU driver and the EP kernels are built"
        );
        return;
    }
    let o = ep()
        .args(["--ranks", "2", "--timeout", "60"])
        .env("NCCL_LIB", "/nonexistent/nccl")
        .env("UCX_TLS", "tcp,cuda_copy")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(err.contains("cannot run ep"), "{err}");
    assert!(
        err.contains("UCX_TLS=tcp,cuda_copy leaves out cuda_ipc"),
        "{err}"
    );
    assert!(
        err.contains("NCCL_LIB=/nonexistent/nccl"),
        "the NCCL search is not reported: {err}"
    );
    // With a real libnccl.so.2 (e.g. unpacked from the nvidia-nccl-cu13
    // wheel) the rank re-executes itself so that cudarc can load it.
    match std::env::var("NIXL_EP_TEST_NCCL_LIB") {
        Err(_) => eprintln!(
            "SKIP NCCL loading: set NIXL_EP_TEST_NCCL_LIB to a folder holding libnccl.so.2"
        ),
        Ok(lib) => {
            let o = ep()
                .args(["--ranks", "1"])
                .env("NCCL_LIB", lib)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains("re-executing") && err.contains("loaded)"),
                "{err}"
            );
        }
    }
}
