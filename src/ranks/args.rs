//! The membership flags of every N-rank program (`ep`, `collectives`):
//! which run survives deaths (`--plan`, `--elastic`), how long a silent
//! rank is waited for, and how the launcher stops the plan's victims. Each
//! program flattens [`ElasticArgs`] into its own arguments.

use std::path::PathBuf;
use std::time::Duration;

use super::launch::KillSignal;
use crate::cli::UsageError;

/// `--plan`, `--elastic`, `--fault-timeout`, `--kill-signal`, `--kill-seed`,
/// `--step-us`, listed under "Elastic runs" in `--help` (flatten it last: the heading
/// holds for every argument after it).
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "Elastic runs")]
pub struct ElasticArgs {
    /// Elastic plan: a JSON file, a list of phases, each a list of ranks
    /// (upstream NIXL EP's format); -r: the launcher kills rank r at a
    /// random moment of that phase. `[[0,1,-2,3]]` starts 4 ranks and
    /// kills rank 2.
    #[arg(long, value_name = "FILE")]
    pub plan: Option<PathBuf>,

    /// Survive deaths in a run of --ranks N (or under torchrun): the same
    /// membership as a --plan run, with masking and agreement after every
    /// step.
    #[arg(long)]
    pub elastic: bool,

    /// Milliseconds a wait for another rank's data (or its report after a
    /// step) may take before that rank is masked and counted gone.
    #[arg(
        long,
        value_name = "MS",
        default_value = "1000",
        allow_negative_numbers = true
    )]
    pub fault_timeout: i64,

    /// How the launcher stops a rank the plan marks -r: KILL (it dies), or
    /// STOP (it freezes with its sockets open; killed at the end).
    #[arg(long, value_enum, ignore_case = true, default_value = "kill")]
    pub kill_signal: KillSignal,

    /// Seed of the moments the launcher kills the plan's -r ranks (a step
    /// in the first half of the phase and a fraction of a step, drawn per
    /// kill) [default: from the clock; printed].
    #[arg(long, value_name = "SEED")]
    pub kill_seed: Option<u64>,

    /// With --check-connection: what one step's work takes, µs (a pause
    /// before each agreement, standing in for the GPU's step, so that a
    /// kill can land inside a step).
    #[arg(long, value_name = "US", default_value_t = 2000)]
    pub step_us: u64,
}

impl ElasticArgs {
    /// `--step-us` as a duration.
    pub fn step_work(&self) -> Duration {
        Duration::from_micros(self.step_us)
    }

    /// Whether the run survives deaths: a plan, or `--elastic`.
    pub fn elastic(&self) -> bool {
        self.elastic || self.plan.is_some()
    }

    /// `--fault-timeout`. Errors: below 1 ms (a usage error).
    pub fn fault_timeout(&self) -> Result<Duration, UsageError> {
        super::membership::fault_timeout_arg(self.fault_timeout)
    }

    /// `--kill-seed`, or one from the clock ([`super::launch::kill_seed`]).
    pub fn kill_seed(&self) -> u64 {
        super::launch::kill_seed(self.kill_seed)
    }
}
