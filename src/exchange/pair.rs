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

/// A program's two roles, as `--role` takes them.
pub trait Roles: Copy + std::fmt::Debug + clap::ValueEnum + Send + Sync + 'static {
    /// Both, in the order they start: the side whose memory is written first.
    const BOTH: [Self; 2];
    /// The agent's name and the log prefix (`target`, `receiver`).
    fn name(self) -> &'static str;
}

impl Roles for Role {
    const BOTH: [Self; 2] = [Role::Target, Role::Initiator];
    fn name(self) -> &'static str {
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
pub struct PairArgs<R: Roles> {
    /// Run only this role (the exchange must already be up: the store at
    /// --host/--port, or etcd); without it, this process hosts the exchange
    /// and runs both roles as child processes.
    #[arg(long, value_enum)]
    pub role: Option<R>,
    #[command(flatten)]
    pub exchange: ExchangeArgs,
    /// Seconds any wait may take.
    #[arg(short, long, default_value = "30", value_parser = parse_timeout)]
    pub timeout: Duration,
}

impl<R: Roles> PairArgs<R> {
    /// [`main`] with these options.
    pub fn main(
        &self,
        deadline: Duration,
        role_main: impl FnOnce(R, &Agent, &mut Exchange) -> Result<()>,
    ) -> ExitCode {
        main(&self.exchange, self.timeout, self.role, deadline, role_main)
    }
}

/// The whole program. With a `role`: joins the exchange, creates the
/// role's agent (polled: [`create_polled_agent`]), runs `role_main` and
/// withdraws what it published, on every path. Without: hosts the exchange
/// ([`ExchangeHost`]) and runs this program again for both roles, for at
/// most `deadline`. `timeout` bounds every wait of the exchange. Errors
/// become the exit status.
pub fn main<R: Roles>(
    exchange: &ExchangeArgs,
    timeout: Duration,
    role: Option<R>,
    deadline: Duration,
    role_main: impl FnOnce(R, &Agent, &mut Exchange) -> Result<()>,
) -> ExitCode {
    let who = role.map_or("main", R::name);
    crate::logging::init(who);
    let result = match role {
        None => run_both::<R>(exchange, timeout, deadline),
        Some(role) => run_role(exchange, timeout, role, role_main).map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|e| exit_status(who, &e))
}

fn run_role<R: Roles>(
    args: &ExchangeArgs,
    timeout: Duration,
    role: R,
    role_main: impl FnOnce(R, &Agent, &mut Exchange) -> Result<()>,
) -> Result<()> {
    // Before the agent: in NIXL's own modes the agent reads the
    // environment that joining sets.
    let mut exchange = Exchange::join(args, timeout)?;
    let nixl = create_polled_agent(role.name())?;
    let result = role_main(role, &nixl.agent, &mut exchange);
    exchange.withdraw(&nixl.agent);
    result
}

fn run_both<R: Roles>(
    args: &ExchangeArgs,
    timeout: Duration,
    deadline: Duration,
) -> Result<ExitCode> {
    let names = R::BOTH.map(R::name);
    let host = ExchangeHost::start(args, &names, timeout)?;
    crate::say!("[main] Starting {} and {} processes...", names[0], names[1]);
    let port = host.port().to_string();
    let role = |name| RoleSpec::again(name, &["--role", name, "--port", &port]);
    let exits = launch::run_roles(names.map(role).to_vec(), deadline)?;
    drop(host);
    if exits.iter().all(|e| e.code == 0) {
        crate::say!("[main] ✓ Test Complete - Both processes succeeded!");
    }
    Ok(launch::finish("main", &exits))
}
