//! The same-run baseline: NCCL all-to-all of exactly the bytes dispatch and
//! combine move between every pair of ranks (`ncclGroupStart`, one
//! `ncclSend` + `ncclRecv` per peer with those byte counts, the local pair
//! included, `ncclGroupEnd`), each iteration timed with CUDA events,
//! warm-up excluded. Through cudarc's NCCL bindings.
//!
//! ## Finding libnccl
//!
//! On the GPU machines NCCL comes with PyTorch's Python packages
//! (`nvidia/nccl/lib/libnccl.so.2` from the nvidia-nccl wheel, or
//! `torch/lib`). cudarc loads NCCL by bare names (`libnccl.so`,
//! `libnccl.so.<CUDA major>`, …) — never `libnccl.so.2`, the only name the
//! wheel ships — and the dynamic loader reads `LD_LIBRARY_PATH` once, at
//! process start. So [`prepare`], first thing in a rank, finds the library
//! (`NCCL_LIB`, then `python3`'s site-packages, then the project's `.venv`),
//! links it as `libnccl.so` into a private folder, puts that folder on
//! `LD_LIBRARY_PATH` and re-executes the rank (same pid, arguments and
//! environment; torchrun does not notice). Without NCCL the baseline is
//! skipped with a note naming every place searched.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use cudarc::nccl::{result, sys};

use super::group::Group;
use super::layout::PairBytes;
pub use super::report::{NcclStatus, NcclTimes};
use crate::gpu::{DeviceBuffer, Gpu};
use crate::group::Bytes;

/// Set (to the library's path) in the re-executed process.
const REEXEC_MARK: &str = "NIXL_EP_NCCL_REEXEC";

/// Makes NCCL loadable by cudarc, re-executing this process once if
/// needed (see the module docs). Call before any thread or connection
/// exists. Never fails: an unavailable NCCL only skips the baseline.
pub fn prepare() -> NcclStatus {
    // SAFETY: only probes dlopen of NCCL's names.
    if unsafe { sys::is_culib_present() } {
        if let Some(dir) = std::env::var_os(REEXEC_MARK) {
            // Loaded for good by now (cudarc keeps it): the link can go.
            let _ = result::get_nccl_version();
            let _ = std::fs::remove_dir_all(dir);
        }
        return match result::get_nccl_version() {
            Ok(v) => NcclStatus::Ready(format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)),
            Err(e) => {
                NcclStatus::Unavailable(format!("libnccl loaded but ncclGetVersion failed: {e:?}"))
            }
        };
    }
    let lib = match find_library() {
        Ok(lib) => lib,
        Err(why) => return NcclStatus::Unavailable(why),
    };
    if let Some(done) = std::env::var_os(REEXEC_MARK) {
        return NcclStatus::Unavailable(format!(
            "found {} but could not load it even from LD_LIBRARY_PATH ({}): does it match this driver's CUDA?",
            lib.display(),
            PathBuf::from(done).display(),
        ));
    }
    match reexec_with(&lib) {
        Ok(never) => match never {},
        Err(why) => NcclStatus::Unavailable(why),
    }
}

/// Finds `libnccl.so.2`: `NCCL_LIB` (a file or a folder), then the
/// site-packages of `python3` on PATH and of the project's `.venv`, under
/// `nvidia/nccl/lib` and `torch/lib`.
pub fn find_library() -> Result<PathBuf, String> {
    let mut searched = Vec::new();
    if let Some(p) = std::env::var_os("NCCL_LIB").map(PathBuf::from) {
        for c in [p.clone(), p.join("libnccl.so.2"), p.join("libnccl.so")] {
            if c.is_file() {
                return Ok(c);
            }
        }
        searched.push(format!("NCCL_LIB={}", p.display()));
    }
    let mut sites = python_site_packages();
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    if let Ok(dirs) = std::fs::read_dir(&venv) {
        sites.extend(
            dirs.filter_map(|d| d.ok())
                .map(|d| d.path().join("site-packages")),
        );
    }
    for site in sites {
        for sub in ["nvidia/nccl/lib/libnccl.so.2", "torch/lib/libnccl.so.2"] {
            let c = site.join(sub);
            if c.is_file() {
                return Ok(c);
            }
        }
        searched.push(site.display().to_string());
    }
    Err(format!(
        "libnccl.so.2 not found (searched: {}); set NCCL_LIB to it (PyTorch ships it in the nvidia-nccl wheel), \
         or pass --no-baseline",
        searched.join(", ")
    ))
}

fn python_site_packages() -> Vec<PathBuf> {
    let script =
        "import site,sys\nfor p in site.getsitepackages()+[site.getusersitepackages()]: print(p)";
    let Ok(out) = std::process::Command::new("python3")
        .args(["-c", script])
        .output()
    else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect()
}

/// Links `lib` as `libnccl.so` into a private folder, prepends it to
/// `LD_LIBRARY_PATH` and re-executes this program. Returns only on failure.
fn reexec_with(lib: &Path) -> Result<std::convert::Infallible, String> {
    let dir = std::env::temp_dir().join(format!("nixl-ep-nccl-{}", std::process::id()));
    let link = dir.join("libnccl.so");
    let made = std::fs::create_dir_all(&dir).and_then(|()| {
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(lib, &link)
    });
    if let Err(e) = made {
        return Err(format!(
            "cannot link {} into {}: {e}",
            lib.display(),
            dir.display()
        ));
    }
    let mut path = OsString::from(&dir);
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(old);
    }
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find our own executable to re-execute: {e}"))?;
    tracing::info!(
        "loading NCCL from {} (re-executing with it on LD_LIBRARY_PATH)",
        lib.display()
    );
    let err = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", path)
        .env(REEXEC_MARK, &dir)
        .exec();
    Err(format!(
        "re-executing with NCCL on LD_LIBRARY_PATH failed: {err}"
    ))
}

/// The NCCL unique id, through the store: rank 0 makes it, the others read it.
fn exchange_id(group: &Group) -> Result<sys::ncclUniqueId> {
    let key = group.keys.nccl_id();
    let bytes: Vec<u8> = if group.rank == 0 {
        let id =
            result::get_uniqueid().map_err(|e| anyhow::anyhow!("ncclGetUniqueId failed: {e:?}"))?;
        let b: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
        group.put(&key, &Bytes(b.clone()))?;
        b
    } else {
        group.get(&key, 0, "NCCL unique id")?.0
    };
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    anyhow::ensure!(
        bytes.len() == 128,
        "the NCCL unique id in the store has {} bytes, not 128",
        bytes.len()
    );
    for (d, s) in id.internal.iter_mut().zip(&bytes) {
        *d = *s as _;
    }
    Ok(id)
}

/// Runs the baseline for both phases. NCCL calls can block forever when a
/// rank is gone, so they run on a worker thread; this thread waits with the
/// run's timeout and the group's probes.
/// `version`: from [`prepare`], which must have found NCCL.
pub fn baseline(
    group: &Group,
    gpu: &Gpu,
    version: String,
    pairs: &(PairBytes, PairBytes),
    warmup: u32,
    iters: u32,
) -> Result<NcclTimes> {
    let id = exchange_id(group)?;
    let send_max = pairs
        .0
        .send
        .iter()
        .sum::<u64>()
        .max(pairs.1.send.iter().sum());
    let recv_max = pairs
        .0
        .recv
        .iter()
        .sum::<u64>()
        .max(pairs.1.recv.iter().sum());
    let send = DeviceBuffer::zeroed(&gpu.ctx, send_max.max(16) as usize)?;
    let recv = DeviceBuffer::zeroed(&gpu.ctx, recv_max.max(16) as usize)?;
    let job = Job {
        ctx: gpu.ctx.clone(),
        stream: gpu.stream.clone(),
        rank: group.rank,
        world: group.world,
        id,
        pairs: pairs.clone(),
        warmup,
        iters,
        send,
        recv,
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(job.run());
    });
    let start = Instant::now();
    let limit = group.timeout() + Duration::from_secs(10);
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(r) => {
                let (dispatch_ns, combine_ns) = r?;
                return Ok(NcclTimes {
                    version,
                    dispatch_ns,
                    combine_ns,
                });
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the NCCL baseline thread died"),
        }
        if let Some(why) = group.probe() {
            bail!("{why} (during the NCCL baseline)");
        }
        if start.elapsed() > limit {
            bail!(
                "the NCCL baseline did not finish within {limit:?}: a rank stopped, or NCCL hangs (NCCL_DEBUG=INFO says more)"
            );
        }
    }
}

/// What the worker thread needs; it owns the buffers (a hung NCCL call then
/// keeps them alive with it).
struct Job {
    ctx: std::sync::Arc<cudarc::driver::CudaContext>,
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    rank: u32,
    world: u32,
    id: sys::ncclUniqueId,
    pairs: (PairBytes, PairBytes),
    warmup: u32,
    iters: u32,
    send: DeviceBuffer,
    recv: DeviceBuffer,
}

fn nccl<T>(what: &str, r: Result<T, result::NcclError>) -> Result<T> {
    r.map_err(|e| {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
        anyhow::anyhow!("{what} failed: {} ({:?})", text.to_string_lossy(), e.0)
    })
}

impl Job {
    fn run(self) -> Result<(Vec<f64>, Vec<f64>)> {
        self.ctx
            .bind_to_thread()
            .context("binding the CUDA context for NCCL")?;
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: comm is written by NCCL on success; the id came from rank 0.
        let comm = unsafe {
            nccl(
                "ncclCommInitRank",
                result::comm_init_rank(
                    comm.as_mut_ptr(),
                    self.world as i32,
                    self.id,
                    self.rank as i32,
                ),
            )?;
            comm.assume_init()
        };
        let out = self
            .phase(comm, &self.pairs.0)
            .and_then(|d| Ok((d, self.phase(comm, &self.pairs.1)?)));
        // SAFETY: the communicator is live and no longer used.
        let _ = unsafe { result::comm_destroy(comm) };
        out
    }

    /// `warmup + iters` all-to-alls of `pairs`, each between two events.
    fn phase(&self, comm: sys::ncclComm_t, pairs: &PairBytes) -> Result<Vec<f64>> {
        let stream = self.stream.cu_stream() as sys::cudaStream_t;
        let offsets = |v: &[u64]| -> Vec<u64> {
            v.iter()
                .scan(0, |a, &b| {
                    let o = *a;
                    *a += b;
                    Some(o)
                })
                .collect()
        };
        let (so, ro) = (offsets(&pairs.send), offsets(&pairs.recv));
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut events = Vec::new();
        for _ in 0..self.warmup + self.iters {
            let e0 = self.stream.record_event(timing)?;
            nccl("ncclGroupStart", result::group_start())?;
            for peer in 0..self.world as usize {
                // SAFETY: offsets and sizes stay within the buffers sized from these sums.
                unsafe {
                    if pairs.send[peer] > 0 {
                        let p = (self.send.addr() + so[peer]) as *const std::ffi::c_void;
                        nccl(
                            "ncclSend",
                            result::send(
                                p,
                                pairs.send[peer] as usize,
                                sys::ncclDataType_t::ncclUint8,
                                peer as i32,
                                comm,
                                stream,
                            ),
                        )?;
                    }
                    if pairs.recv[peer] > 0 {
                        let p = (self.recv.addr() + ro[peer]) as *mut std::ffi::c_void;
                        nccl(
                            "ncclRecv",
                            result::recv(
                                p,
                                pairs.recv[peer] as usize,
                                sys::ncclDataType_t::ncclUint8,
                                peer as i32,
                                comm,
                                stream,
                            ),
                        )?;
                    }
                }
            }
            nccl("ncclGroupEnd", result::group_end())?;
            events.push((e0, self.stream.record_event(timing)?));
        }
        self.stream.synchronize()?;
        events
            .iter()
            .skip(self.warmup as usize)
            .map(|(a, b)| Ok(f64::from(a.elapsed_ms(b)?) * 1e6))
            .collect()
    }
}
