//! Who this process is: torchrun's environment.
//!
//! `torchrun --no-python --nproc-per-node=N ep …` and `ep --ranks N` both
//! start one process per rank with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `LOCAL_WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT` set (so do
//! `collectives`' and any program on this layer). With
//! `TORCHELASTIC_USE_AGENT_STORE=True` (torchrun's default) torchrun's agent
//! already hosts a c10d TCPStore at `MASTER_ADDR:MASTER_PORT` and every rank
//! joins it as a client; otherwise rank 0 hosts the store. Our launcher
//! ([`super::launch`]: `--ranks N`, `--plan FILE`) hosts the store itself
//! and adds `NIXL_EP_INCARNATION` (the plan's phase that started the
//! process): the ranks then join the launcher's store, so any rank may die.

use crate::cli::UsageError;

/// The program the ranks run: it names the store namespace its keys live
/// in, its launcher in messages, and its NIXL agents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Program {
    /// The command, e.g. `ep`: `[ep]` lines, "the ep launcher", `ep-rank-2`.
    pub name: &'static str,
    /// The key namespace, e.g. `nixl_ep` (a name torch never uses).
    pub namespace: &'static str,
}

impl Program {
    /// The program's `main` once its arguments are parsed: its lines
    /// tagged ([`RankEnv::tag`]), `run` run, and an error turned into the
    /// exit status ([`crate::cli::exit_status`]: 2 bad arguments, 3 wrong
    /// data, 1 any other failure).
    pub fn main<A>(
        self,
        args: A,
        run: impl FnOnce(A) -> anyhow::Result<std::process::ExitCode>,
    ) -> std::process::ExitCode {
        let tag = RankEnv::tag(self.name);
        crate::logging::init(&tag);
        run(args).unwrap_or_else(|e| crate::cli::exit_status(&tag, &e))
    }
}

/// One rank's place in the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankEnv {
    /// What the ranks run.
    pub program: Program,
    pub rank: u32,
    pub world: u32,
    /// Rank among the processes of this machine: picks the GPU.
    pub local_rank: u32,
    pub local_world: u32,
    pub master_addr: String,
    pub master_port: u16,
    /// Join torchrun's store instead of having rank 0 host one.
    pub agent_store: bool,
    /// `TORCHELASTIC_RESTART_COUNT`: names torch's key namespace.
    pub restart_count: u32,
    /// `NIXL_EP_INCARNATION`: the plan's phase that started this process
    /// (0 under torchrun).
    pub incarnation: usize,
    /// Started by `ep`'s own launcher (`NIXL_EP_INCARNATION` set), which
    /// hosts the store: every rank joins it as a client.
    pub launcher_store: bool,
}

/// The variable `ep`'s launcher sets: the phase that started the process.
pub const INCARNATION_VAR: &str = "NIXL_EP_INCARNATION";

impl RankEnv {
    /// The run's rank count: `WORLD_SIZE` under a launcher (torchrun),
    /// else `--ranks` (default 2). Both given and different is a usage error.
    pub fn world(env: Option<&Self>, ranks: Option<u32>) -> Result<u32, UsageError> {
        match (env, ranks) {
            (Some(e), Some(n)) if n != e.world => Err(UsageError(format!(
                "--ranks {n} but WORLD_SIZE={}: drop --ranks under torchrun",
                e.world
            ))),
            (Some(e), _) => Ok(e.world),
            (None, n) => Ok(n.unwrap_or(2)),
        }
    }

    /// The `[tag]` of this process's lines: `rank R` for a rank, else the
    /// program's name (the launcher).
    pub fn tag(program: &str) -> String {
        match std::env::var("RANK") {
            Ok(r) => format!("rank {r}"),
            Err(_) => program.into(),
        }
    }

    /// Reads the process environment; `None` when `RANK` is unset (this
    /// process is not a rank: it launches them).
    pub fn from_env(program: Program) -> Result<Option<Self>, UsageError> {
        Self::from_vars(program, |k| std::env::var(k).ok())
    }

    /// As [`RankEnv::from_env`], from any lookup (testable).
    pub fn from_vars(
        program: Program,
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, UsageError> {
        let Some(rank) = get("RANK") else {
            return Ok(None);
        };
        let num = |name: &str| -> Result<Option<u32>, UsageError> {
            get(name).map(|v| number(name, &v)).transpose()
        };
        let rank = number("RANK", &rank)?;
        let world = num("WORLD_SIZE")?.ok_or_else(|| {
            UsageError("RANK is set but WORLD_SIZE is not: set both (torchrun does)".into())
        })?;
        if world == 0 || rank >= world {
            return Err(UsageError(format!(
                "RANK={rank} with WORLD_SIZE={world}: RANK must be below WORLD_SIZE"
            )));
        }
        let local_rank = num("LOCAL_RANK")?.unwrap_or(rank);
        let local_world = num("LOCAL_WORLD_SIZE")?.unwrap_or(world);
        let master_port = port(get("MASTER_PORT"))?;
        Ok(Some(Self {
            program,
            rank,
            world,
            local_rank,
            local_world,
            master_addr: get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
            master_port,
            agent_store: get("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True"),
            restart_count: num("TORCHELASTIC_RESTART_COUNT")?.unwrap_or(0),
            incarnation: num(INCARNATION_VAR)?.unwrap_or(0) as usize,
            launcher_store: get(INCARNATION_VAR).is_some(),
        }))
    }

    /// The prefix of every key this run sets. On our own store the
    /// program's namespace (`nixl_ep/`); on torchrun's store
    /// `/worker/attempt_<restart>/nixl_ep/`, which is where torch's
    /// `PrefixStore(f"/worker/attempt_{n}", store)` puts a worker's key
    /// `nixl_ep/…`, so our keys sit in the workers' namespace under a name
    /// torch never uses.
    pub fn key_prefix(&self) -> String {
        let ns = self.program.namespace;
        if self.agent_store {
            format!("/worker/attempt_{}/{ns}/", self.restart_count)
        } else {
            format!("{ns}/")
        }
    }

    /// How the ranks name this program's launcher: `the ep launcher`.
    pub fn launcher(&self) -> String {
        format!("the {} launcher", self.program.name)
    }
}

/// `name`'s value `v` as a number. Errors: it is not one.
fn number(name: &str, v: &str) -> Result<u32, UsageError> {
    v.trim()
        .parse()
        .map_err(|_| UsageError(format!("{name}={v:?} is not a number")))
}

/// `MASTER_PORT`, which a rank needs. Errors: unset, or not a TCP port.
fn port(v: Option<String>) -> Result<u16, UsageError> {
    let Some(p) = v else {
        return Err(UsageError(
            "RANK is set but MASTER_PORT is not: set MASTER_ADDR and MASTER_PORT".into(),
        ));
    };
    (p.trim().parse::<u16>().ok().filter(|&p| p > 0))
        .ok_or_else(|| UsageError(format!("MASTER_PORT={p:?} is not a TCP port (1..65535)")))
}

#[cfg(test)]
mod tests {
    use super::*;

    const EP: Program = Program {
        name: "ep",
        namespace: "nixl_ep",
    };

    fn env(vars: &[(&str, &str)]) -> Result<Option<RankEnv>, UsageError> {
        RankEnv::from_vars(EP, |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn torchrun_variables() {
        assert_eq!(env(&[]).unwrap(), None);
        let e = env(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCHELASTIC_RESTART_COUNT", "1"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((e.rank, e.world, e.local_rank, e.local_world), (2, 4, 0, 2));
        assert!(e.agent_store);
        assert_eq!(e.key_prefix(), "/worker/attempt_1/nixl_ep/");
        let e = env(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "1234")])
            .unwrap()
            .unwrap();
        assert_eq!(
            (
                e.local_rank,
                e.master_addr.as_str(),
                e.key_prefix().as_str()
            ),
            (0, "127.0.0.1", "nixl_ep/")
        );
        for (vars, needle) in [
            (
                &[("RANK", "3"), ("WORLD_SIZE", "3"), ("MASTER_PORT", "1")][..],
                "below WORLD_SIZE",
            ),
            (
                &[("RANK", "0"), ("MASTER_PORT", "1")][..],
                "WORLD_SIZE is not",
            ),
            (&[("RANK", "x"), ("WORLD_SIZE", "3")][..], "not a number"),
            (&[("RANK", "0"), ("WORLD_SIZE", "3")][..], "MASTER_PORT"),
            (
                &[("RANK", "0"), ("WORLD_SIZE", "3"), ("MASTER_PORT", "0")][..],
                "TCP port",
            ),
        ] {
            let err = env(vars).unwrap_err().0;
            assert!(err.contains(needle), "{vars:?}: {err}");
        }
    }
}
