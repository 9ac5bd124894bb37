// Expert-parallel dispatch and combine between N ranks through NIXL's device
// API (NIXL 1.x). docs/EP.md walks through the design; in one paragraph:
//
// Every rank exposes one registered window (src/ep/config.rs WindowLayout).
// A phase kernel starts with a barrier among the ranks (block 0 raises a
// bare flag in every rank's window, every block waits for all), then every
// warp copies token chunks into the destination ranks' windows — nixlPut
// (path put) or plain 16-byte stores through nixlGetPtr (path store), local
// copies for this rank's own share — and every block, once its copies are
// done, adds (1 << 32) | tokens_it_sent to each destination's counter for
// this source with one release reduction (GPU scope when every rank shares
// this GPU, system scope otherwise). The receiver knows the data is
// complete when the high half of that counter reaches the number of
// blocks, and reads the token count from the low half: counts are signalled
// after the data. Counters only grow (the targets grow with the run-wide
// step number), so nothing is ever reset under a peer's atomic.
//
// Waits happen after the sends: a rank never holds SMs spinning on a peer
// while it still has data to send, and its grid is sized to its share of
// the GPU when ranks share one. Every spin goes through ep_wait: a
// %globaltimer deadline, the host's cancel flag, and a record of which rank
// it waited for.
//
// The mask (docs/EP.md §13): a wait on another rank that passes
// fault_timeout_ns (counted from when that wait began) sets mask[src] = 1,
// records it in EpReport and goes on as if src sent nothing; senders skip
// masked destinations, waits skip masked sources, combine leaves out masked
// ranks' contributions, the verify kernels check against the mask as it is
// after the step. Waits on this rank's own blocks stay fatal (timeout_ns).

#include <cuda/atomic>
#include <cuda_bf16.h>

// NIXL's device header, the clock, scoped signals, the bounded wait.
#include "device_common.cuh"
#include "ep_common.cuh"

static_assert(sizeof(EpSendEntry) == 12, "EpSendEntry layout is shared with the host");
static_assert(sizeof(EpReport) == 96, "EpReport layout is shared with the host");
static_assert(offsetof(EpReport, base) == 0, "run_watched reads and cancels an EpReport as its KernelReport");
static_assert(sizeof(EpVerify) == 48, "EpVerify layout is shared with the host");
static_assert(sizeof(EpTiming) == 32, "EpTiming layout is shared with the host");
static_assert(sizeof(EpParams) == 312, "EpParams layout is shared with the host");
static_assert(offsetof(EpParams, off_dispatch_count) == 144, "EpParams layout is shared with the host");
static_assert(offsetof(EpParams, rank) == 240, "EpParams layout is shared with the host");

// ------------------------------------------------------------ primitives

__device__ __forceinline__ uint64_t *word_at(uint8_t *base, uint64_t offset) {
    return reinterpret_cast<uint64_t *>(base + offset);
}

__device__ __forceinline__ bool given_up(const EpReport *r) {
    return *static_cast<const volatile uint32_t *>(&r->base.timed_out) != 0;
}

// Records why a wait gave up (the first one to give up writes it).
__device__ void give_up(EpReport *r, uint32_t why, uint64_t seen, uint64_t threshold, uint32_t kind, uint32_t rank) {
    if (atomicCAS(&r->base.timed_out, 0u, why) == 0) {
        r->base.observed = seen;
        r->wait_kind = kind;
        r->wait_rank = rank;
        r->wait_target = threshold;
    }
}

// Whether a wait of this rank stops: past its deadline or the host's cancel
// (recorded: what it waited for), or another block of this rank gave up.
__device__ bool ep_stop(EpReport *r, uint64_t deadline, uint64_t seen, uint64_t threshold, uint32_t kind,
                        uint32_t rank) {
    const uint32_t why = wait_expired(&r->base, deadline);
    if (why != 0) give_up(r, why, seen, threshold, kind, rank);
    return why != 0 || given_up(r);
}

// Spins (one thread) until *word >= threshold, napping nap_ns between polls
// where other warps of the SM have work, or until ep_stop. Waits on other
// ranks go through ep_wait_peer.
__device__ bool ep_wait(const uint64_t *word, uint64_t threshold, uint64_t deadline, EpReport *r,
                        uint32_t kind, uint32_t rank, uint32_t nap_ns = 0) {
    const uint64_t v = spin_wait(
        word, threshold, [&](uint64_t seen) { return ep_stop(r, deadline, seen, threshold, kind, rank); }, nap_ns);
    return reached(v, threshold);
}

// The mask word of rank r as it is now: the host writes it between launches,
// any block of this rank may set it while the kernel runs (mask_source), so
// every read goes to memory.
__device__ __forceinline__ bool is_masked(const EpParams &p, uint32_t r) {
    return *static_cast<const volatile int32_t *>(&p.mask[r]) != 0;
}

// Masks rank src after a wait on it passed the fault timeout: the first
// block to mask it records it (and the first masking of the launch, with
// when its wait began, for the host's agreement to tell a dead rank from one
// that was itself waiting on a dead rank).
__device__ void mask_source(const EpParams &p, uint32_t src, uint32_t kind, uint64_t began, uint64_t now) {
    if (atomicExch(&p.mask[src], 1) != 0) return;
    EpReport *r = p.report;
    atomicOr(reinterpret_cast<unsigned long long *>(&r->masked_bits), 1ull << src);
    if (atomicCAS(reinterpret_cast<unsigned long long *>(&r->first_mask_ns), 0ull, now) == 0) {
        r->first_wait_ns = began;
        r->mask_kind = kind;
        r->mask_rank = src;
    }
}

// When a wait began, and when it gives up: fatally (timeout_ns) or by
// masking its source (fault_timeout_ns, never when 0). Each wait counts from
// its own start, not the kernel's: a rank whose peer was itself held up by
// a dead rank's fault timeout started waiting later, so the delay does not
// cascade into masking the live peer.
struct Wait {
    uint64_t began, deadline, fault_deadline;
};

__device__ __forceinline__ Wait wait_begin(const EpParams &p) {
    const uint64_t now = globaltimer_ns();
    return {now, now + p.timeout_ns, p.fault_timeout_ns != 0 ? now + p.fault_timeout_ns : UINT64_MAX};
}

// What a wait on another rank found.
constexpr int PEER_HERE = 1;    // the word reached its threshold
constexpr int PEER_MASKED = 0;  // the source is masked (before, during, or by this wait): it sent nothing
constexpr int PEER_FAILED = -1; // a fatal give-up: timeout_ns, the host's cancel, or another block gave up

// ep_wait for a word another rank writes (one thread). A masked source is
// not waited for; one that another block masks meanwhile ends the wait; past
// w.fault_deadline this wait masks it. Our own rank's words are waits on our
// own blocks: fatal, never masked.
__device__ int ep_wait_peer(const EpParams &p, const uint64_t *word, uint64_t threshold, const Wait &w,
                            uint32_t kind, uint32_t src, uint32_t nap_ns = 0) {
    if (src == p.rank)
        return ep_wait(word, threshold, w.deadline, p.report, kind, src, nap_ns) ? PEER_HERE : PEER_FAILED;
    if (is_masked(p, src)) return PEER_MASKED;
    int found = PEER_HERE;
    spin_wait(
        word, threshold,
        [&](uint64_t seen) {
            if (is_masked(p, src)) return found = PEER_MASKED, true;
            const uint64_t now = globaltimer_ns();
            if (now > w.fault_deadline) {
                mask_source(p, src, kind, w.began, now);
                return found = PEER_MASKED, true;
            }
            if (ep_stop(p.report, w.deadline, seen, threshold, kind, src)) return found = PEER_FAILED, true;
            return false;
        },
        nap_ns);
    return found;
}

// The global step number (EpParams::step): constant while a kernel runs
// (only ep_advance, queued after the step, changes it), so a cached load.
__device__ __forceinline__ uint32_t step_of(const EpParams &p) { return __ldg(p.step); }

// ---------------------------------------------------------- per-block setup

// Where each rank's window is, as this block reaches it: our own window for
// ourselves; on the store path the mapped peer window (nixlGetPtr); on the put
// path nothing (peers are addressed through the remote view). `masked`: the
// block's copy of the mask, read once here and refreshed by the phase's
// barrier (which waits on, or skips, every rank), so copies test shared
// memory, not a global word per chunk. A rank masked later in the kernel
// still gets this block's copies (its window stays mapped until the host
// drops it between steps), but no signal: signals re-read the mask.
struct Block {
    uint8_t *peer[EP_MAX_RANKS];
    uint32_t sent[EP_MAX_RANKS];  // tokens this block sent to each rank
    uint32_t base[EP_MAX_RANKS + 1];
    uint8_t masked[EP_MAX_RANKS];
    uint64_t kept;                // reduce_all: bit r = rank r's contributions are added
    int ok;
};

__device__ void block_setup(const EpParams &p, Block &b) {
    for (uint32_t d = threadIdx.x; d < p.ranks; d += blockDim.x) {
        b.sent[d] = 0;
        b.masked[d] = is_masked(p, d);
        uint8_t *ptr = nullptr;
        if (d == p.rank) {
            ptr = p.window;
        } else if (p.path == EP_PATH_STORE && !b.masked[d]) {
            // A masked rank's view entry may be gone (a departed rank's is
            // dropped between phases): not looked up, never written.
            ptr = static_cast<uint8_t *>(nixlGetPtr(p.remote_mvh, d));
            if (ptr == nullptr) atomicCAS(&p.report->null_ptr_rank, 0u, d + 1);
        }
        b.peer[d] = ptr;
    }
    __syncthreads();
}

// Adds `value` to the u64 at `offset` in rank `dest`'s window: the signal
// that follows the data. Stores through a mapped pointer: one release
// reduction (our own window is observed on this GPU only, so GPU scope).
// The put path: a release fence, then nixlAtomicAdd on the block's own
// channel (RDMA transports keep a channel's operations in order, so the
// count cannot overtake the data).
__device__ void signal_add(const EpParams &p, const Block &b, uint32_t dest, uint64_t offset, uint64_t value) {
    if (is_masked(p, dest)) return;  // nothing touches a masked rank's window
    if (dest == p.rank || p.path == EP_PATH_STORE) {
        if (b.peer[dest] != nullptr) release_add(word_at(b.peer[dest], offset), value, p.gpu_scope | (dest == p.rank));
        return;
    }
    fence_release(p.gpu_scope);
    const nixlMemViewElem counter{p.remote_mvh, dest, offset};
    record_status(&p.report->base, nixlAtomicAdd<nixl_gpu_level_t::THREAD>(value, counter, blockIdx.x));
}

// Sets rank `dest`'s barrier word for us to `value`: a bare flag (one writer
// per word, so a store, and it guards no data: the reads it protects ended
// with our previous kernels, in stream order). The put path adds through
// NIXL, where nothing may be mapped.
__device__ void barrier_arrive(const EpParams &p, const Block &b, uint32_t dest, uint64_t value) {
    const uint64_t offset = p.off_barrier + 8ull * p.rank;
    if (is_masked(p, dest)) return;
    if (dest == p.rank || p.path == EP_PATH_STORE) {
        if (b.peer[dest] != nullptr) store_relaxed_system(word_at(b.peer[dest], offset), value);
        return;
    }
    const nixlMemViewElem word{p.remote_mvh, dest, offset};
    record_status(&p.report->base, nixlAtomicAdd<nixl_gpu_level_t::THREAD>(1, word, blockIdx.x));
}

// ----------------------------------------------------------------- copying

__device__ __forceinline__ int4 load_nc(const int4 *p) {
    int4 v;
    asm volatile("ld.global.nc.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ int4 load_cg(const int4 *p) {
    int4 v;
    asm volatile("ld.global.cg.v4.s32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
    return v;
}

// One warp copies n16 16-byte vectors, and m16 (at most 32) more from a
// second place: a token's metadata record beside its first chunk, loaded
// with the chunk instead of after it. Eight loads in flight per lane
// before their stores, so a low-latency chunk (up to 4 KiB) costs one
// memory latency, and a lane keeps the link busy while it waits.
__device__ void warp_copy(uint8_t *dst, const uint8_t *src, uint32_t n16, uint8_t *mdst = nullptr,
                          const uint8_t *msrc = nullptr, uint32_t m16 = 0) {
    const uint32_t lane = threadIdx.x % 32;
    const int4 *s = reinterpret_cast<const int4 *>(src);
    int4 *d = reinterpret_cast<int4 *>(dst);
    int4 m;
    if (lane < m16) m = load_nc(reinterpret_cast<const int4 *>(msrc) + lane);
    constexpr uint32_t U = 8;
    for (uint32_t i = lane; i < n16; i += 32 * U) {
        int4 v[U];
#pragma unroll
        for (uint32_t u = 0; u < U; ++u)
            if (i + 32 * u < n16) v[u] = load_nc(s + i + 32 * u);
#pragma unroll
        for (uint32_t u = 0; u < U; ++u)
            if (i + 32 * u < n16) d[i + 32 * u] = v[u];
    }
    if (lane < m16) reinterpret_cast<int4 *>(mdst)[lane] = m;
}

// One warp copies `len` bytes (a multiple of 16) from our window at src_off
// to rank `dest`'s window at dst_off, by the run's data path, and `mlen`
// more (at most 512) from msrc_off to mdst_off. Every lane calls.
__device__ void copy_to(const EpParams &p, const Block &b, uint32_t dest, uint64_t src_off, uint64_t dst_off,
                        uint32_t len, uint64_t msrc_off = 0, uint64_t mdst_off = 0, uint32_t mlen = 0) {
    if (b.masked[dest]) return;
    if (dest == p.rank || p.path == EP_PATH_STORE) {
        // Our own share (cuda_ipc refuses a peer in its own process, so the
        // remote view has no usable entry for ourselves), or a mapped peer.
        uint8_t *peer = b.peer[dest];
        if (peer != nullptr)
            warp_copy(peer + dst_off, p.window + src_off, len / 16, peer + mdst_off, p.window + msrc_off, mlen / 16);
        return;
    }
    const nixlMemViewElem src{p.local_mvh, 0, src_off};
    const nixlMemViewElem dst{p.remote_mvh, dest, dst_off};
    record_status(&p.report->base, nixlPut<nixl_gpu_level_t::WARP>(src, dst, len, blockIdx.x));
    if (mlen == 0) return;
    const nixlMemViewElem msrc{p.local_mvh, 0, msrc_off};
    const nixlMemViewElem mdst{p.remote_mvh, dest, mdst_off};
    record_status(&p.report->base, nixlPut<nixl_gpu_level_t::WARP>(msrc, mdst, mlen, blockIdx.x));
}

// ----------------------------------------------------- phase start and end

__device__ __forceinline__ bool leader() { return blockIdx.x == 0 && threadIdx.x == 0; }

// The barrier of phase `phase` (0 dispatch, 1 combine) of this step:
// block 0 tells every unmasked rank it arrived; every block waits for all
// unmasked ranks' arrivals itself (a relay through block 0 cost one more
// hop), and a rank silent past the fault timeout is masked. Nobody writes
// into a peer's buffers before the peer has finished reading the last
// step's (it arrives only after its previous kernels, in stream order).
// The block's mask copy is refreshed from what the waits found. Block 0
// starts the clock when it sees the last arrival.
__device__ bool phase_start(const EpParams &p, Block &b, uint32_t phase) {
    const uint32_t step = step_of(p);
    const uint64_t target = 2ull * step + phase + 1;
    if (threadIdx.x == 0) {
        bool ok = true;
        if (blockIdx.x == 0)
            for (uint32_t d = 0; d < p.ranks; ++d) barrier_arrive(p, b, d, target);
        const Wait w = wait_begin(p);
        for (uint32_t s = 0; s < p.ranks && ok; ++s) {
            const int got = ep_wait_peer(p, word_at(p.window, p.off_barrier + 8ull * s), target, w, EP_WAIT_BARRIER, s);
            ok = got != PEER_FAILED;
            b.masked[s] = got == PEER_MASKED;
        }
        // Our stores into peers' buffers must not be performed before the
        // arrivals were seen (the peers' reads of them have ended).
        if (ok) fence_acquire(p.gpu_scope);
        if (ok && blockIdx.x == 0 && step < p.timing_slots) {
            EpTiming &t = p.timing[2 * step + phase];
            t.gt_start = globaltimer_ns();
            t.clock_start = clock64();
        }
        b.ok = ok;
    }
    __syncthreads();
    return b.ok;
}

// After this block's copies: count them into every rank's counter for us,
// (1 << 32) | tokens. __syncthreads orders every warp's stores before the
// signalling threads' releases, which are cumulative, so the data is
// visible to the peer before its counter moves.
// A destination masked since the block's copies is skipped (signal_add
// reads the mask again).
__device__ void signal_sent(const EpParams &p, const Block &b, uint64_t counter_offset) {
    __syncthreads();
    const uint32_t d = threadIdx.x;
    if (d < p.ranks) signal_add(p, b, d, counter_offset + 8ull * p.rank, (1ull << 32) | b.sent[d]);
}

// Block 0, one thread: waits until every unmasked source's dispatch counter
// shows all its blocks, then reads how many tokens came (low half minus last
// time's). A masked source sent nothing: count 0, its counter and prev_low
// left alone (Rig::reset_source sets both before it is unmasked again).
__device__ bool gather_counts(const EpParams &p) {
    const Wait w = wait_begin(p);
    const uint64_t target = (uint64_t(step_of(p)) + 1) * gridDim.x << 32;
    uint64_t here = 0;
    for (uint32_t s = 0; s < p.ranks; ++s) {
        const uint64_t *counter = word_at(p.window, p.off_dispatch_count + 8ull * s);
        const int got = ep_wait_peer(p, counter, target, w, EP_WAIT_DISPATCH, s);
        if (got == PEER_FAILED) return false;
        if (got == PEER_HERE) here |= 1ull << s;
    }
    fence_acquire(p.gpu_scope);
    for (uint32_t s = 0; s < p.ranks; ++s) {
        if (!(here >> s & 1)) {
            p.recv_count[s] = 0;
            continue;
        }
        const uint64_t v = load_relaxed_system(word_at(p.window, p.off_dispatch_count + 8ull * s));
        p.recv_count[s] = uint32_t(v) - uint32_t(p.prev_low[s]);
        p.prev_low[s] = uint32_t(v);
    }
    return true;
}

__device__ void stamp_end(const EpParams &p, uint32_t phase) {
    const uint32_t step = step_of(p);
    if (step >= p.timing_slots) return;
    EpTiming &t = p.timing[2 * step + phase];
    t.clock_end = clock64();
    t.gt_end = globaltimer_ns();
}

// ---------------------------------------------------------------- dispatch

// Every (token, destination) copy, cut into `chunks` chunks, one warp per
// chunk; the warp holding chunk 0 also copies the metadata record (with
// its chunk) and counts the token.
__device__ void send_tokens(const EpParams &p, Block &b) {
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const uint32_t warps = gridDim.x * blockDim.x / 32;
    const uint64_t row = 2ull * p.hidden;
    const uint64_t units = uint64_t(p.n_entries) * p.chunks;
    for (uint64_t u = warp; u < units; u += warps) {
        const EpSendEntry e = p.entries[u / p.chunks];
        const uint64_t at = (u % p.chunks) * p.chunk_bytes;
        const uint32_t len = uint32_t(min(uint64_t(p.chunk_bytes), row - at));
        const uint64_t dst_row = uint64_t(p.rank) * p.tokens + e.slot;
        const uint32_t mlen = at == 0 ? p.meta_bytes : 0;
        copy_to(p, b, e.dest, p.off_x + e.token * row + at, p.off_recv_x + dst_row * row + at, len,
                p.off_meta + uint64_t(e.token) * p.meta_bytes, p.off_recv_meta + dst_row * p.meta_bytes, mlen);
        if (at == 0 && lane == 0) atomicAdd(&b.sent[e.dest], 1u);
    }
}

// Dispatch: barrier, send, signal; block 0 then waits until every source's
// tokens are here. The phase's time ends there.
extern "C" __global__ void __launch_bounds__(EP_THREADS) ep_dispatch(EpParams p) {
    __shared__ Block b;
    if (given_up(p.report)) return;
    block_setup(p, b);
    if (!phase_start(p, b, 0)) return;
    send_tokens(p, b);
    signal_sent(p, b, p.off_dispatch_count);
    if (leader() && gather_counts(p)) stamp_end(p, 0);
}

// ----------------------------------------------------------------- combine
//
// Combine returns every received token's expert output to its origin, which
// adds up the contributions of all ranks. Two shapes:
//
// Many tokens (combine_batches > 1, the high-throughput shape): an expert
// rank sends its contributions in batches of combine_batch slots, dealt
// over the blocks with the origins interleaved (batch k of the deal goes to
// origin k mod ranks), so every origin's data arrives from the start. In
// each block warps 1 .. combine_senders send the block's batches and warp 0
// flags each one (the senders sync with it, then one release add on the
// origin's flag for this rank and batch, which waits while they go on); the
// block's other warps add up pieces of tokens from the start, each as soon
// as the batches holding its token's slots are flagged, and warp 0 and the
// senders join them once the block's batches are out. Reduction and
// transfer overlap inside every block: no SM stops sending (giving half the
// grid to the reduction left too few senders to keep NVLink busy), and a
// contribution is read back while it is still in L2. docs/EP.md §11a has
// the measurements behind the batch size, the senders and the pieces.
//
// Few tokens (one batch per expert rank, the low-latency shape): every
// block copies a share of every origin's slots, as dispatch does, then adds
// 1 to each origin's flag; every block waits once for all flags, then the
// grid's warps each reduce a slice of a token.

__device__ __forceinline__ uint64_t flag_offset(const EpParams &p, uint32_t expert_rank, uint32_t batch) {
    return p.off_combine_flags + 8ull * (uint64_t(expert_rank) * p.combine_batches + batch);
}

// The value a combine flag reaches once its batch is complete this
// step: one add per batch, or (one batch) one add per block.
__device__ __forceinline__ uint64_t flag_target(const EpParams &p) {
    const uint64_t adds = p.combine_batches == 1 ? gridDim.x : 1;
    return (uint64_t(step_of(p)) + 1) * adds;
}

// One warp copies chunk `chunk` of slot j of origin s from our y to s's
// combine_recv[rank][j].
__device__ __forceinline__ void send_slot(const EpParams &p, const Block &b, uint32_t s, uint32_t j, uint32_t chunk) {
    const uint64_t row = 2ull * p.hidden;
    const uint64_t at = uint64_t(chunk) * p.chunk_bytes;
    const uint32_t len = uint32_t(min(uint64_t(p.chunk_bytes), row - at));
    const uint64_t src = p.off_y + (uint64_t(s) * p.tokens + j) * row + at;
    const uint64_t dst = p.off_combine_recv + (uint64_t(p.rank) * p.tokens + j) * row + at;
    copy_to(p, b, s, src, dst, len);
}

// Named barrier 1 among the block's first `warps` warps (warp 0 and the
// senders): the reducing warps never wait on the senders' syncs.
__device__ __forceinline__ void sync_senders(uint32_t warps) {
    asm volatile("bar.sync 1, %0;" ::"r"(warps * 32) : "memory");
}

// Batches of slots owed to each origin: b.base[s], and the most owed to
// one peer in b.base[ranks].
__device__ void count_batches(const EpParams &p, Block &b) {
    if (threadIdx.x == 0) {
        uint32_t most = 0;
        for (uint32_t s = 0; s < p.ranks; ++s) {
            // Nothing for a masked origin (its count is 0 if it was masked in dispatch).
            b.base[s] = b.masked[s] ? 0 : (min(p.recv_count[s], p.tokens) + p.combine_batch - 1) / p.combine_batch;
            if (s != p.rank) most = max(most, b.base[s]);
        }
        b.base[p.ranks] = most;
    }
    __syncthreads();
}

// The sender warps of a block (warps 1 .. senders): this block's batches
// for the peers, origins interleaved; warp 0 flags each once its data is
// out. The senders sync with warp 0 and go on to the next batch while its
// release waits for this one's stores to land: when a sending warp raised
// the flag, the others waited for its release at the next sync (two
// H200s, EP2: put path 186 -> 182 µs, store 178 -> 177). Our own share is
// not sent: the reducers read it from y (reduce_token).
__device__ void send_batches(const EpParams &p, const Block &b, uint32_t senders) {
    const uint32_t warp = threadIdx.x / 32;
    const uint32_t peers = p.ranks - 1;
    const uint32_t deal = b.base[p.ranks] * peers;
    for (uint32_t k = blockIdx.x; k < deal; k += gridDim.x) {
        const uint32_t q = k % peers, g = k / peers;
        const uint32_t s = q < p.rank ? q : q + 1;
        if (g >= b.base[s]) continue;
        const uint32_t j0 = g * p.combine_batch;
        const uint32_t j1 = min(j0 + p.combine_batch, min(p.recv_count[s], p.tokens));
        if (warp != 0)
            for (uint32_t u = warp - 1; u < (j1 - j0) * p.chunks; u += senders)
                send_slot(p, b, s, j0 + u / p.chunks, u % p.chunks);
        // As signal_sent: the senders' stores, then a cumulative release.
        sync_senders(senders + 1);
        if (threadIdx.x == 0) signal_add(p, b, s, flag_offset(p, p.rank, g), 1);
    }
}

// Few tokens (one batch per expert rank): every block copies a share of
// every peer's slots (our own share the reducers read from y), chunks
// dealt over all the grid's warps as dispatch deals them, then signals each
// peer once (+1 on its flag for us). A release
// per block and rank instead of one per slot, and every SM busy: with one
// slot per batch, 128 tokens kept a few blocks fencing one after another
// (34-40 µs on one H100 under MPS, against 10-12 µs for the dispatch of the
// same bytes). The origin waits for gridDim.x adds from every rank.
__device__ void send_outputs_all(const EpParams &p, Block &b) {
    if (threadIdx.x == 0) {
        b.base[0] = 0;
        for (uint32_t s = 0; s < p.ranks; ++s)
            b.base[s + 1] = b.base[s] + (s == p.rank || b.masked[s] ? 0 : min(p.recv_count[s], p.tokens));
    }
    __syncthreads();
    const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const uint32_t warps = gridDim.x * blockDim.x / 32;
    const uint64_t units = uint64_t(b.base[p.ranks]) * p.chunks;
    for (uint64_t u = warp; u < units; u += warps) {
        const uint32_t k = uint32_t(u / p.chunks);
        uint32_t s = 0;
        while (k >= b.base[s + 1]) ++s;
        send_slot(p, b, s, k - b.base[s], uint32_t(u % p.chunks));
    }
    // As signal_sent: every warp's stores, then a cumulative release.
    __syncthreads();
    if (threadIdx.x < p.ranks && threadIdx.x != p.rank) signal_add(p, b, threadIdx.x, flag_offset(p, p.rank, 0), 1);
}

// The flag of the batch that holds rank r's contribution to our token t.
__device__ __forceinline__ const uint64_t *token_flag(const EpParams &p, uint32_t r, uint32_t t) {
    return word_at(p.window, flag_offset(p, r, uint32_t(p.send_slot[r * p.tokens + t]) / p.combine_batch));
}

// One lane waits until the batches holding token t's contributions are
// flagged (every unmasked rank with one of its experts); the warp then reads
// them. The lane naps between polls: its block's sender warps share the SM.
// Returns the ranks whose contributions to add (bit r; our own always), or
// 0 after a fatal give-up. A rank masked after this wait can still be in it
// (its batch came in time for this token but not for a later one): such a
// step does not match the mask after it, and the host counts it lost.
__device__ uint64_t wait_token(const EpParams &p, uint32_t t) {
    unsigned long long kept = 1ull << p.rank;
    if (threadIdx.x % 32 == 0) {
        const Wait w = wait_begin(p);
        for (uint32_t r = 0; r < p.ranks && kept != 0; ++r) {
            if (p.send_slot[r * p.tokens + t] < 0 || r == p.rank) continue;
            const uint64_t *flag = token_flag(p, r, t);
            const int got = ep_wait_peer(p, flag, flag_target(p), w, EP_WAIT_COMBINE, r, 64);
            if (got == PEER_FAILED) kept = 0;
            if (got != PEER_HERE) continue;
            // An acquire re-read of the flag, not a fence: that also waits
            // for the warp's own stores of its last piece, once per claim,
            // and with it smaller claims slowed the combine (7 pieces a
            // token: 225 µs against 186 whole, two H200s).
            load_acquire(flag, p.gpu_scope);
            kept |= 1ull << r;
        }
        // A rank another warp masked while this one waited on the others is
        // left out too: fewer tokens disagree with the mask after the step.
        for (uint32_t r = 0; r < p.ranks && kept != 0; ++r)
            if (r != p.rank && (kept >> r & 1) && is_masked(p, r)) kept &= ~(1ull << r);
    }
    // __syncwarp orders lane 0's acquire before every lane's loads (a
    // shuffle alone is not documented to order memory).
    __syncwarp();
    return __shfl_sync(0xffffffff, kept, 0);
}

// Where rank r's contribution to our slot `slot` lies: a peer's in
// combine_recv[r][slot]; ours stays where our experts wrote it, y[rank][slot]
// (our share never travels: no copy, no flag to wait for, and combine_recv's
// own row stays unused).
__device__ __forceinline__ const uint8_t *contribution(const EpParams &p, uint32_t r, uint32_t slot) {
    const uint64_t off = r == p.rank ? p.off_y : p.off_combine_recv;
    return p.window + off + (uint64_t(r) * p.tokens + slot) * 2ull * p.hidden;
}

// The next contribution to token t from a kept rank r on (r advances past
// it), or null when no rank is left.
__device__ __forceinline__ const int4 *next_contribution(const EpParams &p, uint32_t t, uint32_t &r, uint64_t kept) {
    for (; r < p.ranks; ++r) {
        const int32_t slot = p.send_slot[r * p.tokens + t];
        if (slot < 0 || !(kept >> r & 1)) continue;
        return reinterpret_cast<const int4 *>(contribution(p, r++, uint32_t(slot)));
    }
    return nullptr;
}

__device__ __forceinline__ void add_vec(float *acc, const int4 &v) {
    const __nv_bfloat16 *h = reinterpret_cast<const __nv_bfloat16 *>(&v);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] += __bfloat162float(h[k]);
}

// out[t] = sum over kept ranks r (in rank order; bit r of `kept`) of r's
// contribution (our own from y, a peer's from combine_recv), added in f32,
// stored as bf16 (none kept: 0); here
// 16-byte vectors v0..v1 of it. A lane
// keeps R = 4 vectors of two contributions in flight (8 loads) before it
// adds them: with one load at a time a warp waits a full memory latency per
// vector, and the reduction, not the transfer, set the low-latency
// combine's time (31-34 µs on two H200s against 11 µs for the dispatch of
// the same bytes).
constexpr uint32_t R = 4;

__device__ void reduce_token(const EpParams &p, uint32_t t, uint32_t v0, uint32_t v1, uint64_t kept) {
    const uint32_t lane = threadIdx.x % 32;
    for (uint32_t i0 = v0 + lane; i0 < v1; i0 += 32 * R) {
        float acc[R][8] = {};
        uint32_t r = 0;
        for (;;) {
            const int4 *a = next_contribution(p, t, r, kept);
            if (a == nullptr) break;
            const int4 *c = next_contribution(p, t, r, kept);
            int4 va[R], vc[R];
#pragma unroll
            for (uint32_t u = 0; u < R; ++u) {
                if (i0 + 32 * u >= v1) continue;
                va[u] = load_cg(a + i0 + 32 * u);
                if (c != nullptr) vc[u] = load_cg(c + i0 + 32 * u);
            }
#pragma unroll
            for (uint32_t u = 0; u < R; ++u) {
                if (i0 + 32 * u >= v1) continue;
                add_vec(acc[u], va[u]);
                if (c != nullptr) add_vec(acc[u], vc[u]);
            }
            if (c == nullptr) break;
        }
#pragma unroll
        for (uint32_t u = 0; u < R; ++u) {
            if (i0 + 32 * u >= v1) continue;
            int4 o;
            __nv_bfloat16 *oh = reinterpret_cast<__nv_bfloat16 *>(&o);
#pragma unroll
            for (int k = 0; k < 8; ++k) oh[k] = __float2bfloat16_rn(acc[u][k]);
            reinterpret_cast<int4 *>(p.out + uint64_t(t) * p.hidden)[i0 + 32 * u] = o;
        }
    }
}

// Claims the calling warp's next piece of this step's reduction: claim c
// is part c % combine_pieces of token c / combine_pieces. Tokens are cut
// into pieces (src/ep/config.rs Shape::combine_pieces) so that the last
// tokens to arrive are added by more than one warp each. The claims count
// up from step × (tokens × pieces + the grid's warps): every warp of the
// grid makes exactly one claim past the last piece (the one that ends its
// loop), so each step advances the counter by that much (with or without
// masked ranks; Rig::reset_local sets it for a new process).
__device__ __forceinline__ uint32_t claim_piece(const EpParams &p) {
    unsigned long long c = 0;
    if (threadIdx.x % 32 == 0) c = atomicAdd(reinterpret_cast<unsigned long long *>(&p.grid_flags[3]), 1ull);
    const uint64_t claim = __shfl_sync(0xffffffff, c, 0);
    const uint64_t per_step = uint64_t(p.tokens) * p.combine_pieces + gridDim.x * (blockDim.x / 32);
    const uint64_t first = uint64_t(step_of(p)) * per_step;
    if (claim < first || claim - first >= UINT32_MAX) return UINT32_MAX;
    return uint32_t(claim - first);
}

// Many tokens: the warp adds up pieces of tokens, claimed lowest first,
// each once its token's batches are flagged (or their ranks masked).
__device__ bool reduce_claimed(const EpParams &p) {
    const uint32_t n16 = p.hidden / 8;
    const uint32_t per = (n16 + p.combine_pieces - 1) / p.combine_pieces;
    for (;;) {
        const uint32_t c = claim_piece(p);
        const uint32_t t = c == UINT32_MAX ? UINT32_MAX : c / p.combine_pieces;
        if (t >= p.tokens) return true;
        const uint64_t kept = wait_token(p, t);
        if (kept == 0) return false;
        const uint32_t v0 = (c % p.combine_pieces) * per;
        reduce_token(p, t, v0, min(n16, v0 + per), kept);
    }
}

// Few tokens: one thread per block waits for every unmasked rank's flag
// (masking a silent one), then the
// grid's warps take a slice of a token each (as many slices as leave every
// warp about one, at least a vector per lane), so all the grid reduces at
// once instead of one warp per token.
__device__ bool reduce_all(const EpParams &p, Block &b) {
    if (threadIdx.x == 0) {
        const Wait w = wait_begin(p);
        bool ok = true;
        uint64_t kept = 1ull << p.rank;
        for (uint32_t r = 0; r < p.ranks && ok; ++r) {
            if (r == p.rank) continue;
            const int got = ep_wait_peer(p, word_at(p.window, flag_offset(p, r, 0)), flag_target(p), w,
                                         EP_WAIT_COMBINE, r);
            ok = got != PEER_FAILED;
            if (got == PEER_HERE) kept |= 1ull << r;
        }
        if (ok) fence_acquire(p.gpu_scope);
        b.ok = ok;
        b.kept = kept;
    }
    __syncthreads();
    if (!b.ok) return false;
    const uint32_t warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const uint32_t warps = gridDim.x * blockDim.x / 32;
    const uint32_t n16 = p.hidden / 8;
    const uint32_t slices = max(1u, min(warps / max(p.tokens, 1u), n16 / 32));
    const uint32_t per = (n16 + slices - 1) / slices;
    for (uint32_t u = warp; u < p.tokens * slices; u += warps) {
        const uint32_t v0 = (u % slices) * per;
        reduce_token(p, u / slices, v0, min(n16, v0 + per), b.kept);
    }
    return true;
}

// Combine: barrier, send the outputs back, add up our tokens as their
// contributions arrive; the phase ends when the last block finished its
// share of the reduction (block 0 counts them in).
extern "C" __global__ void __launch_bounds__(EP_THREADS) ep_combine(EpParams p) {
    __shared__ Block b;
    if (given_up(p.report)) return;
    block_setup(p, b);
    if (!phase_start(p, b, 1)) return;
    bool reduced;
    if (p.combine_batches == 1) {
        send_outputs_all(p, b);
        reduced = reduce_all(p, b);
    } else {
        count_batches(p, b);
        const uint32_t senders = max(1u, min(p.combine_senders, blockDim.x / 32 - 1));
        if (threadIdx.x / 32 <= senders) send_batches(p, b, senders);
        reduced = reduce_claimed(p);
    }
    if (!__syncthreads_and(reduced) || threadIdx.x != 0) return;
    cuda::atomic_ref<uint64_t, cuda::thread_scope_device> done(p.grid_flags[2]);
    done.fetch_add(1, cuda::memory_order_release);
    if (blockIdx.x != 0) return;
    const uint64_t deadline = globaltimer_ns() + p.timeout_ns;
    if (ep_wait(&p.grid_flags[2], (uint64_t(step_of(p)) + 1) * gridDim.x, deadline, p.report, EP_WAIT_BLOCKS,
                p.rank))
        stamp_end(p, 1);
}

// ------------------------------------------------- untimed: data and experts

__device__ __forceinline__ uint32_t global_thread() { return blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ uint32_t global_threads() { return gridDim.x * blockDim.x; }

// This step's activations: x[t][h] = ep_x_bits(key(seed, rank, step, t), h),
// eight elements (one vector) per thread and step.
extern "C" __global__ void __launch_bounds__(EP_THREADS) ep_fill(EpParams p) {
    const uint32_t n16 = p.hidden / 8;
    const uint64_t total = uint64_t(p.tokens) * n16;
    uint16_t *x = reinterpret_cast<uint16_t *>(p.window + p.off_x);
    for (uint64_t v = global_thread(); v < total; v += global_threads()) {
        const uint32_t t = uint32_t(v / n16);
        const uint32_t h0 = uint32_t(v % n16) * 8;
        const uint64_t key = ep_token_key(p.seed, p.rank, step_of(p), t);
        int4 o;
        uint16_t *oh = reinterpret_cast<uint16_t *>(&o);
#pragma unroll
        for (int k = 0; k < 8; ++k) oh[k] = ep_x_bits(key, h0 + k);
        reinterpret_cast<int4 *>(x + uint64_t(t) * p.hidden)[h0 / 8] = o;
    }
}

// A token's routing, staged in shared memory for the warp working on it.
struct TokenRoute {
    uint32_t expert[EP_MAX_TOPK];
    float weight[EP_MAX_TOPK];
};

__device__ __forceinline__ const uint8_t *recv_meta(const EpParams &p, uint32_t s, uint32_t j) {
    return p.window + p.off_recv_meta + (uint64_t(s) * p.tokens + j) * p.meta_bytes;
}

// Gate-weighted output of the experts on rank `on` for one element, and the
// sum of the terms' magnitudes (src/ep/reference.rs weighted, same order).
__device__ __forceinline__ float weighted(const EpParams &p, const TokenRoute &r, float x, uint32_t on,
                                          bool all, float &abs_sum) {
    float acc = 0.0f;
    abs_sum = 0.0f;
    for (uint32_t k = 0; k < p.topk; ++k) {
        const uint32_t e = r.expert[k];
        if (!all && e / p.local_experts != on) continue;
        const float t = fmaf(ep_expert_scale(e), x, ep_expert_bias(e));
        acc = fmaf(r.weight[k], t, acc);
        abs_sum += fabsf(r.weight[k] * t);
    }
    return acc;
}

// Maps the n-th received token (over all sources, in source order) to its
// (source, slot). counts: tokens received per source.
// A count is never trusted past the slots that exist (a wrong one is
// reported by ep_verify_dispatch, not turned into an out-of-bounds access).
__device__ __forceinline__ bool nth_received(const EpParams &p, const uint32_t *counts, uint32_t n, uint32_t &s,
                                             uint32_t &j) {
    for (s = 0; s < p.ranks; ++s) {
        const uint32_t c = min(counts[s], p.tokens);
        if (n < c) {
            j = n;
            return true;
        }
        n -= c;
    }
    return false;
}

// The stand-in experts: for every received token, y = sum over this rank's
// experts k of the token of w_k * (a_e * x + b_e), in f32, stored bf16 at
// the token's (source, slot). Routing comes from the received metadata.
extern "C" __global__ void __launch_bounds__(EP_THREADS) ep_expert(EpParams p) {
    __shared__ TokenRoute routes[EP_THREADS / 32];
    if (given_up(p.report)) return;
    const uint32_t lane = threadIdx.x % 32;
    TokenRoute &r = routes[threadIdx.x / 32];
    const uint64_t row = 2ull * p.hidden;
    for (uint32_t n = global_thread() / 32;; n += global_threads() / 32) {
        uint32_t s, j;
        if (!nth_received(p, p.recv_count, n, s, j)) break;
        const uint8_t *meta = recv_meta(p, s, j);
        if (lane < p.topk) {
            r.expert[lane] = reinterpret_cast<const uint32_t *>(meta + 16)[lane];
            r.weight[lane] = reinterpret_cast<const float *>(meta + 16 + 4 * p.topk)[lane];
        }
        __syncwarp();
        const int4 *x = reinterpret_cast<const int4 *>(p.window + p.off_recv_x + (uint64_t(s) * p.tokens + j) * row);
        int4 *y = reinterpret_cast<int4 *>(p.window + p.off_y + (uint64_t(s) * p.tokens + j) * row);
        for (uint32_t i = lane; i < p.hidden / 8; i += 32) {
            const int4 v = x[i];
            const __nv_bfloat16 *xh = reinterpret_cast<const __nv_bfloat16 *>(&v);
            int4 o;
            __nv_bfloat16 *oh = reinterpret_cast<__nv_bfloat16 *>(&o);
            float unused;
#pragma unroll
            for (int k = 0; k < 8; ++k)
                oh[k] = __float2bfloat16_rn(weighted(p, r, __bfloat162float(xh[k]), p.rank, false, unused));
            y[i] = o;
        }
        __syncwarp();
    }
}

// -------------------------------------------------------- untimed: checks

// Keeps the first mismatch (the thread that counts it first writes it).
__device__ void mismatch(const EpParams &p, uint32_t kind, uint32_t src, uint32_t token, uint32_t slot, uint32_t h,
                         uint32_t expert, uint32_t got_bits, uint32_t want_bits, float got, float ref, float bound) {
    EpVerify *v = p.verify;
    if (atomicAdd(&v->mismatches, 1u) != 0) return;
    v->kind = kind;
    v->src_rank = src;
    v->token = token;
    v->slot = slot;
    v->h = h;
    v->expert = expert;
    v->got_bits = got_bits;
    v->want_bits = want_bits;
    v->got = got;
    v->reference = ref;
    v->bound = bound;
}

// The first of a token's experts hosted by rank `on`, to name it.
__device__ uint32_t first_expert_on(const EpParams &p, const uint32_t *experts, uint32_t on) {
    for (uint32_t k = 0; k < p.topk; ++k)
        if (experts[k] / p.local_experts == on) return experts[k];
    return experts[0];
}

// One received token: its metadata record word for word, then every
// activation bit for bit against the regenerated data.
__device__ void verify_token(const EpParams &p, uint32_t s, uint32_t j) {
    const uint32_t lane = threadIdx.x % 32;
    const uint32_t t = p.expect_tokens[s * p.tokens + j];
    const uint32_t *want_e = p.all_experts + (uint64_t(s) * p.tokens + t) * p.topk;
    const float *want_w = p.all_weights + (uint64_t(s) * p.tokens + t) * p.topk;
    const uint32_t expert = first_expert_on(p, want_e, p.rank);
    const uint32_t *meta = reinterpret_cast<const uint32_t *>(recv_meta(p, s, j));
    for (uint32_t w = lane; w < 4 + 2 * p.topk; w += 32) {
        uint32_t want = w == 0 ? t : w == 1 ? s : w == 2 ? p.topk : 0;
        if (w >= 4 && w < 4 + p.topk) want = want_e[w - 4];
        if (w >= 4 + p.topk) want = __float_as_uint(want_w[w - 4 - p.topk]);
        if (meta[w] != want) mismatch(p, EP_BAD_META, s, t, j, w, expert, meta[w], want, 0, 0, 0);
    }
    const uint64_t key = ep_token_key(p.seed, s, step_of(p), t);
    const uint16_t *x = reinterpret_cast<const uint16_t *>(p.window + p.off_recv_x) + (uint64_t(s) * p.tokens + j) * p.hidden;
    for (uint32_t h = lane; h < p.hidden; h += 32) {
        const uint16_t want = ep_x_bits(key, h);
        if (x[h] != want) mismatch(p, EP_BAD_X, s, t, j, h, expert, x[h], want, 0, 0, 0);
    }
}

// After dispatch: tokens received per unmasked source, then each of their
// tokens. A masked source is not checked: its count is 0 and its rows are
// never read (the mask as it is after dispatch, in stream order).
extern "C" __global__ void __launch_bounds__(EP_THREADS) ep_verify_dispatch(EpParams p) {
    if (given_up(p.report)) return;
    if (global_thread() < p.ranks) {
        const uint32_t s = global_thread();
        if (p.mask[s] == 0 && p.recv_count[s] != p.expect_count[s])
            mismatch(p, EP_BAD_COUNT, s, 0, 0, 0, 0, p.recv_count[s], p.expect_count[s], 0, 0, 0);
    }
    for (uint32_t n = global_thread() / 32;; n += global_threads() / 32) {
        uint32_t s, j;
        if (!nth_received(p, p.expect_count, n, s, j)) break;
        if (p.mask[s] == 0 && j < p.recv_count[s]) verify_token(p, s, j);
    }
}

// One of our tokens after combine: each unmasked contributing rank's output
// within ep_partial_bound of its f32 reference, then the combined output
// within ep_combined_bound of the reference over the experts whose owner is
// unmasked (ep_masked_reference; the bound over the kept terms), with the
// mask as it is after the step (src/ep/reference.rs check_combined_masked).
__device__ void verify_combined_token(const EpParams &p, const TokenRoute &r, uint32_t t) {
    const uint32_t lane = threadIdx.x % 32;
    const uint64_t key = ep_token_key(p.seed, p.rank, step_of(p), t);
    for (uint32_t h = lane; h < p.hidden; h += 32) {
        const uint16_t xb = ep_x_bits(key, h);
        const float x = __uint_as_float(uint32_t(xb) << 16);
        for (uint32_t q = 0; q < p.ranks; ++q) {
            const int32_t slot = p.send_slot[q * p.tokens + t];
            if (slot < 0 || p.mask[q] != 0) continue;
            float abs_sum;
            const float ref = weighted(p, r, x, q, false, abs_sum);
            const uint16_t gb = reinterpret_cast<const uint16_t *>(contribution(p, q, uint32_t(slot)))[h];
            const float got = __uint_as_float(uint32_t(gb) << 16);
            const float bound = ep_partial_bound(abs_sum, p.topk);
            if (!(fabsf(got - ref) <= bound))
                mismatch(p, EP_BAD_CONTRIBUTION, q, t, slot, h, first_expert_on(p, r.expert, q), gb, 0, got, ref,
                         bound);
        }
        float abs_sum;
        const float ref = ep_masked_reference(x, r.expert, r.weight, p.topk, p.local_experts, p.mask, &abs_sum);
        const uint16_t ob = p.out[uint64_t(t) * p.hidden + h];
        const float got = __uint_as_float(uint32_t(ob) << 16);
        const float bound = ep_combined_bound(abs_sum, p.topk, p.ranks);
        if (!(fabsf(got - ref) <= bound))
            mismatch(p, EP_BAD_COMBINED, p.rank, t, 0, h, r.expert[0], ob, 0, got, ref, bound);
    }
}

// After combine: every token of this rank, one warp each.
extern "C" __global__ void __launch_bounds__(EP_THREADS) ep_verify_combine(EpParams p) {
    __shared__ TokenRoute routes[EP_THREADS / 32];
    if (given_up(p.report)) return;
    const uint32_t lane = threadIdx.x % 32;
    TokenRoute &r = routes[threadIdx.x / 32];
    for (uint32_t t = global_thread() / 32; t < p.tokens; t += global_threads() / 32) {
        const uint64_t at = (uint64_t(p.rank) * p.tokens + t) * p.topk;
        if (lane < p.topk) {
            r.expert[lane] = p.all_experts[at + lane];
            r.weight[lane] = p.all_weights[at + lane];
        }
        __syncwarp();
        verify_combined_token(p, r, t);
        __syncwarp();
    }
}

// The end of every step: the next step's number (EpParams::step). One
// thread; queued after the step's last kernel, so every kernel of a step
// reads the same number, and a captured graph of a step needs no new
// parameters to run the next one.
extern "C" __global__ void ep_advance(EpParams p) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *p.step += 1;
}
