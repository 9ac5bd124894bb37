//! The metadata exchange of the two-process examples: how each agent gets
//! its peer's agent metadata, and how the initiator gets the target's
//! descriptor list, chosen with `--metadata`:
//!
//! | mode | agent metadata | descriptors |
//! |---|---|---|
//! | `tcpstore` | our TCPStore: `{agent}_meta` ([`crate::store`]) | the store: `{agent}_descs` |
//! | `etcd` | NIXL's own etcd client (`NIXL_ETCD_ENDPOINTS`; `sendLocalMD` / `fetchRemoteMD`) | a notification `DESCS:<nixlSerDes bytes>` |
//! | `nixl-tcpstore` | NIXL's own c10d client (`NIXL_TCPSTORE_ENDPOINT`) against our TCPStore server | a notification, as for etcd |
//!
//! NIXL's built-in exchange carries agent metadata only, so in those modes
//! the descriptors travel as a notification, as the etcd mode of upstream's Python examples
//! (NIXL PR #980) does.
//! The handshake cannot deadlock because no side waits before it has done
//! everything the other side waits for:
//!
//! 1. both sides publish their own metadata first ([`Exchange::publish`]);
//! 2. the target (the side whose memory is written or read) waits for the
//!    initiator's metadata, then sends `DESCS:` once ([`Exchange::offer_descs`]);
//! 3. the initiator waits for the target's metadata and for `DESCS:`
//!    ([`Exchange::load_peer`], [`Exchange::take_descs`]).
//!
//! Step 2 depends only on step 1 of the peer, and step 3 only on steps 1
//! and 2 of the peer. One `DESCS:` suffices (upstream's Python examples repeat `READY` until
//! answered): once the peer's metadata is loaded NIXL has its UCX endpoint,
//! and UCX delivers the active message reliably even if the peer has not
//! fetched our metadata yet — the receiving side needs no metadata to
//! receive a notification.
//!
//! Two things users of the built-in modes meet:
//!
//! - NIXL loads whatever it finds under the peer's name. Keys left by a
//!   crashed run make `fetchRemoteMD` load a dead agent (or fail to
//!   deserialize), and NIXL's etcd watcher only reacts to deletions, not to
//!   the new peer's later publication. [`ExchangeHost::start`] therefore
//!   deletes the role agents' keys before starting them.
//! - At exit in etcd mode NIXL may log `Failed to invalidate remote
//!   metadata for agent: <peer>: NIXL_ERR_NOT_FOUND`. It is harmless:
//!   nixl-sys's `Agent` drop invalidates every fetched peer, then NIXL's
//!   metadata thread drains the etcd watcher's queued "peer deleted its
//!   keys" event and invalidates the same peer again.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nixl_sys::Agent;

pub mod etcd;
pub mod pair;

use self::etcd::Etcd;
use crate::cli::StoreBackend;
use crate::nixl::serdes::DescList;
use crate::nixl::view::load_peer as load_peer_blob;
use crate::nixl::xfer::NotifInbox;
use crate::store::native::TcpStore;
use crate::store::{self, Store, StoreOptions};

/// Where agent metadata travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MetadataMode {
    /// Our TCPStore (hosted by the parent process) carries metadata and descriptors.
    Tcpstore,
    /// NIXL's built-in etcd exchange; descriptors as a notification.
    Etcd,
    /// NIXL's built-in c10d TCPStore client against our server; descriptors as a notification.
    NixlTcpstore,
}

impl MetadataMode {
    /// The `--metadata` value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Tcpstore => "tcpstore",
            Self::Etcd => "etcd",
            Self::NixlTcpstore => "nixl-tcpstore",
        }
    }

    /// Whether the mode needs a TCPStore server (ours, or torch's).
    pub fn needs_store(self) -> bool {
        self != Self::Etcd
    }
}

/// The exchange options every two-process example takes (flatten into
/// its clap arguments).
#[derive(Clone, Debug, clap::Args)]
pub struct ExchangeArgs {
    /// How agent metadata travels: our TCPStore, NIXL's etcd client, or
    /// NIXL's TCPStore client against our server.
    #[arg(long, value_enum, default_value_t = MetadataMode::Tcpstore)]
    pub metadata: MetadataMode,
    /// TCPStore host (tcpstore and nixl-tcpstore).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// TCPStore port (0 = any free port; only in the process that hosts it).
    #[arg(short, long, default_value_t = 9998)]
    pub port: u16,
    /// TCPStore implementation (the server the parent hosts, and our client).
    #[arg(long, value_enum, default_value_t = StoreBackend::Native)]
    pub store: StoreBackend,
    /// etcd endpoints for --metadata etcd, as NIXL_ETCD_ENDPOINTS takes them
    /// [default: $NIXL_ETCD_ENDPOINTS, else http://127.0.0.1:2379].
    #[arg(long)]
    pub etcd_endpoints: Option<String>,
}

impl ExchangeArgs {
    /// The etcd endpoints in effect.
    pub fn etcd_endpoints(&self) -> String {
        self.etcd_endpoints
            .clone()
            .or_else(|| {
                std::env::var("NIXL_ETCD_ENDPOINTS")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .unwrap_or_else(|| "http://127.0.0.1:2379".into())
    }

    /// The same options as command-line arguments for a role process,
    /// with the port the host actually bound.
    pub fn to_args(&self, port: u16) -> Vec<String> {
        let mut v: Vec<String> = vec![
            "--metadata".into(),
            self.metadata.name().into(),
            "--host".into(),
            self.host.clone(),
            "--port".into(),
            port.to_string(),
            "--store".into(),
            self.store.name().into(),
        ];
        if self.metadata == MetadataMode::Etcd {
            v.extend(["--etcd-endpoints".into(), self.etcd_endpoints()]);
        }
        v
    }

    fn store_options(&self, is_server: bool, timeout: Duration) -> StoreOptions {
        StoreOptions {
            host: self.host.clone(),
            port: self.port,
            is_server,
            num_workers: None,
            wait_workers: false,
            timeout,
        }
    }
}

/// What the parent process of a two-process example provides for the
/// exchange while its role processes run: the TCPStore server
/// (`tcpstore`, `nixl-tcpstore`), or a checked etcd cleared of the role
/// agents' stale keys (`etcd`).
pub struct ExchangeHost {
    _store: Option<Box<dyn Store>>,
    port: u16,
}

impl ExchangeHost {
    /// Starts what `args.metadata` needs. `agents` are the agent names the
    /// roles will use: in etcd mode their keys from an earlier run are
    /// deleted first (an agent that finds a dead peer's metadata would
    /// connect to it and fail), like upstream's Python examples' `etcdctl del --prefix`, but
    /// limited to those agents.
    ///
    /// Errors: the store port is taken ([`store::StoreError::Bind`]), etcd
    /// does not answer ([`etcd::EtcdError::Unreachable`]).
    pub fn start(args: &ExchangeArgs, agents: &[&str], timeout: Duration) -> Result<Self> {
        if !args.metadata.needs_store() {
            let etcd =
                Etcd::from_endpoints(&args.etcd_endpoints(), timeout.min(Duration::from_secs(5)))?;
            let version = etcd.version()?;
            let ns = namespace();
            let mut stale = 0;
            for a in agents {
                stale += etcd.delete_prefix(&agent_prefix(&ns, a))?;
            }
            crate::say!(
                "[main] Using etcd {version} at {} for NIXL's metadata exchange (cleared {stale} stale key(s))",
                etcd.endpoint()
            );
            return Ok(Self {
                _store: None,
                port: args.port,
            });
        }
        let opts = args.store_options(true, timeout);
        // A taken or privileged port is the user's to change (exit 2), said once.
        let usage = |e: store::StoreError| match e {
            e @ store::StoreError::Bind { .. } => crate::cli::store_error(e),
            e => crate::cli::store_error(e).context("starting the store"),
        };
        let (store, port): (Box<dyn Store>, u16) = match args.store {
            // The native store reports the port it bound (useful with --port 0).
            StoreBackend::Native => {
                let s = TcpStore::open(&opts).map_err(usage)?;
                let port = s.port();
                (Box::new(s), port)
            }
            StoreBackend::Libtorch => {
                if args.port == 0 {
                    bail!(
                        "--store libtorch needs an explicit --port (torch's server does not report the port it bound)"
                    );
                }
                (args.store.open(&opts).map_err(usage)?, args.port)
            }
        };
        crate::say!("[main] Started TCPStore on port {port}");
        Ok(Self {
            _store: Some(store),
            port,
        })
    }

    /// The store port the roles must use (the bound one when `--port 0`).
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// The etcd key namespace NIXL uses (`NIXL_ETCD_NAMESPACE` or its default).
pub fn namespace() -> String {
    std::env::var("NIXL_ETCD_NAMESPACE")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| etcd::DEFAULT_NAMESPACE.into())
}

/// The etcd prefix under which NIXL keeps agent `agent`'s keys: NIXL joins
/// namespace and agent name with `/` even when the namespace ends in one
/// (`/nixl/agents//target/metadata`), so this does the same.
pub fn agent_prefix(namespace: &str, agent: &str) -> String {
    format!("{namespace}/{agent}/")
}

/// How often an unanswered `fetchRemoteMD` is issued again, ms. NIXL's etcd
/// backend watches for the key for 5 s (`etcdWatchTimeout`) and then gives
/// up without retrying; its TCPStore backend keeps trying for
/// `NIXL_TCPSTORE_TIMEOUT_MS`.
const REFETCH: Duration = Duration::from_millis(5500);

const DESCS_PREFIX: &[u8] = b"DESCS:";

/// One role's side of the exchange. Create it with [`Exchange::join`]
/// *before* the NIXL agent: in the built-in modes NIXL reads its
/// environment when the agent is constructed.
pub struct Exchange {
    mode: MetadataMode,
    store: Option<Box<dyn Store>>,
    timeout: Duration,
    endpoint: String,
    loaded: HashSet<String>,
    published: Vec<String>,
}

impl Exchange {
    /// Prepares this process for `args.metadata`:
    ///
    /// - `tcpstore`: connects to the store;
    /// - `etcd`: checks that etcd answers, sets `NIXL_ETCD_ENDPOINTS`;
    /// - `nixl-tcpstore`: checks that the store answers, sets
    ///   `NIXL_TCPSTORE_ENDPOINT=host:port` and `NIXL_TCPSTORE_TIMEOUT_MS`
    ///   (NIXL's fetch budget) to `timeout` unless already set.
    ///
    /// The other NIXL variable is removed (NIXL refuses both at once, and
    /// an inherited one would otherwise start an exchange nobody asked for).
    /// Edits the environment: call it before any other thread starts.
    ///
    /// Errors name the service that did not answer and how to start it.
    pub fn join(args: &ExchangeArgs, timeout: Duration) -> Result<Self> {
        let mut endpoint = format!("{}:{}", args.host, args.port);
        let mut store = None;
        match args.metadata {
            MetadataMode::Tcpstore => {
                set_env("NIXL_ETCD_ENDPOINTS", None);
                set_env("NIXL_TCPSTORE_ENDPOINT", None);
                store = Some(
                    args.store
                        .open(&args.store_options(false, timeout))
                        .map_err(crate::cli::store_error)
                        .with_context(|| format!("connecting to the store at {endpoint}"))?,
                );
            }
            MetadataMode::Etcd => {
                endpoint = args.etcd_endpoints();
                let etcd = Etcd::from_endpoints(&endpoint, timeout.min(Duration::from_secs(5)))?;
                etcd.version()
                    .context("NIXL's etcd exchange needs a running etcd server")?;
                set_env("NIXL_TCPSTORE_ENDPOINT", None);
                set_env("NIXL_ETCD_ENDPOINTS", Some(&endpoint));
            }
            MetadataMode::NixlTcpstore => {
                // NIXL's client connects in the background and only logs a
                // failure; find out here, with a message that names the fix.
                wait_for_port(&args.host, args.port, timeout).with_context(|| {
                    format!(
                        "no TCPStore at {endpoint} for NIXL's TCPStore client: start the process that hosts it first, or check --host/--port"
                    )
                })?;
                set_env("NIXL_ETCD_ENDPOINTS", None);
                set_env("NIXL_TCPSTORE_ENDPOINT", Some(&endpoint));
                if std::env::var_os("NIXL_TCPSTORE_TIMEOUT_MS").is_none() {
                    set_env(
                        "NIXL_TCPSTORE_TIMEOUT_MS",
                        Some(&timeout.as_millis().to_string()),
                    );
                }
            }
        }
        Ok(Self {
            mode: args.metadata,
            store,
            timeout,
            endpoint,
            loaded: HashSet::new(),
            published: Vec::new(),
        })
    }

    /// The store, in `tcpstore` mode: an example that shows the store's
    /// keys sets and gets them itself (`two_proc`); `None` in NIXL's modes.
    pub fn store(&self) -> Option<&dyn Store> {
        self.store.as_deref()
    }

    /// The mode in use.
    pub fn mode(&self) -> MetadataMode {
        self.mode
    }

    /// Where the metadata goes, for messages (`host:port` or etcd endpoints).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Publishes this agent's metadata (`getLocalMD` into the store as
    /// `{agent}_meta`, or NIXL's `sendLocalMD`). Call it after registering
    /// memory: the metadata carries the registrations.
    pub fn publish(&mut self, agent: &Agent) -> Result<()> {
        if let Some(store) = &self.store {
            let key = format!("{}_meta", agent.name());
            store.set(
                &key,
                &agent
                    .get_local_md()
                    .context("reading our agent metadata (getLocalMD)")?,
            )?;
            self.published.push(key);
        } else {
            agent.send_local_md(None).map_err(|e| {
                anyhow::anyhow!(
                    "sendLocalMD failed ({e}): NIXL could not queue our metadata for {}",
                    self.endpoint
                )
            })?;
        }
        Ok(())
    }

    /// Loads agent `peer`'s metadata and waits until NIXL can use it, for at
    /// most the timeout. Built-in modes: `fetchRemoteMD`, polled with
    /// `checkRemoteMD` every 10 ms and issued again every 5.5 s.
    pub fn load_peer(&mut self, agent: &Agent, peer: &str) -> Result<()> {
        if self.loaded.contains(peer) {
            return Ok(());
        }
        if let Some(store) = &self.store {
            let md = store
                .get(&format!("{peer}_meta"))
                .with_context(|| format!("waiting for {peer}'s metadata"))?;
            load_peer_blob(agent, &md, peer, self.timeout)?;
        } else {
            let start = Instant::now();
            let mut last_fetch: Option<Instant> = None;
            while !agent.check_remote_metadata(peer, None) {
                if last_fetch.is_none_or(|t| t.elapsed() > REFETCH) {
                    agent
                        .fetch_remote_md(peer, None)
                        .map_err(|e| anyhow::anyhow!("fetchRemoteMD({peer}) failed: {e}"))?;
                    last_fetch = Some(Instant::now());
                }
                if start.elapsed() > self.timeout {
                    bail!(
                        "metadata of agent '{peer}' did not arrive through {} ({}) within {:?}: is the {peer} process running with the same --metadata and endpoint? (NIXL's own log lines above say more)",
                        self.mode.name(),
                        self.endpoint,
                        self.timeout
                    );
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.loaded.insert(peer.to_string());
        Ok(())
    }

    /// Target side: makes `descs` (our registered buffers) available to
    /// `peer`, the initiator. Store: the key `{agent}_descs`. Built-in
    /// modes: waits for `peer`'s metadata ([`Exchange::load_peer`]), then
    /// sends the notification `DESCS:` + `descs` in NIXL's serialized form.
    pub fn offer_descs(&mut self, agent: &Agent, peer: &str, descs: &DescList) -> Result<()> {
        if let Some(store) = &self.store {
            let key = format!("{}_descs", agent.name());
            store.set(&key, &descs.encode())?;
            self.published.push(key);
            return Ok(());
        }
        self.load_peer(agent, peer)?;
        let mut msg = DESCS_PREFIX.to_vec();
        msg.extend_from_slice(&descs.encode());
        agent.send_notification(peer, &msg, None).map_err(|e| {
            anyhow::anyhow!("sending our descriptors to {peer} as a notification failed: {e}")
        })
    }

    /// Initiator side: the descriptor list `peer` offered. Store: waits for
    /// `{peer}_descs`. Built-in modes: waits for the `DESCS:` notification
    /// (other notifications stay in `inbox`).
    ///
    /// Errors: nothing within the timeout; bytes that are not a descriptor list.
    pub fn take_descs(
        &mut self,
        agent: &Agent,
        inbox: &mut NotifInbox,
        peer: &str,
    ) -> Result<DescList> {
        let bytes = if let Some(store) = &self.store {
            store
                .get(&format!("{peer}_descs"))
                .with_context(|| format!("waiting for {peer}'s descriptors"))?
        } else {
            let mut m = inbox
                .wait_matching(agent, peer, |m| m.starts_with(DESCS_PREFIX), self.timeout)
                .with_context(|| {
                    format!("waiting for {peer}'s descriptors (a DESCS: notification)")
                })?;
            m.drain(..DESCS_PREFIX.len());
            m
        };
        DescList::decode(&bytes).with_context(|| format!("decoding {peer}'s descriptors"))
    }

    /// Removes what we published, best effort: our store keys, or NIXL's
    /// `invalidateLocalMD` (which deletes our etcd/TCPStore keys; NIXL runs
    /// it on its metadata thread and finishes it before the agent is
    /// destroyed). Call it once the peer no longer needs our metadata.
    pub fn withdraw(&mut self, agent: &Agent) {
        if let Some(store) = &self.store {
            for key in self.published.drain(..) {
                let _ = store.delete_key(&key);
            }
        } else if let Err(e) = agent.invalidate_local_md(None) {
            tracing::warn!(
                "invalidateLocalMD failed ({e}); our metadata may stay in {}",
                self.endpoint
            );
        }
    }
}

fn set_env(name: &str, value: Option<&str>) {
    // SAFETY: Exchange::join documents that it runs before other threads
    // exist; nothing else reads the environment concurrently.
    unsafe {
        match value {
            Some(v) => std::env::set_var(name, v),
            None => std::env::remove_var(name),
        }
    }
}

fn wait_for_port(host: &str, port: u16, timeout: Duration) -> Result<()> {
    use std::net::ToSocketAddrs;
    let start = Instant::now();
    loop {
        let addrs: Vec<_> = (host, port)
            .to_socket_addrs()
            .with_context(|| format!("resolving {host}"))?
            .collect();
        let mut last = None;
        for a in &addrs {
            match std::net::TcpStream::connect_timeout(a, Duration::from_secs(1)) {
                Ok(_) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        if start.elapsed() > timeout {
            return Err(last
                .map(anyhow::Error::from)
                .unwrap_or_else(|| anyhow::anyhow!("no address for {host}")));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
