//! What crosses between two processes for a host-API transfer: the
//! target's agent metadata and descriptor list, through a store. The target
//! registers two DRAM buffers and publishes both; the initiator loads them,
//! READs both buffers with a request built in one call (notification
//! `UUID1`), then WRITEs its own back crosswise from prepared lists (local
//! [0, 1] to remote [1, 0], `UUID2`). The target learns each transfer is
//! done from its notification. Both sides check every byte.
//!
//! The store is our TCPStore (PyTorch's c10d protocol; `--store libtorch`
//! runs torch's own). `--metadata etcd` or `nixl-tcpstore` swap metadata
//! through NIXL's own clients instead, the descriptors then travelling as a
//! notification: `nixl_examples::exchange` holds those paths.
//!
//! ```text
//! cargo run --example two_proc                 # hosts the store, runs both roles
//! cargo run --example two_proc -- --metadata etcd --etcd-endpoints http://127.0.0.1:2379
//! cargo run --example two_proc -- --role target --port 9998   # one role by hand
//! ```
//! Exit status: 0 verified, 1 failure, 2 bad arguments, 3 wrong data.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use clap::Parser;
use nixl_examples::cli::{DataMismatch, bytes_between};
use nixl_examples::exchange::Exchange;
use nixl_examples::exchange::pair::{PairArgs, Role, Roles};
use nixl_examples::nixl::memory::HostBuffer;
use nixl_examples::nixl::serdes::{Desc, DescList, MemType};
use nixl_examples::nixl::view::load_peer;
use nixl_examples::nixl::xfer::{NotifInbox, notif_args, post_and_wait};
use nixl_examples::{pattern, say};
use nixl_sys::{Agent, XferOp};

/// Two NIXL agents, two processes, host API over DRAM: a READ and a WRITE
/// with notifications, every byte verified.
#[derive(Parser, Debug)]
#[command(version, args_override_self = true)]
struct Args {
    #[command(flatten)]
    pair: PairArgs<Role>,
    /// Bytes per buffer (each side has two), e.g. 256, 64K, 1M; at most 1G.
    #[arg(long, default_value = "256", value_parser = bytes_between(1, 1 << 30))]
    buf_size: u64,
    /// Pattern seed; both roles must use the same one.
    #[arg(long, default_value_t = 0x2b0c)]
    seed: u64,
}

const TARGET: &str = "target";
const INITIATOR: &str = "initiator";
// Pattern variants: the target's data, the initiator's poison before the
// READ, and what the initiator WRITEs back.
const TARGET_DATA: u64 = 0;
const POISON: u64 = 7;
const WRITTEN: u64 = 1;

fn main() -> ExitCode {
    let args = Args::parse();
    let deadline = args.pair.timeout * 2 + Duration::from_secs(10);
    args.pair
        .main(deadline, |role, agent, ex| run_role(&args, role, agent, ex))
}

/// One role: an agent and one registered buffer holding both of its
/// 256-byte (`--buf-size`) buffers, then the role's part.
fn run_role(args: &Args, role: Role, agent: &Agent, ex: &mut Exchange) -> Result<()> {
    let name = role.name();
    let mut buf = HostBuffer::new(2 * args.buf_size as usize);
    let reg = agent.register_memory(&buf, None)?;
    say!("[{name}] Memory registered");
    let result = match role {
        Role::Target => target(args, ex, agent, &mut buf),
        Role::Initiator => initiator(args, ex, agent, &mut buf),
    };
    // Cleanup on every path: our keys, then our memory (the agent goes last).
    if let (Some(store), Role::Target) = (ex.store(), role) {
        let _ = ["target_meta", "target_descs"].map(|k| store.delete_key(k));
    }
    drop(reg);
    result?;
    say!("[{name}] Process complete");
    Ok(())
}

fn target(args: &Args, exchange: &mut Exchange, agent: &Agent, buf: &mut HostBuffer) -> Result<()> {
    pattern::fill(buf.as_mut_slice(), args.seed, TARGET_DATA);
    let descs = two_descs(buf);
    match exchange.store() {
        // Our metadata (name, UCX address, memory keys) and our buffers' descriptors.
        Some(store) => {
            store.set("target_meta", &agent.get_local_md()?)?;
            store.set("target_descs", &descs.encode())?;
            say!("[target] Published metadata and xfer descriptors to TCP server");
        }
        None => {
            exchange.publish(agent)?;
            exchange.offer_descs(agent, INITIATOR, &descs)?;
            let mode = exchange.mode().name();
            say!(
                "[target] Published metadata via {mode} and sent xfer descriptors to the initiator"
            );
        }
    }
    say!("[target] Waiting for transfers...");
    let mut inbox = NotifInbox::new();
    inbox.wait_for(agent, INITIATOR, b"UUID1", args.pair.timeout)?;
    // The READ's data is checked where it lands, on the initiator: checking
    // here would race the WRITE, which may already have started.
    say!("[target] Transfer 1 done");

    inbox.wait_for(agent, INITIATOR, b"UUID2", args.pair.timeout)?;
    check_swapped(buf, args)?;
    say!("[target] Transfer 2 done");
    Ok(())
}

fn initiator(args: &Args, ex: &mut Exchange, agent: &Agent, buf: &mut HostBuffer) -> Result<()> {
    pattern::fill(buf.as_mut_slice(), args.seed, POISON);
    let remote = match ex.store() {
        Some(store) => {
            let md = store.get("target_meta").context("the target's metadata")?;
            load_peer(agent, &md, TARGET, args.pair.timeout)?;
            DescList::decode(&store.get("target_descs")?)?
        }
        None => {
            ex.publish(agent)?;
            ex.load_peer(agent, TARGET)?;
            ex.take_descs(agent, &mut NotifInbox::new(), TARGET)?
        }
    };
    ensure!(
        remote.mem_type == MemType::Dram
            && remote.descs.len() == 2
            && remote.descs.iter().all(|d| d.len == args.buf_size),
        "the target published {remote:?}, expected two DRAM buffers of {} bytes (same --buf-size on both sides?)",
        args.buf_size
    );
    say!("[initiator] Successfully retrieved target descriptors");
    let local = two_descs(buf).to_xfer_dlist()?;
    let remote = remote.to_xfer_dlist()?;

    // Transfer 1: a request built in one call (createXferReq).
    say!("[initiator] Starting transfer 1 (READ)...");
    let tag = notif_args(b"UUID1")?;
    let req1 = agent
        .create_xfer_req(XferOp::Read, &local, &remote, TARGET, Some(&tag))
        .context("creating transfer 1 (READ)")?;
    post_and_wait(agent, &req1, "transfer 1 (READ)", args.pair.timeout)?;
    if let Some(m) = pattern::verify(buf.as_slice(), args.seed, TARGET_DATA) {
        return Err(DataMismatch(format!("initiator buffers after the READ: {m}")).into());
    }
    say!("[initiator] Transfer 1 done");

    // Transfer 2: prepared lists, then a request by indices (prepXferDlist +
    // makeXferReq); "" (NIXL_INIT_AGENT) names the local side.
    say!("[initiator] Starting transfer 2 (WRITE)...");
    pattern::fill(buf.as_mut_slice(), args.seed, WRITTEN);
    let local_prep = agent.prepare_xfer_dlist("", &local, None)?;
    let remote_prep = agent.prepare_xfer_dlist(TARGET, &remote, None)?;
    let (l, r, tag) = (&local_prep, &remote_prep, notif_args(b"UUID2")?);
    let req2 = agent
        .make_xfer_req(XferOp::Write, l, &[0, 1], r, &[1, 0], Some(&tag))
        .context("making transfer 2 (WRITE) from prepared lists")?;
    post_and_wait(agent, &req2, "transfer 2 (WRITE)", args.pair.timeout)?;
    say!("[initiator] Transfer 2 done");
    // Requests before the prepared lists they were made from.
    drop((req1, req2, local_prep, remote_prep));
    let _ = agent.invalidate_remote_md(TARGET);
    Ok(())
}

/// The two halves of `buf` as a descriptor list.
fn two_descs(buf: &HostBuffer) -> DescList {
    DescList::new(MemType::Dram, Desc::of(buf).split(2).collect())
}

/// Checks that the WRITE sent initiator buffer 0 to our buffer 1 and 1 to
/// 0: a [`DataMismatch`] naming the buffer and byte otherwise.
fn check_swapped(buf: &HostBuffer, args: &Args) -> Result<()> {
    let n = args.buf_size as usize;
    let mut written = vec![0u8; 2 * n];
    pattern::fill(&mut written, args.seed, WRITTEN);
    let (got, want) = (buf.as_slice(), [&written[n..], &written[..n]].concat());
    match got.iter().zip(&want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(at) => {
            let (k, b) = (at / n, at % n);
            let m = format!("target buffer {k} after the WRITE: byte {b} wrong");
            Err(DataMismatch(m).into())
        }
    }
}
