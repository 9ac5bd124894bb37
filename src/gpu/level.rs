//! The thread group that makes one collective device-API call, NIXL's
//! `nixl_gpu_level_t`: the one vocabulary of levels every program here
//! takes on its command line (`--level thread,warp,block`).

/// Which group of threads makes one collective `nixlPut` / `nixlAtomicAdd`
/// call (`nixl_gpu_level_t`). GRID exists in the header but is a silent
/// no-op on the cuda_ipc transport, so it is not offered.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// One thread per call; on cuda_ipc its put is a single-thread memcpy.
    Thread,
    /// One warp (32 lanes) per call, all lanes with the same arguments.
    Warp,
    /// One thread block per call, all threads with the same arguments.
    Block,
}

impl Level {
    /// Every level, smallest group first.
    pub const ALL: [Level; 3] = [Level::Thread, Level::Warp, Level::Block];

    /// Lower-case name, as on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Level::Thread => "thread",
            Level::Warp => "warp",
            Level::Block => "block",
        }
    }

    /// Threads that make one call.
    pub fn group_size(self, threads_per_block: u32) -> u32 {
        match self {
            Level::Thread => 1,
            Level::Warp => 32,
            Level::Block => threads_per_block,
        }
    }

    /// Default threads per block for a level: one caller's worth for THREAD
    /// and WARP, 1024 for BLOCK (the widest block, fastest single-block put).
    pub fn default_threads(self) -> u32 {
        match self {
            Level::Thread => 1,
            Level::Warp => 32,
            Level::Block => 1024,
        }
    }

    /// Channels a grid of `blocks` × `threads` has at this level: one per
    /// group that makes a call.
    pub fn channels(self, blocks: u32, threads: u32) -> u32 {
        blocks * (threads / self.group_size(threads))
    }
}

impl std::str::FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Level::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| format!("unknown level '{s}' (thread, warp, block)"))
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl clap::ValueEnum for Level {
    fn value_variants<'a>() -> &'a [Self] {
        &Self::ALL
    }
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self {
            Level::Thread => "one thread per call; on cuda_ipc its put is a single-thread memcpy",
            Level::Warp => "one warp (32 lanes) per call, every lane with the same arguments",
            Level::Block => "one thread block per call, every thread with the same arguments",
        };
        Some(clap::builder::PossibleValue::new(self.name()).help(help))
    }
}
