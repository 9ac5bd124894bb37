//! The c10d TCPStore frame format (torch 2.11), both directions.
//!
//! Every request is one opcode byte followed by its fields; integers are
//! little-endian (torch copies host-order integers onto the wire, and every
//! platform it ships on is little-endian); a `str` or `bytes` field is a u64
//! length followed by that many bytes. Replies have no opcode: the client
//! knows what it asked for. The opcodes are [`Op`]; the
//! sources are `TCPStoreBackend.hpp` (opcodes, magic) and
//! `TCPStoreLibUvBackend.cpp` (`UvClient::parse_*_command`, the limits).
//!
//! Decoding reads from a blocking [`Read`] and is written for hostile input:
//! every length is checked against [`Limits`] before anything is allocated,
//! a frame cut short is an error, an unknown opcode is an error, and nothing
//! panics.

use std::borrow::Cow;
use std::io::{self, Read};

/// Magic number of the VALIDATE request (`c10d::detail::validationMagicNumber`).
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;

/// CHECK reply: all keys exist (`CheckResponseType::READY`).
pub const CHECK_READY: u8 = 0;
/// CHECK reply: some key is missing (`CheckResponseType::NOT_READY`).
pub const CHECK_NOT_READY: u8 = 1;
/// WAIT reply once all keys exist (`WaitResponseType::STOP_WAITING`).
pub const WAIT_STOP_WAITING: u8 = 0;
/// CANCEL_WAIT reply (`WaitResponseType::WAIT_CANCELED`).
pub const WAIT_CANCELED: u8 = 1;

/// Request opcodes, `c10d::detail::QueryType` of torch 2.11 (values 0..=17).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    /// u32 magic; no reply. Must be a connection's first request.
    Validate = 0,
    /// str key, bytes value; no reply.
    Set = 1,
    /// str key, bytes expected, bytes desired; reply bytes.
    CompareSet = 2,
    /// str key; reply bytes (empty if the key is missing).
    Get = 3,
    /// str key, i64 delta; reply i64.
    Add = 4,
    /// u64 n, n × str; reply u8 ([`CHECK_READY`] / [`CHECK_NOT_READY`]).
    Check = 5,
    /// u64 n, n × str; reply u8 [`WAIT_STOP_WAITING`] once all keys exist.
    Wait = 6,
    /// No fields; reply i64.
    GetNumKeys = 7,
    /// str key; reply i64 (number deleted, 0 or 1).
    DeleteKey = 8,
    /// str key, bytes value; no reply.
    Append = 9,
    /// u64 n, n × str; reply n × bytes.
    MultiGet = 10,
    /// i64 n, n × (str, bytes); no reply.
    MultiSet = 11,
    /// No fields; reply u8 [`WAIT_CANCELED`].
    CancelWait = 12,
    /// u32 nonce; reply the same u32.
    Ping = 13,
    /// str key, bytes value; no reply.
    QueuePush = 14,
    /// str key; reply i64 length before the pop, then bytes if it was > 0.
    QueuePop = 15,
    /// str key; reply i64.
    QueueLen = 16,
    /// No fields; reply i64 n, n × str.
    ListKeys = 17,
}

impl TryFrom<u8> for Op {
    type Error = WireError;

    fn try_from(byte: u8) -> Result<Self, WireError> {
        use Op::*;
        const ALL: [Op; 18] = [
            Validate, Set, CompareSet, Get, Add, Check, Wait, GetNumKeys, DeleteKey, Append,
            MultiGet, MultiSet, CancelWait, Ping, QueuePush, QueuePop, QueueLen, ListKeys,
        ];
        ALL.get(usize::from(byte))
            .copied()
            .ok_or(WireError::UnknownOp(byte))
    }
}

/// Size limits applied while decoding, so that a length field can never make
/// the reader allocate more than the limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest key, bytes (`MAX_STRING_LEN`).
    pub max_key_len: usize,
    /// Longest value, bytes (`MAX_PAYLOAD_LEN`).
    pub max_value_len: usize,
    /// Most keys in one CHECK / WAIT / MULTI_GET / MULTI_SET (`MAX_KEY_COUNT`).
    pub max_key_count: usize,
}

impl Limits {
    /// What torch's default (libuv) server enforces: keys ≤ 8 KiB, values
    /// ≤ 8 MiB, ≤ 128 Ki keys per request. A request over a limit makes that
    /// server drop the connection.
    pub const LIBUV: Limits = Limits {
        max_key_len: 8 * 1024,
        max_value_len: 8 * 1024 * 1024,
        max_key_count: 128 * 1024,
    };
}

/// Why a frame could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The peer closed the connection cleanly between two frames.
    #[error("connection closed by the peer")]
    Closed,
    /// A read failed, or the frame ended early (`UnexpectedEof`).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The opcode byte is not one of [`Op`].
    #[error("unknown opcode {0}")]
    UnknownOp(u8),
    /// A length field is over its limit.
    #[error("{what} of {len} bytes is over the limit of {max} bytes")]
    TooLong {
        /// Which field ("key", "value", ...).
        what: &'static str,
        /// The length the frame announced.
        len: u64,
        /// The limit, bytes.
        max: usize,
    },
    /// A key count is over [`Limits::max_key_count`].
    #[error("{count} keys in one request is over the limit of {max}")]
    TooManyKeys {
        /// The count the frame announced.
        count: u64,
        /// The limit.
        max: usize,
    },
}

/// A key or value on the wire: borrowed when encoding, owned when decoded.
pub type Field<'a> = Cow<'a, [u8]>;

/// One client → server request, named after the torch opcode it carries
/// (see [`Op`] for each reply). Keys are raw bytes as on the wire (already
/// carrying the client's `/` prefix); values are arbitrary bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    /// VALIDATE: the connection's first request.
    Validate {
        /// Must be [`VALIDATION_MAGIC`].
        magic: u32,
    },
    /// SET: store `value` at `key`, waking its waiters.
    Set {
        /// Wire key.
        key: Field<'a>,
        /// New value.
        value: Field<'a>,
    },
    /// COMPARE_SET: swap in `desired` if the value is `expected`.
    CompareSet {
        /// Wire key.
        key: Field<'a>,
        /// Value the key must hold (empty: the key must be missing).
        expected: Field<'a>,
        /// Value to store.
        desired: Field<'a>,
    },
    /// GET: the value, empty if missing (clients WAIT first).
    Get {
        /// Wire key.
        key: Field<'a>,
    },
    /// ADD: add to the decimal counter at `key`.
    Add {
        /// Wire key.
        key: Field<'a>,
        /// Amount to add.
        delta: i64,
    },
    /// CHECK: whether all keys exist now.
    Check {
        /// Wire keys.
        keys: Vec<Field<'a>>,
    },
    /// WAIT: answered once all keys exist.
    Wait {
        /// Wire keys.
        keys: Vec<Field<'a>>,
    },
    /// GETNUMKEYS: number of keys (queues not counted).
    GetNumKeys,
    /// DELETE_KEY: remove a key.
    DeleteKey {
        /// Wire key.
        key: Field<'a>,
    },
    /// APPEND: append to the value (or create it).
    Append {
        /// Wire key.
        key: Field<'a>,
        /// Bytes to append.
        value: Field<'a>,
    },
    /// MULTI_GET: several values in order (clients WAIT first).
    MultiGet {
        /// Wire keys.
        keys: Vec<Field<'a>>,
    },
    /// MULTI_SET: several SETs in one frame.
    MultiSet {
        /// (wire key, value) pairs.
        pairs: Vec<(Field<'a>, Field<'a>)>,
    },
    /// CANCEL_WAIT: forget this connection's pending WAIT.
    CancelWait,
    /// PING: the server echoes `nonce`.
    Ping {
        /// Any value; torch's client sends its pid.
        nonce: u32,
    },
    /// QUEUE_PUSH: append to the queue named `key`.
    QueuePush {
        /// Queue name.
        key: Field<'a>,
        /// Element.
        value: Field<'a>,
    },
    /// QUEUE_POP: take the queue's first element, if any.
    QueuePop {
        /// Queue name.
        key: Field<'a>,
    },
    /// QUEUE_LEN: length of the queue.
    QueueLen {
        /// Queue name.
        key: Field<'a>,
    },
    /// LIST_KEYS: every key.
    ListKeys,
}

impl Request<'_> {
    /// The opcode this request is sent with.
    pub fn op(&self) -> Op {
        match self {
            Request::Validate { .. } => Op::Validate,
            Request::Set { .. } => Op::Set,
            Request::CompareSet { .. } => Op::CompareSet,
            Request::Get { .. } => Op::Get,
            Request::Add { .. } => Op::Add,
            Request::Check { .. } => Op::Check,
            Request::Wait { .. } => Op::Wait,
            Request::GetNumKeys => Op::GetNumKeys,
            Request::DeleteKey { .. } => Op::DeleteKey,
            Request::Append { .. } => Op::Append,
            Request::MultiGet { .. } => Op::MultiGet,
            Request::MultiSet { .. } => Op::MultiSet,
            Request::CancelWait => Op::CancelWait,
            Request::Ping { .. } => Op::Ping,
            Request::QueuePush { .. } => Op::QueuePush,
            Request::QueuePop { .. } => Op::QueuePop,
            Request::QueueLen { .. } => Op::QueueLen,
            Request::ListKeys => Op::ListKeys,
        }
    }

    /// Appends the frame, byte for byte as torch's `SendBuffer` builds it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.op() as u8);
        match self {
            Request::Validate { magic } => put_u32(out, *magic),
            Request::Ping { nonce } => put_u32(out, *nonce),
            Request::Set { key, value }
            | Request::Append { key, value }
            | Request::QueuePush { key, value } => {
                put_bytes(out, key);
                put_bytes(out, value);
            }
            Request::CompareSet {
                key,
                expected,
                desired,
            } => {
                put_bytes(out, key);
                put_bytes(out, expected);
                put_bytes(out, desired);
            }
            Request::Get { key }
            | Request::DeleteKey { key }
            | Request::QueuePop { key }
            | Request::QueueLen { key } => put_bytes(out, key),
            Request::Add { key, delta } => {
                put_bytes(out, key);
                put_i64(out, *delta);
            }
            Request::Check { keys } | Request::Wait { keys } | Request::MultiGet { keys } => {
                put_u64(out, keys.len() as u64);
                keys.iter().for_each(|k| put_bytes(out, k));
            }
            Request::MultiSet { pairs } => {
                // torch's client writes this count as int64_t, the others as size_t.
                put_i64(out, pairs.len() as i64);
                for (key, value) in pairs {
                    put_bytes(out, key);
                    put_bytes(out, value);
                }
            }
            Request::GetNumKeys | Request::CancelWait | Request::ListKeys => {}
        }
    }

    /// Reads one request. A clean end of stream before the opcode is
    /// [`WireError::Closed`]; any other shortfall is an `UnexpectedEof` I/O
    /// error.
    pub fn read_from<R: Read>(r: &mut R, limits: &Limits) -> Result<Request<'static>, WireError> {
        let mut first = [0u8; 1];
        loop {
            match r.read(&mut first) {
                Ok(0) => return Err(WireError::Closed),
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let key = |r: &mut R| read_key(r, limits).map(Cow::Owned);
        let value = |r: &mut R| read_value(r, limits).map(Cow::Owned);
        Ok(match Op::try_from(first[0])? {
            Op::Validate => Request::Validate {
                magic: read_u32(r)?,
            },
            Op::Ping => Request::Ping {
                nonce: read_u32(r)?,
            },
            Op::Set => Request::Set {
                key: key(r)?,
                value: value(r)?,
            },
            Op::Append => Request::Append {
                key: key(r)?,
                value: value(r)?,
            },
            Op::QueuePush => Request::QueuePush {
                key: key(r)?,
                value: value(r)?,
            },
            Op::CompareSet => Request::CompareSet {
                key: key(r)?,
                expected: value(r)?,
                desired: value(r)?,
            },
            Op::Get => Request::Get { key: key(r)? },
            Op::DeleteKey => Request::DeleteKey { key: key(r)? },
            Op::QueuePop => Request::QueuePop { key: key(r)? },
            Op::QueueLen => Request::QueueLen { key: key(r)? },
            Op::Add => Request::Add {
                key: key(r)?,
                delta: read_i64(r)?,
            },
            Op::Check => Request::Check {
                keys: read_keys(r, limits)?,
            },
            Op::Wait => Request::Wait {
                keys: read_keys(r, limits)?,
            },
            Op::MultiGet => Request::MultiGet {
                keys: read_keys(r, limits)?,
            },
            Op::MultiSet => {
                let n = read_count(r, limits)?;
                let mut pairs = Vec::with_capacity(n.min(64));
                for _ in 0..n {
                    pairs.push((key(r)?, value(r)?));
                }
                Request::MultiSet { pairs }
            }
            Op::GetNumKeys => Request::GetNumKeys,
            Op::CancelWait => Request::CancelWait,
            Op::ListKeys => Request::ListKeys,
        })
    }
}

/// Appends a u32, little-endian.
pub fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a u64, little-endian.
pub fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends an i64, little-endian.
pub fn put_i64(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// Appends a `str`/`bytes` field: u64 length, then the bytes.
pub fn put_bytes(out: &mut Vec<u8>, v: &[u8]) {
    put_u64(out, v.len() as u64);
    out.extend_from_slice(v);
}

/// Reads one byte.
pub fn read_u8(r: &mut impl Read) -> io::Result<u8> {
    let mut b = [0u8; 1];
    r.read_exact(&mut b)?;
    Ok(b[0])
}

/// Reads a little-endian u32.
pub fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

/// Reads a little-endian u64.
pub fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Reads a little-endian i64.
pub fn read_i64(r: &mut impl Read) -> io::Result<i64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(i64::from_le_bytes(b))
}

/// Reads a `str`/`bytes` field of at most `max` bytes. `what` names the
/// field in the error. Memory grows with the bytes that actually arrive, so a
/// lying length costs at most `max`.
pub fn read_field(r: &mut impl Read, max: usize, what: &'static str) -> Result<Vec<u8>, WireError> {
    let len = read_u64(r)?;
    if len > max as u64 {
        return Err(WireError::TooLong { what, len, max });
    }
    let len = len as usize;
    // Reserve up front only for modest sizes; larger ones grow as data comes.
    let mut buf = Vec::with_capacity(len.min(1 << 20));
    let got = r.take(len as u64).read_to_end(&mut buf)?;
    if got < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("{what} cut short: {got} of {len} bytes"),
        )
        .into());
    }
    Ok(buf)
}

/// Reads a key under `limits`.
pub fn read_key(r: &mut impl Read, limits: &Limits) -> Result<Vec<u8>, WireError> {
    read_field(r, limits.max_key_len, "key")
}

/// Reads a value under `limits`.
pub fn read_value(r: &mut impl Read, limits: &Limits) -> Result<Vec<u8>, WireError> {
    read_field(r, limits.max_value_len, "value")
}

fn read_count(r: &mut impl Read, limits: &Limits) -> Result<usize, WireError> {
    let count = read_u64(r)?;
    if count > limits.max_key_count as u64 {
        return Err(WireError::TooManyKeys {
            count,
            max: limits.max_key_count,
        });
    }
    Ok(count as usize)
}

fn read_keys(r: &mut impl Read, limits: &Limits) -> Result<Vec<Field<'static>>, WireError> {
    let n = read_count(r, limits)?;
    let mut keys = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        keys.push(Cow::Owned(read_key(r, limits)?));
    }
    Ok(keys)
}

/// Parses a counter value the way the server's `add` does (`std::stoll`,
/// base 10): leading whitespace, an optional sign, then at least one digit;
/// anything after the digits is ignored. `None` where `stoll` would throw
/// (no digits, or out of the i64 range).
pub fn parse_stoll(bytes: &[u8]) -> Option<i64> {
    let mut rest = bytes;
    while let [b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r', tail @ ..] = rest {
        rest = tail;
    }
    let negative = match rest {
        [b'-', tail @ ..] => {
            rest = tail;
            true
        }
        [b'+', tail @ ..] => {
            rest = tail;
            false
        }
        _ => false,
    };
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    // Accumulate negatively so that i64::MIN parses too.
    let mut acc: i64 = 0;
    for &d in &rest[..digits] {
        acc = acc.checked_mul(10)?.checked_sub(i64::from(d - b'0'))?;
    }
    if negative {
        Some(acc)
    } else {
        acc.checked_neg()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Field<'_> {
        Cow::Borrowed(s.as_bytes())
    }

    fn all_requests() -> Vec<Request<'static>> {
        vec![
            Request::Validate {
                magic: VALIDATION_MAGIC,
            },
            Request::Set {
                key: b("/k"),
                value: Cow::Borrowed(&[0, 1, 2, 255]),
            },
            Request::CompareSet {
                key: b("/k"),
                expected: b(""),
                desired: b("d"),
            },
            Request::Get { key: b("/k") },
            Request::Add {
                key: b("init/"),
                delta: -3,
            },
            Request::Check {
                keys: vec![b("/a"), b("/b")],
            },
            Request::Wait { keys: vec![] },
            Request::GetNumKeys,
            Request::DeleteKey { key: b("/k") },
            Request::Append {
                key: b("/k"),
                value: b("more"),
            },
            Request::MultiGet {
                keys: vec![b("/a"), b("/b"), b("/c")],
            },
            Request::MultiSet {
                pairs: vec![(b("/a"), b("1")), (b("/b"), b(""))],
            },
            Request::CancelWait,
            Request::Ping { nonce: 0xDEAD_BEEF },
            Request::QueuePush {
                key: b("/q"),
                value: b("x"),
            },
            Request::QueuePop { key: b("/q") },
            Request::QueueLen { key: b("/q") },
            Request::ListKeys,
        ]
    }

    fn encoded(req: &Request) -> Vec<u8> {
        let mut out = Vec::new();
        req.encode(&mut out);
        out
    }

    #[test]
    fn opcodes_match_torch_query_type() {
        for (i, req) in all_requests().iter().enumerate() {
            assert_eq!(req.op() as u8, i as u8);
            assert_eq!(Op::try_from(i as u8).unwrap(), req.op());
        }
        assert!(matches!(Op::try_from(18), Err(WireError::UnknownOp(18))));
        assert!(matches!(Op::try_from(255), Err(WireError::UnknownOp(255))));
    }

    #[test]
    fn frames_are_byte_exact() {
        assert_eq!(encoded(&all_requests()[0]), [0, 0xCE, 0xF7, 0x85, 0x3C]);
        let set = encoded(&Request::Set {
            key: b("/a"),
            value: b("xyz"),
        });
        let mut want = vec![
            1u8, 2, 0, 0, 0, 0, 0, 0, 0, b'/', b'a', 3, 0, 0, 0, 0, 0, 0, 0,
        ];
        want.extend_from_slice(b"xyz");
        assert_eq!(set, want);
        let add = encoded(&Request::Add {
            key: b("k"),
            delta: -1,
        });
        assert_eq!(
            add,
            [
                4, 1, 0, 0, 0, 0, 0, 0, 0, b'k', 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff
            ]
        );
        assert_eq!(
            encoded(&Request::Wait { keys: vec![] }),
            [6, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(encoded(&Request::CancelWait), [12]);
        assert_eq!(encoded(&Request::Ping { nonce: 1 }), [13, 1, 0, 0, 0]);
    }

    #[test]
    fn every_request_round_trips() {
        for req in all_requests() {
            let bytes = encoded(&req);
            let back = Request::read_from(&mut bytes.as_slice(), &Limits::LIBUV).unwrap();
            assert_eq!(back, req);
        }
    }

    #[test]
    fn truncated_frames_are_errors_at_every_cut() {
        for req in all_requests() {
            let bytes = encoded(&req);
            for cut in 0..bytes.len() {
                let err = Request::read_from(&mut &bytes[..cut], &Limits::LIBUV).unwrap_err();
                match (cut, err) {
                    (0, WireError::Closed) => {}
                    (_, WireError::Io(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {}
                    (cut, other) => panic!("{:?} cut at {cut}: {other:?}", req.op()),
                }
            }
        }
    }

    #[test]
    fn absurd_lengths_are_refused_before_allocating() {
        let mut frame = vec![Op::Get as u8];
        put_u64(&mut frame, u64::MAX);
        let err = Request::read_from(&mut frame.as_slice(), &Limits::LIBUV).unwrap_err();
        assert!(
            matches!(
                err,
                WireError::TooLong {
                    what: "key",
                    len: u64::MAX,
                    ..
                }
            ),
            "{err:?}"
        );

        let mut frame = vec![Op::Set as u8];
        put_bytes(&mut frame, b"/k");
        put_u64(&mut frame, (8 << 20) + 1);
        let err = Request::read_from(&mut frame.as_slice(), &Limits::LIBUV).unwrap_err();
        assert!(
            matches!(err, WireError::TooLong { what: "value", .. }),
            "{err:?}"
        );

        for op in [Op::Check, Op::Wait, Op::MultiGet, Op::MultiSet] {
            let mut frame = vec![op as u8];
            put_u64(&mut frame, u64::MAX);
            let err = Request::read_from(&mut frame.as_slice(), &Limits::LIBUV).unwrap_err();
            assert!(
                matches!(err, WireError::TooManyKeys { .. }),
                "{op:?}: {err:?}"
            );
        }
    }

    #[test]
    fn limits_are_inclusive() {
        let key = vec![b'k'; Limits::LIBUV.max_key_len];
        let frame = encoded(&Request::Get {
            key: Cow::Borrowed(&key),
        });
        assert!(Request::read_from(&mut frame.as_slice(), &Limits::LIBUV).is_ok());
        let key = vec![b'k'; Limits::LIBUV.max_key_len + 1];
        let frame = encoded(&Request::Get {
            key: Cow::Borrowed(&key),
        });
        assert!(Request::read_from(&mut frame.as_slice(), &Limits::LIBUV).is_err());
    }

    #[test]
    fn a_lying_length_allocates_only_what_arrives() {
        let mut frame = vec![Op::Set as u8];
        put_bytes(&mut frame, b"/k");
        put_u64(&mut frame, 8 << 20);
        frame.extend_from_slice(b"short");
        let err = Request::read_from(&mut frame.as_slice(), &Limits::LIBUV).unwrap_err();
        assert!(matches!(err, WireError::Io(ref e) if e.kind() == io::ErrorKind::UnexpectedEof));
    }

    #[test]
    fn garbage_never_panics() {
        // A fixed pseudo-random stream of frames: decoding may fail anywhere
        // but must neither panic nor hang.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut data = Vec::new();
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Bias towards small numbers so that some frames parse.
            data.push(if x % 3 == 0 {
                (x >> 8) as u8 % 20
            } else {
                (x >> 16) as u8
            });
        }
        let mut r = data.as_slice();
        let mut frames = 0;
        while !r.is_empty() {
            match Request::read_from(&mut r, &Limits::LIBUV) {
                Ok(_) => frames += 1,
                Err(WireError::Closed) => break,
                Err(_) => {
                    // Resynchronise by skipping a byte, as a fuzzer would.
                    if !r.is_empty() {
                        r = &r[1..];
                    }
                }
            }
        }
        assert!(frames > 0);
    }

    #[test]
    fn stoll_matches_cpp() {
        assert_eq!(parse_stoll(b"42"), Some(42));
        assert_eq!(parse_stoll(b"  \t\n-17xyz"), Some(-17));
        assert_eq!(parse_stoll(b"+5"), Some(5));
        assert_eq!(parse_stoll(b"007"), Some(7));
        assert_eq!(parse_stoll(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_stoll(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_stoll(b"9223372036854775808"), None);
        assert_eq!(parse_stoll(b""), None);
        assert_eq!(parse_stoll(b"abc"), None);
        assert_eq!(parse_stoll(b"- 1"), None);
        assert_eq!(parse_stoll(b"\x001"), None);
    }
}
