//! The LL and LL128 line formats of `cuda/ll.cuh` on the host: how a
//! payload is laid out in lines, and the check the target runs on what
//! arrived. One [`Format`] describes each.
//!
//! An LL line ([`LL`]) is `{u32 data0, u32 seq, u32 data1, u32 seq}`
//! (little-endian): 8 bytes of payload and the iteration's sequence number
//! twice, as NCCL's LL protocol (`src/device/prims_ll.h`). Payload byte
//! `8k + j` sits in line `k`, at byte `j` (j < 4) or `8 + (j − 4)` (j ≥ 4)
//! of the line.
//!
//! An LL128 line ([`LL128`]) is 128 bytes: 120 of payload, then one 8-byte
//! flag word holding the sequence number twice, as NCCL's LL128 protocol
//! (`src/device/prims_ll128.h`) keeps one flag per 128 bytes. A warp writes
//! four lines with one 16-byte store per lane (eight lanes a line, the
//! eighth carrying the line's last 8 payload bytes and the flag) and reads
//! them the same way: the format relies on a warp's 128-byte store arriving
//! whole, which NVLink gives (`cuda/ll.cuh`).
//!
//! In both, the last line's unused payload bytes are zero.

use std::ops::Range;

/// A line format: its bytes, where its payload sits in it (in payload
/// order) and where its two copies of the sequence number are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Format {
    /// `LL` or `LL128`, for messages.
    pub protocol: &'static str,
    /// Bytes of one line on the wire.
    pub line_bytes: u64,
    /// The payload's byte ranges within a line, in payload order.
    pub data: &'static [Range<usize>],
    /// Offsets of the two little-endian u32 copies of the seq.
    pub seqs: [usize; 2],
}

/// LL: `{data0, seq, data1, seq}`, 8 payload bytes in 16.
pub const LL: Format = Format {
    protocol: "LL",
    line_bytes: 16,
    data: &[0..4, 8..12],
    seqs: [4, 12],
};

/// LL128: 120 payload bytes, then `{seq, seq}`, in 128.
// One payload range is meant: the payload is contiguous in an LL128 line.
#[allow(clippy::single_range_in_vec_init)]
pub const LL128: Format = Format {
    protocol: "LL128",
    line_bytes: 128,
    data: &[0..120],
    seqs: [120, 124],
};

impl Format {
    /// Payload bytes one line carries.
    pub fn payload_per_line(&self) -> u64 {
        self.data.iter().map(|r| r.len() as u64).sum()
    }

    /// Lines that carry `size` payload bytes.
    pub fn lines(&self, size: u64) -> u64 {
        size.div_ceil(self.payload_per_line())
    }

    /// Bytes the lines of `size` payload bytes take in the receiver's
    /// buffer (and on the wire): LL about twice the payload, LL128 16/15
    /// of it, rounded up to a line.
    pub fn wire_bytes(&self, size: u64) -> u64 {
        self.lines(size) * self.line_bytes
    }

    /// `payload` as the kernels write it, every line stamped with `seq`
    /// (the host mirror of `ll_copy` and `ll128_write`, for tests and tools).
    pub fn pack(&self, payload: &[u8], seq: u32) -> Vec<u8> {
        let line = self.line_bytes as usize;
        let mut out = vec![0u8; self.wire_bytes(payload.len() as u64) as usize];
        for (k, chunk) in payload.chunks(self.payload_per_line() as usize).enumerate() {
            let l = &mut out[k * line..(k + 1) * line];
            let mut rest = chunk;
            for r in self.data {
                let n = r.len().min(rest.len());
                l[r.start..r.start + n].copy_from_slice(&rest[..n]);
                rest = &rest[n..];
            }
            for at in self.seqs {
                l[at..at + 4].copy_from_slice(&seq.to_le_bytes());
            }
        }
        out
    }

    /// The payload of `size` bytes out of `wire` (at least
    /// [`Format::wire_bytes`] long), after checking that both copies of the
    /// seq in every line carry `seq`. The payload's own bytes are left for
    /// the caller to verify.
    pub fn unpack(&self, wire: &[u8], size: usize, seq: u32) -> Result<Vec<u8>, LineMismatch> {
        let word = |b: &[u8]| u32::from_le_bytes(b[..4].try_into().unwrap());
        let line = self.line_bytes as usize;
        let n = self.lines(size as u64) as usize;
        let mut payload = Vec::with_capacity(n * self.payload_per_line() as usize);
        for (k, l) in wire[..n * line].chunks_exact(line).enumerate() {
            let seen = self.seqs.map(|at| word(&l[at..]));
            if seen != [seq, seq] {
                return Err(LineMismatch {
                    protocol: self.protocol,
                    line: k,
                    first_byte: k * self.payload_per_line() as usize,
                    seen,
                    expected: seq,
                });
            }
            for r in self.data {
                payload.extend_from_slice(&l[r.clone()]);
            }
        }
        payload.truncate(size);
        Ok(payload)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_up_to_whole_lines() {
        assert_eq!((LL.lines(0), LL.wire_bytes(0)), (0, 0));
        assert_eq!((LL.lines(1), LL.wire_bytes(1)), (1, 16));
        assert_eq!((LL.lines(8), LL.wire_bytes(8)), (1, 16));
        assert_eq!((LL.lines(9), LL.wire_bytes(9)), (2, 32));
        assert_eq!(LL.wire_bytes(64 << 20), 128 << 20);
    }

    #[test]
    fn a_line_is_data_seq_data_seq() {
        let wire = LL.pack(&[1, 2, 3, 4, 5, 6, 7, 8], 0x0a0b0c0d);
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
            let wire = LL.pack(&payload, 42);
            assert_eq!(LL.unpack(&wire, size, 42), Ok(payload), "size {size}");
        }
    }

    #[test]
    fn a_stale_torn_or_missing_line_is_named() {
        let payload = vec![9u8; 40];
        let mut wire = LL.pack(&payload, 7);
        // Line 2's second half from the iteration before: torn.
        wire[2 * 16 + 12..2 * 16 + 16].copy_from_slice(&6u32.to_le_bytes());
        let e = LL.unpack(&wire, 40, 7).unwrap_err();
        assert_eq!((e.line, e.seen, e.expected), (2, [7, 6], 7));
        assert!(e.to_string().contains("torn"), "{e}");
        // A zeroed buffer never passes.
        let e = LL.unpack(&[0u8; 80], 40, 1).unwrap_err();
        assert_eq!(e.line, 0);
        assert!(e.to_string().contains("never arrived"), "{e}");
    }

    #[test]
    fn ll128_sizes_round_up_to_whole_lines() {
        assert_eq!((LL128.lines(0), LL128.wire_bytes(0)), (0, 0));
        assert_eq!((LL128.lines(1), LL128.wire_bytes(1)), (1, 128));
        assert_eq!((LL128.lines(120), LL128.wire_bytes(120)), (1, 128));
        assert_eq!((LL128.lines(121), LL128.wire_bytes(121)), (2, 256));
        // 1 MiB: 8,739 lines (the last one 16 bytes short of full).
        assert_eq!(LL128.lines(1 << 20), 8739);
    }

    #[test]
    fn an_ll128_line_is_120_payload_bytes_then_the_flag_twice() {
        let payload: Vec<u8> = (1..=121).collect();
        let wire = LL128.pack(&payload, 0x0a0b0c0d);
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
            let wire = LL128.pack(&payload, 42);
            assert_eq!(LL128.unpack(&wire, size, 42), Ok(payload), "size {size}");
        }
    }

    #[test]
    fn a_stale_torn_or_missing_ll128_line_is_named() {
        let payload = vec![9u8; 400];
        let mut wire = LL128.pack(&payload, 7);
        wire[2 * 128 + 124..2 * 128 + 128].copy_from_slice(&6u32.to_le_bytes());
        let e = LL128.unpack(&wire, 400, 7).unwrap_err();
        assert_eq!((e.line, e.first_byte, e.seen), (2, 240, [7, 6]));
        assert!(
            e.to_string()
                .starts_with("LL128 line 2 (payload bytes 240..)"),
            "{e}"
        );
        let e = LL128.unpack(&[0u8; 512], 400, 1).unwrap_err();
        assert!(e.to_string().contains("never arrived"), "{e}");
    }
}
