// Collectives the GPU drives itself: allreduce (one-shot and two-shot),
// allgather and reduce-scatter between N ranks through NIXL's device API.
// docs/COLLECTIVES.md walks through the design; in one paragraph:
//
// Every rank registers one window (src/collectives/layout.rs): flag slots,
// the input, two output buffers and two receive areas. Every algorithm is
// push-only: a block copies its slice of the data into the peers' windows —
// plain 16-byte stores through nixlGetPtr (path store) or nixlPut (path put)
// — then signals each peer in the slot [phase][block][this rank], and waits
// for the peers' signals in its own slots. A signal carries the call's
// sequence number (the epoch): the store path stores it with release
// semantics; the put path adds (epoch - last epoch this rank sent) with
// nixlAtomicAdd, so the slot ends equal to the epoch either way. A wait ends
// when its slot reaches the epoch, so nothing is ever cleared between calls.
// Buffers a peer writes into alternate by call parity: a peer can start call
// k+1 while this rank still reads call k's data, but cannot reach call k+2
// before this rank has sent its call k+1 signals, after reading call k.
//
// Every spin goes through coll_wait: a %globaltimer deadline, the host's
// cancel flag, and a record of which rank, phase and block it waited for.
//
// The members: a call runs over `ranks` members, indexed 0..ranks-1 (the
// "index" below), member i being rank members[i] (the "rank": the index of
// its window in the remote view, of its flag slots and receive rows).
// Chunks, slices and output slots follow the index, so when a rank is gone
// the survivors recompute them over fewer members and nothing is
// re-registered. In an elastic run (step != 0) a wait on a rank that passes
// fault_timeout_ns does not fail the call: the rank is recorded as masked,
// this rank tells every other member to abandon the step (its abort slot in
// their windows gets the step's number), and every call of the step still
// queued returns at once. The host then agrees with the survivors on who is
// gone and carries on without it (src/collectives/elastic.rs).

#include <cuda/atomic>
#include <cuda_bf16.h>

// NIXL's device header, the clock, scoped signals, the bounded wait, KernelReport.
#include "device_common.cuh"
#include "ll.cuh"

// Limits the kernels are written for (src/collectives/layout.rs checks them).
constexpr uint32_t COLL_MAX_RANKS = 16;
constexpr uint32_t COLL_MAX_BLOCKS = 264;
constexpr uint32_t COLL_THREADS = 512;
// Slices and chunks start at multiples of this many elements (16-byte
// vectors for bf16 and f32 alike); src/collectives/layout.rs split().
constexpr uint64_t COLL_ALIGN_ELEMS = 8;

// The operation (what coll_fill and coll_check compute) and, for the
// record, the algorithm of a call: the call's kernel entry already is one
// operation's algorithm (COLL_ENTRY below).
enum : uint32_t { COLL_ALLREDUCE = 0, COLL_ALLGATHER = 1, COLL_REDUCE_SCATTER = 2 };
enum : uint32_t { COLL_ONE_SHOT = 0, COLL_TWO_SHOT = 1, COLL_LL = 2, COLL_LL128 = 3, COLL_TWO_SHOT_LL128 = 4, COLL_RING = 5 };
enum : uint32_t { COLL_PATH_PUT = 0, COLL_PATH_STORE = 1 };
enum : uint32_t { COLL_F32 = 0, COLL_BF16 = 1 };

// Mirrored in src/collectives/kernels.rs (CollParams); offsets are bytes
// into the window.
struct CollParams {
    void *local_mvh;
    void *remote_mvh;
    uint8_t *window;
    struct CollReport *report;
    uint64_t *sent;  // [2][COLL_MAX_BLOCKS]: last epoch this rank signalled
    struct CollTiming *timing;  // this call's stamps
    uint64_t off_flags;
    uint64_t off_in;
    uint64_t off_out;
    uint64_t off_recv;
    uint64_t recv_stride;  // bytes per source in the receive area
    uint64_t count;        // allreduce: all elements; allgather/reduce-scatter: per rank
    uint64_t epoch;
    uint64_t timeout_ns;
    uint32_t rank;
    uint32_t ranks;
    uint32_t op;
    uint32_t algo;
    uint32_t path;
    uint32_t dtype;
    uint32_t same_gpu;      // 1: every rank runs on this GPU, GPU-scope ordering suffices
    uint32_t has_peer_ptr;  // 1: peer_ptr holds the members' windows (looked up once per session)
    // Elastic runs (step == 0: a fixed run, every wait fatal after timeout_ns).
    uint64_t off_abort;          // the abort slots, [rank]: the last step that rank abandoned
    uint64_t step;               // this call's step, from 1
    uint64_t fault_timeout_ns;   // a wait on a rank masks it after this long
    uint64_t *abort_sent;        // [rank]: the last step this rank's abort reached that rank (put path)
    uint8_t members[COLL_MAX_RANKS];  // [index]: the member's rank
    // [index]: member i's window as nixlGetPtr gave it, in the parameters
    // themselves: a call reads them from the constant bank, not with a
    // load from device memory before its first store.
    uint64_t peer_ptr[COLL_MAX_RANKS];
    uint64_t piece_elems;  // one-shot and two-shot: elements per piece at most (a multiple of 8)
};

// Begins with the suite's KernelReport, so gpu::run::run_watched zeroes it,
// reads it and cancels through it.
struct CollReport {
    KernelReport base;
    uint32_t wait_phase;
    uint32_t wait_rank;
    uint32_t wait_block;
    uint32_t null_ptr_rank;  // 1 + the rank nixlGetPtr gave no pointer for
    uint64_t wait_target;
    // Elastic runs: not failures, the step was abandoned.
    uint32_t aborted;        // 1: this rank abandoned the step (its own mask, or a peer's abort)
    uint32_t raised;         // 1: this rank told the others
    uint64_t masked_bits;    // bit r: a wait on rank r passed the fault timeout
    uint64_t first_wait_ns;  // %globaltimer when the wait that masked first began
    uint64_t first_mask_ns;  // ... and when it masked
};

// Block 0's clock at the call's start (start_call) and after its last wait
// and its share of the work (cycles, calibrated against %globaltimer on the host),
// and its clock where the first phase's steps end (where the time goes).
struct CollTiming {
    uint64_t clock_start;
    uint64_t clock_end;
    uint64_t gt_start;
    uint64_t gt_end;
    uint64_t clock_setup;      // peer pointers looked up
    uint64_t clock_sent;       // phase 0's data pushed
    uint64_t clock_signalled;  // phase 0's fence and signals done
    uint64_t clock_waited;     // every peer's phase-0 signal seen
    uint64_t gt_last_end;      // the last block's end (every block's atomicMax)
};

// What the fill and check kernels work on (src/collectives/kernels.rs CollData).
struct CollData {
    uint8_t *in;
    uint8_t *out;
    struct CollVerify *verify;
    uint64_t count;
    uint32_t rank;
    uint32_t ranks;
    uint32_t op;
    uint32_t dtype;
    uint32_t call;
    uint32_t random;  // 1: random inputs, results compared within a bound
    const struct CollReport *report;  // the calls' report: a call of an abandoned step is lost, not checked
    uint8_t members[COLL_MAX_RANKS];  // [index]: the member's rank (whose inputs it has)
};

// The first wrong output element of any call checked since it was zeroed.
struct CollVerify {
    uint32_t mismatches;
    uint32_t call;
    uint64_t element;
    float expected;
    float got;
    uint64_t checked;  // elements compared
    uint32_t lost;     // calls not checked: their step was abandoned
    uint32_t reserved;
};

static_assert(sizeof(CollParams) == 328, "CollParams layout is shared with the host");
static_assert(offsetof(CollParams, members) == 176, "CollParams layout is shared with the host");
static_assert(offsetof(CollParams, rank) == 112, "CollParams layout is shared with the host");
static_assert(sizeof(CollTiming) == 72, "CollTiming layout is shared with the host");
static_assert(sizeof(CollReport) == 96, "CollReport layout is shared with the host");
static_assert(offsetof(CollReport, base) == 0, "run_watched reads and cancels a CollReport as its KernelReport");
static_assert(sizeof(CollData) == 80, "CollData layout is shared with the host");
static_assert(sizeof(CollVerify) == 40, "CollVerify layout is shared with the host");

// ------------------------------------------------------------- the data

// Input element i of `rank` in call `call`: a small integer in [-4, 4], so
// every sum of up to 64 ranks is exact in bf16 and f32, in any order
// (src/collectives/reference.rs input()).
__host__ __device__ __forceinline__ float coll_input(uint32_t rank, uint64_t i, uint32_t call) {
    return float(int((i * 7 + uint64_t(rank) * 13 + uint64_t(call) * 5) % 9) - 4);
}

// Slice `i` of `parts` over `total` elements: [lo, hi), starting at a
// multiple of COLL_ALIGN_ELEMS (src/collectives/layout.rs split()).
__device__ __forceinline__ uint64_t split_share(uint64_t total, uint64_t parts) {
    const uint64_t per = (total + parts - 1) / parts;
    return (per + COLL_ALIGN_ELEMS - 1) / COLL_ALIGN_ELEMS * COLL_ALIGN_ELEMS;
}

__device__ __forceinline__ void split(uint64_t total, uint64_t parts, uint64_t i, uint64_t &lo, uint64_t &hi) {
    const uint64_t per = split_share(total, parts);
    lo = min(i * per, total);
    hi = min(lo + per, total);
}

// This block's pieces of `total` elements, each handed to `each(lo, hi)`:
// pieces of the block's share (split's) or of p.piece_elems, whichever is
// smaller, dealt round the blocks (piece i to block i % gridDim.x). A
// small call is one piece per block, split's slices; a large one has every
// block work through the buffer beside the others, so the pages a call
// touches at once stay few: with one slice per block, 132 blocks streamed
// through 132 regions of 2 MiB or more, and the last block ended up to
// 35 % after the first (2 H200s, 512 MiB).
template <class Each> __device__ __forceinline__ void for_pieces(const CollParams &p, uint64_t total, Each &&each) {
    const uint64_t piece = min(split_share(total, gridDim.x), p.piece_elems);
    for (uint64_t lo = blockIdx.x * piece; lo < total; lo += uint64_t(gridDim.x) * piece) each(lo, min(lo + piece, total));
}

// ------------------------------------------------------------ primitives

__device__ __forceinline__ uint32_t elem_bytes(const CollParams &p) { return p.dtype == COLL_BF16 ? 2 : 4; }

__device__ __forceinline__ bool given_up(const CollReport *r) {
    // Both loads before either is used: one load's latency at every call's
    // start, not two.
    const uint32_t timed_out = *static_cast<const volatile uint32_t *>(&r->base.timed_out);
    const uint32_t aborted = *static_cast<const volatile uint32_t *>(&r->aborted);
    return (timed_out | aborted) != 0;
}

// The rank of member `i`.
__device__ __forceinline__ uint32_t rank_of(const CollParams &p, uint32_t i) { return p.members[i]; }

// Member i's window as the store path reaches it (not ourselves): the
// pointer the session looked up once (coll_probe_ptrs), else nixlGetPtr,
// which walks the view in device memory, ~0.5 µs a call.
__device__ __forceinline__ uint8_t *peer_window(const CollParams &p, uint32_t i) {
    return p.has_peer_ptr ? reinterpret_cast<uint8_t *>(p.peer_ptr[i])
                          : static_cast<uint8_t *>(nixlGetPtr(p.remote_mvh, rank_of(p, i)));
}

// Whether another member abandoned this step (elastic runs).
__device__ bool peer_aborted(const CollParams &p) {
    const uint64_t *slots = reinterpret_cast<const uint64_t *>(p.window + p.off_abort);
    for (uint32_t i = 0; i < p.ranks; ++i)
        if (i != p.rank && reached(load_relaxed_system(slots + rank_of(p, i)), p.step)) return true;
    return false;
}

// Tells every member but `gone` that this rank abandons the step: its abort
// slot in their windows gets the step (the store path stores it; the put
// path adds the difference to what it last sent there).
__device__ void raise_abort(const CollParams &p, uint32_t gone) {
    const uint64_t slot = p.off_abort + 8ull * rank_of(p, p.rank);
    for (uint32_t i = 0; i < p.ranks; ++i) {
        const uint32_t d = rank_of(p, i);
        if (i == p.rank || d == gone) continue;
        if (p.path == COLL_PATH_STORE) {
            uint8_t *w = peer_window(p, i);
            if (w != nullptr) release_store(reinterpret_cast<uint64_t *>(w + slot), p.step, false);
        } else {
            const nixlMemViewElem counter{p.remote_mvh, d, slot};
            record_status(&p.report->base, nixlAtomicAdd<nixl_gpu_level_t::THREAD>(p.step - p.abort_sent[d], counter, 0));
            p.abort_sent[d] = p.step;
        }
    }
}

// A wait on rank `src` passed the fault timeout: mask it, and the first
// thread of this rank to do so tells the others; the step is abandoned.
__device__ void mask_and_abort(const CollParams &p, uint32_t src, uint64_t start, uint64_t now, uint32_t phase) {
    CollReport *r = p.report;
    atomicOr(reinterpret_cast<unsigned long long *>(&r->masked_bits), 1ull << src);
    if (atomicCAS(&r->raised, 0u, 1u) == 0) {
        r->first_wait_ns = start;
        r->first_mask_ns = now;
        r->wait_rank = src;
        r->wait_phase = phase;
        r->wait_block = blockIdx.x;
        raise_abort(p, src);
    }
    atomicExch(&r->aborted, 1u);
}

// Whether a spin that began at `start` may go on: not once another thread
// gave up; in an elastic run, not once a member abandoned the step, nor
// past the fault timeout (which masks `rank`); never past the timeout nor
// once the host raised the cancel flag. The first to give up for good
// records what it waited for (`seen`: the value it saw last).
__device__ bool keep_waiting(const CollParams &p, uint64_t start, uint64_t seen, uint64_t target, uint32_t phase,
                             uint32_t rank) {
    CollReport *r = p.report;
    if (given_up(r)) return false;
    if (p.step != 0 && peer_aborted(p)) return atomicExch(&r->aborted, 1u), false;
    const uint64_t now = globaltimer_ns();
    if (p.step != 0 && now - start > p.fault_timeout_ns) return mask_and_abort(p, rank, start, now, phase), false;
    const uint32_t why = wait_expired(&r->base, start + p.timeout_ns);
    if (why == 0) return true;
    if (atomicCAS(&r->base.timed_out, 0u, why) == 0) {
        r->base.observed = seen;
        r->wait_phase = phase;
        r->wait_rank = rank;
        r->wait_block = blockIdx.x;
        r->wait_target = target;
    }
    return false;
}

// Spins (one thread) until *slot reaches `target`, or keep_waiting says stop.
__device__ bool coll_wait(const CollParams &p, const uint64_t *slot, uint64_t target, uint64_t start, uint32_t phase,
                          uint32_t rank) {
    const uint64_t v =
        spin_wait(slot, target, [&](uint64_t seen) { return !keep_waiting(p, start, seen, target, phase, rank); });
    return reached(v, target);
}

// --------------------------------------------------------------- copying

// The 16 bytes at `p`, which needs only be 2-byte aligned: the aligned
// vector holding p and, where p is not aligned, the next one, spliced with
// funnel shifts. Both vectors are the granules holding p's first and last
// byte, so neither load leaves the allocation. `Cg` loads at L2 (data a
// peer wrote), else through L1.
template <bool Cg, bool Aligned> __device__ __forceinline__ int4 load16(const uint8_t *p) {
    const uint32_t m = Aligned ? 0 : uint32_t(reinterpret_cast<uintptr_t>(p) & 15);
    const int4 *at = reinterpret_cast<const int4 *>(p - m);
    const int4 x = Cg ? __ldcg(at) : *at;
    if (Aligned || m == 0) return x;
    const int4 y = Cg ? __ldcg(at + 1) : at[1];
    const uint32_t w[8] = {uint32_t(x.x), uint32_t(x.y), uint32_t(x.z), uint32_t(x.w),
                           uint32_t(y.x), uint32_t(y.y), uint32_t(y.z), uint32_t(y.w)};
    // Words m/4 .. m/4 + 4 of the pair, picked by selects (an array indexed
    // at run time would live in local memory), then shifted by m % 4 bytes.
    const uint32_t q = m >> 2, shift = (m & 3) * 8;
    uint32_t v[5];
#pragma unroll
    for (uint32_t j = 0; j < 5; ++j) v[j] = q == 0 ? w[j] : q == 1 ? w[j + 1] : q == 2 ? w[j + 2] : w[min(j + 3, 7u)];
    return make_int4(int(__funnelshift_r(v[0], v[1], shift)), int(__funnelshift_r(v[1], v[2], shift)),
                     int(__funnelshift_r(v[2], v[3], shift)), int(__funnelshift_r(v[3], v[4], shift)));
}

// The block copies n16 16-byte vectors from `src` to the aligned `dst`,
// four in flight per thread.
template <bool Aligned> __device__ void block_copy16(int4 *dst, const uint8_t *src, uint64_t n16) {
    constexpr uint32_t U = 4;
    for (uint64_t i = threadIdx.x; i < n16; i += uint64_t(blockDim.x) * U) {
        int4 v[U];
#pragma unroll
        for (uint32_t u = 0; u < U; ++u)
            if (i + blockDim.x * u < n16) v[u] = load16<false, Aligned>(src + 16 * (i + blockDim.x * u));
#pragma unroll
        for (uint32_t u = 0; u < U; ++u)
            if (i + blockDim.x * u < n16) dst[i + blockDim.x * u] = v[u];
    }
}

// The block copies `bytes` (a multiple of 2, both ends 2-byte aligned): in
// 2-byte words up to dst's first 16-byte boundary and after its last, in
// 16-byte stores between, whatever src's alignment. Allgather's and
// reduce-scatter's slots of rank × count elements start at any element, so
// on 3 ranks most of them are not 16-byte aligned (2-byte words all along
// took 1.2–1.8× NCCL's time from 16 MiB; stores are what NVLink carries).
__device__ void block_copy(uint8_t *dst, const uint8_t *src, uint64_t bytes) {
    if (dst == src || bytes == 0) return;
    const uint64_t head = min(bytes, uint64_t((16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15));
    const uint64_t n16 = (bytes - head) / 16, tail = head + n16 * 16;
    const uint16_t *s2 = reinterpret_cast<const uint16_t *>(src);
    uint16_t *d2 = reinterpret_cast<uint16_t *>(dst);
    for (uint64_t i = threadIdx.x; i < head / 2; i += blockDim.x) d2[i] = s2[i];
    if (((reinterpret_cast<uintptr_t>(src) + head) & 15) == 0)
        block_copy16<true>(reinterpret_cast<int4 *>(dst + head), src + head, n16);
    else
        block_copy16<false>(reinterpret_cast<int4 *>(dst + head), src + head, n16);
    for (uint64_t i = tail / 2 + threadIdx.x; i < bytes / 2; i += blockDim.x) d2[i] = s2[i];
}

// Block 0's clock into a stamp of this call (phase 0 only).
__device__ __forceinline__ void stamp_phase(const CollParams &p, uint32_t phase, uint64_t CollTiming::*at) {
    if (phase == 0 && blockIdx.x == 0 && threadIdx.x == 0) p.timing->*at = clock64();
}

// Where each rank's window is, as this block reaches it: our own for
// ourselves, the mapped peer window on the store path, nothing on the put
// path (peers are addressed through the remote view there).
struct Peers {
    uint8_t *ptr[COLL_MAX_RANKS];
    const uint8_t *src[COLL_MAX_RANKS];  // the reduction's sources, rank order
    bool ok;      // no wait of this call gave up
    bool opened;  // the call went on past open_call
};

// The call's start, before anything it loads or stores: waits for the
// kernel before it on the stream (wait_previous_grid: at once unless the
// call came by programmatic dependent launch), then lets the next one
// launch, so that at most one call waits resident behind a running one,
// never a chain of them holding SMs; block 0 stamps the start.
__device__ __forceinline__ void start_call(const CollParams &p) {
    wait_previous_grid();
    allow_next_launch();
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        p.timing->gt_start = globaltimer_ns();
        p.timing->clock_start = clock64();
    }
}

// The window of member threadIdx.x - 32 as this block reaches it (threads
// 32 .. 32 + ranks; null for the others): looked up in the memory views,
// which no kernel writes, so before start_call, while the previous call on
// the stream may still be running.
__device__ __forceinline__ uint8_t *member_window(const CollParams &p) {
    const uint32_t i = threadIdx.x - 32;
    if (i >= p.ranks) return nullptr;
    if (i == p.rank) return p.window;
    return p.path == COLL_PATH_STORE ? peer_window(p, i) : nullptr;
}

// Opens the call for this block, after start_call and before its
// first store: whether it goes on (not a step another member abandoned,
// nor after an earlier call's wait gave up: then every thread leaves, or
// none) and the members' windows (`window`, member_window's). One barrier.
// A kernel may load between start_call and this (its own input, which
// nothing else writes during the call), never store: the line kernels
// load their first lines' data there, so that load's latency overlaps the
// report's.
__device__ bool open_call(const CollParams &p, Peers &b, uint8_t *window) {
    if (threadIdx.x == 0) {
        if (p.step != 0 && !given_up(p.report) && peer_aborted(p)) atomicExch(&p.report->aborted, 1u);
        b.ok = b.opened = !given_up(p.report);
    }
    const uint32_t i = threadIdx.x - 32;
    if (i < p.ranks) {
        if (window == nullptr && p.path == COLL_PATH_STORE) atomicCAS(&p.report->null_ptr_rank, 0u, rank_of(p, i) + 1);
        b.ptr[i] = window;
    }
    __syncthreads();
    stamp_phase(p, 0, &CollTiming::clock_setup);
    return b.opened;
}

// The windows looked up, the call started, `load()` (the kernel's first
// loads of its own input, see above), then the call opened.
template <class Load>
__device__ bool open_call(const CollParams &p, Peers &b, Load &&load) {
    uint8_t *window = member_window(p);
    start_call(p);
    load();
    return open_call(p, b, window);
}

__device__ bool open_call(const CollParams &p, Peers &b) {
    return open_call(p, b, [] {});
}

// The block copies `bytes` from our window at src_off to member `dest`'s
// window at dst_off, by the call's path. Every thread of the block calls.
__device__ void send_to(const CollParams &p, const Peers &b, uint32_t dest, uint64_t src_off, uint64_t dst_off,
                        uint64_t bytes) {
    if (bytes == 0) return;
    if (dest == p.rank || p.path == COLL_PATH_STORE) {
        // Our own share (cuda_ipc refuses a peer in its own process), or a
        // mapped peer.
        if (b.ptr[dest] != nullptr) block_copy(b.ptr[dest] + dst_off, p.window + src_off, bytes);
        return;
    }
    // UCX's block copy moves 16-byte vectors only where source and
    // destination are both 16-byte aligned (8-byte ones where both are
    // 8-byte aligned, single bytes otherwise; both windows start aligned).
    // Where both miss alike, the bytes up to the boundary go in a put of
    // their own and the rest aligned; the callers arrange that they miss
    // alike (row_skew, allgather's own slot).
    const uint64_t head = ((src_off ^ dst_off) & 15) == 0 ? min(bytes, (16 - (src_off & 15)) & 15) : 0;
    const auto put = [&](uint64_t at, uint64_t n) {
        if (n == 0) return;
        const nixlMemViewElem src{p.local_mvh, 0, src_off + at};
        const nixlMemViewElem dst{p.remote_mvh, rank_of(p, dest), dst_off + at};
        record_status(&p.report->base, nixlPut<nixl_gpu_level_t::BLOCK>(src, dst, n, blockIdx.x));
    };
    put(0, head);
    put(head, bytes - head);
}

// ------------------------------------------------------- signal and wait

// The flag slot [phase][block][rank `src`] (by rank: a slot is only ever
// written by one rank, whichever its index).
__device__ __forceinline__ uint64_t flag_offset(const CollParams &p, uint32_t phase, uint32_t src) {
    return p.off_flags + 8ull * ((uint64_t(phase) * COLL_MAX_BLOCKS + blockIdx.x) * COLL_MAX_RANKS + src);
}

// The receive row rank `src` writes into (by rank, as the flags).
__device__ __forceinline__ uint64_t row_offset(const CollParams &p, uint32_t src) {
    return p.off_recv + rank_of(p, src) * p.recv_stride;
}

// Where reduce-scatter's chunk d starts in member d's receive rows: as far
// past the row's 16-byte boundary as chunk d of the input (d × count
// elements in) is past one, where that lines up a copy. In place, where the
// output (a slot of the input) lies skewed alike, so the sum's loads and
// stores line up. On the put path where UCX would copy single bytes: an
// aligned row under a chunk 2, 4, 6, 10, 12 or 14 bytes past a boundary
// left every byte to its byte copy (3 and 4 ranks, 301 and 318 MiB: 0.56–
// 0.71x NCCL's busbw). Elsewhere the rows stay aligned, as an out-of-place
// output is: skewed rows make every source of the sum unaligned (two loads
// a vector), which made the store path 23–35 % slower at those sizes and
// the put path 13–24 % slower where the chunk is 8 bytes past a boundary
// (UCX's 8-byte copy runs near its 16-byte one). layout::row_skew.
__device__ __forceinline__ uint64_t row_skew(const CollParams &p, uint32_t d) {
    const uint64_t E = elem_bytes(p), skew = uint64_t(d) * p.count * E & 15;
    const bool in_place = p.off_out == p.off_in + uint64_t(p.rank) * p.count * E;
    return in_place || (p.path == COLL_PATH_PUT && (skew & 7) != 0) ? skew : 0;
}

// After this block's copies: tells every peer this block's data of `phase`
// is there. Each thread fences its own stores before the barrier, so the
// flag cannot overtake any of them: at GPU scope when every rank runs on
// this GPU (the peers read through the same L2; a system-scope fence costs
// ~0.3 µs more per signal there), at system scope across GPUs.
__device__ void signal_peers(const CollParams &p, const Peers &b, uint32_t phase) {
    stamp_phase(p, phase, &CollTiming::clock_sent);
    fence_release(p.same_gpu);
    __syncthreads();
    const uint32_t d = threadIdx.x;
    if (d < p.ranks && d != p.rank) {
        // What this block last added to that rank's slot (only it writes there).
        uint64_t *sent = &p.sent[(phase * COLL_MAX_BLOCKS + blockIdx.x) * COLL_MAX_RANKS + rank_of(p, d)];
        const uint64_t last = *sent;
        const uint64_t slot = flag_offset(p, phase, rank_of(p, p.rank));
        if (p.path == COLL_PATH_STORE) {
            uint64_t *flag = b.ptr[d] == nullptr ? nullptr : reinterpret_cast<uint64_t *>(b.ptr[d] + slot);
            if (flag != nullptr) release_store(flag, p.epoch, p.same_gpu);
        } else {
            // The slot holds `last` (only this rank writes it): add the difference.
            const nixlMemViewElem counter{p.remote_mvh, rank_of(p, d), slot};
            record_status(&p.report->base, nixlAtomicAdd<nixl_gpu_level_t::THREAD>(p.epoch - last, counter, blockIdx.x));
        }
        *sent = p.epoch;
    }
    __syncthreads();
    stamp_phase(p, phase, &CollTiming::clock_signalled);
}

// Waits until every peer's block of the same index signalled `phase` of
// this call; then the block may read what they wrote.
__device__ bool wait_peers(const CollParams &p, Peers &b, uint32_t phase) {
    const uint32_t s = threadIdx.x;
    if (s < p.ranks && s != p.rank) {
        const uint64_t start = globaltimer_ns();
        const uint64_t *slot = reinterpret_cast<const uint64_t *>(p.window + flag_offset(p, phase, rank_of(p, s)));
        if (!coll_wait(p, slot, p.epoch, start, phase, rank_of(p, s))) b.ok = false;
        fence_acquire(p.same_gpu);
    }
    __syncthreads();
    stamp_phase(p, phase, &CollTiming::clock_waited);
    return b.ok;
}

// ------------------------------------------------------------- reduction

// Sums 16-byte vectors of bf16 or f32 in f32.
template <typename T> struct Vec;
template <> struct Vec<float> {
    static constexpr uint32_t N = 4;
    __device__ static void add(float (&a)[4], int4 x) {
        a[0] += __int_as_float(x.x);
        a[1] += __int_as_float(x.y);
        a[2] += __int_as_float(x.z);
        a[3] += __int_as_float(x.w);
    }
    __device__ static int4 pack(const float (&a)[4]) {
        return make_int4(__float_as_int(a[0]), __float_as_int(a[1]), __float_as_int(a[2]), __float_as_int(a[3]));
    }
    // Through L2 (.cg): peers wrote this memory during the kernel.
    __device__ static float load(const uint8_t *p, uint64_t i) { return __ldcg(reinterpret_cast<const float *>(p) + i); }
    __device__ static void store(uint8_t *p, uint64_t i, float v) { reinterpret_cast<float *>(p)[i] = v; }
};
template <> struct Vec<__nv_bfloat16> {
    static constexpr uint32_t N = 8;
    __device__ static void add(float (&a)[8], int4 x) {
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&x);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float2 f = __bfloat1622float2(h[k]);
            a[2 * k] += f.x;
            a[2 * k + 1] += f.y;
        }
    }
    __device__ static int4 pack(const float (&a)[8]) {
        int4 out;
        __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&out);
#pragma unroll
        for (int k = 0; k < 4; ++k) h[k] = __floats2bfloat162_rn(a[2 * k], a[2 * k + 1]);
        return out;
    }
    __device__ static float load(const uint8_t *p, uint64_t i) {
        return __bfloat162float(__ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short *>(p) + i)));
    }
    __device__ static void store(uint8_t *p, uint64_t i, float v) {
        reinterpret_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v);
    }
};

// out[i] = sum over s < n, in order, of b.src[s][i], for i in
// [lo, hi). Single elements up to out's first 16-byte boundary and after
// its last whole vector, 16-byte vectors between (sources at any element:
// load16): every rank adds in the same order, so all get bit-identical
// results. An in-place reduce-scatter's output is its slot of the input,
// rank × count elements in, which need not be 16-byte aligned: summed in
// single elements all along, it took 1.4–2.0x the out-of-place time on the
// store path (3 and 4 H200s, 301 and 318 MiB). Each thread sums U vectors
// at a time, the U loads of a source issued before any is added: with one
// vector, every source's load waited for the one before (a 4-rank
// reduce-scatter's sum ran at a third of the memory's rate).
template <typename T>
__device__ void reduce_into(const CollParams &p, const Peers &b, uint8_t *out, uint64_t lo, uint64_t hi, uint32_t n) {
    using V = Vec<T>;
    constexpr uint64_t E = sizeof(T);
    constexpr uint32_t U = 4;
    // out is element-aligned, so the bytes to its next 16-byte boundary are whole elements.
    const uint64_t v0 = min(hi, lo + ((16 - (reinterpret_cast<uintptr_t>(out + lo * E) & 15)) & 15) / E);
    const uint64_t nv = (hi - v0) / V::N, tail = v0 + nv * V::N;
    int4 *dst = reinterpret_cast<int4 *>(out + v0 * E);
    for (uint64_t v = threadIdx.x; v < nv; v += uint64_t(blockDim.x) * U) {
        float a[U][V::N] = {};
        for (uint32_t s = 0; s < n; ++s) {
            int4 x[U];
#pragma unroll
            for (uint32_t u = 0; u < U; ++u)
                if (v + blockDim.x * u < nv) x[u] = load16<true, false>(b.src[s] + (v0 + (v + blockDim.x * u) * V::N) * E);
#pragma unroll
            for (uint32_t u = 0; u < U; ++u)
                if (v + blockDim.x * u < nv) V::add(a[u], x[u]);
        }
#pragma unroll
        for (uint32_t u = 0; u < U; ++u)
            if (v + blockDim.x * u < nv) dst[v + blockDim.x * u] = V::pack(a[u]);
    }
    const auto one = [&](uint64_t i) {
        float a = 0.0f;
        for (uint32_t s = 0; s < n; ++s) a += V::load(b.src[s], i);
        V::store(out, i, a);
    };
    for (uint64_t i = lo + threadIdx.x; i < v0; i += blockDim.x) one(i);
    for (uint64_t i = tail + threadIdx.x; i < hi; i += blockDim.x) one(i);
}

// Sets the reduction's sources: our input at `own` for ourselves, the
// receive area's row of each peer.
__device__ void set_sources(const CollParams &p, Peers &b, uint64_t own_off) {
    __syncthreads();
    for (uint32_t s = threadIdx.x; s < p.ranks; s += blockDim.x)
        b.src[s] = s == p.rank ? p.window + own_off : p.window + row_offset(p, s);
    __syncthreads();
}

// Sums b.src[0 .. n): every member's in rank order (n = p.ranks), or the
// ring's own piece and partial sum.
__device__ void reduce(const CollParams &p, const Peers &b, uint8_t *out, uint64_t lo, uint64_t hi, uint32_t n) {
    if (p.dtype == COLL_BF16) reduce_into<__nv_bfloat16>(p, b, out, lo, hi, n);
    else reduce_into<float>(p, b, out, lo, hi, n);
}

// ------------------------------------------------------------ algorithms

// The member `j` places after this one. Every push loop goes round the
// members in this order, so at each step every member writes to a
// different one: in index order all of them would write to member 0 first,
// then all to member 1, … and each member's NVLink ingress would take every
// writer at once while the others stood idle (4 H100s: one-shot allgather
// at 190 GB/s bus bandwidth where NCCL's ring made 324).
__device__ __forceinline__ uint32_t peer_at(const CollParams &p, uint32_t j) { return (p.rank + j) % p.ranks; }

// One-shot allreduce: push this block's pieces of the input to every
// peer's receive row for us, wait for theirs, sum all N in rank order.
// Every push loop takes the peers in the outer loop: at each step each
// GPU then receives from one writer (peer_at); with the pieces outside,
// the blocks drifted out of step and 4-rank calls from 256 MiB ran up to
// 8 % slower (four H200s).
__device__ void allreduce_one_shot(const CollParams &p, Peers &b) {
    if (!open_call(p, b)) return;
    const uint64_t E = elem_bytes(p);
    for (uint32_t j = 1; j < p.ranks; ++j)
        for_pieces(p, p.count, [&](uint64_t lo, uint64_t hi) {
            send_to(p, b, peer_at(p, j), p.off_in + lo * E, row_offset(p, p.rank) + lo * E, (hi - lo) * E);
        });
    signal_peers(p, b, 0);
    if (!wait_peers(p, b, 0)) return;
    set_sources(p, b, p.off_in);
    for_pieces(p, p.count, [&](uint64_t lo, uint64_t hi) { reduce(p, b, p.window + p.off_out, lo, hi, p.ranks); });
}

// An allreduce's second half: push this block's pieces of our chunk's sums
// (chunk `rank` of split) from our output to the same place in every
// peer's, signal phase 1, wait for theirs.
__device__ void allgather_sums(const CollParams &p, Peers &b) {
    const uint64_t E = elem_bytes(p);
    uint64_t c0, c1;
    split(p.count, p.ranks, p.rank, c0, c1);
    __syncthreads();
    for (uint32_t j = 1; j < p.ranks; ++j)
        for_pieces(p, c1 - c0, [&](uint64_t lo, uint64_t hi) {
            send_to(p, b, peer_at(p, j), p.off_out + (c0 + lo) * E, p.off_out + (c0 + lo) * E, (hi - lo) * E);
        });
    signal_peers(p, b, 1);
    wait_peers(p, b, 1);
}

// Two-shot allreduce: reduce-scatter (rank c sums chunk c), then allgather
// of the sums. Block b moves the same pieces of every chunk in both
// phases, so it pairs with block b of every peer.
__device__ void allreduce_two_shot(const CollParams &p, Peers &b) {
    if (!open_call(p, b)) return;
    const uint64_t E = elem_bytes(p);
    for (uint32_t j = 1; j < p.ranks; ++j) {
        const uint32_t d = peer_at(p, j);
        uint64_t c0, c1;
        split(p.count, p.ranks, d, c0, c1);
        for_pieces(p, c1 - c0, [&](uint64_t lo, uint64_t hi) {
            send_to(p, b, d, p.off_in + (c0 + lo) * E, row_offset(p, p.rank) + lo * E, (hi - lo) * E);
        });
    }
    signal_peers(p, b, 0);
    if (!wait_peers(p, b, 0)) return;
    uint64_t c0, c1;
    split(p.count, p.ranks, p.rank, c0, c1);
    // Element c0 + j comes from our input there and from the peers' rows at
    // j: shift the rows back by c0 so one index serves all.
    set_sources(p, b, p.off_in);
    if (threadIdx.x < p.ranks && threadIdx.x != p.rank) b.src[threadIdx.x] -= c0 * E;
    __syncthreads();
    for_pieces(p, c1 - c0, [&](uint64_t lo, uint64_t hi) { reduce(p, b, p.window + p.off_out, c0 + lo, c0 + hi, p.ranks); });
    allgather_sums(p, b);
}

// Allgather: push this block's pieces of our input into slot `rank` of
// every rank's output, wait for every peer's. Our own slot is copied piece
// by piece beside the first peer's pushes, a copy in our own memory while
// the link carries the pushes (after all of them: 2 ranks 7–11 % slower
// from 128 MiB).
__device__ void allgather(const CollParams &p, Peers &b) {
    if (!open_call(p, b)) return;
    const uint64_t E = elem_bytes(p);
    // On the put path, where our slot is not 8-byte aligned, the pushes read
    // it from our own slot, copied first, which misses a 16-byte boundary
    // alike (send_to): from the aligned input every byte went in UCX's byte
    // copy (3 ranks, 256 MiB: 1,357 µs, 561 now). 8 bytes past a boundary
    // UCX copies 8-byte vectors, and copying our slot first cost more than
    // it saved (128 MiB: 286 -> 332 µs).
    const bool from_slot = p.path == COLL_PATH_PUT && (p.rank * p.count * E & 7) != 0;
    for (uint32_t j = 1; j < max(p.ranks, 2u); ++j)
        for_pieces(p, p.count, [&](uint64_t lo, uint64_t hi) {
            const uint64_t at = (p.rank * p.count + lo) * E, n = (hi - lo) * E;
            if (j == 1 && from_slot) {
                send_to(p, b, p.rank, p.off_in + lo * E, p.off_out + at, n);
                __syncthreads();
            }
            if (j < p.ranks) send_to(p, b, peer_at(p, j), from_slot ? p.off_out + at : p.off_in + lo * E, p.off_out + at, n);
            if (j == 1 && !from_slot) send_to(p, b, p.rank, p.off_in + lo * E, p.off_out + at, n);
        });
    signal_peers(p, b, 0);
    wait_peers(p, b, 0);
}

// Reduce-scatter: push this block's pieces of chunk d of our input to rank
// d's receive row for us, wait, sum our chunk's pieces from all N.
__device__ void reduce_scatter(const CollParams &p, Peers &b) {
    if (!open_call(p, b)) return;
    const uint64_t E = elem_bytes(p);
    for (uint32_t j = 1; j < p.ranks; ++j) {
        const uint32_t d = peer_at(p, j);
        for_pieces(p, p.count, [&](uint64_t lo, uint64_t hi) {
            send_to(p, b, d, p.off_in + (d * p.count + lo) * E, row_offset(p, p.rank) + row_skew(p, d) + lo * E,
                    (hi - lo) * E);
        });
    }
    signal_peers(p, b, 0);
    if (!wait_peers(p, b, 0)) return;
    set_sources(p, b, p.off_in + p.rank * p.count * E);
    if (threadIdx.x < p.ranks && threadIdx.x != p.rank) b.src[threadIdx.x] += row_skew(p, p.rank);
    __syncthreads();
    for_pieces(p, p.count, [&](uint64_t lo, uint64_t hi) { reduce(p, b, p.window + p.off_out, lo, hi, p.ranks); });
}

// Ring reduce-scatter (store path): the sum travels. At step s each member
// adds its piece of chunk (rank − s − 1) mod N to the partial sum the
// member before it stored at step s − 1, and stores the result into the
// next member's receive row s; at the last step the sum of chunk `rank`
// lands in the output. The sum rides on the push (two local loads feed a
// store over the link), where one-shot sums in a pass of its own after all
// pushes, reading N rows and writing one; and each GPU sends to one peer at
// a time. 4 H200s, 1 GiB: 2,357 µs against the one shot's 2,518 (bus
// bandwidth 1.04x NCCL's, against 0.98x); below 16 MiB its N − 1 steps of
// flags cost more than the sum saves. A piece's flag, slot [PIECE_PHASE][block][s] in the next
// member's window, counts the pieces of step s: epoch << 32 | pieces, so it
// only grows, from call to call as the epoch does. The put path has no
// ring: nixlPut copies, it cannot add on the way.
constexpr uint32_t PIECE_PHASE = 2;

__device__ __forceinline__ uint64_t piece_count(const CollParams &p, uint64_t pieces) { return p.epoch << 32 | pieces; }

// Chunk c of a ring: where it starts in the input and where its sum goes
// in the output (bytes), and its elements.
struct RingChunk {
    uint64_t in, out, n;
};

// The ring's N steps over the chunks `chunk(c)` gives, the last step's sums
// stored in the output. False where a wait failed.
template <class Chunk>
__device__ bool ring_reduce_scatter(const CollParams &p, Peers &b, Chunk &&chunk) {
    const uint32_t N = p.ranks, next = peer_at(p, 1), before = peer_at(p, N - 1);
    for (uint32_t s = 0; s < N && b.ok; ++s) {
        const RingChunk ch = chunk((p.rank + 2 * N - s - 1) % N);
        const bool last = s + 1 == N;
        uint8_t *dst = last ? p.window + p.off_out + ch.out : b.ptr[next] + p.off_recv + s * p.recv_stride;
        if (threadIdx.x == 0) {
            b.src[0] = p.window + p.off_in + ch.in;
            b.src[1] = s > 0 ? p.window + p.off_recv + (s - 1) * p.recv_stride : nullptr;  // what `before` stored
        }
        __syncthreads();
        uint64_t k = 0;
        for_pieces(p, ch.n, [&](uint64_t lo, uint64_t hi) {
            ++k;
            if (!b.ok || (!last && b.ptr[next] == nullptr)) return;
            if (s > 0) {
                if (threadIdx.x == 0) {
                    const uint64_t *slot = reinterpret_cast<const uint64_t *>(p.window + flag_offset(p, PIECE_PHASE, s - 1));
                    if (!coll_wait(p, slot, piece_count(p, k), globaltimer_ns(), 0, rank_of(p, before))) b.ok = false;
                    fence_acquire(p.same_gpu);
                }
                __syncthreads();
                if (!b.ok) return;
            }
            reduce(p, b, dst, lo, hi, s > 0 ? 2 : 1);
            __syncthreads();
            if (last) return;
            // As signal_peers, but one release after the block's barrier
            // (cumulative over the stores of the threads it synced with).
            if (threadIdx.x == 0)
                release_store(reinterpret_cast<uint64_t *>(b.ptr[next] + flag_offset(p, PIECE_PHASE, s)),
                              piece_count(p, k), p.same_gpu);
        });
        __syncthreads();
        if (s == 0) {
            stamp_phase(p, 0, &CollTiming::clock_sent);
            stamp_phase(p, 0, &CollTiming::clock_signalled);
        }
    }
    stamp_phase(p, 0, &CollTiming::clock_waited);
    return b.ok;
}

__device__ void reduce_scatter_ring(const CollParams &p, Peers &b) {
    if (!open_call(p, b)) return;
    const uint64_t E = elem_bytes(p);
    ring_reduce_scatter(p, b, [&](uint32_t c) { return RingChunk{c * p.count * E, 0, p.count}; });
}

// Ring allreduce (store path): the ring's reduce-scatter over two-shot's
// chunks, then two-shot's allgather of the sums (each rank pushing its
// chunk to every peer at once: no N − 1 more steps of flags).
__device__ void allreduce_ring(const CollParams &p, Peers &b) {
    if (!open_call(p, b)) return;
    const uint64_t E = elem_bytes(p);
    const auto chunk = [&](uint32_t c) {
        uint64_t c0, c1;
        split(p.count, p.ranks, c, c0, c1);
        return RingChunk{c0 * E, c0 * E, c1 - c0};
    };
    if (ring_reduce_scatter(p, b, chunk)) allgather_sums(p, b);
}

// ------------------------------------------------------------- LL lines

// A line is {u32 data, u32 epoch, u32 data, u32 epoch}: 8 bytes of data and
// the call's epoch (low 32 bits) twice, written with one 16-byte store, so a
// reader that sees the epoch in both halves has the data too — no fence, no
// separate flag (NCCL's LL protocol; the store, load and poll are
// cuda/ll.cuh's, src/gpu/ll.rs has the format). A line's old contents carry
// an older epoch, so nothing is cleared. Packing is ours: lines hold f32 or
// bf16 elements, so a partial line is read and written in 16-bit halves.

// Whether `p` can be read or written as one 8-byte word: allgather's and
// reduce-scatter's slots of rank × count elements can start at any even
// byte (count 1 of f32: every 4 bytes).
__device__ __forceinline__ bool aligned8(const uint8_t *p) { return (reinterpret_cast<uintptr_t>(p) & 7) == 0; }

// Data bytes [at, at + 8) of `src` (`bytes` in all; zeros past the end;
// `at` a multiple of 8).
__device__ __forceinline__ uint2 word_at(const uint8_t *src, uint64_t at, uint64_t bytes) {
    if (at + 8 <= bytes && aligned8(src)) return *reinterpret_cast<const uint2 *>(src + at);
    uint32_t h[4] = {0, 0, 0, 0};
    for (uint32_t j = 0; j < 4 && at + 2 * j < bytes; ++j) h[j] = reinterpret_cast<const uint16_t *>(src + at)[j];
    return make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
}

// Writes the 8 data bytes `v` at byte `at` of `dst` (only those before `bytes`).
__device__ __forceinline__ void word_to(uint8_t *dst, uint64_t at, uint64_t bytes, uint2 v) {
    if (at + 8 <= bytes && aligned8(dst)) {
        *reinterpret_cast<uint2 *>(dst + at) = v;
        return;
    }
    const uint32_t h[4] = {v.x & 0xffff, v.x >> 16, v.y & 0xffff, v.y >> 16};
    for (uint32_t j = 0; j < 4 && at + 2 * j < bytes; ++j) reinterpret_cast<uint16_t *>(dst + at)[j] = uint16_t(h[j]);
}

// Data bytes [8k, 8k + 8) of `src`: line k's data.
__device__ __forceinline__ uint2 ll_payload(const uint8_t *src, uint64_t k, uint64_t bytes) {
    return word_at(src, 8 * k, bytes);
}

// Writes the 8 data bytes of line k into `dst` (only those before `bytes`).
__device__ __forceinline__ void ll_unpack(uint8_t *dst, uint64_t k, uint64_t bytes, uint2 v) {
    word_to(dst, 8 * k, bytes, v);
}

// Stores the 8 data bytes `v` as the line at `dst`, stamped with `epoch`.
__device__ __forceinline__ void ll_put(uint8_t *dst, uint2 v, uint32_t epoch) {
    ll_store(reinterpret_cast<uint4 *>(dst), v.x, v.y, epoch);
}

// Polls a line until both halves carry exactly `epoch`; its data into `out`.
__device__ bool ll_wait(const uint8_t *line, uint32_t epoch, uint64_t start, const CollParams &p, uint32_t src,
                        uint2 &out) {
    uint4 v;
    const auto stop = [&](const uint4 &seen) { return !keep_waiting(p, start, seen.y, epoch, 0, rank_of(p, src)); };
    if (!ll_poll<ll_exact>(reinterpret_cast<const uint4 *>(line), epoch, v, stop)) return false;
    out = make_uint2(v.x, v.z);
    return true;
}

// Adds the 8 data bytes of a line (2 f32 or 4 bf16) into `a`, in f32.
__device__ __forceinline__ void ll_add(float (&a)[4], uint2 w, bool bf16) {
    if (!bf16) {
        a[0] += __uint_as_float(w.x);
        a[1] += __uint_as_float(w.y);
        return;
    }
    const float2 f0 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w.x));
    const float2 f1 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&w.y));
    a[0] += f0.x;
    a[1] += f0.y;
    a[2] += f1.x;
    a[3] += f1.y;
}

__device__ __forceinline__ uint2 ll_pack(const float (&a)[4], bool bf16) {
    if (!bf16) return make_uint2(__float_as_uint(a[0]), __float_as_uint(a[1]));
    const __nv_bfloat162 h0 = __floats2bfloat162_rn(a[0], a[1]);
    const __nv_bfloat162 h1 = __floats2bfloat162_rn(a[2], a[3]);
    return make_uint2(*reinterpret_cast<const uint32_t *>(&h0), *reinterpret_cast<const uint32_t *>(&h1));
}

// The lines [k0, k1) of this block's slice of `count` elements, each
// thread's first line, and the call's epoch as lines carry it. Slices
// start at multiples of 16 bytes: whole lines, none shared between blocks.
// A thread takes lines k0, k0 + blockDim, ...
struct LlSlice {
    uint64_t k0, k1;
    uint32_t epoch;
};

__device__ __forceinline__ LlSlice ll_slice(const CollParams &p) {
    const uint64_t E = elem_bytes(p);
    uint64_t lo, hi;
    split(p.count, gridDim.x, blockIdx.x, lo, hi);
    return {lo * E / 8 + threadIdx.x, (hi * E + 7) / 8, uint32_t(p.epoch)};
}

// This thread's first line of `in` (`bytes` in all), loaded before the
// call opens (ll_push stores it).
__device__ __forceinline__ uint2 ll_first(const LlSlice &l, const uint8_t *in, uint64_t bytes) {
    return l.k0 < l.k1 ? ll_payload(in, l.k0, bytes) : make_uint2(0, 0);
}

// Stores this thread's lines of `in` into every peer's LL row for us, the
// first from `first`; with kOwn, also unpacks them at `own` (allgather's
// own slot), as ll128_push does in LL128 lines. (A template flag, not a
// null test: the kernels then compile to the instructions they had.)
template <bool kOwn>
__device__ __forceinline__ void ll_push(const CollParams &p, const Peers &b, const LlSlice &l, const uint8_t *in,
                                        uint64_t bytes, uint2 first, uint8_t *own) {
    const uint64_t row = row_offset(p, p.rank);
    uint2 v = first;
    for (uint64_t k = l.k0; k < l.k1; k += blockDim.x) {
        if (k != l.k0) v = ll_payload(in, k, bytes);
        for (uint32_t d = 0; d < p.ranks; ++d)
            if (d != p.rank && b.ptr[d] != nullptr) ll_put(b.ptr[d] + row + 16 * k, v, l.epoch);
        if (kOwn) ll_unpack(own, k, bytes, v);
    }
}

// Members whose lines a thread loads together (reduce-scatter's push): a
// volatile store orders every load after it, so each member's load and
// store in turn cost one load's latency per member (push 0.9–1.4 µs on 4
// ranks, against 0.4 batched). Four at a time keeps the unrolled code
// small: unrolled over all 16 members, the call's start took 0.3–0.4 µs
// longer on four H200s (more code to fetch before the first store).
constexpr uint32_t LL_BATCH = 4;

// The data of line k of the chunks of members d0 .. d0 + LL_BATCH - 1 (not
// ours; member d's from `in` + d × bytes), all loads issued before any is
// used.
__device__ __forceinline__ void ll_chunks(const CollParams &p, const uint8_t *in, uint64_t k, uint64_t bytes,
                                          uint32_t d0, uint2 (&v)[LL_BATCH]) {
#pragma unroll
    for (uint32_t i = 0; i < LL_BATCH; ++i)
        if (d0 + i < p.ranks && d0 + i != p.rank) v[i] = ll_payload(in + (d0 + i) * bytes, k, bytes);
}

// LL allreduce (store path, small sizes): one-shot's data movement in lines.
// Thread t of block b stores lines t, t + blockDim, … of the block's slice
// into every peer's LL row for us, then polls the same lines of every
// peer's row in ours and sums all N in rank order, as reduce_into does (so
// the results are bit-identical to one-shot's). Off the store path's
// fence → barrier → flag → poll chain, a line costs one store one way.
// Every line kernel loads its first line's data before it opens the call.
__device__ void allreduce_ll(const CollParams &p, Peers &b) {
    const uint64_t bytes = p.count * elem_bytes(p);
    const bool bf16 = p.dtype == COLL_BF16;
    const LlSlice l = ll_slice(p);
    const uint8_t *in = p.window + p.off_in;
    uint2 first;
    if (!open_call(p, b, [&] { first = ll_first(l, in, bytes); })) return;
    ll_push<false>(p, b, l, in, bytes, first, nullptr);
    stamp_phase(p, 0, &CollTiming::clock_sent);
    stamp_phase(p, 0, &CollTiming::clock_signalled);
    const uint64_t start = globaltimer_ns();
    for (uint64_t k = l.k0; k < l.k1; k += blockDim.x) {
        float a[4] = {};
        for (uint32_t s = 0; s < p.ranks; ++s) {
            uint2 w;
            if (s == p.rank) w = ll_payload(in, k, bytes);
            else if (!ll_wait(p.window + row_offset(p, s) + 16 * k, l.epoch, start, p, s, w)) return;
            ll_add(a, w, bf16);
        }
        ll_unpack(p.window + p.off_out, k, bytes, ll_pack(a, bf16));
    }
    stamp_phase(p, 0, &CollTiming::clock_waited);
}

// LL allgather (store path, small sizes): allgather's data movement in
// lines. Each thread stores its lines of our input into every peer's LL
// row for us and into our own output slot, then polls the same lines of
// every peer's row in ours and unpacks them into that peer's slot.
__device__ void allgather_ll(const CollParams &p, Peers &b) {
    const uint64_t bytes = p.count * elem_bytes(p);
    const LlSlice l = ll_slice(p);
    const uint8_t *in = p.window + p.off_in;
    uint2 first;
    if (!open_call(p, b, [&] { first = ll_first(l, in, bytes); })) return;
    uint8_t *out = p.window + p.off_out;
    ll_push<true>(p, b, l, in, bytes, first, out + p.rank * bytes);
    stamp_phase(p, 0, &CollTiming::clock_sent);
    stamp_phase(p, 0, &CollTiming::clock_signalled);
    const uint64_t start = globaltimer_ns();
    for (uint64_t k = l.k0; k < l.k1; k += blockDim.x) {
        for (uint32_t s = 0; s < p.ranks; ++s) {
            uint2 w;
            if (s == p.rank) continue;
            if (!ll_wait(p.window + row_offset(p, s) + 16 * k, l.epoch, start, p, s, w)) return;
            ll_unpack(out + s * bytes, k, bytes, w);
        }
    }
    stamp_phase(p, 0, &CollTiming::clock_waited);
}

// LL reduce-scatter (store path, small sizes): reduce-scatter's data
// movement in lines. Each thread stores its lines of chunk d of our input
// into rank d's LL row for us, then polls the same lines of every peer's
// row in ours and sums our chunk from all N in rank order, as reduce_into
// does (bit-identical to the one-shot reduce-scatter).
__device__ void reduce_scatter_ll(const CollParams &p, Peers &b) {
    const uint64_t bytes = p.count * elem_bytes(p);
    const bool bf16 = p.dtype == COLL_BF16;
    const LlSlice l = ll_slice(p);
    const uint8_t *in = p.window + p.off_in;
    uint2 v[LL_BATCH];
    if (!open_call(p, b, [&] { if (l.k0 < l.k1) ll_chunks(p, in, l.k0, bytes, 0, v); })) return;
    const uint64_t row = row_offset(p, p.rank);
    for (uint64_t k = l.k0; k < l.k1; k += blockDim.x) {
        for (uint32_t d0 = 0; d0 < p.ranks; d0 += LL_BATCH) {
            if (k != l.k0 || d0 != 0) ll_chunks(p, in, k, bytes, d0, v);
#pragma unroll
            for (uint32_t i = 0; i < LL_BATCH; ++i) {
                const uint32_t d = d0 + i;
                if (d < p.ranks && d != p.rank && b.ptr[d] != nullptr) ll_put(b.ptr[d] + row + 16 * k, v[i], l.epoch);
            }
        }
    }
    stamp_phase(p, 0, &CollTiming::clock_sent);
    stamp_phase(p, 0, &CollTiming::clock_signalled);
    const uint64_t start = globaltimer_ns();
    for (uint64_t k = l.k0; k < l.k1; k += blockDim.x) {
        float a[4] = {};
        for (uint32_t s = 0; s < p.ranks; ++s) {
            uint2 w;
            if (s == p.rank) w = ll_payload(in + p.rank * bytes, k, bytes);
            else if (!ll_wait(p.window + row_offset(p, s) + 16 * k, l.epoch, start, p, s, w)) return;
            ll_add(a, w, bf16);
        }
        ll_unpack(p.window + p.off_out, k, bytes, ll_pack(a, bf16));
    }
    stamp_phase(p, 0, &CollTiming::clock_waited);
}

// ---------------------------------------------------------- LL128 lines

// The LL128 algorithms (store path, mid sizes): the LL algorithms' data
// movement in 128-byte lines of 120 data bytes and one flag word carrying
// the call's epoch twice (NCCL's LL128; the store, load and what it relies
// on are cuda/ll.cuh's, src/gpu/ll.rs has the format), so 15/16 of the
// bytes on the wire are data where LL's are half. A warp owns four lines
// at a time: lane 8j + c stores (and the receiver loads) bytes 16c.. of
// line j with one 16-byte access, lane 8j + 7 the last 8 data bytes and
// the flag; a block's share is whole lines.

// This block's lines [k0, k1) of a row of `bytes` data bytes, and the
// call's epoch as the flags carry it.
struct Ll128Slice {
    uint64_t k0, k1;
    uint32_t epoch;
};

__device__ __forceinline__ Ll128Slice ll128_slice(const CollParams &p, uint64_t bytes) {
    const uint64_t n = ll128_lines(bytes), per = (n + gridDim.x - 1) / gridDim.x;
    const uint64_t k0 = min(n, uint64_t(blockIdx.x) * per);
    return {k0, min(n, k0 + per), uint32_t(p.epoch)};
}

// This lane's place in a quad of lines: `line` 0..3 of the quad, `part`
// 0..7 of the line (16 bytes each; part 7 holds the flag).
struct Ll128Lane {
    uint32_t warp, warps, line, part;
    __device__ Ll128Lane()
        : warp(threadIdx.x / 32), warps(blockDim.x / 32), line(threadIdx.x % 32 / LL128_LANES),
          part(threadIdx.x % LL128_LANES) {}
    __device__ bool flag() const { return part == LL128_LANES - 1; }
    // This lane's 16 bytes of line k: in a row of lines, and in the data.
    __device__ uint64_t wire(uint64_t k) const { return k * LL128_LINE_BYTES + 16 * part; }
    __device__ uint64_t data(uint64_t k) const { return k * LL128_PAYLOAD + 16 * part; }
};

__device__ __forceinline__ uint64_t as_word(uint2 v) { return uint64_t(v.y) << 32 | v.x; }
__device__ __forceinline__ uint2 as_uint2(uint64_t w) { return make_uint2(uint32_t(w), uint32_t(w >> 32)); }

// This lane's 16 bytes of line k of `src` as it sends them: two data words,
// or one and the flag (zeros past the end of the data).
__device__ __forceinline__ void ll128_words(const Ll128Lane &me, const uint8_t *src, uint64_t k, uint64_t bytes,
                                            uint64_t flag, uint64_t &lo, uint64_t &hi) {
    lo = as_word(word_at(src, me.data(k), bytes));
    hi = me.flag() ? flag : as_word(word_at(src, me.data(k) + 8, bytes));
}

// Writes this lane's data of line k (16 bytes, or 8 beside the flag) at
// `dst` (only the bytes before `bytes`).
__device__ __forceinline__ void ll128_unpack(const Ll128Lane &me, uint8_t *dst, uint64_t k, uint64_t bytes,
                                             uint64_t lo, uint64_t hi) {
    word_to(dst, me.data(k), bytes, as_uint2(lo));
    if (!me.flag()) word_to(dst, me.data(k) + 8, bytes, as_uint2(hi));
}

// The warp's quads of this block's lines: quad q covers lines
// k0 + 4q .. k0 + 4q + 3; warp w takes quads w, w + warps, .... Calls
// `each(k, mine)` for this lane's line of each quad, alike on every lane
// of the warp (`mine`: the line is in the slice), so the warp's stores and
// loads of one line stay one instruction; stops when `each` returns false
// (and returns false).
template <class Each>
__device__ __forceinline__ bool ll128_quads(const Ll128Lane &me, const Ll128Slice &l, Each &&each) {
    for (uint64_t q = me.warp; 4 * q < l.k1 - l.k0; q += me.warps) {
        const uint64_t k = l.k0 + 4 * q + me.line;
        if (!each(k, k < l.k1)) return false;
    }
    return true;
}

// Polls this lane's part of line k of rank `src`'s row in our window (at
// `row`) until every line of the warp's quad carries exactly `epoch` (a
// vote: a line's data and flag must come from the same load); its 16 bytes
// in lo/hi. False, for the whole warp, once a lane's keep_waiting says stop.
__device__ bool ll128_wait(const CollParams &p, const Ll128Lane &me, uint64_t row, uint64_t k, bool mine,
                           uint32_t epoch, uint64_t start, uint32_t src, uint64_t &lo, uint64_t &hi) {
    const uint4 *at = reinterpret_cast<const uint4 *>(p.window + row + me.wire(k));
    const uint64_t want = ll128_flag(epoch);
    lo = hi = 0;
    __syncwarp();
    if (mine) ll128_load(at, lo, hi);
    bool ready = !mine || !me.flag() || hi == want;
    for (uint32_t polls = 1; __any_sync(~0u, !ready); ++polls) {
        const bool stop = (polls & 63) == 0 && !ready && !keep_waiting(p, start, uint32_t(hi), epoch, 0, rank_of(p, src));
        if (__any_sync(~0u, stop)) return false;
        if (mine) ll128_load(at, lo, hi);
        ready = !mine || !me.flag() || hi == want;
    }
    return true;
}

// Stores this lane's 16 bytes of line k into member `d`'s window at `row`
// (a peer with a pointer; not ourselves). Callers go round the members
// from the one after us (peer_at), as every push does.
__device__ __forceinline__ void ll128_send(const CollParams &p, const Peers &b, uint32_t d, uint64_t row,
                                           const Ll128Lane &me, uint64_t k, uint64_t lo, uint64_t hi) {
    if (d != p.rank && b.ptr[d] != nullptr) ll128_store(reinterpret_cast<uint4 *>(b.ptr[d] + row + me.wire(k)), lo, hi);
}

// Pushes this block's lines of each peer's chunk into that peer's row for
// us at `row`, going round the members from the one after us (reduce-
// scatter's and two-shot's first half); `chunk(d, src, bytes)` names the
// chunk bound for member d.
template <class Chunk>
__device__ void ll128_scatter(const CollParams &p, const Peers &b, const Ll128Lane &me, const Ll128Slice &l,
                              uint64_t row, Chunk &&chunk) {
    const uint64_t flag = ll128_flag(l.epoch);
    ll128_quads(me, l, [&](uint64_t k, bool mine) {
        for (uint32_t j = 1; j < p.ranks; ++j) {
            const uint32_t d = peer_at(p, j);
            const uint8_t *src;
            uint64_t bytes, lo = 0, hi = 0;
            chunk(d, src, bytes);
            if (mine) ll128_words(me, src, k, bytes, flag, lo, hi);
            __syncwarp();
            if (mine) ll128_send(p, b, d, row, me, k, lo, hi);
        }
        return true;
    });
}

// Adds this lane's 16 bytes of a line (4 f32 or 8 bf16; beside the flag
// half that) into `a` (first word) and `c` (second), in f32.
__device__ __forceinline__ void ll128_add(const Ll128Lane &me, float (&a)[4], float (&c)[4], uint64_t lo,
                                          uint64_t hi, bool bf16) {
    ll_add(a, as_uint2(lo), bf16);
    if (!me.flag()) ll_add(c, as_uint2(hi), bf16);
}

// This lane's words of its warp's first quad of `in` (`bytes` in all),
// read before the call opens (ll128_push sends them): line k, lo/hi as
// ll128_words gives them.
struct Ll128First {
    uint64_t k, lo, hi;
};

__device__ __forceinline__ Ll128First ll128_first(const Ll128Lane &me, const Ll128Slice &l, const uint8_t *in,
                                                  uint64_t bytes) {
    Ll128First f{l.k0 + 4 * me.warp + me.line, 0, 0};  // ll128_quads' first line for this lane
    if (f.k < l.k1) ll128_words(me, in, f.k, bytes, ll128_flag(l.epoch), f.lo, f.hi);
    return f;
}

// Pushes this block's lines of `in` (`bytes` in all) into every peer's
// row for us, going round the members from the one after us; with `own`,
// also unpacks them there (allgather's own slot). The first quad's words
// are `first`'s.
__device__ void ll128_push(const CollParams &p, const Peers &b, const Ll128Lane &me, const Ll128Slice &l,
                           const uint8_t *in, uint64_t bytes, uint8_t *own, const Ll128First &first) {
    const uint64_t flag = ll128_flag(l.epoch), row = row_offset(p, p.rank);
    ll128_quads(me, l, [&](uint64_t k, bool mine) {
        uint64_t lo = first.lo, hi = first.hi;
        if (mine && k != first.k) ll128_words(me, in, k, bytes, flag, lo, hi);
        __syncwarp();
        if (!mine) return true;
        for (uint32_t j = 1; j < p.ranks; ++j) ll128_send(p, b, peer_at(p, j), row, me, k, lo, hi);
        if (own != nullptr) ll128_unpack(me, own, k, bytes, lo, hi);
        return true;
    });
}

// Sums this lane's part of line k from every member in rank order (ours
// from `own`, the peers' from their rows in our window, each waited for)
// into `out`, in f32, as reduce_into does; the sum as this lane's words of
// the line in lo/hi. False, for the whole warp, when a wait stopped.
__device__ bool ll128_sum(const CollParams &p, const Ll128Lane &me, const Ll128Slice &l, uint64_t k, bool mine,
                          const uint8_t *own, uint8_t *out, uint64_t bytes, uint64_t start, uint64_t &lo,
                          uint64_t &hi) {
    const bool bf16 = p.dtype == COLL_BF16;
    float a[4] = {}, c[4] = {};
    for (uint32_t s = 0; s < p.ranks; ++s) {
        uint64_t x = 0, y = 0;
        if (s == p.rank) {
            if (mine) ll128_words(me, own, k, bytes, 0, x, y);
        } else if (!ll128_wait(p, me, row_offset(p, s), k, mine, l.epoch, start, s, x, y)) {
            return false;
        }
        ll128_add(me, a, c, x, y, bf16);
    }
    lo = as_word(ll_pack(a, bf16));
    hi = as_word(ll_pack(c, bf16));
    if (mine) ll128_unpack(me, out, k, bytes, lo, hi);
    return true;
}

// LL128 allreduce (store path, mid sizes): allreduce_ll in LL128 lines.
// Each warp stores its quads of our input into every peer's LL128 row for
// us, then polls the same quads of every peer's row in ours and sums all N
// in rank order (bit-identical to one-shot's).
__device__ void allreduce_ll128(const CollParams &p, Peers &b) {
    const uint64_t bytes = p.count * elem_bytes(p);
    const Ll128Slice l = ll128_slice(p, bytes);
    const Ll128Lane me;
    const uint8_t *in = p.window + p.off_in;
    Ll128First first;
    if (!open_call(p, b, [&] { first = ll128_first(me, l, in, bytes); })) return;
    ll128_push(p, b, me, l, in, bytes, nullptr, first);
    stamp_phase(p, 0, &CollTiming::clock_sent);
    stamp_phase(p, 0, &CollTiming::clock_signalled);
    const uint64_t start = globaltimer_ns();
    uint8_t *out = p.window + p.off_out;
    ll128_quads(me, l, [&](uint64_t k, bool mine) {
        uint64_t lo, hi;
        return ll128_sum(p, me, l, k, mine, in, out, bytes, start, lo, hi);
    });
    stamp_phase(p, 0, &CollTiming::clock_waited);
}

// LL128 two-shot allreduce (store path, mid sizes): allreduce_two_shot in
// LL128 lines, with no barrier between its halves. A row for a peer has two
// halves of the largest chunk's lines: the reduce-scatter's (chunk d of our
// input, into rank d's first half for us) and the allgather's (the sums of
// our chunk, into every peer's second half for us). Each warp pushes its
// quads of every peer's chunk, sums the same quads of ours as they arrive
// and pushes the sums on at once (the summing lane holds the line's words),
// then unpacks the peers' sums. Half of one-shot's bytes per rank on 4
// ranks, where every rank pushing its whole input stops paying (2–4 MiB).
__device__ void allreduce_two_shot_ll128(const CollParams &p, Peers &b) {
    if (!open_call(p, b)) return;
    const uint64_t E = elem_bytes(p);
    // Chunk d's first byte and bytes (the last chunks may be short or empty:
    // their lines carry zeros past the end, so every member has the lines of
    // the largest).
    const auto chunk = [&](uint32_t d, uint64_t &at, uint64_t &bytes) {
        uint64_t c0, c1;
        split(p.count, p.ranks, d, c0, c1);
        at = c0 * E;
        bytes = (c1 - c0) * E;
    };
    uint64_t at, bytes;
    chunk(0, at, bytes);  // the largest chunk sets the lines
    const Ll128Slice l = ll128_slice(p, bytes);
    const uint64_t half = ll128_lines(bytes) * LL128_LINE_BYTES, flag = ll128_flag(l.epoch);
    const uint64_t row = row_offset(p, p.rank);
    const Ll128Lane me;
    const uint8_t *in = p.window + p.off_in;
    uint8_t *out = p.window + p.off_out;
    ll128_scatter(p, b, me, l, row, [&](uint32_t d, const uint8_t *&src, uint64_t &n) {
        uint64_t c0;
        chunk(d, c0, n);
        src = in + c0;
    });
    stamp_phase(p, 0, &CollTiming::clock_sent);
    stamp_phase(p, 0, &CollTiming::clock_signalled);
    const uint64_t start = globaltimer_ns();
    chunk(p.rank, at, bytes);  // ours from here on
    const bool summed = ll128_quads(me, l, [&](uint64_t k, bool mine) {
        uint64_t lo, hi;
        if (!ll128_sum(p, me, l, k, mine, in + at, out + at, bytes, start, lo, hi)) return false;
        if (me.flag()) hi = flag;
        __syncwarp();
        for (uint32_t j = 1; j < p.ranks; ++j)
            if (mine) ll128_send(p, b, peer_at(p, j), row + half, me, k, lo, hi);
        return true;
    });
    if (summed) {
        ll128_quads(me, l, [&](uint64_t k, bool mine) {
            for (uint32_t j = 1; j < p.ranks; ++j) {
                const uint32_t s = peer_at(p, j);
                uint64_t lo, hi, c0, n;
                chunk(s, c0, n);
                if (!ll128_wait(p, me, row_offset(p, s) + half, k, mine, l.epoch, start, s, lo, hi)) return false;
                if (mine) ll128_unpack(me, out + c0, k, n, lo, hi);
            }
            return true;
        });
    }
    stamp_phase(p, 0, &CollTiming::clock_waited);
}

// LL128 allgather (store path, mid sizes): allgather_ll in LL128 lines.
__device__ void allgather_ll128(const CollParams &p, Peers &b) {
    const uint64_t bytes = p.count * elem_bytes(p);
    const Ll128Slice l = ll128_slice(p, bytes);
    const Ll128Lane me;
    const uint8_t *in = p.window + p.off_in;
    Ll128First first;
    if (!open_call(p, b, [&] { first = ll128_first(me, l, in, bytes); })) return;
    uint8_t *out = p.window + p.off_out;
    ll128_push(p, b, me, l, in, bytes, out + p.rank * bytes, first);
    stamp_phase(p, 0, &CollTiming::clock_sent);
    stamp_phase(p, 0, &CollTiming::clock_signalled);
    const uint64_t start = globaltimer_ns();
    ll128_quads(me, l, [&](uint64_t k, bool mine) {
        for (uint32_t s = 0; s < p.ranks; ++s) {
            if (s == p.rank) continue;
            uint64_t lo, hi;
            if (!ll128_wait(p, me, row_offset(p, s), k, mine, l.epoch, start, s, lo, hi)) return false;
            if (mine) ll128_unpack(me, out + s * bytes, k, bytes, lo, hi);
        }
        return true;
    });
    stamp_phase(p, 0, &CollTiming::clock_waited);
}

// LL128 reduce-scatter (store path, mid sizes): reduce_scatter_ll in LL128
// lines: chunk d of our input goes to rank d's row for us; our chunk is
// summed from all N in rank order.
__device__ void reduce_scatter_ll128(const CollParams &p, Peers &b) {
    if (!open_call(p, b)) return;
    const uint64_t bytes = p.count * elem_bytes(p);
    const Ll128Slice l = ll128_slice(p, bytes);
    const Ll128Lane me;
    const uint64_t row = row_offset(p, p.rank);
    const uint8_t *in = p.window + p.off_in;
    ll128_scatter(p, b, me, l, row, [&](uint32_t d, const uint8_t *&src, uint64_t &n) {
        src = in + d * bytes;
        n = bytes;
    });
    stamp_phase(p, 0, &CollTiming::clock_sent);
    stamp_phase(p, 0, &CollTiming::clock_signalled);
    const uint64_t start = globaltimer_ns();
    ll128_quads(me, l, [&](uint64_t k, bool mine) {
        uint64_t lo, hi;
        return ll128_sum(p, me, l, k, mine, in + p.rank * bytes, p.window + p.off_out, bytes, start, lo, hi);
    });
    stamp_phase(p, 0, &CollTiming::clock_waited);
}

// One call of one collective: `Algorithm` (which starts and opens the call
// itself, start_call and open_call), then block 0's end stamp.
// Every rank launches the same grid.
template <void (*Algorithm)(const CollParams &, Peers &)>
__device__ __forceinline__ void coll_call(const CollParams &p) {
    __shared__ Peers b;
    const bool stamp = blockIdx.x == 0 && threadIdx.x == 0;
    Algorithm(p, b);
    __syncthreads();
    if (!b.opened) return;  // nothing ran: no end to stamp
    if (stamp) {
        p.timing->clock_end = clock64();
        p.timing->gt_end = globaltimer_ns();
    }
    // A slot keeps an earlier call's end, always earlier than this one's.
    if (threadIdx.x == 0)
        atomicMax(reinterpret_cast<unsigned long long *>(&p.timing->gt_last_end), globaltimer_ns());
}

// The kernel entries, coll_<algorithm>, one per operation and algorithm:
// each operation's file in src/collectives/ops/ names its own
// (`Collective::kernel`). One block per SM is all a call ever needs
// resident (its grid is at most its share of the SMs): said so, ptxas
// gives the kernels the registers they use (without it, it held two of
// them to 64 and spilled up to 108 bytes a thread; on 4 H200s the LL and
// LL128 calls ran 0.7 % faster with it).
#define COLL_ENTRY(algorithm) \
    extern "C" __global__ void __launch_bounds__(COLL_THREADS, 1) coll_##algorithm(CollParams p) { \
        coll_call<algorithm>(p); \
    }
COLL_ENTRY(allreduce_one_shot)
COLL_ENTRY(allreduce_two_shot)
COLL_ENTRY(allreduce_ll)
COLL_ENTRY(allreduce_ll128)
COLL_ENTRY(allreduce_two_shot_ll128)
COLL_ENTRY(allreduce_ring)
COLL_ENTRY(allgather)
COLL_ENTRY(allgather_ll)
COLL_ENTRY(allgather_ll128)
COLL_ENTRY(reduce_scatter)
COLL_ENTRY(reduce_scatter_ll)
COLL_ENTRY(reduce_scatter_ll128)
COLL_ENTRY(reduce_scatter_ring)
#undef COLL_ENTRY

// The launch floor: an entry that starts and ends as every call does (it
// waits for the kernel before it and lets the next one launch) and does
// nothing else, one block of COLL_THREADS taking a call's parameters. The
// host times it exactly as it times the calls (src/collectives/session.rs,
// `measure_floor`): what a call costs with nothing inside its kernel, the
// launch and the events around it, which a call of ours cannot go below.
extern "C" __global__ void __launch_bounds__(COLL_THREADS, 1) coll_empty(CollParams) {
    wait_previous_grid();
    allow_next_launch();
}

// ------------------------------------------------------ fill and check

__device__ __forceinline__ float load_elem(const CollData &d, const uint8_t *p, uint64_t i) {
    return d.dtype == COLL_BF16 ? Vec<__nv_bfloat16>::load(p, i) : Vec<float>::load(p, i);
}

// Random data: splitmix64's finalizer (a counter-based hash: every rank and
// every check recompute any element without storing it).
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Input element i of `rank` in this call, as the buffer holds it: exact
// data (coll_input), or uniform in [-1, 1) with 24 random bits (exact in
// f32), rounded to bf16 for bf16.
__device__ float coll_value(const CollData &d, uint32_t rank, uint64_t i) {
    if (!d.random) return coll_input(rank, i, d.call);
    const uint64_t h = mix64(mix64(i ^ (uint64_t(d.call) << 32)) ^ (uint64_t(rank) + 1) * 0x9e3779b97f4a7c15ull);
    const float v = float(int64_t(h >> 40) - (int64_t(1) << 23)) * 0x1p-23f;
    return d.dtype == COLL_BF16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

// Writes this rank's input of call `call`: count elements (allgather),
// count (allreduce) or ranks × count (reduce-scatter).
extern "C" __global__ void coll_fill(CollData d) {
    const uint64_t n = d.op == COLL_REDUCE_SCATTER ? d.count * d.ranks : d.count;
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
        const float v = coll_value(d, d.members[d.rank], i);
        if (d.dtype == COLL_BF16) Vec<__nv_bfloat16>::store(d.in, i, v);
        else Vec<float>::store(d.in, i, v);
    }
}

// The expected output element i and how far a right result may lie from it
// (`tol`; 0 with exact data). Random data: `want` is the sum of the inputs
// in rank order in f32, and any order of the N − 1 additions in the type's
// precision, plus the rounding to the type, stays within N·u·Σ|x| of the
// exact sum (u: 2^-24 for f32, 2^-8 for bf16), and `want` within N·2^-24·Σ|x|
// of it: tol = 2·N·u·Σ|x| (`collectives --help` states it). Our kernels add
// in rank order in f32, so they land on `want` (bf16: rounded once); NCCL
// adds in its own order.
__device__ float expected(const CollData &d, uint64_t i, float &tol) {
    tol = 0.0f;
    if (d.op == COLL_ALLGATHER) return coll_value(d, d.members[i / d.count], i % d.count);
    const uint64_t at = d.op == COLL_REDUCE_SCATTER ? d.rank * d.count + i : i;
    float sum = 0.0f, mag = 0.0f;
    for (uint32_t m = 0; m < d.ranks; ++m) {
        const float x = coll_value(d, d.members[m], at);
        sum += x;
        mag += fabsf(x);
    }
    if (d.random) tol = 2.0f * float(d.ranks) * (d.dtype == COLL_BF16 ? 0x1p-8f : 0x1p-24f) * mag;
    return sum;
}

// Compares every output element with the expected value; records the first
// mismatch and counts the elements compared.
extern "C" __global__ void coll_check(CollData d) {
    if (d.report != nullptr && *static_cast<const volatile uint32_t *>(&d.report->aborted) != 0) {
        if (blockIdx.x == 0 && threadIdx.x == 0) atomicAdd(&d.verify->lost, 1u);
        return;
    }
    const uint64_t n = d.op == COLL_ALLGATHER ? d.count * d.ranks : d.count;
    uint64_t mine = 0;
    for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
        float tol;
        const float want = expected(d, i, tol);
        const float got = load_elem(d, d.out, i);
        ++mine;
        const bool wrong = d.random ? !(fabsf(got - want) <= tol) : got != want;
        if (wrong && atomicAdd(&d.verify->mismatches, 1u) == 0) {
            d.verify->call = d.call;
            d.verify->element = i;
            d.verify->expected = want;
            d.verify->got = got;
        }
    }
    atomicAdd(reinterpret_cast<unsigned long long *>(&d.verify->checked), (unsigned long long)mine);
}

// out[d] = nixlGetPtr(remote, d) for every rank d in `wanted` (1 for `rank`
// itself, 0 for the rest): whether the store path can reach those peers.
// Ranks outside `wanted` are not asked: an element of the view that holds no
// peer yet (a rank that joins later) has no endpoint to ask.
extern "C" __global__ void coll_probe_ptrs(void *remote_mvh, uint32_t ranks, uint32_t rank, uint64_t wanted,
                                           uint64_t *out) {
    for (uint32_t d = threadIdx.x; d < ranks; d += blockDim.x) {
        if (d == rank) out[d] = 1;
        else if ((wanted >> d & 1) == 0) out[d] = 0;
        else out[d] = reinterpret_cast<uint64_t>(nixlGetPtr(remote_mvh, d));
    }
}
