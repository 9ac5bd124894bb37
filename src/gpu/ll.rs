//! The LL and LL128 line formats of `cuda/ll.cuh` on the host: how a
//! payload is laid out in lines, and the check the target runs on what
//! arrived.
//!
//! An LL line is `{u32 data0, u32 seq, u32 data1, u32 seq}` (little-endian):
//! 8 bytes of payload and the iteration's sequence number twice, as NCCL's
//! LL protocol (`src/device/prims_ll.h`). Payload byte `8k + j` sits in
//! line `k`, at byte `j` (j < 4) or `8 + (j − 4)` (j ≥ 4) of the line; the
//! last line's unused payload bytes are zero.
//!
//! An LL128 line ([`ll128`]) is 128 bytes: 120 of payload, then one 8-byte
//! flag word holding the sequence number twice, as NCCL's LL128 protocol
//! (`src/device/prims_ll128.h`) keeps one flag per 128 bytes.

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
    "{protocol} line {line} (payload bytes {first_byte}..) carries seq {seen:?}, expected {expected} in both \
     halves: {}",
    if seen[0] == 0 && seen[1] == 0 { "it never arrived" } else { "it is from another iteration, or torn" }
)]
pub struct LineMismatch {
    /// `LL` or `LL128`.
    pub protocol: &'static str,
    pub line: usize,
    /// The line's first payload byte.
    pub first_byte: usize,
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
                protocol: "LL",
                line: k,
                first_byte: k * PAYLOAD_PER_LINE as usize,
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

/// The LL128 line: 128 bytes, the first 120 payload, the last 8 a flag
/// word `{u32 seq, u32 seq}`. Payload byte `120k + j` sits at byte `j` of
/// line `k`; the last line's unused payload bytes are zero. A warp writes
/// four lines with one 16-byte store per lane (eight lanes a line, the
/// eighth carrying the line's last 8 payload bytes and the flag) and reads
/// them the same way, polling the flag: the format relies on a warp's
/// 128-byte store arriving whole, which NVLink gives (`cuda/ll.cuh`).
pub mod ll128 {
    use super::LineMismatch;

    /// Bytes of one line on the wire.
    pub const LINE_BYTES: u64 = 128;
    /// Payload bytes one line carries.
    pub const PAYLOAD_PER_LINE: u64 = 120;

    /// Lines that carry `size` payload bytes.
    pub fn lines(size: u64) -> u64 {
        size.div_ceil(PAYLOAD_PER_LINE)
    }

    /// Bytes the lines of `size` payload bytes take in the receiver's
    /// buffer (and on the wire): 16/15 of the payload, rounded up to a line.
    pub fn wire_bytes(size: u64) -> u64 {
        lines(size) * LINE_BYTES
    }

    /// `payload` as the kernels write it, every line's flag `{seq, seq}`
    /// (the host mirror of `ll128_write`, for tests and tools).
    pub fn pack(payload: &[u8], seq: u32) -> Vec<u8> {
        let mut out = vec![0u8; wire_bytes(payload.len() as u64) as usize];
        let (line, data) = (LINE_BYTES as usize, PAYLOAD_PER_LINE as usize);
        for (k, chunk) in payload.chunks(data).enumerate() {
            out[k * line..k * line + chunk.len()].copy_from_slice(chunk);
        }
        for flag in out.chunks_exact_mut(line) {
            flag[data..data + 4].copy_from_slice(&seq.to_le_bytes());
            flag[data + 4..].copy_from_slice(&seq.to_le_bytes());
        }
        out
    }

    /// The payload of `size` bytes out of `wire` (at least [`wire_bytes`]
    /// long), after checking that every line's flag word carries `seq`
    /// twice. The payload's own bytes are left for the caller to verify.
    pub fn unpack(wire: &[u8], size: usize, seq: u32) -> Result<Vec<u8>, LineMismatch> {
        let word = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap());
        let (line, data) = (LINE_BYTES as usize, PAYLOAD_PER_LINE as usize);
        let n = lines(size as u64) as usize;
        let mut payload = Vec::with_capacity(n * data);
        for (k, l) in wire[..n * line].chunks_exact(line).enumerate() {
            let seen = [word(&l[data..data + 4]), word(&l[data + 4..])];
            if seen != [seq, seq] {
                return Err(LineMismatch {
                    protocol: "LL128",
                    line: k,
                    first_byte: k * data,
                    seen,
                    expected: seq,
                });
            }
            payload.extend_from_slice(&l[..data]);
        }
        payload.truncate(size);
        Ok(payload)
    }
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

    #[test]
    fn ll128_sizes_round_up_to_whole_lines() {
        use super::ll128::*;
        assert_eq!((lines(0), wire_bytes(0)), (0, 0));
        assert_eq!((lines(1), wire_bytes(1)), (1, 128));
        assert_eq!((lines(120), wire_bytes(120)), (1, 128));
        assert_eq!((lines(121), wire_bytes(121)), (2, 256));
        // 1 MiB: 8,739 lines (the last one 16 bytes short of full).
        assert_eq!(lines(1 << 20), 8739);
    }

    #[test]
    fn an_ll128_line_is_120_payload_bytes_then_the_flag_twice() {
        let payload: Vec<u8> = (1..=121).collect();
        let wire = super::ll128::pack(&payload, 0x0a0b0c0d);
        assert_eq!(wire.len(), 256);
        assert_eq!(&wire[..120], &payload[..120]);
        assert_eq!(
            &wire[120..128],
            &[0x0d, 0x0c, 0x0b, 0x0a, 0x0d, 0x0c, 0x0b, 0x0a]
        );
        assert_eq!(wire[128], 121);
        assert!(
            wire[129..248].iter().all(|&b| b == 0),
            "the last line's padding is zero"
        );
        assert_eq!(&wire[248..], &wire[120..128]);
    }

    #[test]
    fn ll128_unpack_returns_what_pack_took() {
        use super::ll128::*;
        for size in [
            0usize,
            1,
            7,
            8,
            112,
            119,
            120,
            121,
            239,
            240,
            241,
            4096 + 3,
            65537,
        ] {
            let payload: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
            let wire = pack(&payload, 42);
            assert_eq!(unpack(&wire, size, 42), Ok(payload), "size {size}");
        }
    }

    #[test]
    fn a_stale_torn_or_missing_ll128_line_is_named() {
        use super::ll128::*;
        let payload = vec![9u8; 400];
        let mut wire = pack(&payload, 7);
        wire[2 * 128 + 124..2 * 128 + 128].copy_from_slice(&6u32.to_le_bytes());
        let e = unpack(&wire, 400, 7).unwrap_err();
        assert_eq!((e.line, e.first_byte, e.seen), (2, 240, [7, 6]));
        assert!(
            e.to_string()
                .starts_with("LL128 line 2 (payload bytes 240..)"),
            "{e}"
        );
        let e = unpack(&[0u8; 512], 400, 1).unwrap_err();
        assert!(e.to_string().contains("never arrived"), "{e}");
    }
}
