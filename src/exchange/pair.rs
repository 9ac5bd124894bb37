//! The frame of the two-process host-API examples (`two_proc`,
//! `notifications`): one command line for the roles and the exchange, one
//! way to start the roles ([`crate::launch`]) and one way to exit
//! ([`crate::cli::exit_status`]: 0 success, 1 failure, 2 bad arguments,
//! 3 wrong data).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use nixl_sys::Agent;

use super::{Exchange, ExchangeArgs, ExchangeHost};
use crate::cli::{exit_status, parse_timeout};
use crate::launch::{self, RoleSpec};
use crate::nixl::agent::create_polled_agent;

/// The two roles of a host-API pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Registers memory, publishes it, waits for the initiator's transfers.
    Target,
    /// Loads the target's metadata and descriptors, transfers, notifies.
    Initiator,
}

impl Role {
    /// `target` or `initiator`: the agent's name and the log prefix.
    pub fn name(self) -> &'static str {
        match self {
            Role::Target => "target",
            Role::Initiator => "initiator",
        }
    }
}

/// The options every pair takes (flatten into the program's arguments,
/// whose parser must set clap's `args_override_self`: a role's process
/// gets the parent's arguments with its `--role` and `--port` after them).
#[derive(Clone, Debug, clap::Args)]
pub struct PairArgs {
    /// Run only this role (the exchange must already be up: the store at
    /// --host/--port, or etcd); without it, this process hosts the exchange
    /// and runs both roles as child processes.
    #[arg(long, value_enum)]
    pub role: Option<Role>,
    #[command(flatten)]
    pub exchange: ExchangeArgs,
    /// Seconds any wait may take.
    #[arg(short, long, default_value = "30", value_parser = parse_timeout)]
    pub timeout: Duration,
}

/// The whole program. With `--role`: joins the exchange, creates the
/// role's agent (polled: [`create_polled_agent`]), runs `role_main` and
/// withdraws what it published, on every path. Without: hosts the exchange
/// ([`ExchangeHost`]) and runs this program again for the target and the
/// initiator, for at most `deadline`. Errors become the exit status.
pub fn main(
    args: &PairArgs,
    deadline: Duration,
    role_main: impl FnOnce(Role, &Agent, &mut Exchange) -> Result<()>,
) -> ExitCode {
    let who = args.role.map_or("main", Role::name);
    crate::logging::init(who);
    let result = match args.role {
        None => run_both(args, deadline),
        Some(role) => run_role(args, role, role_main).map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|e| exit_status(who, &e))
}

fn run_role(
    args: &PairArgs,
    role: Role,
    role_main: impl FnOnce(Role, &Agent, &mut Exchange) -> Result<()>,
) -> Result<()> {
    // Before the agent: in NIXL's own modes the agent reads the
    // environment that joining sets.
    let mut exchange = Exchange::join(&args.exchange, args.timeout)?;
    let nixl = create_polled_agent(role.name())?;
    let result = role_main(role, &nixl.agent, &mut exchange);
    exchange.withdraw(&nixl.agent);
    result
}

fn run_both(args: &PairArgs, deadline: Duration) -> Result<ExitCode> {
    let names = [Role::Target.name(), Role::Initiator.name()];
    let host = ExchangeHost::start(&args.exchange, &names, args.timeout)?;
    crate::say!("[main] Starting target and initiator processes...");
    let port = host.port().to_string();
    let role = |name| RoleSpec::again(name, &["--role", name, "--port", &port]);
    let exits = launch::run_roles(names.map(role).to_vec(), deadline)?;
    drop(host);
    if exits.iter().all(|e| e.code == 0) {
        crate::say!("[main] ✓ Test Complete - Both processes succeeded!");
    }
    Ok(launch::finish("main", &exits))
}
