//! Finding and loading NCCL, for the same-run baselines of the programs on
//! this layer (`ep`'s all-to-all, `collectives`' allreduce and kin).
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

use anyhow::{Result, bail};
use cudarc::nccl::{result, sys};
use serde::{Deserialize, Serialize};

use super::group::Group;
use crate::gpu::Gpu;
use crate::group::{Bytes, Entry, Member};

/// Whether NCCL can be used in this process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NcclStatus {
    /// Loaded: NCCL's version, e.g. `2.27.7`.
    Ready(String),
    /// Why not, with what to do about it.
    Unavailable(String),
}

/// `NCCL 2.27.7`, or why it is not used, as the ranks print it.
impl std::fmt::Display for NcclStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NcclStatus::Ready(v) => write!(f, "NCCL {v}"),
            NcclStatus::Unavailable(why) => write!(f, "NCCL not used: {why}"),
        }
    }
}

/// Set (to the library's path) in the re-executed process.
const REEXEC_MARK: &str = "NIXL_NCCL_REEXEC";

/// A rank's NCCL at start-up: [`prepare`]d when the program runs its
/// same-run baseline (`baseline`), else unavailable for `--no-baseline`;
/// and NVLink SHARP (`NCCL_NVLS_ENABLE`) off unless the user set it, as
/// the launcher sets it for its ranks. `graphs`: NCCL's calls will be
/// captured into CUDA graphs ([`GRAPH_MIXING`]). Call first, before any
/// thread or connection exists: it may re-execute the process.
pub fn start(baseline: bool, graphs: bool) -> NcclStatus {
    let status = match baseline {
        true => prepare(),
        false => NcclStatus::Unavailable("--no-baseline".into()),
    };
    let mut defaults = vec![("NCCL_NVLS_ENABLE", "0")];
    if graphs {
        defaults.push(GRAPH_MIXING);
    }
    for (name, value) in defaults {
        if std::env::var_os(name).is_none() {
            // SAFETY: no other thread exists yet (this function's contract).
            unsafe { std::env::set_var(name, value) };
        }
    }
    status
}

/// NCCL's support for graphs and eager calls outstanding at once on one
/// communicator, off for the baselines captured into CUDA graphs (unless
/// the user set it). On, the captured calls never ran on two H100s: both
/// ranks waited forever, no kernel running, though the eager calls before
/// the capture had finished (NCCL 2.28.3). A baseline never has a graph
/// beside other NCCL work: its eager warm-up ends before the capture, and
/// one graph runs at a time.
pub const GRAPH_MIXING: (&str, &str) = ("NCCL_GRAPH_MIXING_SUPPORT", "0");

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

/// Finds `libnccl.so.2`: `NCCL_LIB` (a file or a folder; set, it is the
/// only place looked at, so a wrong one is named rather than passed over),
/// else the site-packages of `python3` on PATH and of the project's
/// `.venv`, under `nvidia/nccl/lib` and `torch/lib`.
pub fn find_library() -> Result<PathBuf, String> {
    let mut searched = Vec::new();
    if let Some(p) = std::env::var_os("NCCL_LIB").map(PathBuf::from) {
        for c in [p.clone(), p.join("libnccl.so.2"), p.join("libnccl.so")] {
            if c.is_file() {
                return Ok(c);
            }
        }
        return Err(format!(
            "NCCL_LIB={} holds no libnccl.so.2: point it at the library or its folder, unset it to search \
             Python's site-packages, or pass --no-baseline",
            p.display()
        ));
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
    let dir = std::env::temp_dir().join(format!("nixl-nccl-{}", std::process::id()));
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

/// NCCL's error as one naming the call and NCCL's own words:
/// `ncclCommInitRank failed: unhandled system error (ncclSystemError)`.
pub fn check<T>(what: &str, r: Result<T, result::NcclError>) -> Result<T> {
    r.map_err(|e| {
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string.
        let text = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(e.0)) };
        anyhow::anyhow!("{what} failed: {} ({:?})", text.to_string_lossy(), e.0)
    })
}

/// A live NCCL communicator of this rank, destroyed when dropped.
pub struct Comm(sys::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread, one at a time;
// it is only moved from the thread that made it to the rank's thread.
unsafe impl Send for Comm {}

impl Comm {
    /// `ncclCommInitRank`: blocks until all `world` ranks join with `id`
    /// (call it on a thread the caller watches). The CUDA context must be
    /// bound to this thread.
    pub fn init(world: u32, id: sys::ncclUniqueId, rank: u32) -> Result<Self> {
        let mut comm = std::mem::MaybeUninit::uninit();
        // SAFETY: NCCL writes comm on success; the id came from rank 0.
        unsafe {
            check(
                "ncclCommInitRank",
                result::comm_init_rank(comm.as_mut_ptr(), world as i32, id, rank as i32),
            )?;
            Ok(Self(comm.assume_init()))
        }
    }

    /// The raw handle, for NCCL's calls.
    pub fn raw(&self) -> sys::ncclComm_t {
        self.0
    }

    /// `ncclCommAbort`: frees the communicator without waiting for its
    /// queued work (which it aborts), for the error paths, where a peer
    /// may be gone and `ncclCommDestroy` (the drop) could wait forever.
    pub fn abort(self) {
        let comm = std::mem::ManuallyDrop::new(self);
        // SAFETY: the communicator is live; it is not used again.
        let _ = unsafe { result::comm_abort(comm.0) };
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: the communicator is live and no call on it is queued
        // (every stream using it was synchronised first).
        let _ = unsafe { result::comm_destroy(self.0) };
    }
}

/// NCCL's unique id through the store under `entry`: rank 0 makes and
/// writes it, the others wait for it (`member`'s deadline and probes).
pub fn exchange_id(member: &Member, entry: &Entry<Bytes>, rank: u32) -> Result<sys::ncclUniqueId> {
    let bytes = match rank {
        0 => {
            let id = result::get_uniqueid()
                .map_err(|e| anyhow::anyhow!("ncclGetUniqueId failed: {e:?}"))?;
            let b: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            member.put(entry, &Bytes(b.clone()))?;
            b
        }
        _ => member.get(entry, 0, "NCCL unique id")?.0,
    };
    anyhow::ensure!(
        bytes.len() == 128,
        "the NCCL unique id in the store has {} bytes, not 128",
        bytes.len()
    );
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    for (d, s) in id.internal.iter_mut().zip(&bytes) {
        *d = *s as _;
    }
    Ok(id)
}

/// Makes the communicator of all ranks (rank 0's unique id through the
/// store under `nccl_id`). `ncclCommInitRank` blocks until every rank
/// joins, so it runs [`watched`]. Errors: NCCL's own message, a peer that
/// gave up, or the group's timeout.
pub fn connect(group: &Group, gpu: &Gpu) -> Result<Comm> {
    let id = exchange_id(group, &group.entry("nccl_id"), group.rank)?;
    let (world, rank) = (group.world, group.rank);
    watched(group, gpu, group.timeout(), "ncclCommInitRank", move || {
        Comm::init(world, id, rank)
    })
}

/// Runs `work` (NCCL calls that may block the host until the peers take
/// part) on a thread bound to `gpu`'s context, while this one asks the
/// group's probes every 100 ms whether a peer gave up and gives up itself
/// after `limit`. A thread stuck in NCCL is left behind: the caller fails,
/// and must not free what the thread or its queued work still uses (see
/// [`Comm::abort`]). Errors: `work`'s, a peer's, or `what` past `limit`.
pub fn watched<T: Send + 'static>(
    group: &Group,
    gpu: &Gpu,
    limit: Duration,
    what: &str,
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let ctx = gpu.ctx.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let done = ctx
            .bind_to_thread()
            .map_err(anyhow::Error::from)
            .and_then(|()| work());
        let _ = tx.send(done);
    });
    let start = Instant::now();
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(done) => return done,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => bail!("the thread running {what} died"),
        }
        if let Some(why) = group.probe() {
            bail!("{why} (during {what})");
        }
        if start.elapsed() > limit {
            bail!("{what} did not return within {limit:?} (NCCL_DEBUG=INFO says why)");
        }
    }
}

/// A rank's NCCL setup outcome as the others read it (`rank/<r>/nccl`):
/// `Some(why)` when it failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NcclOutcome(pub Option<String>);

crate::json_value!(NcclOutcome => "NCCL setup outcome");

/// Connects NCCL over all ranks when every rank loaded it (`statuses[r]`:
/// rank r's [`prepare`]); otherwise, or when NCCL refuses on any rank,
/// returns why, and every rank returns the same (each writes its outcome
/// under `rank/<r>/nccl` and reads all), so all agree on whether the
/// baseline runs. NCCL refuses ranks that share a GPU ("Duplicate GPU
/// detected"); the communicator is still tried, and with `ranks_on_gpu` > 1
/// the reason says so. Errors (the outer `Result`): the store.
pub fn connect_all(
    g: &Group,
    gpu: &Gpu,
    statuses: &[&NcclStatus],
    ranks_on_gpu: u32,
) -> Result<Result<Comm, String>> {
    if let Some((r, why)) = statuses.iter().enumerate().find_map(|(r, s)| match s {
        NcclStatus::Unavailable(why) => Some((r, why.clone())),
        NcclStatus::Ready(_) => None,
    }) {
        return Ok(Err(format!("rank {r}: {why}")));
    }
    let shared = match ranks_on_gpu {
        0 | 1 => String::new(),
        n => format!(" ({n} ranks share a GPU, which NCCL refuses: \"Duplicate GPU detected\")"),
    };
    let mine = connect(g, gpu).map_err(|e| anyhow::anyhow!("{e:#}{shared}"));
    let status = NcclOutcome(mine.as_ref().err().map(|e| format!("{e:#}")));
    g.put(&g.rank_entry(g.rank, "nccl"), &status)?;
    let all: Vec<NcclOutcome> = g.gather_ranks("nccl", "NCCL setup outcome")?;
    if let Some((r, why)) = all
        .iter()
        .enumerate()
        .find_map(|(r, o)| o.0.as_ref().map(|w| (r, w)))
    {
        // A peer's failure: ours is not waited on (abort, not destroy).
        mine.map(Comm::abort).ok();
        return Ok(Err(format!("rank {r}: {why}")));
    }
    Ok(mine.map_err(|e| format!("{e:#}")))
}
