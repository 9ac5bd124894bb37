// The LL and LL128 lines, written once for every kernel that uses them:
// simple_write's LL and LL128 paths (kernels.cu), the pipeline's LL path
// (pipeline.cu) and the LL collectives (collectives.cu). NCCL keeps its LL
// protocol's line store and load the same way, once (storeLL / readLL in
// src/device/prims_ll.h; LL128's in prims_ll128.h).
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

// ================================================================ LL128
//
// An LL128 line, as NCCL's LL128 protocol (src/device/prims_ll128.h): 128
// bytes, 120 of payload and one 8-byte flag word {seq, seq} at the end.
// Eight consecutive lanes of a warp write it, each with one 16-byte
// volatile store in the same instruction: lane 8j + c writes bytes
// 16c..16c+15 of the warp's line j (one warp store covers four lines),
// and lane 8j + 7 carries the line's last 8 payload bytes and the flag.
// The receiver reads a line the same way, eight lanes in one load, and the
// lane holding the flag checks it; the warp loads again until every flag
// of its lines is current (a vote).
//
// What it relies on: a warp's 128-byte aligned store reaches the peer's
// memory as one 128-byte write, and a warp's 128-byte aligned load is
// served as one read, so a current flag means the line's 120 payload bytes
// beside it are current too. NVLink and a GPU's own memory give that (NCCL
// turns LL128 on only there); PCIe peer writes, RDMA and anything between
// nodes may split a line, and are not offered. No fence, no signal, 15/16
// of the bytes on the wire are payload (LL: 1/2). The host reads the format
// in src/gpu/ll.rs (ll128); simple_write's target stores back what it read
// with the last flag, so the host's check of the data tests the reliance.

constexpr uint32_t LL128_LINE_BYTES = 128;
constexpr uint32_t LL128_PAYLOAD = 120;     // payload bytes a line carries
constexpr uint32_t LL128_LANES = 8;         // lanes that write one line
constexpr uint32_t LL128_WARP_LINES = 4;    // lines one warp store covers

// The flag word of sequence number `seq`: seq in both halves.
__device__ __forceinline__ uint64_t ll128_flag(uint32_t seq) { return (uint64_t(seq) << 32) | seq; }

// Lines that carry `bytes` payload bytes.
__device__ __forceinline__ uint64_t ll128_lines(uint64_t bytes) {
    return (bytes + LL128_PAYLOAD - 1) / LL128_PAYLOAD;
}

// One lane's 16 bytes of a line: one volatile 16-byte store.
__device__ __forceinline__ void ll128_store(uint4 *part, uint64_t lo, uint64_t hi) {
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(part), "l"(lo), "l"(hi) : "memory");
}

// One lane's 16 bytes of a line: one volatile 16-byte load.
__device__ __forceinline__ void ll128_load(const uint4 *part, uint64_t &lo, uint64_t &hi) {
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(lo), "=l"(hi) : "l"(part) : "memory");
}

// A flag word carrying `seq` or a later one in both halves (as ll_ready).
__device__ __forceinline__ bool ll128_ready(uint64_t flag, uint32_t seq) {
    return uint32_t(flag) >= seq && uint32_t(flag >> 32) >= seq;
}
