// What cuda/ep.cu shares with the Rust host: the deterministic data, the
// stand-in experts and their bound, and the structs passed to the kernels.
//
// Plain C++ that also compiles without nvcc: tests/ep_abi.rs builds a small
// host program from this header with the system C++ compiler and checks
// every struct offset and every formula against the Rust side
// (src/ep/kernels.rs, src/ep/rng.rs, src/ep/reference.rs).

#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernel_report.h"

#ifdef __CUDACC__
#define EP_HD __host__ __device__ __forceinline__
#else
#define EP_HD inline
#endif

// Limits the kernels are written for (src/ep/config.rs checks them first).
constexpr uint32_t EP_MAX_RANKS = 64;
constexpr uint32_t EP_MAX_TOPK = 32;
constexpr uint32_t EP_THREADS = 512;

// ---------------------------------------------------------------- the data

// splitmix64's output function with its increment (src/ep/rng.rs mix64).
EP_HD uint64_t ep_mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The key of one token's activations (src/ep/rng.rs token_key).
EP_HD uint64_t ep_token_key(uint64_t seed, uint32_t src_rank, uint32_t iteration, uint32_t token) {
    return ep_mix64(ep_mix64(ep_mix64(seed) ^ src_rank) ^ ((uint64_t(iteration) << 32) | token));
}

// Element h of a token, as bf16 bits: a normal number, |x| in [2^-6, 1)
// (src/ep/rng.rs x_bits).
EP_HD uint16_t ep_x_bits(uint64_t key, uint32_t h) {
    const uint64_t r = ep_mix64(key + h);
    const uint32_t mantissa = uint32_t(r & 0x7f);
    const uint32_t exponent = 121 + uint32_t(((r >> 7) & 7) % 6);
    const uint32_t sign = uint32_t((r >> 12) & 1);
    return uint16_t(sign << 15 | exponent << 7 | mantissa);
}

// ---------------------------------------------------------- the experts

// Expert e is x -> a_e * x + b_e (src/ep/reference.rs).
EP_HD float ep_expert_scale(uint32_t e) { return 1.0f + float(e % 16u) / 32.0f; }
EP_HD float ep_expert_bias(uint32_t e) { return (float(e % 7u) - 3.0f) / 128.0f; }

// The bounds on one rank's contribution and on the combined output, given
// the sum of the terms' magnitudes (derivation in src/ep/reference.rs).
EP_HD float ep_partial_bound(float abs_sum, uint32_t topk) {
    return abs_sum * (0x1p-8f + float(2 * topk + 8) * 0x1p-24f);
}
EP_HD float ep_combined_bound(float abs_sum, uint32_t topk, uint32_t ranks) {
    return abs_sum * (0x1p-7f + 0x1p-16f + float(2 * topk + ranks + 8) * 0x1p-24f);
}

// ------------------------------------------------------------- the mask
//
// int32 mask[capacity] in this rank's device memory (never in the window):
// 1 = rank masked (gone, or silent past the fault timeout), 0 = present.
// The host sets it between launches; a kernel sets mask[src] = 1 when a
// wait on src passes EpParams::fault_timeout_ns. docs/EP.md §13.

// Whether expert e's contribution to a token is kept: its owner rank is
// not masked. The own rank is never masked (its own waits are fatal).
EP_HD bool ep_kept(const int32_t *mask, uint32_t e, uint32_t local_experts) {
    return mask[e / local_experts] == 0;
}

// The combine reference of one element under a mask: sum over the token's
// top-k experts whose owner is unmasked of w_k * (a_k * x + b_k), f32 fused
// multiply-adds in top-k order; *abs_sum gets the sum of the kept terms'
// magnitudes, for ep_combined_bound. Nothing kept: 0 (and abs_sum 0, so
// the output must be exactly 0). src/ep/reference.rs masked_reference.
EP_HD float ep_masked_reference(float x, const uint32_t *experts, const float *weights, uint32_t topk,
                                uint32_t local_experts, const int32_t *mask, float *abs_sum) {
    float acc = 0.0f, mag = 0.0f;
    for (uint32_t k = 0; k < topk; ++k) {
        const uint32_t e = experts[k];
        if (!ep_kept(mask, e, local_experts)) continue;
        const float t = fmaf(ep_expert_scale(e), x, ep_expert_bias(e));
        acc = fmaf(weights[k], t, acc);
        mag += fabsf(weights[k] * t);
    }
    *abs_sum = mag;
    return acc;
}

// ------------------------------------------------------- shared structs
// Each is mirrored field for field in src/ep/kernels.rs; tests/ep_abi.rs
// compares every offset.

// One copy a source makes: its token into slot `slot` of its region on
// rank `dest` (src/ep/layout.rs SendEntry).
struct EpSendEntry {
    uint32_t token;
    uint32_t dest;
    uint32_t slot;
};

// What went wrong in a launch. The first 40 bytes are the project's
// KernelReport (src/gpu/kernels.rs), so gpu::run::run_watched can zero it,
// read it and raise `cancel` from the host.
struct EpReport {
    KernelReport base;      // what every kernel reports: errors, the wait that gave up, cancel
    uint32_t wait_kind;     // EP_WAIT_* of the wait that gave up
    uint32_t wait_rank;     // the rank it waited for
    uint64_t wait_target;   // the value it waited for
    uint32_t null_ptr_rank; // store path: 1 + the rank whose nixlGetPtr was null
    uint32_t reserved;
    // Masking (EpParams::fault_timeout_ns): not a failure, the launch went on.
    uint64_t masked_bits;   // bit r: this launch masked rank r (it was unmasked when the launch began)
    uint64_t first_mask_ns; // %globaltimer when the first of them was masked
    uint64_t first_wait_ns; // %globaltimer when the wait that masked it began
    uint32_t mask_kind;     // EP_WAIT_* of that wait
    uint32_t mask_rank;     // the rank it masked
};

// What a wait was for, to name the silent rank.
constexpr uint32_t EP_WAIT_BARRIER = 1;   // a rank's arrival at the phase barrier
constexpr uint32_t EP_WAIT_DISPATCH = 2;  // a rank's dispatch data
constexpr uint32_t EP_WAIT_COMBINE = 3;   // a batch of a rank's combine contributions
constexpr uint32_t EP_WAIT_GRID = 4;      // this rank's own block 0 (grid release)
constexpr uint32_t EP_WAIT_BLOCKS = 5;    // this rank's own blocks finishing the reduction

// The first wrong value a verify kernel found.
struct EpVerify {
    uint32_t mismatches;   // how many values were wrong
    uint32_t kind;         // EP_BAD_*
    uint32_t src_rank;     // dispatch: the source; combine: the contributing rank
    uint32_t token;        // the source token
    uint32_t slot;
    uint32_t h;            // element (or metadata word) index
    uint32_t expert;       // the first of the token's experts concerned
    uint32_t got_bits;     // bf16 bits, a count, or a metadata word
    uint32_t want_bits;
    float got;
    float reference;
    float bound;
};

constexpr uint32_t EP_BAD_COUNT = 1;         // tokens received from a source
constexpr uint32_t EP_BAD_META = 2;          // a metadata word
constexpr uint32_t EP_BAD_X = 3;             // a dispatched activation
constexpr uint32_t EP_BAD_CONTRIBUTION = 4;  // one rank's expert output, at the origin
constexpr uint32_t EP_BAD_COMBINED = 5;      // the combined output

// GPU time of one phase on this rank: from the barrier to completion.
struct EpTiming {
    uint64_t clock_start;  // clock64 of block 0 (cycle resolution)
    uint64_t clock_end;
    uint64_t gt_start;     // %globaltimer, ns (calibrates the cycles)
    uint64_t gt_end;
};

constexpr uint32_t EP_PATH_PUT = 0;  // nixlPut + nixlAtomicAdd
constexpr uint32_t EP_PATH_STORE = 1;  // nixlGetPtr + stores + release reductions

// The parameters of every EP kernel, passed by value.
struct EpParams {
    void *local_mvh;                 // local memory view of this rank's window (one buffer)
    void *remote_mvh;                // remote view: element r = rank r's window; own entry null
    uint8_t *window;                 // this rank's registered window (src/ep/config.rs WindowLayout)
    EpReport *report;
    EpVerify *verify;
    EpTiming *timing;                // [timing_slots][2]: dispatch, combine, by step
    const EpSendEntry *entries;      // this rank's dispatch copies, by token then destination
    const int32_t *send_slot;        // [ranks][tokens]: slot of token t on rank d, or -1
    const uint32_t *expect_tokens;   // [ranks][tokens]: source token held in (source, slot)
    const uint32_t *expect_count;    // [ranks]: tokens expected from each source
    const uint32_t *all_experts;     // [ranks][tokens][topk]: every rank's routing
    const float *all_weights;        // [ranks][tokens][topk]
    uint32_t *recv_count;            // [ranks]: tokens received from each source (dispatch)
    uint64_t *prev_low;              // [ranks]: dispatch counters' low halves at the last completion
    uint64_t *grid_flags;            // [4]: barrier passed, reduce go, blocks done, combine claims (this rank only)
    uint16_t *out;                   // [tokens][hidden]: combined output, bf16
    int32_t *mask;                   // [ranks]: 1 = masked (see "the mask" above); this rank's memory, not the window
    uint32_t *step;                  // the global step number (one device word): drives the data, every
                                     // counter target and the timing slot. The host sets it once at the
                                     // start of a phase; ep_advance adds 1 at the end of every step, so a
                                     // CUDA graph of a step is replayed unchanged for every step.
    uint64_t off_dispatch_count;     // window offsets (WindowLayout)
    uint64_t off_combine_flags;
    uint64_t off_barrier;
    uint64_t off_recv_x;
    uint64_t off_recv_meta;
    uint64_t off_combine_recv;
    uint64_t off_x;
    uint64_t off_meta;
    uint64_t off_y;
    uint64_t seed;
    uint64_t timeout_ns;             // a wait on this rank's own blocks gives up (fatal) after this long
    uint64_t fault_timeout_ns;       // a wait on another rank masks it after this long from the wait's
                                     // start; 0: never masks, every wait is fatal after timeout_ns
    uint32_t rank;
    uint32_t ranks;
    uint32_t tokens;
    uint32_t hidden;
    uint32_t topk;
    uint32_t local_experts;
    uint32_t meta_bytes;
    uint32_t n_entries;
    uint32_t chunks;                 // chunks per token; one warp copies one
    uint32_t chunk_bytes;
    uint32_t path;                   // EP_PATH_*
    uint32_t timing_slots;           // steps the timing buffer holds; later steps are not stamped
    uint32_t combine_batch;          // slots per combine flag (src/ep/config.rs Shape::combine_batch)
    uint32_t combine_batches;        // flags per expert rank: ceil(tokens / combine_batch)
    uint32_t gpu_scope;              // 1: every rank shares this GPU, releases are GPU-scope; 0: system scope
    uint32_t combine_senders;        // high-throughput combine: warps per block that send (the rest reduce)
    uint32_t combine_pieces;         // high-throughput combine: pieces a token's reduction is claimed in
};
