//! The GPU run of one rank (placeholder while the pieces land).

use std::path::PathBuf;

use anyhow::Result;

use super::config::RunConfig;
use super::env::RankEnv;

/// Fault injection for tests: corrupt one value so the checks must fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corrupt {
    Dispatch,
    Combine,
}

/// What the run needs beyond the shared configuration.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    pub gpus: Option<u32>,
    pub json: Option<PathBuf>,
    pub csv: Option<PathBuf>,
    pub ref_put_gbps: Option<f64>,
    pub corrupt: Option<Corrupt>,
}

pub fn run(_env: &RankEnv, _cfg: &RunConfig, _opts: &RunOptions) -> Result<()> {
    anyhow::bail!("not yet")
}
