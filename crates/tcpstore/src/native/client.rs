//! The TCPStore client connection: torch's `TCPClient` plus the request
//! logic of `c10d::TCPStore` (`doWait`, `doGet`, ...), on raw wire keys.
//!
//! Keys here are exactly what goes on the wire; putting the `/` prefix on
//! user keys is the caller's job ([`super::TcpStore`]), as in torch where the
//! prefix is added by `TCPStore` and not by `TCPClient`.

use std::borrow::Cow;
use std::io::{self, BufReader, ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use super::wire::{self, Limits, Request, WireError};
use crate::{Stalled, StoreError};

/// Largest reply value the client accepts. Above the libuv server's 8 MiB so
/// that torch's legacy server (no limit) still works; memory grows only with
/// bytes that actually arrive.
const MAX_REPLY_VALUE: usize = 1 << 30;

/// Connect retry delays: short first so a peer starting a moment later is
/// found quickly, capped so a slow one is not hammered.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(10);
const MAX_RETRY_DELAY: Duration = Duration::from_millis(500);

/// One user-level operation: what to name in errors, and the deadline of
/// each wire request it sends.
#[derive(Clone, Copy)]
pub(crate) struct Ctx<'a> {
    /// c10d wire name of the operation (`GET`, `ADD`, ...).
    pub(crate) op: &'static str,
    /// The keys as the caller named them (no `/` prefix).
    pub(crate) keys: &'a [&'a str],
    /// How long each request may take to be written and answered, from
    /// when it is sent; `Duration::ZERO`: no limit.
    pub(crate) deadline: Duration,
}

impl Ctx<'_> {
    fn until(&self) -> Option<Instant> {
        (!self.deadline.is_zero()).then(|| Instant::now() + self.deadline)
    }

    /// The [`StoreError::NoReply`] for this operation on the store at `addr`.
    pub(crate) fn no_reply(&self, addr: &str, stalled: Stalled) -> StoreError {
        StoreError::NoReply {
            addr: addr.to_owned(),
            op: self.op,
            keys: self.keys.iter().map(|k| k.to_string()).collect(),
            after: self.deadline,
            stalled,
        }
    }
}

/// The read half of the connection, bounded by the current request's
/// deadline: every read waits at most until then, so a server that trickles
/// bytes cannot stretch a reply past it as a plain read timeout would allow.
struct TimedRead {
    stream: TcpStream,
    until: Option<Instant>,
}

impl Read for TimedRead {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let limit = match self.until {
            None => None,
            Some(until) => {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(ErrorKind::TimedOut.into());
                }
                Some(left)
            }
        };
        self.stream.set_read_timeout(limit)?;
        self.stream.read(buf)
    }
}

/// Writes all of `buf` by `until` (`None`: no limit); a store that stopped
/// reading fails it with `TimedOut` once the socket buffers are full.
fn write_by(stream: &mut TcpStream, mut buf: &[u8], until: Option<Instant>) -> io::Result<()> {
    while !buf.is_empty() {
        let limit = match until {
            None => None,
            Some(until) => match until.saturating_duration_since(Instant::now()) {
                left if left.is_zero() => return Err(ErrorKind::TimedOut.into()),
                left => Some(left),
            },
        };
        stream.set_write_timeout(limit)?;
        match stream.write(buf) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether a socket error is a read or write timeout.
fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// One validated connection to a c10d TCPStore server.
pub(crate) struct Client {
    reader: BufReader<TimedRead>,
    writer: TcpStream,
    /// `host:port`, for errors.
    addr: String,
    /// Set once a request failed half-way: the reply stream can no longer be
    /// matched to requests, so every later call fails fast.
    broken: bool,
    /// The [`StoreError::NoReply`] that broke the connection, if that was
    /// the cause: later calls return it again.
    silent: Option<StoreError>,
}

/// Why one connection attempt failed.
enum Attempt {
    /// Worth another try before the deadline (refused, reset, closed).
    Retry,
    /// The peer answered, but not as a TCPStore would, or not at all.
    Fatal(StoreError),
}

impl Client {
    /// Connects to `host:port`, retrying with backoff until `timeout`, then
    /// sends VALIDATE and a PING, as torch's `TCPStore` constructor does.
    ///
    /// Errors: [`StoreError::Unreachable`] when no store answered in time;
    /// [`StoreError::NoReply`] (`PING`) when one accepted the connection but
    /// never answered the PING; [`StoreError::Protocol`] when something
    /// answered the PING wrongly.
    pub(crate) fn connect(host: &str, port: u16, timeout: Duration) -> Result<Self, StoreError> {
        let start = Instant::now();
        let deadline = start + timeout;
        let mut delay = FIRST_RETRY_DELAY;
        loop {
            match Self::try_connect(host, port, deadline, timeout) {
                Ok(client) => return Ok(client),
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Retry) => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Unreachable {
                    addr: format!("{host}:{port}"),
                    waited: now - start,
                });
            }
            thread::sleep(delay.min(deadline - now));
            delay = (delay * 2).min(MAX_RETRY_DELAY);
        }
    }

    fn try_connect(
        host: &str,
        port: u16,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Self, Attempt> {
        // Resolve on every attempt: a resolver that is briefly unavailable
        // may answer later. A name the resolver says does not exist fails
        // now, rather than after the whole timeout.
        let addrs = (host, port).to_socket_addrs().map_err(|e| {
            if unknown_name(&e) {
                Attempt::Fatal(StoreError::UnknownHost {
                    host: host.to_string(),
                    source: e,
                })
            } else {
                Attempt::Retry
            }
        })?;
        for addr in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let Ok(stream) = TcpStream::connect_timeout(&addr, left) else {
                continue;
            };
            match Self::handshake(stream, format!("{host}:{port}"), deadline, timeout) {
                Ok(client) => return Ok(client),
                Err(Attempt::Retry) => continue,
                Err(fatal) => return Err(fatal),
            }
        }
        Err(Attempt::Retry)
    }

    fn handshake(
        stream: TcpStream,
        addr: String,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Self, Attempt> {
        let retry = |_: io::Error| Attempt::Retry;
        stream.set_nodelay(true).map_err(retry)?;
        let writer = stream.try_clone().map_err(retry)?;
        let mut client = Client {
            reader: BufReader::with_capacity(
                64 << 10,
                TimedRead {
                    stream,
                    until: Some(deadline),
                },
            ),
            writer,
            addr,
            broken: false,
            silent: None,
        };
        // torch pings with its pid; any value works, the echo is what counts.
        let nonce = std::process::id();
        let mut frame = Vec::with_capacity(10);
        Request::Validate {
            magic: wire::VALIDATION_MAGIC,
        }
        .encode(&mut frame);
        Request::Ping { nonce }.encode(&mut frame);
        let ping = Ctx {
            op: "PING",
            keys: &[],
            deadline: timeout,
        };
        let silent = |e: io::Error, client: &Client| {
            if is_timeout(&e) {
                Attempt::Fatal(ping.no_reply(&client.addr, Stalled::Replying))
            } else {
                Attempt::Retry
            }
        };
        if let Err(e) = write_by(&mut client.writer, &frame, Some(deadline)) {
            return Err(silent(e, &client));
        }
        let echo = match wire::read_u32(&mut client.reader) {
            Ok(echo) => echo,
            Err(e) => return Err(silent(e, &client)),
        };
        if echo != nonce {
            return Err(Attempt::Fatal(StoreError::Protocol(format!(
                "PING {nonce} was answered with {echo}: the server is not a c10d TCPStore"
            ))));
        }
        Ok(client)
    }

    /// Fails fast on a connection an earlier request left unusable.
    fn usable(&self) -> Result<(), StoreError> {
        if let Some(e) = self.silent.as_ref().and_then(StoreError::replay) {
            return Err(e);
        }
        if self.broken {
            return Err(StoreError::Io(io::Error::new(
                ErrorKind::NotConnected,
                "an earlier request failed half-way, so this connection is unusable; reopen the store",
            )));
        }
        Ok(())
    }

    /// Sends one request, within `ctx.deadline`.
    fn send(&mut self, ctx: &Ctx<'_>, request: &Request<'_>) -> Result<(), StoreError> {
        self.usable()?;
        let mut frame = Vec::new();
        request.encode(&mut frame);
        write_by(&mut self.writer, &frame, ctx.until())
            .map_err(|e| self.fail(ctx, Stalled::Sending, e))
    }

    /// Marks the connection unusable and converts the error: a timeout is
    /// [`StoreError::NoReply`], anything else [`StoreError::Io`].
    fn fail(&mut self, ctx: &Ctx<'_>, stalled: Stalled, e: io::Error) -> StoreError {
        self.broken = true;
        if is_timeout(&e) {
            let err = ctx.no_reply(&self.addr, stalled);
            self.silent = err.replay();
            return err;
        }
        let e = if e.kind() == ErrorKind::UnexpectedEof {
            io::Error::new(ErrorKind::UnexpectedEof, "the server closed the connection")
        } else {
            e
        };
        StoreError::Io(e)
    }

    /// Reads (part of) a reply, which must arrive within `ctx.deadline` of
    /// this call.
    fn recv<T>(
        &mut self,
        ctx: &Ctx<'_>,
        read: impl FnOnce(&mut BufReader<TimedRead>) -> io::Result<T>,
    ) -> Result<T, StoreError> {
        self.reader.get_mut().until = ctx.until();
        read(&mut self.reader).map_err(|e| self.fail(ctx, Stalled::Replying, e))
    }

    fn recv_value(&mut self, ctx: &Ctx<'_>) -> Result<Vec<u8>, StoreError> {
        self.reader.get_mut().until = ctx.until();
        match wire::read_field(&mut self.reader, MAX_REPLY_VALUE, "reply value") {
            Ok(v) => Ok(v),
            Err(WireError::Io(e)) => Err(self.fail(ctx, Stalled::Replying, e)),
            Err(other) => {
                self.broken = true;
                Err(StoreError::Protocol(other.to_string()))
            }
        }
    }

    /// SET; no reply.
    pub(crate) fn set(
        &mut self,
        ctx: &Ctx<'_>,
        key: &[u8],
        value: &[u8],
    ) -> Result<(), StoreError> {
        self.send(
            ctx,
            &Request::Set {
                key: key.into(),
                value: value.into(),
            },
        )
    }

    /// WAIT for `key` (up to `timeout`), then GET (torch's `doGet`).
    /// `Ok(None)` if the wait timed out.
    pub(crate) fn get(
        &mut self,
        ctx: &Ctx<'_>,
        key: &[u8],
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        if !self.wait(ctx, &[key], timeout)? {
            return Ok(None);
        }
        self.send(ctx, &Request::Get { key: key.into() })?;
        self.recv_value(ctx).map(Some)
    }

    /// GET alone, without torch's WAIT before it: a missing key reads as an
    /// empty value (the caller CHECKs first).
    pub(crate) fn get_now(&mut self, ctx: &Ctx<'_>, key: &[u8]) -> Result<Vec<u8>, StoreError> {
        self.send(ctx, &Request::Get { key: key.into() })?;
        self.recv_value(ctx)
    }

    /// WAIT for all `keys` (up to `timeout`), then MULTI_GET. `Ok(None)` if
    /// the wait timed out.
    pub(crate) fn multi_get(
        &mut self,
        ctx: &Ctx<'_>,
        keys: &[&[u8]],
        timeout: Duration,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        if !self.wait(ctx, keys, timeout)? {
            return Ok(None);
        }
        self.multi_get_now(ctx, keys).map(Some)
    }

    /// MULTI_GET alone, without torch's WAIT before it: a missing key reads
    /// as an empty value (the caller CHECKs those).
    pub(crate) fn multi_get_now(
        &mut self,
        ctx: &Ctx<'_>,
        keys: &[&[u8]],
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        self.send(ctx, &Request::MultiGet { keys: fields(keys) })?;
        (0..keys.len()).map(|_| self.recv_value(ctx)).collect()
    }

    /// ADD; returns the new value.
    pub(crate) fn add(&mut self, ctx: &Ctx<'_>, key: &[u8], delta: i64) -> Result<i64, StoreError> {
        self.send(
            ctx,
            &Request::Add {
                key: key.into(),
                delta,
            },
        )?;
        self.recv(ctx, wire::read_i64)
    }

    /// COMPARE_SET; returns the value the server reports.
    pub(crate) fn compare_set(
        &mut self,
        ctx: &Ctx<'_>,
        key: &[u8],
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        self.send(
            ctx,
            &Request::CompareSet {
                key: key.into(),
                expected: expected.into(),
                desired: desired.into(),
            },
        )?;
        self.recv_value(ctx)
    }

    /// CHECK; true when every key exists.
    pub(crate) fn check(&mut self, ctx: &Ctx<'_>, keys: &[&[u8]]) -> Result<bool, StoreError> {
        self.send(ctx, &Request::Check { keys: fields(keys) })?;
        match self.recv(ctx, wire::read_u8)? {
            wire::CHECK_READY => Ok(true),
            wire::CHECK_NOT_READY => Ok(false),
            other => {
                self.broken = true;
                Err(StoreError::Protocol(format!(
                    "CHECK answered {other}, expected 0 or 1"
                )))
            }
        }
    }

    /// DELETE_KEY; true when the key existed.
    pub(crate) fn delete_key(&mut self, ctx: &Ctx<'_>, key: &[u8]) -> Result<bool, StoreError> {
        self.send(ctx, &Request::DeleteKey { key: key.into() })?;
        Ok(self.recv(ctx, wire::read_i64)? == 1)
    }

    /// DELETE_KEY for each of `keys`, pipelined: every request written,
    /// then every answer read (the server answers a connection's requests in
    /// order); returns how many keys existed. The caller bounds the batch
    /// ([`crate::DELETE_BATCH`]).
    pub(crate) fn delete_keys(
        &mut self,
        ctx: &Ctx<'_>,
        keys: &[&[u8]],
    ) -> Result<usize, StoreError> {
        self.usable()?;
        let mut frame = Vec::new();
        for k in keys {
            Request::DeleteKey { key: (*k).into() }.encode(&mut frame);
        }
        write_by(&mut self.writer, &frame, ctx.until())
            .map_err(|e| self.fail(ctx, Stalled::Sending, e))?;
        let mut existed = 0;
        for _ in keys {
            existed += usize::from(self.recv(ctx, wire::read_i64)? == 1);
        }
        Ok(existed)
    }

    /// GETNUMKEYS.
    pub(crate) fn num_keys(&mut self, ctx: &Ctx<'_>) -> Result<i64, StoreError> {
        self.send(ctx, &Request::GetNumKeys)?;
        self.recv(ctx, wire::read_i64)
    }

    /// WAIT with a client-side timeout (`Duration::ZERO`: none, torch's
    /// `kNoTimeout`). On timeout it sends CANCEL_WAIT and reads until the
    /// WAIT_CANCELED byte, skipping a STOP_WAITING that crossed it, exactly as
    /// `TCPStore::doWait`; returns false then. The cancel's answer has
    /// `ctx.deadline` (torch waits for it forever).
    pub(crate) fn wait(
        &mut self,
        ctx: &Ctx<'_>,
        keys: &[&[u8]],
        timeout: Duration,
    ) -> Result<bool, StoreError> {
        self.send(ctx, &Request::Wait { keys: fields(keys) })?;
        // No answer before `timeout` is the normal "not there yet".
        self.reader.get_mut().until = (!timeout.is_zero()).then(|| Instant::now() + timeout);
        match wire::read_u8(&mut self.reader) {
            Ok(wire::WAIT_STOP_WAITING) => return Ok(true),
            Ok(other) => {
                self.broken = true;
                return Err(StoreError::Protocol(format!(
                    "WAIT answered {other}, expected 0 (stop waiting)"
                )));
            }
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(self.fail(ctx, Stalled::Replying, e)),
        }
        self.send(ctx, &Request::CancelWait)?;
        self.drain_cancel(ctx).map(|()| false)
    }

    fn drain_cancel(&mut self, ctx: &Ctx<'_>) -> Result<(), StoreError> {
        let mut byte = self.recv(ctx, wire::read_u8)?;
        if byte == wire::WAIT_STOP_WAITING {
            // The keys arrived just as we gave up: the cancel reply follows.
            byte = self.recv(ctx, wire::read_u8)?;
        }
        if byte != wire::WAIT_CANCELED {
            self.broken = true;
            return Err(StoreError::Protocol(format!(
                "CANCEL_WAIT answered {byte}, expected 1 (wait canceled)"
            )));
        }
        Ok(())
    }
}

fn fields<'a>(keys: &[&'a [u8]]) -> Vec<Cow<'a, [u8]>> {
    keys.iter().map(|&k| Cow::Borrowed(k)).collect()
}

/// Refuses, before sending, what torch's default server would answer by
/// dropping the connection, so the caller gets an error naming the limit.
pub(crate) fn check_limits(key: &[u8], value: Option<&[u8]>) -> Result<(), StoreError> {
    let limits = Limits::LIBUV;
    if key.len() > limits.max_key_len {
        return Err(StoreError::Invalid(format!(
            "key of {} bytes (with its '/' prefix): torch's TCPStore server accepts at most {}",
            key.len(),
            limits.max_key_len
        )));
    }
    if let Some(v) = value.filter(|v| v.len() > limits.max_value_len) {
        return Err(StoreError::Invalid(format!(
            "value of {} bytes: torch's TCPStore server accepts at most {} (8 MiB)",
            v.len(),
            limits.max_value_len
        )));
    }
    Ok(())
}

/// Whether a lookup error says the name does not exist (EAI_NONAME,
/// EAI_NODATA), rather than that the resolver could not answer now
/// (EAI_AGAIN). std reports getaddrinfo's errors only as text.
fn unknown_name(e: &io::Error) -> bool {
    let m = e.to_string();
    m.contains("Name or service not known") || m.contains("No address associated with hostname")
}
