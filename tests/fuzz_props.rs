//! Property tests (proptest) of the two decoders that read untrusted bytes:
//! the c10d TCPStore request decoder the server runs on every connection
//! (`wire::Request::read_from`) and NIXL's descriptor-list decoder
//! (`serdes::DescList::decode`), which reads what peers publish.
//!
//! For arbitrary bytes, and for valid encodings with random mutations:
//! decoding never panics, allocates at most a fixed reservation plus a
//! small multiple of the input's size (never what a length field claims),
//! and is canonical (whatever decodes re-encodes to exactly its bytes). For
//! arbitrary valid values: encode → decode round-trips, every cut of an
//! encoding is an error, and the size limits hold to the byte.
//!
//! CI runs the case counts below (a few seconds). `PROPTEST_CASES=N`
//! overrides them all; `scripts/fuzz.sh` does that, in a loop, where no
//! coverage-guided fuzzer can run. The coverage-guided targets for the same
//! decoders are in `fuzz/`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::borrow::Cow;
use std::cell::Cell;
use std::io;

use nixl_examples::nixl::serdes::{Desc, DescList, MemType};
use nixl_examples::store::native::wire::{self, Limits, Request, WireError};
use proptest::prelude::*;
use proptest::sample::Index;

// ---------------------------------------------------------------------------
// Allocation meter: a global allocator that counts, per thread, the bytes
// live and their peak, so a property can bound what one decode allocated
// (tests run on several threads; each measures only its own).

struct Meter;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn note(delta: isize) {
    // `try_with`: allocations during thread teardown are not counted.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every call is forwarded unchanged to `System`; the bookkeeping
// touches only const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Meter {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            note(layout.size() as isize);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) };
        note(-(layout.size() as isize));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            note(new_size as isize - layout.size() as isize);
        }
        p
    }
}

#[global_allocator]
static METER: Meter = Meter;

/// Runs `f`; returns its result and the most bytes it had allocated at
/// once on this thread (beyond what was live when it began).
fn peak_alloc<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    let peak = PEAK.with(Cell::get);
    (out, (peak - base).max(0) as usize)
}

/// The case count, unless `PROPTEST_CASES` is set.
fn cases(default: u32) -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = default;
    }
    config
}

// ---------------------------------------------------------------------------
// Mutations of valid encodings, as a fuzzer would make them.

/// Length and count values worth planting in a frame: around zero, around
/// the limits, and far beyond anything allocatable.
const INTERESTING: [u64; 14] = [
    0,
    1,
    7,
    8,
    24,
    8 * 1024,
    8 * 1024 + 1,
    8 << 20,
    (8 << 20) + 1,
    128 * 1024 + 1,
    1 << 40,
    1 << 63,
    u64::MAX / 24 + 1,
    u64::MAX,
];

#[derive(Clone, Debug)]
enum Mutation {
    /// XOR one byte with a non-zero mask.
    Flip(Index, u8),
    /// Insert one byte.
    Insert(Index, u8),
    /// Remove one byte.
    Remove(Index),
    /// Cut everything from here on.
    Truncate(Index),
    /// Overwrite 8 bytes with a little-endian interesting value.
    PutU64(Index, usize),
    /// Copy a run of bytes to another place (duplicates fields and tags).
    Splice(Index, Index, u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 1..=255u8).prop_map(|(i, m)| Mutation::Flip(i, m)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<Index>().prop_map(Mutation::Remove),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), 0..INTERESTING.len()).prop_map(|(i, v)| Mutation::PutU64(i, v)),
        (any::<Index>(), any::<Index>(), 1..=32u8).prop_map(|(a, b, n)| Mutation::Splice(a, b, n)),
    ]
}

fn mutate(bytes: &mut Vec<u8>, mutations: &[Mutation]) {
    for m in mutations {
        if bytes.is_empty() {
            return;
        }
        let len = bytes.len();
        match *m {
            Mutation::Flip(ref i, mask) => bytes[i.index(len)] ^= mask,
            Mutation::Insert(ref i, b) => bytes.insert(i.index(len + 1), b),
            Mutation::Remove(ref i) => {
                bytes.remove(i.index(len));
            }
            Mutation::Truncate(ref i) => bytes.truncate(i.index(len)),
            Mutation::PutU64(ref i, v) => {
                let at = i.index(len);
                let v = INTERESTING[v].to_le_bytes();
                let n = (len - at).min(8);
                bytes[at..at + n].copy_from_slice(&v[..n]);
            }
            Mutation::Splice(ref from, ref to, n) => {
                let from = from.index(len);
                let run: Vec<u8> = bytes[from..(from + usize::from(n)).min(len)].to_vec();
                let to = to.index(len + 1);
                bytes.splice(to..to, run);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// c10d TCPStore request frames.

/// Limits small enough for short generated fields to cross.
const TINY: Limits = Limits {
    max_key_len: 4,
    max_value_len: 16,
    max_key_count: 3,
};

/// What a decode may allocate beyond a multiple of its input: `read_field`
/// reserves up to 1 MiB for a field before its bytes arrive (and only the
/// field being read can be short of its bytes), plus small change.
const WIRE_RESERVE: usize = (1 << 20) + (64 << 10);

/// Decoded requests hold their keys and values (each at least as long as
/// its bytes in the frame) in `Cow`s of 24 bytes for as little as 8 bytes
/// of frame, in vectors that may have doubled: 8 × the input bounds them.
const WIRE_PER_INPUT_BYTE: usize = 8;

fn field(max: usize) -> impl Strategy<Value = Cow<'static, [u8]>> {
    prop::collection::vec(any::<u8>(), 0..=max).prop_map(Cow::Owned)
}

/// Any request, with keys up to `k` bytes, values up to `v` bytes and up to
/// `n` keys per list.
fn request(k: usize, v: usize, n: usize) -> impl Strategy<Value = Request<'static>> {
    let keys = move || prop::collection::vec(field(k), 0..=n);
    prop_oneof![
        any::<u32>().prop_map(|magic| Request::Validate { magic }),
        (field(k), field(v)).prop_map(|(key, value)| Request::Set { key, value }),
        (field(k), field(v), field(v)).prop_map(|(key, expected, desired)| {
            Request::CompareSet {
                key,
                expected,
                desired,
            }
        }),
        field(k).prop_map(|key| Request::Get { key }),
        (field(k), any::<i64>()).prop_map(|(key, delta)| Request::Add { key, delta }),
        keys().prop_map(|keys| Request::Check { keys }),
        keys().prop_map(|keys| Request::Wait { keys }),
        Just(Request::GetNumKeys),
        field(k).prop_map(|key| Request::DeleteKey { key }),
        (field(k), field(v)).prop_map(|(key, value)| Request::Append { key, value }),
        keys().prop_map(|keys| Request::MultiGet { keys }),
        prop::collection::vec((field(k), field(v)), 0..=n)
            .prop_map(|pairs| Request::MultiSet { pairs }),
        Just(Request::CancelWait),
        any::<u32>().prop_map(|nonce| Request::Ping { nonce }),
        (field(k), field(v)).prop_map(|(key, value)| Request::QueuePush { key, value }),
        field(k).prop_map(|key| Request::QueuePop { key }),
        field(k).prop_map(|key| Request::QueueLen { key }),
        Just(Request::ListKeys),
    ]
}

fn encode(requests: &[Request<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    requests.iter().for_each(|r| r.encode(&mut out));
    out
}

/// Whether every field of `r` is within `limits`.
fn fits(r: &Request<'_>, limits: &Limits) -> bool {
    let key = |k: &[u8]| k.len() <= limits.max_key_len;
    let value = |v: &[u8]| v.len() <= limits.max_value_len;
    let keys = |ks: &[Cow<'_, [u8]>]| ks.len() <= limits.max_key_count && ks.iter().all(|k| key(k));
    match r {
        Request::Validate { .. }
        | Request::Ping { .. }
        | Request::GetNumKeys
        | Request::CancelWait
        | Request::ListKeys => true,
        Request::Get { key: k }
        | Request::DeleteKey { key: k }
        | Request::QueuePop { key: k }
        | Request::QueueLen { key: k }
        | Request::Add { key: k, .. } => key(k),
        Request::Set { key: k, value: v }
        | Request::Append { key: k, value: v }
        | Request::QueuePush { key: k, value: v } => key(k) && value(v),
        Request::CompareSet {
            key: k,
            expected,
            desired,
        } => key(k) && value(expected) && value(desired),
        Request::Check { keys: ks }
        | Request::Wait { keys: ks }
        | Request::MultiGet { keys: ks } => keys(ks),
        Request::MultiSet { pairs } => {
            pairs.len() <= limits.max_key_count && pairs.iter().all(|(k, v)| key(k) && value(v))
        }
    }
}

/// Decodes frames from `bytes` until the first error, checking that each
/// decoded frame re-encodes to exactly the bytes it was read from, and
/// that the whole decode allocated at most [`WIRE_RESERVE`] plus
/// [`WIRE_PER_INPUT_BYTE`] × the input.
fn decode_stream(bytes: &[u8], limits: &Limits) -> Result<(), TestCaseError> {
    let ((), peak) = peak_alloc(|| {
        let mut rest = bytes;
        let mut decoded = Vec::new();
        loop {
            let before = rest;
            match Request::read_from(&mut rest, limits) {
                Ok(request) => {
                    let used = &before[..before.len() - rest.len()];
                    decoded.push((request, used));
                }
                Err(_) => break,
            }
        }
        for (request, used) in decoded {
            let mut again = Vec::new();
            request.encode(&mut again);
            assert_eq!(again, used, "{request:?} does not re-encode to its frame");
        }
    });
    let bound = WIRE_RESERVE + WIRE_PER_INPUT_BYTE * bytes.len();
    prop_assert!(
        peak <= bound,
        "decoding {} bytes allocated {peak} bytes (bound {bound})",
        bytes.len()
    );
    Ok(())
}

/// Bytes that look like frames often enough to get past the opcode: the
/// first byte is an opcode (or one past the last) half of the time.
fn frame_like_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![0..=18u8, any::<u8>()],
        prop::collection::vec(any::<u8>(), 0..512),
    )
        .prop_map(|(op, mut rest)| {
            rest.insert(0, op);
            rest
        })
}

/// A piece of a frame: a field with its true length or a lying one (an
/// interesting value, or anything up to twice the largest legal value), a
/// small key count, or a bare u32.
fn wire_item() -> impl Strategy<Value = Vec<u8>> {
    let bytes = || prop::collection::vec(any::<u8>(), 0..32);
    let lie = prop_oneof![
        prop::sample::select(INTERESTING.to_vec()),
        0..=(2 * Limits::LIBUV.max_value_len as u64),
    ];
    prop_oneof![
        bytes().prop_map(|v| {
            let mut f = Vec::new();
            wire::put_bytes(&mut f, &v);
            f
        }),
        (bytes(), lie).prop_map(|(v, len)| {
            let mut f = Vec::new();
            wire::put_u64(&mut f, len);
            f.extend_from_slice(&v);
            f
        }),
        (0..5u64).prop_map(|n| n.to_le_bytes().to_vec()),
        any::<u32>().prop_map(|n| n.to_le_bytes().to_vec()),
    ]
}

/// An opcode (or one past the last), then a few [`wire_item`]s: frames
/// whose layout is right often enough for lying lengths to reach every
/// field's length check.
fn frame_with_lies() -> impl Strategy<Value = Vec<u8>> {
    (0..=18u8, prop::collection::vec(wire_item(), 0..5)).prop_map(|(op, items)| {
        let mut f = vec![op];
        items.iter().for_each(|i| f.extend_from_slice(i));
        f
    })
}

proptest! {
    #![proptest_config(cases(512))]

    /// A stream of any requests decodes back to the same requests, then to
    /// a clean end of stream.
    #[test]
    fn wire_frames_round_trip(requests in prop::collection::vec(request(24, 128, 6), 1..8)) {
        let bytes = encode(&requests);
        let mut rest = bytes.as_slice();
        for want in &requests {
            let got = Request::read_from(&mut rest, &Limits::LIBUV);
            prop_assert_eq!(got.as_ref().ok(), Some(want), "{:?}", got);
        }
        let end = Request::read_from(&mut rest, &Limits::LIBUV);
        prop_assert!(matches!(end, Err(WireError::Closed)), "{:?}", end);
    }

    /// Limits hold to the byte: a request decodes under tiny limits exactly
    /// when all its fields fit, and is otherwise refused as too long or
    /// with too many keys (never as a cut frame).
    #[test]
    fn wire_limits_are_exact(request in request(6, 20, 5)) {
        let bytes = encode(std::slice::from_ref(&request));
        let got = Request::read_from(&mut bytes.as_slice(), &TINY);
        if fits(&request, &TINY) {
            prop_assert_eq!(got.ok(), Some(request));
        } else {
            prop_assert!(
                matches!(got, Err(WireError::TooLong { .. } | WireError::TooManyKeys { .. })),
                "{:?} under {:?}: {:?}", request, TINY, got
            );
        }
    }

    /// Every cut of a frame is an error: a clean close before the first
    /// byte, an unexpected end anywhere after it.
    #[test]
    fn wire_every_cut_is_an_error(request in request(24, 128, 6), cut in any::<Index>()) {
        let bytes = encode(std::slice::from_ref(&request));
        let cut = cut.index(bytes.len());
        let got = Request::read_from(&mut &bytes[..cut], &Limits::LIBUV);
        match got {
            Err(WireError::Closed) => prop_assert_eq!(cut, 0),
            Err(WireError::Io(ref e)) => prop_assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof),
            other => prop_assert!(false, "cut at {} of {}: {:?}", cut, bytes.len(), other),
        }
    }

}

proptest! {
    #![proptest_config(cases(2048))]

    /// Arbitrary bytes: no panic, bounded allocation, canonical frames.
    #[test]
    fn wire_arbitrary_bytes(bytes in frame_like_bytes()) {
        decode_stream(&bytes, &Limits::LIBUV)?;
        decode_stream(&bytes, &TINY)?;
    }

    /// Frames whose fields announce lengths they do not have, up to twice
    /// the largest legal value: refused or cut short without reserving
    /// more than [`WIRE_RESERVE`]; never a panic.
    #[test]
    fn wire_lying_lengths(bytes in frame_with_lies()) {
        decode_stream(&bytes, &Limits::LIBUV)?;
        decode_stream(&bytes, &TINY)?;
    }

    /// Valid frames with a fuzzer's mutations (flipped, inserted, removed
    /// bytes, absurd lengths planted, runs copied): no panic, bounded
    /// allocation, canonical frames.
    #[test]
    fn wire_mutated_frames(
        requests in prop::collection::vec(request(24, 128, 6), 1..5),
        mutations in prop::collection::vec(mutation(), 1..8),
    ) {
        let mut bytes = encode(&requests);
        mutate(&mut bytes, &mutations);
        decode_stream(&bytes, &Limits::LIBUV)?;
        decode_stream(&bytes, &TINY)?;
    }
}

// ---------------------------------------------------------------------------
// NIXL descriptor lists (nixlSerDes).

/// What a decode may allocate beyond [`SERDES_PER_INPUT_BYTE`] × the input.
const SERDES_SLACK: usize = 256;

/// The descriptors take exactly the bytes of their payload; an error
/// naming an unknown list kind holds it lossily as UTF-8, up to 3 bytes
/// (U+FFFD) per input byte.
const SERDES_PER_INPUT_BYTE: usize = 3;

fn mem_type() -> impl Strategy<Value = MemType> {
    prop::sample::select(vec![
        MemType::Dram,
        MemType::Vram,
        MemType::Blk,
        MemType::Obj,
        MemType::File,
    ])
}

fn desc_list(max: usize) -> impl Strategy<Value = DescList> {
    (
        mem_type(),
        prop::collection::vec(
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(addr, len, dev_id)| Desc {
                addr,
                len,
                dev_id,
            }),
            0..=max,
        ),
    )
        .prop_map(|(mem_type, descs)| DescList::new(mem_type, descs))
}

/// Decodes `bytes`, checking that an accepted input is exactly the encoding
/// of what it decoded to, and that the decode allocated at most
/// [`SERDES_PER_INPUT_BYTE`] × the input plus [`SERDES_SLACK`].
fn check_decode(bytes: &[u8]) -> Result<(), TestCaseError> {
    let (decoded, peak) = peak_alloc(|| DescList::decode(bytes));
    if let Ok(list) = decoded {
        prop_assert_eq!(
            list.encode(),
            bytes,
            "{:?} does not re-encode to its bytes",
            list
        );
    }
    let bound = SERDES_SLACK + SERDES_PER_INPUT_BYTE * bytes.len();
    prop_assert!(
        peak <= bound,
        "decoding {} bytes allocated {peak} bytes (bound {bound})",
        bytes.len()
    );
    Ok(())
}

/// A serdes field: `tag ‖ u64 len ‖ payload ‖ sep` with, mostly, the
/// format's `tag` and a fitting `payload`, but sometimes a junk tag, a
/// lying length (an interesting value: up to u64::MAX, and counts whose
/// × 24 overflows) or a separator other than `|`.
fn serdes_field(
    tag: &'static [u8],
    payload: BoxedStrategy<Vec<u8>>,
) -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![8 => Just(tag), 1 => prop::sample::select(vec![&b"nixlDList"[..], b"t", b"n", b"", b"x"])],
        prop_oneof![4 => Just(None), 1 => (0..INTERESTING.len()).prop_map(Some)],
        payload,
        prop_oneof![8 => Just(b'|'), 1 => any::<u8>()],
    )
        .prop_map(|(tag, lie, payload, sep)| {
            let mut f = tag.to_vec();
            let len = lie.map_or(payload.len() as u64, |i| INTERESTING[i]);
            f.extend_from_slice(&len.to_le_bytes());
            f.extend_from_slice(&payload);
            f.push(sep);
            f
        })
}

/// The four fields of a descriptor list in order (kind, memory type,
/// count, descriptors), each as [`serdes_field`] makes them, the count
/// often an interesting value unrelated to the descriptors that follow;
/// sometimes a field is left out or junk follows.
fn serdes_structured() -> impl Strategy<Value = Vec<u8>> {
    let junk = || prop::collection::vec(any::<u8>(), 0..40);
    let kind = prop_oneof![8 => Just(b"nixlBDList".to_vec()), 1 => junk()].boxed();
    let mem = prop_oneof![
        8 => (0..6u32).prop_map(|t| t.to_le_bytes().to_vec()),
        1 => junk(),
    ]
    .boxed();
    let count = prop_oneof![
        (0..4u64).prop_map(|n| n.to_le_bytes().to_vec()),
        (0..INTERESTING.len()).prop_map(|i| INTERESTING[i].to_le_bytes().to_vec()),
        junk(),
    ]
    .boxed();
    let descs = prop_oneof![
        (0..4usize).prop_flat_map(|n| prop::collection::vec(any::<u8>(), 24 * n)),
        junk(),
    ]
    .boxed();
    (
        serdes_field(b"nixlDList", kind),
        serdes_field(b"t", mem),
        serdes_field(b"n", count),
        serdes_field(b"", descs),
        prop::collection::vec(prop::bool::weighted(0.9), 4),
        prop_oneof![4 => Just(Vec::new()), 1 => junk()],
    )
        .prop_map(|(kind, mem, count, descs, keep, trailing)| {
            let mut bytes = b"nixlSerDes|".to_vec();
            for (f, keep) in [kind, mem, count, descs].iter().zip(keep) {
                if keep {
                    bytes.extend_from_slice(f);
                }
            }
            bytes.extend_from_slice(&trailing);
            bytes
        })
}

proptest! {
    #![proptest_config(cases(512))]

    /// Any descriptor list encodes to the documented size (71 bytes empty,
    /// 80 + 24 per descriptor otherwise) and decodes back to itself.
    #[test]
    fn serdes_round_trip(list in desc_list(64)) {
        let bytes = list.encode();
        let n = list.descs.len();
        prop_assert_eq!(bytes.len(), if n == 0 { 71 } else { 80 + 24 * n });
        prop_assert_eq!(DescList::decode(&bytes), Ok(list));
    }
}

proptest! {
    #![proptest_config(cases(2048))]

    /// Arbitrary bytes, bare or behind the real header: no panic, bounded
    /// allocation, canonical.
    #[test]
    fn serdes_arbitrary_bytes(header in any::<bool>(), tail in prop::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = if header { b"nixlSerDes|".to_vec() } else { Vec::new() };
        bytes.extend_from_slice(&tail);
        check_decode(&bytes)?;
    }

    /// The header and the four fields, each possibly with a junk tag, a
    /// lying length, a wrong separator, an absurd count, or left out: no
    /// panic, bounded allocation, canonical.
    #[test]
    fn serdes_structured_garbage(bytes in serdes_structured()) {
        check_decode(&bytes)?;
    }

    /// Valid encodings with a fuzzer's mutations: no panic, bounded
    /// allocation, canonical.
    #[test]
    fn serdes_mutated_encodings(
        list in desc_list(8),
        mutations in prop::collection::vec(mutation(), 1..8),
    ) {
        let mut bytes = list.encode();
        mutate(&mut bytes, &mutations);
        check_decode(&bytes)?;
    }
}

/// The meter sees a decode's allocations: without this the bounds above
/// would pass vacuously.
#[test]
fn allocation_meter_counts() {
    let list = DescList::new(
        MemType::Vram,
        vec![
            Desc {
                addr: 1,
                len: 2,
                dev_id: 3
            };
            1000
        ],
    );
    let bytes = list.encode();
    let (decoded, peak) = peak_alloc(|| DescList::decode(&bytes));
    assert_eq!(decoded.unwrap(), list);
    assert!(
        peak >= 24_000,
        "the meter saw {peak} bytes for 1000 descriptors"
    );
    // A SET announcing a 4 MiB value (legal) with none of its bytes.
    let mut frame = vec![wire::Op::Set as u8];
    wire::put_bytes(&mut frame, b"/k");
    wire::put_u64(&mut frame, 4 << 20);
    let (_, peak) = peak_alloc(|| Request::read_from(&mut frame.as_slice(), &Limits::LIBUV));
    assert!(
        peak >= 1 << 20,
        "the meter saw {peak} bytes for a 1 MiB reservation"
    );
}
