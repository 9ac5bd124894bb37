//! The ring arithmetic every stage's kernel follows (`cuda/pipeline.cu`),
//! on the host: where each part of a rank's window lies, which slot and
//! sequence number a chunk takes, what the put path adds to a ready word,
//! and how a chunk is cut into the channels' slices.
//!
//! Per link, chunk `g` (from 0) goes to slot `g % S` with sequence `g + 1`;
//! a slot is one slice of each channel, and each channel's slices of the S
//! slots lie one after another (a ring per channel, as NCCL gives each
//! channel a FIFO of its own), so a batch of a channel's slices is one
//! stretch of memory: one `nixlPut` on the put path.
//! the sender may write it once the receiver's credit word reads at least
//! [`credit_needed`]`(g, S)`; nothing is ever cleared, so laps differ only
//! by their sequence numbers.

use crate::gpu::ll::Format;

/// Alignment of every part of the window, bytes.
const ALIGN: u64 = 256;

/// The window every rank registers, laid out alike on every rank (offsets
/// in bytes from its start).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// `[channels][slots]` slices of the stride: what the previous stage writes.
    pub off_ring: u64,
    /// `[channels][slots]` slices of the stride: the put path's outgoing copies.
    pub off_stage: u64,
    /// `[slots][channels]` u64 ready words, written by the previous stage.
    pub off_ready: u64,
    /// `[channels]` u64 credit words, written by the next stage.
    pub off_credit: u64,
    pub bytes: u64,
}

/// Bytes of one slot: the chunk itself, or its lines when the path has
/// `lines` (LL: 16 bytes per 8 payload bytes; LL128: 128 per 120).
pub fn slot_bytes(chunk: u64, lines: Option<&Format>) -> u64 {
    lines.map_or(chunk, |f| f.wire_bytes(chunk))
}

/// Bytes from one of a channel's slices to its next in the ring: its
/// payload (or its lines), or, when `slot` (`--slot-bytes`) asks for more,
/// the slot's even share among the channels that carry data, in whole
/// 16-byte units (whole lines on the line paths: an LL128 line must stay
/// 128-byte aligned, so that a warp's store of it arrives whole).
pub fn slice_stride(slot: u64, chunk: u64, channels: u32, lines: Option<&Format>) -> u64 {
    let busy = u64::from(busy_channels(chunk, channels));
    let unit = lines.map_or(16, |f| f.line_bytes);
    slot_bytes(slice_bytes(chunk, channels), lines).max(slot / busy / unit * unit)
}

impl Window {
    /// The window for `slots` slots of `channels` slices of `stride` bytes
    /// ([`slice_stride`]) and `channels` channels' words.
    pub fn new(slots: u32, stride: u64, channels: u32) -> Self {
        let up = |n: u64| n.div_ceil(ALIGN) * ALIGN;
        let ring = up(u64::from(slots) * u64::from(channels) * stride);
        let off_stage = ring;
        let off_ready = off_stage + ring;
        let off_credit = off_ready + up(8 * u64::from(slots) * u64::from(channels));
        let bytes = off_credit + up(8 * u64::from(channels));
        Self {
            off_ring: 0,
            off_stage,
            off_ready,
            off_credit,
            bytes,
        }
    }
}

/// The slot chunk `g` takes in a ring of `slots`.
pub fn slot_of(g: u64, slots: u32) -> u64 {
    g % u64::from(slots)
}

/// The sequence number chunk `g` carries (never 0: a zeroed word or line
/// never passes for a chunk).
pub fn seq_of(g: u64) -> u64 {
    g + 1
}

/// The credit the sender needs before it writes chunk `g`: the receiver
/// has consumed chunk `g - slots`, the slot's previous tenant (none for the
/// first lap).
pub fn credit_needed(g: u64, slots: u32) -> u64 {
    (g + 1).saturating_sub(u64::from(slots))
}

/// What the put path's `nixlAtomicAdd` adds to chunk `g`'s ready word: it
/// held the sequence of chunk `g - slots` (0 on the first lap), and must
/// end at `g + 1`.
pub fn ready_add(g: u64, slots: u32) -> u64 {
    seq_of(g) - credit_needed(g, slots)
}

/// Payload bytes per channel when `chunk` bytes are cut into at most
/// `channels` slices: an even split rounded up to 16 bytes (whole vectors,
/// whole LL lines); channels past the data get none.
pub fn slice_bytes(chunk: u64, channels: u32) -> u64 {
    chunk.div_ceil(u64::from(channels.max(1))).div_ceil(16) * 16
}

/// The channels that carry data: `ceil(chunk / slice)`.
pub fn busy_channels(chunk: u64, channels: u32) -> u32 {
    chunk.div_ceil(slice_bytes(chunk, channels)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::ll;

    #[test]
    fn laps_differ_by_sequence_and_the_ready_word_ends_at_it() {
        let s = 3;
        let mut word = [0u64; 3];
        for g in 0..20 {
            let slot = slot_of(g, s) as usize;
            word[slot] += ready_add(g, s);
            assert_eq!(word[slot], seq_of(g), "chunk {g}");
        }
        assert_eq!((slot_of(0, 3), slot_of(3, 3), slot_of(4, 3)), (0, 0, 1));
    }

    #[test]
    fn a_slot_is_written_again_only_after_its_last_tenant_was_consumed() {
        // The first lap needs no credit; chunk g needs chunk g - S consumed.
        assert_eq!(credit_needed(0, 4), 0);
        assert_eq!(credit_needed(3, 4), 0);
        assert_eq!(credit_needed(4, 4), 1);
        assert_eq!(credit_needed(9, 4), 6);
        // One slot: strictly alternating, a ping-pong.
        assert_eq!(credit_needed(5, 1), 5);
    }

    #[test]
    fn slices_cover_the_chunk_in_whole_vectors() {
        assert_eq!(slice_bytes(8, 64), 16);
        assert_eq!(busy_channels(8, 64), 1);
        assert_eq!(slice_bytes(1 << 20, 64), 16384);
        assert_eq!(busy_channels(1 << 20, 64), 64);
        assert_eq!(slice_bytes(1000, 3), 336);
        assert_eq!(busy_channels(1000, 3), 3);
        for (c, n) in [(1u64 << 20, 66u32), (4096, 7), (48, 64)] {
            let s = slice_bytes(c, n);
            assert!(
                s % 16 == 0 && u64::from(busy_channels(c, n)) * s >= c,
                "{c} {n}"
            );
            assert!(busy_channels(c, n) <= n);
        }
    }

    #[test]
    fn the_window_parts_do_not_overlap() {
        let stride = slice_stride(0, 1 << 20, 64, None);
        assert_eq!(stride, 16 << 10);
        let w = Window::new(8, stride, 64);
        assert_eq!(w.off_stage, 8 << 20);
        assert!(w.off_ready >= w.off_stage + (8 << 20));
        assert!(w.off_credit >= w.off_ready + 8 * 8 * 64);
        assert!(w.bytes >= w.off_credit + 8 * 64);
        assert_eq!(slot_bytes(8, Some(&ll::LL)), 16);
        assert_eq!(slot_bytes(1024, Some(&ll::LL)), 2048);
        assert_eq!(slot_bytes(120, Some(&ll::LL128)), 128);
        assert_eq!(slot_bytes(1024, Some(&ll::LL128)), 9 * 128);
    }

    #[test]
    fn every_channel_s_slices_fit_its_ring_and_a_larger_slot_pads_them() {
        for (chunk, channels, lines) in [
            (1u64 << 20, 66u32, None),
            (1000, 3, None),
            (8, 128, Some(&ll::LL)),
            (4096, 7, Some(&ll::LL)),
            (4096, 7, Some(&ll::LL128)),
            (1 << 20, 33, Some(&ll::LL128)),
        ] {
            let stride = slice_stride(0, chunk, channels, lines);
            let wire = slot_bytes(slice_bytes(chunk, channels), lines);
            assert_eq!(stride, wire, "{chunk} {channels}");
            // Every busy channel's slice of every slot lies inside the ring.
            let w = Window::new(5, stride, channels);
            let last = (u64::from(busy_channels(chunk, channels)) * 5) * stride;
            assert!(last <= w.off_stage, "{chunk} {channels}");
        }
        // --slot-bytes 2 MiB for 1 MiB chunks over 64 channels: 32 KiB apart.
        assert_eq!(slice_stride(2 << 20, 1 << 20, 64, None), 32 << 10);
        // A smaller slot never shrinks a slice (the options refuse it anyway).
        assert_eq!(slice_stride(1, 1 << 20, 64, None), 16 << 10);
        // LL128 slices stay whole lines apart, whatever share the slot gives.
        for (slot, chunk, channels) in [(0, 4096, 7), (100_000, 4096, 7), (3 << 20, 1 << 20, 33)] {
            assert_eq!(
                slice_stride(slot, chunk, channels, Some(&ll::LL128)) % 128,
                0,
                "{slot} {chunk}"
            );
        }
    }
}
