//! The TCPStore client connection: torch's `TCPClient` plus the request
//! logic of `c10d::TCPStore` (`doWait`, `doGet`, ...), on raw wire keys.
//!
//! Keys here are exactly what goes on the wire; putting the `/` prefix on
//! user keys is the caller's job ([`super::TcpStore`]), as in torch where the
//! prefix is added by `TCPStore` and not by `TCPClient`.

use std::borrow::Cow;
use std::io::{self, BufReader, ErrorKind, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

use super::wire::{self, Limits, Request, WireError};
use crate::store::StoreError;

/// Largest reply value the client accepts. Above the libuv server's 8 MiB so
/// that torch's legacy server (no limit) still works; memory grows only with
/// bytes that actually arrive.
const MAX_REPLY_VALUE: usize = 1 << 30;

/// Longest the client waits for the CANCEL_WAIT reply after a wait timed out
/// (torch waits forever; a frozen server should not freeze us).
const MIN_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Connect retry delays: short first so a peer starting a moment later is
/// found quickly, capped so a slow one is not hammered.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(10);
const MAX_RETRY_DELAY: Duration = Duration::from_millis(500);

/// One validated connection to a c10d TCPStore server.
pub(crate) struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// Set once a request failed half-way: the reply stream can no longer be
    /// matched to requests, so every later call fails fast.
    broken: bool,
    /// Bound for draining after a cancelled wait.
    drain_timeout: Duration,
}

/// Why one connection attempt failed.
enum Attempt {
    /// Worth another try before the deadline (refused, reset, no reply yet).
    Retry,
    /// The peer answered, but not as a TCPStore would.
    Fatal(StoreError),
}

impl Client {
    /// Connects to `host:port`, retrying with backoff until `timeout`, then
    /// sends VALIDATE and a PING, as torch's `TCPStore` constructor does.
    ///
    /// Errors: [`StoreError::Unreachable`] when no store answered in time;
    /// [`StoreError::Protocol`] when something answered the PING wrongly.
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
        // Resolve on every attempt: the name may only become resolvable later.
        let addrs = (host, port).to_socket_addrs().map_err(|_| Attempt::Retry)?;
        for addr in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let Ok(stream) = TcpStream::connect_timeout(&addr, left) else {
                continue;
            };
            match Self::handshake(stream, deadline, timeout) {
                Ok(client) => return Ok(client),
                Err(Attempt::Retry) => continue,
                Err(fatal) => return Err(fatal),
            }
        }
        Err(Attempt::Retry)
    }

    fn handshake(stream: TcpStream, deadline: Instant, timeout: Duration) -> Result<Self, Attempt> {
        let retry = |_: io::Error| Attempt::Retry;
        stream.set_nodelay(true).map_err(retry)?;
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        stream.set_read_timeout(Some(left)).map_err(retry)?;
        let writer = stream.try_clone().map_err(retry)?;
        let mut client = Client {
            reader: BufReader::with_capacity(64 << 10, stream),
            writer,
            broken: false,
            drain_timeout: timeout.max(MIN_DRAIN_TIMEOUT),
        };
        // torch pings with its pid; any value works, the echo is what counts.
        let nonce = std::process::id();
        let mut frame = Vec::with_capacity(10);
        Request::Validate {
            magic: wire::VALIDATION_MAGIC,
        }
        .encode(&mut frame);
        Request::Ping { nonce }.encode(&mut frame);
        client.writer.write_all(&frame).map_err(retry)?;
        let echo = wire::read_u32(&mut client.reader).map_err(retry)?;
        if echo != nonce {
            return Err(Attempt::Fatal(StoreError::Protocol(format!(
                "PING {nonce} was answered with {echo}: the server is not a c10d TCPStore"
            ))));
        }
        client
            .reader
            .get_ref()
            .set_read_timeout(None)
            .map_err(retry)?;
        Ok(client)
    }

    /// Sends one request.
    fn send(&mut self, request: &Request<'_>) -> Result<(), StoreError> {
        if self.broken {
            return Err(StoreError::Io(io::Error::new(
                ErrorKind::NotConnected,
                "an earlier request failed half-way, so this connection is unusable; reopen the store",
            )));
        }
        let mut frame = Vec::new();
        request.encode(&mut frame);
        self.writer.write_all(&frame).map_err(|e| self.fail(e))
    }

    /// Marks the connection unusable and converts the error.
    fn fail(&mut self, e: io::Error) -> StoreError {
        self.broken = true;
        let e = if e.kind() == ErrorKind::UnexpectedEof {
            io::Error::new(ErrorKind::UnexpectedEof, "the server closed the connection")
        } else {
            e
        };
        StoreError::Io(e)
    }

    fn recv<T>(
        &mut self,
        read: impl FnOnce(&mut BufReader<TcpStream>) -> io::Result<T>,
    ) -> Result<T, StoreError> {
        read(&mut self.reader).map_err(|e| self.fail(e))
    }

    fn recv_value(&mut self) -> Result<Vec<u8>, StoreError> {
        match wire::read_field(&mut self.reader, MAX_REPLY_VALUE, "reply value") {
            Ok(v) => Ok(v),
            Err(WireError::Io(e)) => Err(self.fail(e)),
            Err(other) => {
                self.broken = true;
                Err(StoreError::Protocol(other.to_string()))
            }
        }
    }

    /// SET; no reply.
    pub(crate) fn set(&mut self, key: &[u8], value: &[u8]) -> Result<(), StoreError> {
        self.send(&Request::Set {
            key: key.into(),
            value: value.into(),
        })
    }

    /// WAIT for `keys`, then GET (torch's `doGet`). `Ok(None)` if the wait
    /// timed out.
    pub(crate) fn get(
        &mut self,
        key: &[u8],
        timeout: Duration,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        if !self.wait(&[key], timeout)? {
            return Ok(None);
        }
        self.send(&Request::Get { key: key.into() })?;
        self.recv_value().map(Some)
    }

    /// WAIT for all `keys`, then MULTI_GET. `Ok(None)` if the wait timed out.
    pub(crate) fn multi_get(
        &mut self,
        keys: &[&[u8]],
        timeout: Duration,
    ) -> Result<Option<Vec<Vec<u8>>>, StoreError> {
        if !self.wait(keys, timeout)? {
            return Ok(None);
        }
        self.send(&Request::MultiGet { keys: fields(keys) })?;
        (0..keys.len())
            .map(|_| self.recv_value())
            .collect::<Result<_, _>>()
            .map(Some)
    }

    /// ADD; returns the new value.
    pub(crate) fn add(&mut self, key: &[u8], delta: i64) -> Result<i64, StoreError> {
        self.send(&Request::Add {
            key: key.into(),
            delta,
        })?;
        self.recv(wire::read_i64)
    }

    /// COMPARE_SET; returns the value the server reports.
    pub(crate) fn compare_set(
        &mut self,
        key: &[u8],
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        self.send(&Request::CompareSet {
            key: key.into(),
            expected: expected.into(),
            desired: desired.into(),
        })?;
        self.recv_value()
    }

    /// CHECK; true when every key exists.
    pub(crate) fn check(&mut self, keys: &[&[u8]]) -> Result<bool, StoreError> {
        self.send(&Request::Check { keys: fields(keys) })?;
        match self.recv(wire::read_u8)? {
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
    pub(crate) fn delete_key(&mut self, key: &[u8]) -> Result<bool, StoreError> {
        self.send(&Request::DeleteKey { key: key.into() })?;
        Ok(self.recv(wire::read_i64)? == 1)
    }

    /// GETNUMKEYS.
    pub(crate) fn num_keys(&mut self) -> Result<i64, StoreError> {
        self.send(&Request::GetNumKeys)?;
        self.recv(wire::read_i64)
    }

    /// WAIT with a client-side timeout (`Duration::ZERO`: none, torch's
    /// `kNoTimeout`). On timeout it sends CANCEL_WAIT and reads until the
    /// WAIT_CANCELED byte, skipping a STOP_WAITING that crossed it, exactly as
    /// `TCPStore::doWait`; returns false then.
    pub(crate) fn wait(&mut self, keys: &[&[u8]], timeout: Duration) -> Result<bool, StoreError> {
        self.send(&Request::Wait { keys: fields(keys) })?;
        let limit = (!timeout.is_zero()).then_some(timeout);
        self.reader
            .get_ref()
            .set_read_timeout(limit)
            .map_err(|e| self.fail(e))?;
        let first = wire::read_u8(&mut self.reader);
        let _ = self.reader.get_ref().set_read_timeout(None);
        match first {
            Ok(wire::WAIT_STOP_WAITING) => return Ok(true),
            Ok(other) => {
                self.broken = true;
                return Err(StoreError::Protocol(format!(
                    "WAIT answered {other}, expected 0 (stop waiting)"
                )));
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => return Err(self.fail(e)),
        }
        self.send(&Request::CancelWait)?;
        self.reader
            .get_ref()
            .set_read_timeout(Some(self.drain_timeout))
            .map_err(|e| self.fail(e))?;
        let drained = self.drain_cancel();
        let _ = self.reader.get_ref().set_read_timeout(None);
        drained.map(|()| false)
    }

    fn drain_cancel(&mut self) -> Result<(), StoreError> {
        let mut byte = self.recv(wire::read_u8)?;
        if byte == wire::WAIT_STOP_WAITING {
            // The keys arrived just as we gave up: the cancel reply follows.
            byte = self.recv(wire::read_u8)?;
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
