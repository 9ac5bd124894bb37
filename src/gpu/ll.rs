//! The LL line format of `cuda/kernels.cu` on the host: how a payload is
//! laid out in 16-byte lines, and the check the target runs on what arrived.
//!
//! A line is `{u32 data0, u32 seq, u32 data1, u32 seq}` (little-endian):
//! 8 bytes of payload and the iteration's sequence number twice, as NCCL's
//! LL protocol (`src/device/prims_ll.h`). Payload byte `8k + j` sits in
//! line `k`, at byte `j` (j < 4) or `8 + (j − 4)` (j ≥ 4) of the line; the
//! last line's unused payload bytes are zero.

/// Bytes of one line on the wire.
pub const LINE_BYTES: u64 = 16;
/// Payload bytes one line carries.
pub const PAYLOAD_PER_LINE: u64 = 8;

/// Lines that carry `size` payload bytes.
pub fn lines(size: u64) -> u64 {
    size.div_ceil(PAYLOAD_PER_LINE)
}

/// Bytes the lines of `size` payload bytes take in the receiver's buffer
/// (and on the wire): about twice the payload.
pub fn wire_bytes(size: u64) -> u64 {
    lines(size) * LINE_BYTES
}

/// `payload` as the kernels write it, every line stamped with `seq`
/// (the host mirror of `ll_copy`, for tests and tools).
pub fn pack(payload: &[u8], seq: u32) -> Vec<u8> {
    let mut out = vec![0u8; wire_bytes(payload.len() as u64) as usize];
    for (k, chunk) in payload.chunks(PAYLOAD_PER_LINE as usize).enumerate() {
        let line = &mut out[k * 16..k * 16 + 16];
        for (j, &b) in chunk.iter().enumerate() {
            line[if j < 4 { j } else { j + 4 }] = b;
        }
        line[4..8].copy_from_slice(&seq.to_le_bytes());
        line[12..16].copy_from_slice(&seq.to_le_bytes());
    }
    out
}

/// A line whose flags do not carry the sequence number the round ended on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "LL line {line} (payload bytes {}..) carries seq {seen:?}, expected {expected} in both halves: {}",
    line * PAYLOAD_PER_LINE as usize,
    if seen[0] == 0 && seen[1] == 0 { "it never arrived" } else { "it is from another iteration, or torn" }
)]
pub struct LineMismatch {
    pub line: usize,
    /// The two seq words as read.
    pub seen: [u32; 2],
    pub expected: u32,
}

/// The payload of `size` bytes out of `wire` (at least [`wire_bytes`]
/// long), after checking that both halves of every line carry `seq`.
/// The payload's own bytes are left for the caller to verify.
pub fn unpack(wire: &[u8], size: usize, seq: u32) -> Result<Vec<u8>, LineMismatch> {
    let word = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap());
    let n = lines(size as u64) as usize;
    let mut payload = Vec::with_capacity(n * 8);
    for (k, line) in wire[..n * 16].chunks_exact(16).enumerate() {
        let seen = [word(&line[4..8]), word(&line[12..16])];
        if seen != [seq, seq] {
            return Err(LineMismatch {
                line: k,
                seen,
                expected: seq,
            });
        }
        payload.extend_from_slice(&line[0..4]);
        payload.extend_from_slice(&line[8..12]);
    }
    payload.truncate(size);
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_whole_lines() {
        assert_eq!((lines(0), wire_bytes(0)), (0, 0));
        assert_eq!((lines(1), wire_bytes(1)), (1, 16));
        assert_eq!((lines(8), wire_bytes(8)), (1, 16));
        assert_eq!((lines(9), wire_bytes(9)), (2, 32));
        assert_eq!(wire_bytes(64 << 20), 128 << 20);
    }

    #[test]
    fn a_line_is_data_seq_data_seq() {
        let wire = pack(&[1, 2, 3, 4, 5, 6, 7, 8], 0x0a0b0c0d);
        assert_eq!(
            wire,
            [
                1, 2, 3, 4, 0x0d, 0x0c, 0x0b, 0x0a, 5, 6, 7, 8, 0x0d, 0x0c, 0x0b, 0x0a
            ]
        );
    }

    #[test]
    fn unpack_returns_what_pack_took() {
        for size in [0usize, 1, 7, 8, 9, 15, 16, 17, 100, 4096 + 3] {
            let payload: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
            let wire = pack(&payload, 42);
            assert_eq!(unpack(&wire, size, 42), Ok(payload), "size {size}");
        }
    }

    #[test]
    fn a_stale_torn_or_missing_line_is_named() {
        let payload = vec![9u8; 40];
        let mut wire = pack(&payload, 7);
        // Line 2's second half from the iteration before: torn.
        wire[2 * 16 + 12..2 * 16 + 16].copy_from_slice(&6u32.to_le_bytes());
        let e = unpack(&wire, 40, 7).unwrap_err();
        assert_eq!((e.line, e.seen, e.expected), (2, [7, 6], 7));
        assert!(e.to_string().contains("torn"), "{e}");
        // A zeroed buffer never passes.
        let e = unpack(&vec![0u8; 80], 40, 1).unwrap_err();
        assert_eq!(e.line, 0);
        assert!(e.to_string().contains("never arrived"), "{e}");
    }
}
