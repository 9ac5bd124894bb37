//! Across nodes, as PyTorch users launch: two torchrun agents on loopback
//! act as two nodes (`--nnodes 2 --node-rank 0` and `1`, rendezvous over
//! c10d at one endpoint), each starting two ranks of `ep` or
//! `collectives --check-connection`. The four ranks must meet through the
//! store the agents host, wire up their NIXL agents across the "nodes" and
//! exit 0. No GPU: the connection check touches none.
//!
//! Needs torchrun, which is PyTorch's (`scripts/setup.sh --full-torch`
//! installs it into .venv, and `scripts/test.sh` runs that); without it
//! each test prints SKIP with the reason and passes.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Reaped, both, free_port};

/// `.venv/bin/torchrun` if PyTorch's launcher can run here, else the SKIP
/// line's reason.
fn torchrun() -> Result<PathBuf, String> {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin");
    let probe = Command::new(venv.join("python"))
        .args(["-c", "import torch.distributed.run"])
        .output();
    match probe {
        Ok(o) if o.status.success() => Ok(venv.join("torchrun")),
        Ok(o) => Err(format!(
            "torch.distributed.run not importable in .venv (run scripts/setup.sh --full-torch): {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )),
        Err(e) => Err(format!(
            "no .venv/bin/python ({e}): run scripts/setup.sh --full-torch"
        )),
    }
}

/// One torchrun agent: node `node` of 2, two ranks of `bin args`.
fn agent(torchrun: &Path, endpoint: &str, node: u32, bin: &str, args: &[&str]) -> Reaped {
    let mut c = common::launcher(torchrun.to_str().unwrap());
    c.args(["--nnodes", "2", "--nproc-per-node", "2"])
        .args(["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint])
        .args(["--rdzv-conf", "join_timeout=60"])
        .args(["--node-rank", &node.to_string(), "--no-python", bin])
        .args(args)
        .env("OMP_NUM_THREADS", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Reaped::new(c.spawn().expect("starting torchrun"))
}

/// Runs `bin args` on two loopback "nodes" of two ranks each; asserts both
/// agents exit 0 and every rank, on either node, connected to the other
/// three. Returns each node's output.
fn two_nodes(bin: &str, args: &[&str]) -> Option<[String; 2]> {
    let torchrun = match torchrun() {
        Ok(t) => t,
        Err(why) => {
            println!("SKIP two-node torchrun test of {bin}: {why}");
            return None;
        }
    };
    let endpoint = format!("127.0.0.1:{}", free_port());
    let agents = [0, 1].map(|n| agent(&torchrun, &endpoint, n, bin, args));
    let outs = agents.map(|a| a.wait_output(Duration::from_secs(180)));
    for (n, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "node {n}'s agent failed:\n{}", both(o));
    }
    let text = outs.map(|o| both(&o));
    let mut ranks = Vec::new();
    for (n, t) in text.iter().enumerate() {
        let here: Vec<u32> = (0..4)
            .filter(|r| t.contains(&format!("[rank {r}] connected to all 3 other rank(s)")))
            .collect();
        assert_eq!(
            here.len(),
            2,
            "node {n} did not run two connected ranks:\n{t}"
        );
        ranks.extend(here);
    }
    ranks.sort();
    assert_eq!(
        ranks,
        [0, 1, 2, 3],
        "ranks across the nodes:\n{}\n{}",
        text[0],
        text[1]
    );
    Some(text)
}

#[test]
fn collectives_ranks_meet_across_two_torchrun_nodes() {
    let Some(text) = two_nodes(env!("CARGO_BIN_EXE_collectives"), &["--check-connection"]) else {
        return;
    };
    // The ranks joined the store the agents host, in torch's worker namespace.
    assert!(
        text.iter()
            .any(|t| t.contains("keys under /worker/attempt_0/nixl_coll/")),
        "{}",
        text[0]
    );
    println!("{}\n{}", text[0], text[1]);
}

#[test]
fn ep_ranks_meet_and_step_across_two_torchrun_nodes() {
    let args = ["--check-connection", "--iters", "5"];
    let Some(text) = two_nodes(env!("CARGO_BIN_EXE_ep"), &args) else {
        return;
    };
    assert!(
        text.iter()
            .any(|t| t.contains("keys under /worker/attempt_0/nixl_ep/")),
        "{}",
        text[0]
    );
    println!("{}\n{}", text[0], text[1]);
}
