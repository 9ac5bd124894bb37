// The LL line, written once for every kernel that uses it: simple_write's
// LL path (kernels.cu), the pipeline's (pipeline.cu) and the LL allreduce
// (collectives.cu). NCCL keeps its LL protocol's line store and load the same
// way, once (storeLL / readLL in src/device/prims_ll.h).
//
// An LL line, as NCCL's LL protocol: 16 bytes {data0, seq, data1, seq}
// carrying 8 bytes of payload and a sequence number twice (simple_write:
// the iteration's, the pipeline: the chunk's, the collectives: the call's
// epoch), written with one 16-byte volatile store. The receiver polls the
// line itself: each 8-byte half {data, seq} is one aligned 8-byte access
// and arrives whole over NVLink and within a GPU, so a half whose seq is
// current holds current data, and no fence or signal is needed. Seqs start
// at 1 (a zeroed buffer never passes) and grow (a line left from an earlier
// one never passes either), so no line is ever cleared. The host reads the
// same format in src/gpu/ll.rs.
//
// What stays with each program: how it packs its payload into the 8 bytes
// (simple_write: any byte count, read through the read-only cache;
// the collectives: 16-bit halves of f32/bf16 elements, summed in place)
// and what a wait that gives up records.

#pragma once

#include <cstdint>

// ---------------------------------------------------------- the line

// One 16-byte volatile store: {d0, seq, d1, seq}.
__device__ __forceinline__ void ll_store(uint4 *line, uint32_t d0, uint32_t d1, uint32_t seq) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};"
                 ::"l"(line), "r"(d0), "r"(seq), "r"(d1), "r"(seq) : "memory");
}

// One 16-byte volatile load: a poll of the line (payload in x and z, the
// two seqs in y and w).
__device__ __forceinline__ uint4 ll_load(const uint4 *line) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(line) : "memory");
    return v;
}

// ------------------------------------------------- when a line is there

// Both halves carry `seq` or a later one (seqs only grow within a run).
// simple_write and the pipeline wait this way; the pipeline then counts a
// later seq as an overwritten slot.
__device__ __forceinline__ bool ll_ready(const uint4 &v, uint32_t seq) {
    return v.y >= seq && v.w >= seq;
}

// Both halves carry exactly `seq`. The collectives wait this way: a line
// carries the call's epoch, and only this call's data may be summed.
__device__ __forceinline__ bool ll_exact(const uint4 &v, uint32_t seq) {
    return v.y == seq && v.w == seq;
}

// ------------------------------------------------------ the bounded wait

// Polls `line` until Ready(v, seq) or `stop(v)` says to give up; the line
// as last loaded in `v`. True when it came. As spin_wait polls a word
// (device_common.cuh): a load and a compare per poll, and `stop` asked
// every 64 polls only; it checks the deadline and the cancel flag, plus
// whatever the program adds, and records why it gave up (from the line it
// was given: the seqs it saw).
template <bool (*Ready)(const uint4 &, uint32_t), class Stop>
__device__ __forceinline__ bool ll_poll(const uint4 *line, uint32_t seq, uint4 &v, Stop &&stop) {
    v = ll_load(line);
    for (uint32_t polls = 1; !Ready(v, seq); ++polls) {
        if ((polls & 63) == 0 && stop(v)) return false;
        v = ll_load(line);
    }
    return true;
}
