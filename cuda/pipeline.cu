// A streaming pipeline the GPUs drive themselves: N ranks form a chain
// 0 -> 1 -> ... -> N-1. Stage 0's kernel produces M chunks, every middle
// stage's kernel receives a chunk, maps every 32-bit word x to 3x + its
// stage number (the maps do not commute: the result proves the order) and
// forwards it, the last stage's kernel verifies every word. No CPU
// in the loop: KERNEL_GUIDE.md ("A streaming pipeline") walks through it.
//
// Per link (stage s -> s+1), in the receiver's window: a ring of S slots
// and a ready word per (slot, channel); in the sender's window: a credit
// word per channel. Chunk g goes to slot g % S with sequence g + 1. The
// sender waits until credit >= g + 1 - S (the receiver has consumed chunk
// g - S, so the slot is free), writes the data, then raises the slot's
// ready word to g + 1 — after the data, so a ready word never runs ahead of
// its data. The receiver waits until ready == g + 1 (nothing is ever
// cleared: laps differ by their sequence), consumes the slot, checks the
// word still reads g + 1 (a later value means the slot was overwritten:
// counted), and raises its credit word in the sender's window to g + 1.
//
// A chunk is cut into one slice per channel; a channel is a thread group at
// the kernel's level (block, warp or thread), and each channel is a
// pipeline of its own with its own ready and credit words, like NCCL's
// channels. Three paths:
//   put:   the sender's slice goes to a staging slot of its own window,
//          nixlPut copies it into the receiver's slot, nixlAtomicAdd raises
//          the ready word; credits are nixlAtomicAdd too (any transport);
//   store: the sender stores straight into the receiver's slot through the
//          pointer nixlGetPtr gives, then a release store of the sequence
//          (NVLink / one GPU only);
//   ll:    16-byte lines {data, seq, data, seq} (cuda/kernels.cu's LL
//          lines) stored through the pointer: every line carries the chunk's
//          sequence, so there is no ready word; the receiver polls the lines.

#include "device_common.cuh"

enum : uint32_t { PIPE_PATH_PUT = 0, PIPE_PATH_STORE = 1, PIPE_PATH_LL = 2 };
// What a wait waited for (PipeReport::wait_on).
enum : uint32_t { PIPE_WAIT_READY = 1, PIPE_WAIT_CREDIT = 2 };

// Mirrored in src/pipeline/kernels.rs (PipeParams); offsets are bytes into
// the window, which every rank lays out alike (src/pipeline/ring.rs).
struct PipeParams {
    void *local_mvh;   // local view of the window (one element)
    void *remote_mvh;  // remote view: element r is rank r's window
    uint8_t *window;
    struct PipeReport *report;
    uint64_t *t_start;  // [stamps]: stage 0, when channel 0 began chunk warmup + i, ns
    uint64_t *t_end;    // [stamps]: last stage, when channel 0's leading lane had checked its share (LL: the group's), ns
    uint64_t off_ring;  // S slots of slot_bytes: what the previous stage writes
    uint64_t off_stage; // S slots of slot_bytes: the put path's outgoing copies
    uint64_t off_ready; // [S][channels] u64, written by the previous stage
    uint64_t off_credit;// [channels] u64, written by the next stage
    uint64_t chunk_bytes;  // payload bytes per chunk
    uint64_t slot_bytes;   // bytes per slot (LL: 16 per 8 payload bytes)
    uint64_t slice_bytes;  // payload bytes per channel (a multiple of 16)
    uint64_t chunks;       // M, warm-up included
    uint64_t warmup;       // the first chunks, not timed
    uint64_t stamps;       // chunks stamped after the warm-up
    uint64_t timeout_ns;   // every wait's limit
    uint64_t delay_ns;     // this stage sleeps this long per chunk (--slow-stage)
    uint32_t stage;
    uint32_t stages;
    uint32_t slots;
    uint32_t path;
    uint32_t same_gpu;     // 1: every rank on this GPU, GPU-scope ordering suffices
    int32_t corrupt_chunk; // test hook: this stage garbles word 0 of this chunk (-1: none)
};

// Begins with the suite's KernelReport: gpu::run::run_watched zeroes it,
// reads it and cancels through it.
struct PipeReport {
    KernelReport base;
    uint32_t wait_on;       // PIPE_WAIT_*: what the wait that gave up waited for
    uint32_t wait_channel;
    uint64_t wait_chunk;
    uint64_t overwrites;    // slots found carrying a later chunk than expected
    uint64_t mismatches;    // last stage: wrong words
    uint64_t bad_chunk;
    uint64_t bad_offset;    // byte offset of the first wrong word in its chunk
    uint32_t bad_got;
    uint32_t bad_want;
    uint32_t null_ptr;      // 1: nixlGetPtr gave no pointer to a neighbour
    uint32_t reserved;
    uint64_t stall_ns;      // summed over channels: waits for credits (timed chunks)
    uint64_t arrive_first;  // max over channels: when chunk `warmup` was there, ns
    uint64_t arrive_last;   // ... chunk M-1
    uint64_t done_ns;       // max over channels: the end of the last chunk's work
    uint64_t checked;       // last stage: payload bytes verified
};

static_assert(sizeof(PipeParams) == 168, "PipeParams layout is shared with the host");
static_assert(sizeof(PipeReport) == 144, "PipeReport layout is shared with the host");

// ------------------------------------------------------------- the data

// Word w (4 bytes) of chunk g as stage 0 produces it (src/pipeline/data.rs
// word()): a cheap mix of both, so a word from another chunk or offset
// fails.
__host__ __device__ __forceinline__ uint32_t pipe_word(uint64_t g, uint64_t w) {
    uint32_t x = uint32_t(g) * 0x9E3779B1u ^ uint32_t(w) * 0x85EBCA77u ^ uint32_t(g >> 32) * 0xC2B2AE3Du;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    return x;
}


// ------------------------------------------------------------ the groups

template <nixl_gpu_level_t L> struct Lanes;
template <> struct Lanes<nixl_gpu_level_t::THREAD> {
    __device__ static unsigned index() { return blockIdx.x * blockDim.x + threadIdx.x; }
    __device__ static unsigned count() { return gridDim.x * blockDim.x; }
    __device__ static unsigned rank() { return 0; }
    __device__ static unsigned size() { return 1; }
    __device__ static void sync() {}
};
template <> struct Lanes<nixl_gpu_level_t::WARP> {
    __device__ static unsigned index() { return (blockIdx.x * blockDim.x + threadIdx.x) / 32; }
    __device__ static unsigned count() { return gridDim.x * blockDim.x / 32; }
    __device__ static unsigned rank() { return threadIdx.x % 32; }
    __device__ static unsigned size() { return 32; }
    __device__ static void sync() { __syncwarp(); }
};
template <> struct Lanes<nixl_gpu_level_t::BLOCK> {
    __device__ static unsigned index() { return blockIdx.x; }
    __device__ static unsigned count() { return gridDim.x; }
    __device__ static unsigned rank() { return threadIdx.x; }
    __device__ static unsigned size() { return blockDim.x; }
    __device__ static void sync() { __syncthreads(); }
};

// -------------------------------------------------------------- the team

// The threads of a channel that work on its chunks, and how they meet. A
// channel is a group at the kernel's level (Lanes<L>), but a small slice
// (store and LL paths) keeps only as many lanes as it has vectors or
// lines, rounded up to the cheapest meeting: lane 0 alone (no barrier at
// all, as simple_write's LL ping-pong with a one-line message), one warp
// (a vote), or the whole block. The rest leave at the start. The put path
// keeps the group: nixlPut and nixlAtomicAdd are calls of the whole group.
enum : uint32_t { TEAM_ONE = 0, TEAM_WARP = 1, TEAM_BLOCK = 2 };
struct Team {
    unsigned rank, size;
    uint32_t kind;
    __device__ void sync() const {
        if (kind == TEAM_BLOCK) __syncthreads();
        else if (kind == TEAM_WARP) __syncwarp();
    }
    // Every member's `ok`, anded: the members' barrier.
    __device__ bool all(bool ok) const {
        if (kind == TEAM_BLOCK) return __syncthreads_and(ok);
        if (kind == TEAM_WARP) return __all_sync(~0u, ok);
        return ok;
    }
};

// ------------------------------------------------------------- the waits

__device__ __forceinline__ bool given_up(const PipeReport *r) {
    return *static_cast<const volatile uint32_t *>(&r->base.timed_out) != 0;
}

// Whether a wait must stop: another thread gave up, its deadline passed or
// the host cancelled. The clock starts at the first check (`start` 0:
// not yet), so a wait that succeeds within its first polls reads no clock.
// The first to give up records what it waited for.
__device__ bool pipe_stop(const PipeParams &p, uint64_t &start, uint64_t seen, uint32_t on, uint64_t g) {
    PipeReport *r = p.report;
    if (given_up(r)) return true;
    if (start == 0) start = globaltimer_ns();
    const uint32_t why = wait_expired(&r->base, start + p.timeout_ns);
    if (why == 0) return false;
    if (atomicCAS(&r->base.timed_out, 0u, why) == 0) {
        r->base.observed = seen;
        r->wait_on = on;
        r->wait_chunk = g;
        r->wait_channel = 0;
    }
    return true;
}

// One thread waits until *word reaches target; returns the value seen
// last (not reached: it gave up).
__device__ uint64_t pipe_wait(const PipeParams &p, const uint64_t *word, uint64_t target, uint32_t on, uint64_t g) {
    uint64_t start = 0;
    return spin_wait(word, target, [&](uint64_t seen) { return pipe_stop(p, start, seen, on, g); });
}

// Release and acquire in one fence: what a consumer's leader issues
// between its reads of one chunk and its credit for it, after having read
// the next chunk's ready word (Carry below).
__device__ __forceinline__ void fence_acq_rel(bool gpu_scope) {
    if (gpu_scope) cuda::atomic_thread_fence(cuda::memory_order_acq_rel, cuda::thread_scope_device);
    else cuda::atomic_thread_fence(cuda::memory_order_acq_rel, cuda::thread_scope_system);
}

// ---------------------------------------------------------- the channel

// One channel's share of the run: its slice of every chunk, its words.
struct Channel {
    uint64_t lo, len;        // payload bytes [lo, lo + len) of every chunk
    uint32_t index, count;
    uint8_t *next;           // store/LL: the next stage's window, mapped
    uint8_t *prev;           // store/LL: the previous stage's window, mapped
    uint32_t mul, add;       // last stage: the middle stages composed, x -> x * mul + add
};

// What a channel's leader carries from one chunk to the next: the words
// it read early, so that a wait which would succeed at once costs no
// round trip of its own (pipe_read_ahead), and its stall time.
struct Carry {
    uint64_t credit;   // producer: the credit word as last read
    uint64_t ahead;    // producer: the credit word read during the last chunk, not yet looked at
    uint64_t ready;    // consumer: the next chunk's ready word, read during this chunk
    bool acquired;     // consumer: a fence ran after that read (it is acquired)
    uint64_t stall;    // ns waited for credits over the timed chunks
};

__device__ __forceinline__ uint64_t *ready_word(const PipeParams &p, uint8_t *window, const Channel &c, uint64_t g) {
    return reinterpret_cast<uint64_t *>(window + p.off_ready) + (g % p.slots) * c.count + c.index;
}
__device__ __forceinline__ uint64_t ready_offset(const PipeParams &p, const Channel &c, uint64_t g) {
    return p.off_ready + 8 * ((g % p.slots) * c.count + c.index);
}
__device__ __forceinline__ uint64_t *credit_word(const PipeParams &p, uint8_t *window, const Channel &c) {
    return reinterpret_cast<uint64_t *>(window + p.off_credit) + c.index;
}
__device__ __forceinline__ uint64_t slot_offset(const PipeParams &p, uint64_t g) {
    return (g % p.slots) * p.slot_bytes;
}

// The stage's GPU sleeps `ns` (--slow-stage): __nanosleep sleeps at most
// about 1 ms a call and may wake early, so it loops on the clock.
__device__ void pipe_delay(uint64_t ns) {
    const uint64_t until = globaltimer_ns() + ns;
    while (globaltimer_ns() < until) __nanosleep(ns < 1000000 ? uint32_t(ns) : 1000000u);
}

// ------------------------------------------------------ moving the data

// The word the stage writes for input word `in` (stage 0: none read).
__device__ __forceinline__ uint32_t pipe_transform(const PipeParams &p, uint64_t g, uint64_t w, uint32_t in) {
    return p.stage == 0 ? pipe_word(g, w) : in * 3u + p.stage;
}

// Last stage: what word w of chunk g must read.
__device__ __forceinline__ uint32_t pipe_want(const Channel &c, uint64_t g, uint64_t w) {
    return pipe_word(g, w) * c.mul + c.add;
}

// Last stage: word w of chunk g read `got`; a wrong one is recorded.
__device__ __forceinline__ void pipe_check(const PipeParams &p, uint64_t g, uint64_t w, uint32_t got, uint32_t want) {
    if (got == want) return;
    PipeReport *r = p.report;
    if (atomicAdd(reinterpret_cast<unsigned long long *>(&r->mismatches), 1ull) == 0) {
        r->bad_chunk = g;
        r->bad_offset = 4 * w;
        r->bad_got = got;
        r->bad_want = want;
    }
}

// One 16-byte vector (4 words from word w) through the stage: `v` as read
// (stage 0: nothing), transformed or checked, written to `out` (unless the
// last stage).
__device__ __forceinline__ void pipe_vec(const PipeParams &p, const Channel &c, uint64_t g, uint64_t w, uint4 v, uint4 *out) {
    if (p.stage + 1 == p.stages) {
        pipe_check(p, g, w, v.x, pipe_want(c, g, w));
        pipe_check(p, g, w + 1, v.y, pipe_want(c, g, w + 1));
        pipe_check(p, g, w + 2, v.z, pipe_want(c, g, w + 2));
        pipe_check(p, g, w + 3, v.w, pipe_want(c, g, w + 3));
        return;
    }
    v = make_uint4(pipe_transform(p, g, w, v.x), pipe_transform(p, g, w + 1, v.y), pipe_transform(p, g, w + 2, v.z),
                   pipe_transform(p, g, w + 3, v.w));
    if (p.corrupt_chunk >= 0 && uint64_t(p.corrupt_chunk) == g && w == 0) v.x ^= 1;
    *out = v;
}

// The team's slice of chunk g, simple form (put and store paths): from
// our ring slot to `dst` (the next stage's slot, or our staging slot).
// Up to four vectors a lane per round, all their loads issued before any
// is used: a lane waits for L2 (or the link) once per round. Every round
// is full but the last (predicated), so a slice of 2 vectors a lane (1 MiB
// over 64 blocks of 512) is one round trip, not two.
__device__ void move_slice(const PipeParams &p, const Channel &c, const Team &t, uint64_t g, uint8_t *dst) {
    const uint4 *in = reinterpret_cast<const uint4 *>(p.window + p.off_ring + slot_offset(p, g) + c.lo);
    uint4 *out = reinterpret_cast<uint4 *>(dst);
    const uint64_t vecs = c.len / 16, w0 = c.lo / 4, n = t.size;
    constexpr uint32_t U = 4;
    for (uint64_t i = t.rank; i < vecs; i += U * n) {
        uint4 v[U];
#pragma unroll
        for (uint32_t u = 0; u < U; ++u)
            v[u] = p.stage > 0 && i + u * n < vecs ? __ldcg(in + i + u * n) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (uint32_t u = 0; u < U; ++u)
            if (i + u * n < vecs) pipe_vec(p, c, g, w0 + 4 * (i + u * n), v[u], out + i + u * n);
    }
}

// An LL line as cuda/kernels.cu writes it: one 16-byte volatile store.
__device__ __forceinline__ void ll_store(uint4 *line, uint32_t d0, uint32_t d1, uint32_t seq) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line), "r"(d0), "r"(seq), "r"(d1), "r"(seq)
                 : "memory");
}
__device__ __forceinline__ uint4 ll_load(const uint4 *line) {
    uint4 v;
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(line)
                 : "memory");
    return v;
}

// Polls one line until both halves carry `seq` or later; false when the
// wait gave up. A later seq means the slot was overwritten (counted).
__device__ bool ll_wait_line(const PipeParams &p, const uint4 *line, uint32_t seq, uint64_t g, uint4 &v) {
    uint64_t start = 0;
    v = ll_load(line);
    for (uint32_t n = 1; !(reached(v.y, seq) && reached(v.w, seq)); ++n) {
        if ((n & 63) == 0 && pipe_stop(p, start, min(v.y, v.w), PIPE_WAIT_READY, g)) return false;
        v = ll_load(line);
    }
    if (v.y != seq || v.w != seq) atomicAdd(reinterpret_cast<unsigned long long *>(&p.report->overwrites), 1ull);
    return true;
}

// The team's slice of chunk g, LL form: each lane takes whole lines (8
// payload bytes each), waits for them in our ring (unless stage 0), and
// writes them, stamped with g + 1, into the next stage's ring. What a
// line must carry (last stage) or will carry (stage 0) is computed before
// the wait or the store, as simple_write's ping-pong reads its payload
// ahead: the arrival is followed by one compare.
__device__ bool ll_slice(const PipeParams &p, const Channel &c, const Team &t, uint64_t g) {
    const uint32_t seq = uint32_t(g + 1);
    const bool last = p.stage + 1 == p.stages;
    const uint64_t first = c.lo / 8, lines = c.len / 8;
    const uint4 *in = reinterpret_cast<const uint4 *>(p.window + p.off_ring + slot_offset(p, g)) + first;
    uint4 *out = c.next ? reinterpret_cast<uint4 *>(c.next + p.off_ring + slot_offset(p, g)) + first : nullptr;
    for (uint64_t i = t.rank; i < lines; i += t.size) {
        const uint64_t w = (c.lo + 8 * i) / 4;
        uint32_t a = last ? pipe_want(c, g, w) : pipe_word(g, w), b = last ? pipe_want(c, g, w + 1) : pipe_word(g, w + 1);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (p.stage > 0 && !ll_wait_line(p, in + i, seq, g, v)) return false;
        if (last) {
            pipe_check(p, g, w, v.x, a);
            pipe_check(p, g, w + 1, v.z, b);
            continue;
        }
        if (p.stage > 0) a = v.x * 3u + p.stage, b = v.z * 3u + p.stage;
        if (p.corrupt_chunk >= 0 && uint64_t(p.corrupt_chunk) == g && w == 0) a ^= 1;
        ll_store(out + i, a, b, seq);
    }
    return true;
}

// ----------------------------------------------------- signal and credit

// Store path, once the team's slice of chunk g is in the next stage's slot
// (not the last stage) and has been read from ours (not stage 0): one
// barrier, then the leader alone fences once and raises both words, each
// a plain store of the new value (one writer each). One thread's fence is
// enough, as in simple_write's store path: the barrier orders every
// member's loads and stores before the leader's fence, and the fence is
// cumulative, so the peers see the data before the ready word and the
// reads done before the credit. The same fence (acquire side) orders the
// next chunk's reads after the ready word the leader read ahead.
__device__ void store_signal(const PipeParams &p, const Channel &c, const Team &t, uint64_t g, Carry &k) {
    t.sync();
    if (t.rank != 0) return;
    fence_acq_rel(p.same_gpu);
    k.acquired = true;
    if (p.stage > 0) store_relaxed_system(credit_word(p, c.prev, c), g + 1);
    if (p.stage + 1 < p.stages) store_relaxed_system(ready_word(p, c.next, c, g), g + 1);
}

// Put path, after the team's slice of chunk g went to our staging slot:
// nixlPut copies it into the next stage's slot, then the slot's ready word
// is raised by what it lacks, g + 1 minus the sequence of chunk g - S
// (only this channel writes it). nixlAtomicAdd is not a release, and on
// cuda_ipc the put is the group's own stores: the group syncs, then every
// member fences (release), so whichever member the add runs on, the data
// is visible before the ready word.
template <nixl_gpu_level_t L>
__device__ void pipe_forward(const PipeParams &p, const Channel &c, uint64_t g) {
    using G = Lanes<L>;
    // Every lane's part of the staging slot is written before any lane
    // copies it: on cuda_ipc the put is the group's own loads and stores.
    G::sync();
    const nixlMemViewElem src{p.local_mvh, 0, p.off_stage + slot_offset(p, g) + c.lo};
    const nixlMemViewElem dst{p.remote_mvh, p.stage + 1, p.off_ring + slot_offset(p, g) + c.lo};
    record_status(&p.report->base, nixlPut<L>(src, dst, c.len, c.index));
    G::sync();
    fence_release(p.same_gpu);
    const uint64_t add = g < p.slots ? g + 1 : p.slots;
    const nixlMemViewElem word{p.remote_mvh, p.stage + 1, ready_offset(p, c, g)};
    record_status(&p.report->base, nixlAtomicAdd<L>(add, word, c.index));
}

// After the team read its slice of chunk g from our slot (put and LL
// paths): the previous stage may reuse the slot, so our credit word in its
// window becomes g + 1 (the put path adds 1). A release: our reads of the
// slot come first. (The put path's team is the whole group: pipe_team.)
template <nixl_gpu_level_t L>
__device__ void pipe_credit(const PipeParams &p, const Channel &c, const Team &t, uint64_t g) {
    t.sync();
    const uint64_t off = p.off_credit + 8ull * c.index;
    if (p.path == PIPE_PATH_PUT) {
        const nixlMemViewElem word{p.remote_mvh, p.stage - 1, off};
        record_status(&p.report->base, nixlAtomicAdd<L>(1, word, c.index));
    } else if (t.rank == 0) {
        release_store(reinterpret_cast<uint64_t *>(c.prev + off), g + 1, p.same_gpu);
    }
}

// ------------------------------------------------------ the leader's waits

// The leader waits for chunk g's ready word (simple form) and checks its
// sequence; the team then reads the slot. The word may have been read
// already (pipe_read_ahead): if it showed g + 1, no poll, and if a fence
// followed that read (store path), no fence either. False: gave up.
__device__ bool pipe_arrive(const PipeParams &p, const Channel &c, uint64_t g, Carry &k) {
    const uint64_t want = g + 1;
    const bool early = reached(k.ready, want);
    const uint64_t v = early ? k.ready : pipe_wait(p, ready_word(p, p.window, c, g), want, PIPE_WAIT_READY, g);
    if (!reached(v, want)) return false;
    // A later sequence: the sender wrote chunk g + S (or later) into this
    // slot before we consumed chunk g, past its credits.
    if (v != want) atomicAdd(reinterpret_cast<unsigned long long *>(&p.report->overwrites), 1ull);
    if (!(early && k.acquired)) fence_acquire(p.same_gpu);
    return true;
}

// The leader waits for a free slot downstream: credit >= g + 1 - S. The
// credit last seen (or read ahead) often shows it already: the receiver
// is more than one slot behind only when the ring runs full. Time spent
// polling beyond that goes to the stage's stall.
__device__ bool pipe_slot_free(const PipeParams &p, const Channel &c, uint64_t g, Carry &k) {
    if (g < p.slots) return true;
    const uint64_t need = g + 1 - p.slots;
    if (reached(k.ahead, k.credit)) k.credit = k.ahead;
    if (reached(k.credit, need)) return true;
    const uint64_t t0 = globaltimer_ns();
    k.credit = pipe_wait(p, credit_word(p, p.window, c), need, PIPE_WAIT_CREDIT, g);
    if (g >= p.warmup) k.stall += globaltimer_ns() - t0;
    return reached(k.credit, need);
}

// The leader's waits before chunk g: for it to have arrived (not stage 0;
// simple form: its ready word), for a free slot downstream (not the last
// stage), then the slow stage's delay. False: a wait gave up.
__device__ bool pipe_wait_turn(const PipeParams &p, const Channel &c, uint64_t g, Carry &k) {
    if (p.stage > 0 && p.path != PIPE_PATH_LL && !pipe_arrive(p, c, g, k)) return false;
    if (p.stage + 1 < p.stages && !pipe_slot_free(p, c, g, k)) return false;
    if (p.delay_ns != 0) pipe_delay(p.delay_ns);
    return true;
}

// The leader's reads for the next chunk, issued while the team moves this
// one and looked at only then: the next ready word (consumer, simple form)
// and our credit word (producer). Their round trips overlap the data's.
__device__ void pipe_read_ahead(const PipeParams &p, const Channel &c, uint64_t g, Carry &k) {
    if (p.stage > 0 && p.path != PIPE_PATH_LL && g + 1 < p.chunks) {
        k.ready = load_relaxed_system(ready_word(p, p.window, c, g + 1));
        k.acquired = false;
    }
    if (p.stage + 1 < p.stages && g + 1 >= p.slots) k.ahead = load_relaxed_system(credit_word(p, p.window, c));
}

// ------------------------------------------------------------- the stamps

// The clock for chunk g's stamps, or 0 where it has none: arrival
// (`end` false: the first timed and the last chunk; max over channels),
// channel 0's start at stage 0 and end at the last stage of the first
// `stamps` timed chunks (the channels run apart: one slice's latency is
// channel 0's, not a spread over channels), and the last chunk's end.
// Most chunks read no clock at all.
__device__ uint64_t pipe_clock(const PipeParams &p, const Channel &c, uint64_t g, bool end) {
    const bool timed = c.index == 0 && g >= p.warmup && g - p.warmup < p.stamps;
    const bool mine = g + 1 == p.chunks || (end ? p.stage + 1 == p.stages && timed : g == p.warmup || (p.stage == 0 && timed));
    return mine ? globaltimer_ns() : 0;
}

// Writes chunk g's stamps taken at `now` (pipe_clock; 0: none).
__device__ void pipe_stamp(const PipeParams &p, const Channel &c, uint64_t g, bool end, uint64_t now) {
    if (now == 0) return;
    auto *r = p.report;
    const bool timed = c.index == 0 && g >= p.warmup && g - p.warmup < p.stamps;
    if (!end) {
        if (p.stage == 0 && timed) p.t_start[g - p.warmup] = now;
        if (g == p.warmup) atomicMax(reinterpret_cast<unsigned long long *>(&r->arrive_first), now);
        if (g + 1 == p.chunks) atomicMax(reinterpret_cast<unsigned long long *>(&r->arrive_last), now);
        return;
    }
    if (p.stage + 1 == p.stages && timed) p.t_end[g - p.warmup] = now;
    if (g + 1 == p.chunks) atomicMax(reinterpret_cast<unsigned long long *>(&r->done_ns), now);
}

// ------------------------------------------------------------- the stage

// This channel's slice, this stage's neighbours; false if a neighbour's
// window is not mapped (store and LL paths need it).
template <nixl_gpu_level_t L>
__device__ bool pipe_channel(const PipeParams &p, Channel &c) {
    c.index = Lanes<L>::index();
    c.count = Lanes<L>::count();
    c.lo = min(uint64_t(c.index) * p.slice_bytes, p.chunk_bytes);
    c.len = min(p.slice_bytes, p.chunk_bytes - c.lo);
    c.next = c.prev = nullptr;
    c.mul = 1;
    c.add = 0;
    for (uint32_t s = 1; s + 1 < p.stages; ++s) c.mul *= 3u, c.add = c.add * 3u + s;  // data.rs composed()
    if (p.path == PIPE_PATH_PUT) return true;
    if (p.stage + 1 < p.stages) c.next = static_cast<uint8_t *>(nixlGetPtr(p.remote_mvh, p.stage + 1));
    if (p.stage > 0) c.prev = static_cast<uint8_t *>(nixlGetPtr(p.remote_mvh, p.stage - 1));
    const bool ok = (p.stage + 1 == p.stages || c.next) && (p.stage == 0 || c.prev);
    if (!ok) atomicExch(&p.report->null_ptr, 1u);
    return ok;
}

// The channel's team (Team above): the whole group, or on the store and
// LL paths only the lanes its slice needs (vectors, or lines).
template <nixl_gpu_level_t L>
__device__ Team pipe_team(const PipeParams &p, const Channel &c) {
    using G = Lanes<L>;
    const uint32_t kind = L == nixl_gpu_level_t::THREAD ? TEAM_ONE : L == nixl_gpu_level_t::WARP ? TEAM_WARP : TEAM_BLOCK;
    const Team group{G::rank(), G::size(), kind};
    if (p.path == PIPE_PATH_PUT) return group;
    const uint64_t work = p.path == PIPE_PATH_LL ? c.len / 8 : c.len / 16;
    if (work <= 1) return Team{G::rank(), 1, TEAM_ONE};
    if (work <= 32 && kind == TEAM_BLOCK && G::size() % 32 == 0) return Team{G::rank(), 32, TEAM_WARP};
    return group;
}

// One chunk through this stage, one team: the leader waits for it (not
// stage 0) and for a free slot downstream (not the last stage), the team
// moves it, credits upstream and forwards. False once a wait gave up.
template <nixl_gpu_level_t L>
__device__ bool pipe_chunk(const PipeParams &p, const Channel &c, const Team &t, uint64_t g, Carry &k) {
    const bool first = p.stage == 0, last = p.stage + 1 == p.stages;
    const bool lead = t.rank == 0;
    if (!t.all(!lead || pipe_wait_turn(p, c, g, k))) return false;  // (a wait that gave up stops the others: pipe_stop)
    if (lead) {
        pipe_stamp(p, c, g, false, pipe_clock(p, c, g, false));
        pipe_read_ahead(p, c, g, k);
    }
    if (p.path == PIPE_PATH_LL) {
        if (!t.all(ll_slice(p, c, t, g))) return false;
    } else {
        uint8_t *dst = p.path == PIPE_PATH_PUT ? p.window + p.off_stage + slot_offset(p, g) + c.lo
                       : last                  ? nullptr
                                               : c.next + p.off_ring + slot_offset(p, g) + c.lo;
        move_slice(p, c, t, g, dst);
    }
    // The last stage's clock is read now (checked: the chunk is through)
    // and written after the credit, so the credit's fence does not wait
    // for the stamp's store.
    const uint64_t now = lead && last ? pipe_clock(p, c, g, true) : 0;
    if (p.path == PIPE_PATH_STORE) store_signal(p, c, t, g, k);
    else if (!first) pipe_credit<L>(p, c, t, g);
    if (p.path == PIPE_PATH_PUT && !last) pipe_forward<L>(p, c, g);
    if (lead) pipe_stamp(p, c, g, true, last ? now : pipe_clock(p, c, g, true));
    return true;
}

// One kernel per level and path: the path a constant (`q.path`, folded
// into every function below), so each kernel holds only its path's code
// and registers. With the three paths in one kernel, pipe_block spilled.
template <nixl_gpu_level_t L, uint32_t P>
__device__ void pipe_stage(const PipeParams &p) {
    PipeParams q = p;
    q.path = P;
    Channel c;
    if (!pipe_channel<L>(q, c) || c.len == 0) return;  // unmapped neighbour, or no data for this channel
    const Team t = pipe_team<L>(q, c);
    if (t.rank >= t.size) return;  // a lane the slice does not need
    Carry k{0, 0, 0, false, 0};
    for (uint64_t g = 0; g < q.chunks; ++g)
        if (!pipe_chunk<L>(q, c, t, g, k)) break;
    if (t.rank == 0) {
        atomicAdd(reinterpret_cast<unsigned long long *>(&q.report->stall_ns), k.stall);
        if (q.stage + 1 == q.stages)
            atomicAdd(reinterpret_cast<unsigned long long *>(&q.report->checked), c.len * q.chunks);
    }
}

#define PIPE_ENTRY(name, level, path) \
    extern "C" __global__ void __launch_bounds__(1024) name(PipeParams p) { pipe_stage<level, path>(p); }

PIPE_ENTRY(pipe_thread_put, nixl_gpu_level_t::THREAD, PIPE_PATH_PUT)
PIPE_ENTRY(pipe_warp_put, nixl_gpu_level_t::WARP, PIPE_PATH_PUT)
PIPE_ENTRY(pipe_block_put, nixl_gpu_level_t::BLOCK, PIPE_PATH_PUT)
PIPE_ENTRY(pipe_thread_store, nixl_gpu_level_t::THREAD, PIPE_PATH_STORE)
PIPE_ENTRY(pipe_warp_store, nixl_gpu_level_t::WARP, PIPE_PATH_STORE)
PIPE_ENTRY(pipe_block_store, nixl_gpu_level_t::BLOCK, PIPE_PATH_STORE)
PIPE_ENTRY(pipe_thread_ll, nixl_gpu_level_t::THREAD, PIPE_PATH_LL)
PIPE_ENTRY(pipe_warp_ll, nixl_gpu_level_t::WARP, PIPE_PATH_LL)
PIPE_ENTRY(pipe_block_ll, nixl_gpu_level_t::BLOCK, PIPE_PATH_LL)
