//! libFuzzer target: arbitrary bytes as a stream of c10d TCPStore request
//! frames, through the decoder the server runs on every connection
//! (`wire::Request::read_from`).
//!
//! Checks: no panic; no allocation over `-malloc_limit_mb` (scripts/fuzz.sh
//! sets 2 MiB: inputs are at most 4 KiB and a field's buffer is reserved at
//! most 1 MiB ahead of its bytes, so more means a length field was believed
//! before its bytes arrived); and decoding is canonical,
//! so every frame that decodes re-encodes to exactly the bytes it came from.
//! Each input is decoded twice: under torch's limits, and under tiny ones
//! so that short inputs reach the over-the-limit paths too.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tcpstore::native::wire::{Limits, Request};

/// Limits small enough for the fuzzer to cross with a few bytes.
const TINY: Limits = Limits {
    max_key_len: 4,
    max_value_len: 16,
    max_key_count: 3,
};

fn decode_all(data: &[u8], limits: &Limits) {
    let mut rest = data;
    loop {
        let before = rest;
        match Request::read_from(&mut rest, limits) {
            Ok(request) => {
                let used = &before[..before.len() - rest.len()];
                let mut again = Vec::with_capacity(used.len());
                request.encode(&mut again);
                assert_eq!(again, used, "{request:?} does not re-encode to its bytes");
            }
            Err(_) => break,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    decode_all(data, &Limits::LIBUV);
    decode_all(data, &TINY);
});
