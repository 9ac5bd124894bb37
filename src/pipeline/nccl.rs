//! The same-run NCCL baseline: NCCL's point-to-point calls through the
//! same chain (`ncclSend` / `ncclRecv`, through cudarc's NCCL bindings; NCCL
//! found and loaded as for `collectives`, [`crate::ranks::nccl::prepare`]).
//!
//! For every chunk size of the run, the same number of chunks and warm-up
//! chunks as the pipeline's cases: stage 0 sends each chunk to stage 1;
//! each middle stage receives chunk c from its predecessor while it sends
//! chunk c − 1 on (one `ncclGroupStart`/`ncclGroupEnd` per step, two
//! receive buffers used in turn, so neighbouring links overlap); the last
//! stage receives. Unlike the pipeline's middle stages, NCCL's forward the
//! bytes unchanged (NCCL's send/recv does not transform); nor does any
//! stage sleep (`--slow-stage` is the pipeline's alone). Stage 0 sends the
//! pattern of chunk M − 2 ([`super::data::word`]) for every chunk but the
//! last, whose own pattern it sends last; the last stage checks that the
//! last two chunks arrived in order, word for word (exit 3 otherwise).
//!
//! Timing: CUDA events on the rank's stream, one after the warm-up's last
//! step, one after the last chunk's; a link's GB/s (1e9 B/s) is measured
//! where the data lands, chunk bytes × timed chunks / the receiver's time,
//! as the pipeline counts its payload. NCCL refuses ranks that share a GPU,
//! so under MPS on one GPU the baseline does not run and the report says
//! why ([`crate::ranks::nccl::connect_all`]).
//!
//! Nothing hangs: the calls are queued on a thread the rank watches
//! ([`crate::ranks::nccl::watched`]: the group's probes, `--timeout` per
//! chunk size), at most two batches of [`BATCH`] steps in flight, so a
//! dead neighbour leaves that thread stuck, not the rank.

use std::sync::Arc;

use anyhow::Result;
use cudarc::driver::{CudaStream, sys as cu};
use cudarc::nccl::{result, sys};
use serde::{Deserialize, Serialize};

use super::config::Config;
use super::data::word;
use crate::cli::{DataMismatch, fmt_bytes};
use crate::gpu::{DeviceBuffer, Gpu};
use crate::ranks::group::Group;
use crate::ranks::nccl::{Comm, check, watched};

/// Steps (one group call each) queued before the thread waits for the
/// batch before them.
pub const BATCH: u64 = 128;

/// One rank's NCCL chain for one chunk size.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NcclTimes {
    /// Payload bytes per chunk.
    pub chunk: u64,
    /// Chunks timed (after the warm-up).
    pub timed: u64,
    /// GPU time on this rank's stream from the end of the warm-up's last
    /// step to the end of the last chunk's, ns.
    pub span_ns: f64,
}

crate::json_value!(Vec<NcclTimes> => "NCCL chain results");

/// Runs NCCL's chain for every chunk size of `cfg` (in order) on `comm`;
/// this rank's times. Errors: NCCL's, a neighbour that gave up, the
/// `limit` per chunk size passed, a wrong word on the last stage (exit 3).
/// On error the buffers are leaked, as NCCL may still use them.
pub fn measure(
    g: &Group,
    gpu: &Gpu,
    comm: &Comm,
    cfg: &Config,
    limit: std::time::Duration,
) -> Result<Vec<NcclTimes>> {
    let max = cfg.chunk_sizes.iter().copied().max().unwrap_or(16) as usize;
    let alloc = || DeviceBuffer::zeroed(&gpu.ctx, max).map(Arc::new);
    let bufs = Bufs {
        recv: [alloc()?, alloc()?],
        src: [alloc()?, alloc()?],
    };
    let mut out = Vec::new();
    for &chunk in &cfg.chunk_sizes {
        match one_size(g, gpu, comm, cfg, &bufs, chunk, limit) {
            Ok(t) => out.push(t),
            Err(e) => {
                std::mem::forget(bufs);
                return Err(e.context(format!(
                    "stage {}: NCCL's send/recv chain, {} chunks",
                    g.rank,
                    fmt_bytes(chunk)
                )));
            }
        }
    }
    Ok(out)
}

/// A rank's NCCL buffers, each the largest chunk: two to receive into (in
/// turn), and stage 0's two sources (every chunk's but the last, the last's).
struct Bufs {
    recv: [Arc<DeviceBuffer>; 2],
    src: [Arc<DeviceBuffer>; 2],
}

/// One chunk size: fill, queue and time the steps watched, check.
fn one_size(
    g: &Group,
    gpu: &Gpu,
    comm: &Comm,
    cfg: &Config,
    b: &Bufs,
    chunk: u64,
    limit: std::time::Duration,
) -> Result<NcclTimes> {
    let m = cfg.chunks;
    for buf in &b.recv {
        buf.zero(&gpu.stream)?;
    }
    if g.rank == 0 {
        b.src[0].upload(&gpu.stream, &pattern(m - 2, chunk))?;
        b.src[1].upload(&gpu.stream, &pattern(m - 1, chunk))?;
    }
    g.barrier(&format!("nccl/{chunk}/go"))?;
    let job = Job {
        stream: gpu.stream.clone(),
        comm: RawComm(comm.raw()),
        rank: g.rank,
        world: g.world,
        chunk,
        chunks: m,
        warmup: cfg.warmup,
        recv: [b.recv[0].addr(), b.recv[1].addr()],
        src: [b.src[0].addr(), b.src[1].addr()],
    };
    let span_ns = watched(g, gpu, limit, "ncclSend/ncclRecv", move || job.run())?;
    if g.rank + 1 == g.world {
        for c in [m - 2, m - 1] {
            verify(gpu, &b.recv[(c % 2) as usize], c, chunk)?;
        }
    }
    Ok(NcclTimes {
        chunk,
        timed: m - cfg.warmup,
        span_ns,
    })
}

/// The bytes of chunk `g` as stage 0 produces it ([`word`]), `chunk` bytes.
fn pattern(g: u64, chunk: u64) -> Vec<u8> {
    (0..chunk / 4)
        .flat_map(|w| word(g, w).to_le_bytes())
        .collect()
}

/// The last stage: chunk `g` must be in `buf`, word for word (exit 3).
fn verify(gpu: &Gpu, buf: &DeviceBuffer, g: u64, chunk: u64) -> Result<()> {
    let mut got = vec![0u8; chunk as usize];
    buf.download(&gpu.stream, &mut got)?;
    let bad = (got.chunks_exact(4).enumerate())
        .map(|(w, b)| (w, u32::from_le_bytes(b.try_into().expect("4 bytes"))))
        .find(|&(w, x)| x != word(g, w as u64));
    match bad {
        None => Ok(()),
        Some((w, x)) => Err(DataMismatch(format!(
            "NCCL's send/recv chain delivered chunk {g} wrong at byte offset {}: word {x:#010x}, expected {:#010x}",
            4 * w,
            word(g, w as u64)
        ))
        .into()),
    }
}

/// One of a rank's buffers (`Bufs`): receive buffer i, source i.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    Recv(usize),
    Src(usize),
}

/// Step `c` of stage `rank` of `world` over `chunks` chunks: the buffer it
/// receives chunk c into (all but stage 0, c < chunks: the two in turn),
/// and the one it sends from: stage 0 chunk c (the last chunk's source for
/// the last), a middle stage chunk c − 1 (what the step before received).
pub fn schedule(rank: u32, world: u32, chunks: u64, c: u64) -> (Option<Buf>, Option<Buf>) {
    let recv = (rank > 0 && c < chunks).then_some(Buf::Recv((c % 2) as usize));
    let send = match rank {
        _ if rank + 1 == world => None,
        0 => (c < chunks).then(|| Buf::Src(usize::from(c + 1 == chunks))),
        _ => (c > 0).then(|| Buf::Recv(((c - 1) % 2) as usize)),
    };
    (recv, send)
}

/// A communicator's handle, moved to the queueing thread.
struct RawComm(sys::ncclComm_t);

// SAFETY: NCCL's communicators may be used from any thread, one at a time:
// the rank's thread waits while the queueing thread uses it.
unsafe impl Send for RawComm {}

/// What the queueing thread needs.
struct Job {
    stream: Arc<CudaStream>,
    comm: RawComm,
    rank: u32,
    world: u32,
    chunk: u64,
    chunks: u64,
    warmup: u64,
    /// Device addresses of [`Bufs`].
    recv: [u64; 2],
    src: [u64; 2],
}

impl Job {
    /// Every step in order (a middle stage's last one sends the last
    /// chunk on), at most two batches in flight; the timed span, ns.
    fn run(self) -> Result<f64> {
        let middle = self.rank > 0 && self.rank + 1 < self.world;
        let steps = self.chunks + u64::from(middle);
        let timing = Some(cu::CUevent_flags::CU_EVENT_DEFAULT);
        let mut marks = std::collections::VecDeque::new();
        let (mut start, mut end) = (None, None);
        for c in 0..steps {
            if c == self.warmup {
                start = Some(self.stream.record_event(timing)?);
            }
            // SAFETY: the buffers outlive the work (leaked on failure).
            unsafe { self.step(c)? };
            if c + 1 == self.chunks {
                end = Some(self.stream.record_event(timing)?);
            }
            if (c + 1) % BATCH == 0 {
                marks.push_back(self.stream.record_event(None)?);
                if marks.len() > 2 {
                    marks.pop_front().expect("three marks").synchronize()?;
                }
            }
        }
        self.stream.synchronize()?;
        let (start, end) = (start.expect("warmup < chunks"), end.expect("a last chunk"));
        Ok(f64::from(start.elapsed_ms(&end)?) * 1e6)
    }

    /// Step `c`: receive chunk c (all but stage 0, c < chunks) and send
    /// chunk c (stage 0) or c − 1 (a middle stage), in one NCCL group.
    ///
    /// # Safety
    /// The buffers hold `chunk` bytes and outlive the queued work.
    unsafe fn step(&self, c: u64) -> Result<()> {
        let r = self.rank;
        let bytes = self.chunk as usize;
        let s = self.stream.cu_stream() as sys::cudaStream_t;
        let u8t = sys::ncclDataType_t::ncclUint8;
        let (recv, send) = schedule(r, self.world, self.chunks, c);
        let addr = |b: Buf| match b {
            Buf::Recv(i) => self.recv[i],
            Buf::Src(i) => self.src[i],
        };
        let (recv, send) = (recv.map(addr), send.map(addr));
        check("ncclGroupStart", result::group_start())?;
        // SAFETY: as the caller promises; the peers are our neighbours.
        unsafe {
            if let Some(a) = recv {
                let peer = (r - 1) as i32;
                check(
                    "ncclRecv",
                    result::recv(a as _, bytes, u8t, peer, self.comm.0, s),
                )?;
            }
            if let Some(a) = send {
                let peer = (r + 1) as i32;
                check(
                    "ncclSend",
                    result::send(a as _, bytes, u8t, peer, self.comm.0, s),
                )?;
            }
        }
        check("ncclGroupEnd", result::group_end())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every stage's steps as NCCL matches them (the k-th send of a link
    /// with its k-th receive), what each buffer holds followed on the host.
    fn through(world: u32, chunks: u64) -> Vec<Vec<u64>> {
        let mut got = vec![Vec::new(); world as usize];
        let mut held = vec![[u64::MAX; 2]; world as usize];
        let mut sent: Vec<Vec<u64>> = vec![Vec::new(); world as usize];
        for r in 0..world {
            let steps = chunks + u64::from(r > 0 && r + 1 < world);
            for c in 0..steps {
                let (recv, send) = schedule(r, world, chunks, c);
                // One group: the send reads before the receive lands (they
                // never share a buffer, checked here).
                if let (Some(a), Some(b)) = (recv, send) {
                    assert_ne!(a, b, "stage {r} step {c}");
                }
                if let Some(b) = send {
                    sent[r as usize].push(match b {
                        Buf::Src(i) => [chunks - 2, chunks - 1][i],
                        Buf::Recv(i) => held[r as usize][i],
                    });
                }
                if let Some(Buf::Recv(i)) = recv {
                    let k = got[r as usize].len();
                    let chunk = sent[r as usize - 1][k];
                    held[r as usize][i] = chunk;
                    got[r as usize].push(chunk);
                }
            }
        }
        got
    }

    #[test]
    fn every_stage_receives_every_chunk_once_in_order() {
        for world in 2..=5 {
            for chunks in [2, 3, 7] {
                let got = through(world, chunks);
                let mut want = vec![chunks - 2; chunks as usize];
                want[chunks as usize - 1] = chunks - 1;
                for (r, stage) in got.iter().enumerate().skip(1) {
                    assert_eq!(*stage, want, "{world} stages, {chunks} chunks, stage {r}");
                }
            }
        }
    }

    #[test]
    fn the_last_stage_ends_with_the_last_two_chunks_in_turn() {
        for chunks in [2u64, 5, 6] {
            let (last, prev) = (chunks - 1, chunks - 2);
            let r = |c: u64| schedule(2, 3, chunks, c).0;
            assert_eq!(r(last), Some(Buf::Recv((last % 2) as usize)));
            assert_eq!(r(prev), Some(Buf::Recv((prev % 2) as usize)));
            assert_eq!(schedule(0, 3, chunks, last).1, Some(Buf::Src(1)));
        }
    }
}
