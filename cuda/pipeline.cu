// A streaming pipeline the GPUs drive themselves: N ranks form a chain
// 0 -> 1 -> ... -> N-1. Stage 0's kernel produces M chunks, every middle
// stage's kernel receives a chunk, maps every 32-bit word x to 3x + its
// stage number (the maps do not commute: the result proves the order) and
// forwards it, the last stage's kernel verifies every word. No CPU
// in the loop: docs/PIPELINE.md walks through it.
//
// Per link (stage s -> s+1), in the receiver's window: a ring of S slots
// (each channel's slices of them one after another: slice_offset) and a
// ready word per (slot, channel); in the sender's window: a credit
// word per channel. Chunk g goes to slot g % S with sequence g + 1. The
// sender waits until credit >= g + 1 - S (the receiver has consumed chunk
// g - S, so the slot is free), writes the data, then raises the slot's
// ready word to g + 1 — after the data, so a ready word never runs ahead of
// its data. The receiver waits until ready == g + 1 (nothing is ever
// cleared: laps differ by their sequence), consumes the slot, checks the
// word still reads g + 1 (a later value means the slot was overwritten:
// counted), and raises its credit word in the sender's window to g + 1.
// A handshake may cover a batch of up to min(16, S/2) chunks (the ones
// that have arrived and have a free slot): one barrier, one fence, one
// credit (the batch's last g + 1) and a ready word per slot. The fences
// (~0.4 us each on an H200) and barriers were most of a chunk's time.
//
// A chunk is cut into one slice per channel; a channel is a thread group at
// the kernel's level (block, warp or thread), and each channel is a
// pipeline of its own with its own ready and credit words, like NCCL's
// channels. Three paths:
//   put:   the sender's slice goes to a staging slot of its own window,
//          nixlPut copies it into the receiver's slot, nixlAtomicAdd raises
//          the ready word; credits are nixlAtomicAdd too (any transport);
//   store: the sender stores straight into the receiver's slot through the
//          pointer nixlGetPtr gives, then one fence and plain stores of
//          the sequences (NVLink / one GPU only);
//   ll:    16-byte lines {data, seq, data, seq} (cuda/ll.cuh, as
//          simple_write's LL path) stored through the pointer: every line carries the chunk's
//          sequence, so there is no ready word; the receiver polls the lines;
//   ll128: 128-byte lines of 120 payload bytes and a flag word {seq, seq}
//          (cuda/ll.cuh's LL128), eight lanes of a warp to a line: as ll,
//          with 15/16 of the bytes payload (warp and block level).

#include "device_common.cuh"
#include "ll.cuh"

enum : uint32_t { PIPE_PATH_PUT = 0, PIPE_PATH_STORE = 1, PIPE_PATH_LL = 2, PIPE_PATH_LL128 = 3 };

// The paths whose lines carry their own sequence (no ready word, one
// chunk a handshake).
__device__ __forceinline__ bool pipe_lines(uint32_t path) { return path == PIPE_PATH_LL || path == PIPE_PATH_LL128; }
// What a wait waited for (PipeReport::wait_on).
enum : uint32_t { PIPE_WAIT_READY = 1, PIPE_WAIT_CREDIT = 2 };

// Mirrored in src/pipeline/kernels.rs (PipeParams); offsets are bytes into
// the window, which every rank lays out alike (src/pipeline/ring.rs).
struct PipeParams {
    void *local_mvh;   // local view of the window (one element)
    void *remote_mvh;  // remote view: element r is rank r's window
    uint8_t *window;
    struct PipeReport *report;
    uint64_t *t_start;  // [stamps]: stage 0, when channel 0 began chunk warmup + i (LL: just before its leader's line store), ns
    uint64_t *t_end;    // [stamps]: last stage, when channel 0's leading lane had checked its share (LL: its own line), ns
    uint64_t off_ring;  // [channels][S] slices of slice_stride: what the previous stage writes
    uint64_t off_stage; // [channels][S] slices of slice_stride: the put path's outgoing copies
    uint64_t off_ready; // [S][channels] u64, written by the previous stage
    uint64_t off_credit;// [channels] u64, written by the next stage
    uint64_t chunk_bytes;  // payload bytes per chunk
    uint64_t slice_stride; // bytes from a channel's slice of one slot to the next (LL: 16 per 8 payload bytes)
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
    uint32_t batch;        // the most chunks one handshake covers, 1 .. PIPE_BATCH (LL: 1)
    uint32_t reserved;
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
    uint32_t handshakes;    // channel 0's handshakes over the run (chunks / handshakes: the mean batch)
    uint64_t stall_ns;      // summed over channels: waits for credits (timed chunks)
    uint64_t arrive_first;  // max over channels: when chunk `warmup` was there, ns
    uint64_t arrive_last;   // ... chunk M-1
    uint64_t done_ns;       // max over channels: the end of the last chunk's work
    uint64_t checked;       // last stage: payload bytes verified
};

static_assert(sizeof(PipeParams) == 176, "PipeParams layout is shared with the host");
static_assert(sizeof(PipeReport) == 144, "PipeReport layout is shared with the host");

// ------------------------------------------------------------- the data

// Word w (4 bytes) of chunk g as stage 0 produces it (src/pipeline/data.rs
// word()): a mix of g, plus w steps of an odd constant. A word from
// another chunk (another lap of the slot) or another offset fails, and
// the words of a vector follow from its first by adds, so checking a word
// costs an add and a compare: with a hash of (g, w) a word, the last
// stage's checks took about a fifth of a 1 MiB link's throughput on an
// H200 (its SMs are the writer's too, on one GPU).
__host__ __device__ __forceinline__ uint32_t pipe_chunk_mix(uint64_t g) {
    uint32_t x = uint32_t(g) * 0x9E3779B1u ^ uint32_t(g >> 32) * 0xC2B2AE3Du;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    return x;
}
constexpr uint32_t PIPE_WORD_STEP = 0x85EBCA77u;
__host__ __device__ __forceinline__ uint32_t pipe_word(uint64_t g, uint64_t w) {
    return pipe_chunk_mix(g) + uint32_t(w) * PIPE_WORD_STEP;
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
    // The leader's `v` to every member, at a barrier (block: through
    // `slot`, a shared word, rewritten only after the next barrier).
    __device__ uint32_t share(uint32_t v, uint32_t *slot) const {
        if (kind == TEAM_WARP) return __shfl_sync(~0u, v, 0);
        if (kind == TEAM_ONE) return v;
        if (rank == 0) *slot = v;
        __syncthreads();
        return *slot;
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

// ---------------------------------------------------------- the channel

// One channel's share of the run: its slice of every chunk, its words.
struct Channel {
    uint64_t lo, len;        // payload bytes [lo, lo + len) of every chunk
    uint32_t index, count;
    uint8_t *next;           // store/LL: the next stage's window, mapped
    uint8_t *prev;           // store/LL: the previous stage's window, mapped
    uint32_t mul, add;       // last stage: the middle stages composed, x -> x * mul + add
};

// The most chunks one handshake covers (a batch; batch_max below). On an
// H200, 8 over 16 slots moved 1 MiB store chunks about 30% faster than 4,
// and 16 over 32 about 10-25% faster than 8 over 16 (the ring's 32 MiB
// still in L2; 64 slots were slower).
constexpr uint32_t PIPE_BATCH = 16;

// What a channel's leader carries from one batch to the next. (Nothing
// is read ahead: on an H200 a word read during one batch for the next
// cost its full round trip at once, the value going to a spilled
// register, and the batches it showed were older, so smaller: reading the
// words when they are needed was 8-40% faster at 1 and 4 MiB.)
struct Carry {
    uint64_t credit;      // producer: the credit word as last read
    uint64_t stall;       // SM clock cycles waited for credits over the timed chunks
    uint32_t handshakes;  // batches so far
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
// Where channel c's slice of chunk g lies, from the ring's (or the staging
// slots') start: each channel has a ring of its own, its S slices one
// after another, as NCCL gives each channel a FIFO of its own. The put
// path then moves a batch of slices with one nixlPut: a block-level put
// of one 8 KiB slice kept 2 of the block's 8 warps busy (UCX's cuda_ipc
// copy hands each warp 4 KiB), and cost a call per chunk.
__device__ __forceinline__ uint64_t slice_offset(const PipeParams &p, const Channel &c, uint64_t g) {
    return (uint64_t(c.index) * p.slots + g % p.slots) * p.slice_stride;
}

// The stage's GPU sleeps `ns` (--slow-stage): __nanosleep sleeps at most
// about 1 ms a call and may wake early, so it loops on the clock.
__device__ void pipe_delay(uint64_t ns) {
    const uint64_t until = globaltimer_ns() + ns;
    while (globaltimer_ns() < until) __nanosleep(ns < 1000000 ? uint32_t(ns) : 1000000u);
}

// ------------------------------------------------------ moving the data

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
// last stage). The words of a vector are `d` apart (pipe_word; the middle
// stages scale the step by c.mul), so one product gives all four.
__device__ __forceinline__ void pipe_vec(const PipeParams &p, const Channel &c, uint64_t g, uint64_t w, uint4 v, uint4 *out) {
    if (p.stage + 1 == p.stages) {
        const uint32_t a = pipe_want(c, g, w), d = c.mul * PIPE_WORD_STEP;
        if (((v.x ^ a) | (v.y ^ (a + d)) | (v.z ^ (a + 2 * d)) | (v.w ^ (a + 3 * d))) == 0) return;
        pipe_check(p, g, w, v.x, a);
        pipe_check(p, g, w + 1, v.y, a + d);
        pipe_check(p, g, w + 2, v.z, a + 2 * d);
        pipe_check(p, g, w + 3, v.w, a + 3 * d);
        return;
    }
    if (p.stage == 0) {
        const uint32_t a = pipe_word(g, w);
        v = make_uint4(a, a + PIPE_WORD_STEP, a + 2 * PIPE_WORD_STEP, a + 3 * PIPE_WORD_STEP);
    } else {
        v = make_uint4(v.x * 3u + p.stage, v.y * 3u + p.stage, v.z * 3u + p.stage, v.w * 3u + p.stage);
    }
    if (p.corrupt_chunk >= 0 && uint64_t(p.corrupt_chunk) == g && w == 0) v.x ^= 1;
    *out = v;
}

// Vectors a lane moves per round: all their loads are issued before any
// is used, so a lane waits for L2 (or the link) once per round.
constexpr uint32_t MOVE_ROUND = 4;

// The team's slice of chunk g, simple form (put and store paths): from our
// ring's slice to the same place from `dst` (the next stage's ring, our
// staging slots; null at the last stage). Every round is full but the
// last (predicated).
__device__ void move_slice(const PipeParams &p, const Channel &c, const Team &t, uint64_t g, uint8_t *dst) {
    const uint64_t at = slice_offset(p, c, g);
    const uint4 *in = reinterpret_cast<const uint4 *>(p.window + p.off_ring + at);
    uint4 *out = reinterpret_cast<uint4 *>(dst + at);
    const uint64_t vecs = c.len / 16, w0 = c.lo / 4, n = t.size;
    constexpr uint32_t U = MOVE_ROUND;
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

// A lane's walk through a batch's slices, chunk after chunk: its m-th
// vector of chunk h + j lies in the channel's slice of slot `slot`, vector
// rank + m * size. Stepping needs no division (a lane has q vectors a
// chunk).
struct Walk {
    uint32_t j, m, slot;
    __device__ __forceinline__ void step(uint32_t q, uint32_t slots) {
        if (++m < q) return;
        m = 0, ++j;
        if (++slot == slots) slot = 0;
    }
    // The vector's byte offset from the start of the channel's ring.
    __device__ __forceinline__ uint64_t offset(const PipeParams &p, const Team &t) const {
        return uint64_t(slot) * p.slice_stride + 16ull * (t.rank + m * t.size);
    }
};

// A lane's q vectors a chunk of the batch's n chunks as one sequence
// (move_batch), a round at a time.
__device__ void move_walk(const PipeParams &p, const Channel &c, const Team &t, uint64_t h, uint32_t n, uint32_t q, uint8_t *dst) {
    constexpr uint32_t U = MOVE_ROUND;
    const uint8_t *in = p.window + p.off_ring + slice_offset(p, c, 0);
    dst += slice_offset(p, c, 0);
    Walk w{0, 0, uint32_t(h % p.slots)};
    for (uint32_t e = 0; e < n * q; e += U) {
        uint4 v[U];
        Walk r = w;
#pragma unroll
        for (uint32_t u = 0; u < U; ++u, r.step(q, p.slots)) {
            const bool load = p.stage > 0 && e + u < n * q;
            v[u] = load ? __ldcg(reinterpret_cast<const uint4 *>(in + r.offset(p, t))) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (uint32_t u = 0; u < U; ++u, w.step(q, p.slots)) {
            if (e + u >= n * q) continue;
            uint4 *out = reinterpret_cast<uint4 *>(dst + w.offset(p, t));
            pipe_vec(p, c, h + w.j, c.lo / 4 + 4 * (t.rank + w.m * t.size), v[u], out);
        }
    }
}

// The team's slices of chunks h .. h + n - 1 (a batch), as move_slice
// moves one. When a lane's share of a chunk fills a round, chunk by chunk.
// When it does not (a 1 MiB chunk over 128 blocks of 512 is one vector a
// lane), a lane's vectors of the whole batch are one sequence, moved a
// round at a time: a batch of four chunks then costs one round trip, not
// four. On an H200 that took 1 MiB store chunks from about 655 to 885
// GB/s (16 slots); at 4 MiB and at warp level, where a chunk fills
// rounds anyway, the walk's bookkeeping cost 5-9%, so they keep the
// chunk-by-chunk loop.
__device__ void move_batch(const PipeParams &p, const Channel &c, const Team &t, uint64_t h, uint32_t n, uint8_t *dst) {
    const uint32_t vecs = uint32_t(c.len / 16);
    const uint32_t q = t.rank < vecs ? (vecs - t.rank + t.size - 1) / t.size : 0;  // this lane's vectors a chunk
    constexpr uint32_t U = MOVE_ROUND;
    if (q >= U) {
        for (uint32_t j = 0; j < n; ++j) move_slice(p, c, t, h + j, dst);
        return;
    }
    move_walk(p, c, t, h, n, q, dst);
}

// Polls one line until both halves carry `seq` or later; false when the
// wait gave up. A later seq means the slot was overwritten (counted).
__device__ bool ll_wait_line(const PipeParams &p, const uint4 *line, uint32_t seq, uint64_t g, uint4 &v) {
    uint64_t start = 0;
    const auto stop = [&](const uint4 &seen) { return pipe_stop(p, start, min(seen.y, seen.w), PIPE_WAIT_READY, g); };
    if (!ll_poll<ll_ready>(line, seq, v, stop)) return false;
    if (v.y != seq || v.w != seq) atomicAdd(reinterpret_cast<unsigned long long *>(&p.report->overwrites), 1ull);
    return true;
}

// The team's slice of chunk g, LL form: each lane takes whole lines (8
// payload bytes each), waits for them in our ring (unless stage 0), and
// writes them, stamped with g + 1, into the next stage's ring. What a
// line must carry (last stage) or will carry (stage 0) is computed before
// the wait or the store, as simple_write's ping-pong reads its payload
// ahead: the arrival is followed by one compare. `at` (the leader, when
// `stamp`): the clock just before its first line's store (stage 0) or
// just after its first line arrived and was checked.
__device__ bool ll_slice(const PipeParams &p, const Channel &c, const Team &t, uint64_t g, bool stamp, uint64_t &at) {
    const uint32_t seq = uint32_t(g + 1);
    const bool last = p.stage + 1 == p.stages;
    const uint64_t lines = c.len / 8;
    const uint4 *in = reinterpret_cast<const uint4 *>(p.window + p.off_ring + slice_offset(p, c, g));
    uint4 *out = c.next ? reinterpret_cast<uint4 *>(c.next + p.off_ring + slice_offset(p, c, g)) : nullptr;
    for (uint64_t i = t.rank; i < lines; i += t.size) {
        const uint64_t w = (c.lo + 8 * i) / 4;
        uint32_t a = last ? pipe_want(c, g, w) : pipe_word(g, w), b = last ? pipe_want(c, g, w + 1) : pipe_word(g, w + 1);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (p.stage > 0 && !ll_wait_line(p, in + i, seq, g, v)) return false;
        if (last) {
            pipe_check(p, g, w, v.x, a);
            pipe_check(p, g, w + 1, v.z, b);
        } else {
            if (p.stage > 0) a = v.x * 3u + p.stage, b = v.z * 3u + p.stage;
            if (p.corrupt_chunk >= 0 && uint64_t(p.corrupt_chunk) == g && w == 0) a ^= 1;
        }
        if (stamp && i == t.rank) at = globaltimer_ns();
        if (!last) ll_store(out + i, a, b, seq);
    }
    return true;
}

// What lane `part` of an LL128 line carries of chunk g's words from word
// w (4 words, 2 beside the flag; `n` of them are payload, the rest past
// the slice are zeros): stage 0 makes them, a middle stage maps what it
// read (`lo`/`hi`), the last checks them. Leaves in lo/hi the lane's 16
// bytes to store (the flag lane's high half: its flag word).
__device__ __forceinline__ void ll128_words(const PipeParams &p, const Channel &c, uint64_t g, uint64_t w, uint32_t n,
                                            bool holds_flag, uint64_t flag, uint64_t &lo, uint64_t &hi) {
    uint32_t v[4] = {uint32_t(lo), uint32_t(lo >> 32), uint32_t(hi), uint32_t(hi >> 32)};
    const bool last = p.stage + 1 == p.stages;
#pragma unroll
    for (uint32_t j = 0; j < 4; ++j) {
        if (j >= n) {
            v[j] = 0;
        } else if (last) {
            pipe_check(p, g, w + j, v[j], pipe_want(c, g, w + j));
        } else {
            v[j] = p.stage == 0 ? pipe_word(g, w + j) : v[j] * 3u + p.stage;
            if (p.corrupt_chunk >= 0 && uint64_t(p.corrupt_chunk) == g && w + j == 0) v[j] ^= 1;
        }
    }
    lo = uint64_t(v[1]) << 32 | v[0];
    hi = holds_flag ? flag : uint64_t(v[3]) << 32 | v[2];
}

// The team's slice of chunk g, LL128 form: the team is whole warps, and
// warp i of it takes the quads of lines i, i + warps, ... (four lines a
// quad, 120 payload bytes a line). Lane 8j + c holds bytes 16c .. 16c + 15
// of line j of its quad (c = 7: the last 8 and the flag). Unless stage 0,
// the warp polls its quad in our ring until every line's flag carries
// g + 1 or later (a later one: the slot was overwritten, counted); then,
// unless the last stage, it stores the quad, stamped with g + 1, into the
// next stage's ring, the eight lanes of a line in one instruction. `at`
// as ll_slice's (the leader's first line).
__device__ bool ll128_slice(const PipeParams &p, const Channel &c, const Team &t, uint64_t g, bool stamp, uint64_t &at) {
    const uint32_t seq = uint32_t(g + 1);
    const uint64_t lines = ll128_lines(c.len), flag = ll128_flag(seq);
    const uint8_t *in = p.window + p.off_ring + slice_offset(p, c, g);
    uint8_t *out = c.next ? c.next + p.off_ring + slice_offset(p, c, g) : nullptr;
    const uint32_t lane = t.rank % 32, part = lane % LL128_LANES, flag_lane = lane | (LL128_LANES - 1);
    const bool holds_flag = part == LL128_LANES - 1;
    for (uint64_t q = t.rank / 32; LL128_WARP_LINES * q < lines; q += t.size / 32) {
        const uint64_t k = LL128_WARP_LINES * q + lane / LL128_LANES;
        const bool mine = k < lines;
        const uint64_t off = k * LL128_PAYLOAD + 16 * part;  // payload byte in the slice
        const uint32_t n = off >= c.len ? 0 : uint32_t(min(uint64_t(holds_flag ? 2 : 4), (c.len - off) / 4));
        const uint4 *line = reinterpret_cast<const uint4 *>(in + k * LL128_LINE_BYTES + 16 * part);
        uint64_t lo = 0, hi = 0, start = 0;
        if (p.stage > 0) {
            __syncwarp();  // a line's eight lanes load in one instruction: data and flag together
            if (mine) ll128_load(line, lo, hi);
            bool got = __shfl_sync(~0u, !mine || ll128_ready(hi, seq), flag_lane);
            for (uint32_t polls = 1; __any_sync(~0u, !got); ++polls) {
                const bool stop = (polls & 63) == 0 && !got && holds_flag &&
                                  pipe_stop(p, start, min(uint32_t(hi), uint32_t(hi >> 32)), PIPE_WAIT_READY, g);
                if (__any_sync(~0u, stop)) return false;
                if (mine && !got) ll128_load(line, lo, hi);
                got = __shfl_sync(~0u, !mine || ll128_ready(hi, seq), flag_lane);
            }
            if (mine && holds_flag && hi != flag) atomicAdd(reinterpret_cast<unsigned long long *>(&p.report->overwrites), 1ull);
        }
        if (mine) ll128_words(p, c, g, (c.lo + off) / 4, n, holds_flag, flag, lo, hi);
        if (stamp && q == t.rank / 32 && lane == 0) at = globaltimer_ns();
        __syncwarp();
        if (out != nullptr && mine) ll128_store(reinterpret_cast<uint4 *>(out + k * LL128_LINE_BYTES + 16 * part), lo, hi);
    }
    return true;
}

// ----------------------------------------------------- signal and credit

// Store path, once the team's slices of the batch's chunks h .. h + n - 1
// are in the next stage's slots (not the last stage) and have been read
// from ours (not stage 0): one barrier, then the leader alone fences once
// and raises the words, each a plain store of the new value (one writer
// each): our credit to h + n, the slots' ready words to their chunks'
// sequences. One thread's fence is enough, as in simple_write's store
// path: the barrier orders every member's loads and stores before the
// leader's fence, and the fence is cumulative, so the peers see the data
// before the ready words and the reads done before the credit; one fence
// covers the whole batch.
__device__ void store_signal(const PipeParams &p, const Channel &c, const Team &t, uint64_t h, uint32_t n) {
    t.sync();
    if (t.rank != 0) return;
    fence_release(p.same_gpu);
    if (p.stage > 0) store_relaxed_system(credit_word(p, c.prev, c), h + n);
    if (p.stage + 1 == p.stages) return;
    for (uint32_t j = 0; j < n; ++j) store_relaxed_system(ready_word(p, c.next, c, h + j), h + j + 1);
}

// Put path, after the team's slices of chunks h .. h + n - 1 went to our
// staging slots: nixlPut copies them into the next stage's slots, one call
// per run of slices that lie one after another in the channel's ring (one,
// or two where the batch wraps; one a slice when the slices are padded).
// Then each slot's ready word is raised by what it lacks, g + 1 minus the
// sequence of chunk g - S (only this channel writes it). nixlAtomicAdd is
// not a release, and on cuda_ipc the put is the group's own stores: the
// group syncs, then every member fences (release), so whichever member the
// add runs on, the data is visible before the ready word.
template <nixl_gpu_level_t L>
__device__ void pipe_forward(const PipeParams &p, const Channel &c, uint64_t h, uint32_t n) {
    using G = Lanes<L>;
    // Every lane's part of the staging slot is written before any lane
    // copies it: on cuda_ipc the put is the group's own loads and stores.
    G::sync();
    const bool packed = c.len == p.slice_stride;
    for (uint64_t g = h; g < h + n;) {
        const uint64_t run = packed ? min(uint64_t(h + n - g), p.slots - g % p.slots) : 1;
        const nixlMemViewElem src{p.local_mvh, 0, p.off_stage + slice_offset(p, c, g)};
        const nixlMemViewElem dst{p.remote_mvh, p.stage + 1, p.off_ring + slice_offset(p, c, g)};
        record_status(&p.report->base, nixlPut<L>(src, dst, run * c.len, c.index));
        g += run;
    }
    G::sync();
    fence_release(p.same_gpu);
    for (uint64_t g = h; g < h + n; ++g) {
        const nixlMemViewElem word{p.remote_mvh, p.stage + 1, ready_offset(p, c, g)};
        record_status(&p.report->base, nixlAtomicAdd<L>(g < p.slots ? g + 1 : p.slots, word, c.index));
    }
}

// After the team read its slices of chunks h .. h + n - 1 from our slots
// (put and LL paths): the previous stage may reuse them, so our credit
// word in its window becomes h + n (the put path adds n; its team is the
// whole group, pipe_team). The reads must come first. Put: the add is
// ordered after the group's barrier as simple_write's put path orders it.
// LL: a plain store after the barrier, as NCCL's LL protocol returns its
// credit (src/device/prims_ll.h, postRecv: a volatile store of the head,
// no fence) and simple_write's LL ping-pong acknowledges its lines: every
// lane has loaded its lines and compared them before the barrier (the
// loads have returned their values), and the store, issued after, cannot
// take effect before them. The PTX memory model itself promises that only
// of a release; this relies, as NCCL does, on the GPU never letting a
// store overtake loads whose values decided to reach it. A release here
// (a fence) would cost about 0.4 us a chunk on an H200, a third of the
// one-slot round trip.
template <nixl_gpu_level_t L>
__device__ void pipe_credit(const PipeParams &p, const Channel &c, const Team &t, uint64_t h, uint32_t n) {
    t.sync();
    const uint64_t off = p.off_credit + 8ull * c.index;
    if (p.path == PIPE_PATH_PUT) {
        const nixlMemViewElem word{p.remote_mvh, p.stage - 1, off};
        record_status(&p.report->base, nixlAtomicAdd<L>(n, word, c.index));
    } else if (t.rank == 0) {
        store_relaxed_system(reinterpret_cast<uint64_t *>(c.prev + off), h + n);
    }
}

// ------------------------------------------------------ the leader's waits

// The most chunks one handshake covers (`--batch`; the host's default is
// half the ring, so the two ends still overlap: one fills half the ring
// while the other drains the other half, at most PIPE_BATCH; and 1 on the
// line paths, LL and LL128, whose lines are their own ready words: the
// small-chunk, low-latency forms).
__device__ __forceinline__ uint32_t batch_max(const PipeParams &p) {
    return pipe_lines(p.path) ? 1u : max(1u, min(PIPE_BATCH, p.batch));
}

// The leader polls the ready words of chunks h .. h + 7 (up to `most`,
// all loads of a poll in flight together) until chunk h's has arrived,
// then takes every chunk that has, up to the first that has not (reading
// the next eight words while all eight so far had): one handshake for
// them all. Each word's sequence is checked (a later one: the slot was
// overwritten, counted). Returns the count; 0: the wait gave up. (Eight
// at a time whatever the batch: the words a poll holds are registers.)
__device__ uint32_t pipe_arrived(const PipeParams &p, const Channel &c, uint64_t h, uint32_t most) {
    constexpr uint32_t G = 8;  // words a poll has in flight
    uint64_t v[G], start = 0;
    for (;;) {
#pragma unroll
        for (uint32_t j = 0; j < G; ++j) v[j] = j < most ? load_relaxed_system(ready_word(p, p.window, c, h + j)) : 0;
        if (reached(v[0], h + 1)) break;
        if (pipe_stop(p, start, v[0], PIPE_WAIT_READY, h)) return 0;
    }
    uint32_t n = 0, ovw = 0;
    for (uint32_t j0 = 0;; j0 += G) {
#pragma unroll
        for (uint32_t j = 0; j < G; ++j)
            if (n == j0 + j && j0 + j < most && reached(v[j], h + j0 + j + 1)) ++n, ovw += v[j] != h + j0 + j + 1;
        if (n != j0 + G || n >= most) break;
#pragma unroll
        for (uint32_t j = 0; j < G; ++j)
            v[j] = n + j < most ? load_relaxed_system(ready_word(p, p.window, c, h + n + j)) : 0;
    }
    if (ovw != 0) atomicAdd(reinterpret_cast<unsigned long long *>(&p.report->overwrites), ovw);
    fence_acquire(p.same_gpu);
    return n;
}

// The leader waits for room downstream: chunk g needs credit >= g + 1 - S.
// Returns how many of the chunks h, h + 1, ... (up to `most`) have their
// slot free; 0: the wait gave up. The credit last seen usually shows room
// already: only a ring that looked full is read again, and the time spent
// polling goes to the stage's stall (SM clock cycles: %globaltimer reads
// cost about 0.1 us each).
__device__ uint32_t pipe_room(const PipeParams &p, const Channel &c, uint64_t h, uint32_t most, Carry &k) {
    if (h >= p.slots && !reached(k.credit, h + 1 - p.slots)) {
        const uint64_t t0 = clock64();
        k.credit = pipe_wait(p, credit_word(p, p.window, c), h + 1 - p.slots, PIPE_WAIT_CREDIT, h);
        if (h >= p.warmup) k.stall += clock64() - t0;
        if (!reached(k.credit, h + 1 - p.slots)) return 0;
    }
    return uint32_t(min(uint64_t(most), k.credit + p.slots - h));  // chunks h .. credit + S - 1 have a slot
}

// The leader's waits before the batch from chunk h: for its chunks to have
// arrived (not stage 0; simple form: the ready words), for room downstream
// (not the last stage), then the slow stage's delay. Returns the batch's
// size; 0: a wait gave up.
__device__ uint32_t pipe_turn(const PipeParams &p, const Channel &c, uint64_t h, Carry &k) {
    uint32_t n = uint32_t(min(uint64_t(batch_max(p)), p.chunks - h));
    if (p.stage > 0 && !pipe_lines(p.path)) n = pipe_arrived(p, c, h, n);
    if (n != 0 && p.stage + 1 < p.stages) n = pipe_room(p, c, h, n, k);
    if (n != 0 && p.delay_ns != 0) pipe_delay(p.delay_ns * n);
    return n;
}

// ------------------------------------------------------------- the stamps

// Whether chunk g has a stamp (`end` false: arrival, the first timed and
// the last chunk, max over channels; channel 0's start at stage 0 and end
// at the last stage of the first `stamps` timed chunks: the channels run
// apart, so one slice's latency is channel 0's; the last chunk's end).
// Most chunks have none and read no clock.
__device__ bool pipe_stamped(const PipeParams &p, const Channel &c, uint64_t g, bool end) {
    const bool timed = c.index == 0 && g >= p.warmup && g - p.warmup < p.stamps;
    return g + 1 == p.chunks || (end ? p.stage + 1 == p.stages && timed : g == p.warmup || (p.stage == 0 && timed));
}

// The clock for the stamps of chunks h .. h + n - 1, or 0 if none has one.
__device__ uint64_t pipe_clock(const PipeParams &p, const Channel &c, uint64_t h, uint32_t n, bool end) {
    for (uint64_t g = h; g < h + n; ++g)
        if (pipe_stamped(p, c, g, end)) return globaltimer_ns();
    return 0;
}

// Writes the stamps of chunks h .. h + n - 1, taken at `now` (0: none).
__device__ void pipe_stamp(const PipeParams &p, const Channel &c, uint64_t h, uint32_t n, bool end, uint64_t now) {
    if (now == 0) return;
    auto *r = p.report;
    for (uint64_t g = h; g < h + n; ++g) {
        const bool timed = c.index == 0 && g >= p.warmup && g - p.warmup < p.stamps;
        if (!end) {
            if (p.stage == 0 && timed) p.t_start[g - p.warmup] = now;
            if (g == p.warmup) atomicMax(reinterpret_cast<unsigned long long *>(&r->arrive_first), now);
            if (g + 1 == p.chunks) atomicMax(reinterpret_cast<unsigned long long *>(&r->arrive_last), now);
            continue;
        }
        if (p.stage + 1 == p.stages && timed) p.t_end[g - p.warmup] = now;
        if (g + 1 == p.chunks) atomicMax(reinterpret_cast<unsigned long long *>(&r->done_ns), now);
    }
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
    if (p.path == PIPE_PATH_LL128) {
        // Whole warps: a quad of lines is one warp's (at most one warp
        // when the slice is one quad).
        const bool one_quad = ll128_lines(c.len) <= LL128_WARP_LINES;
        return one_quad && kind == TEAM_BLOCK ? Team{G::rank(), 32, TEAM_WARP} : group;
    }
    const uint64_t work = p.path == PIPE_PATH_LL ? c.len / 8 : c.len / 16;
    if (work <= 1) return Team{G::rank(), 1, TEAM_ONE};
    if (work <= 32 && kind == TEAM_BLOCK && G::size() % 32 == 0) return Team{G::rank(), 32, TEAM_WARP};
    return group;
}

// Where this stage writes its slices (simple form), before the slot's
// offset: our staging slots (put), the next stage's slots (store), nowhere
// (the last stage).
__device__ __forceinline__ uint8_t *pipe_dst(const PipeParams &p, const Channel &c) {
    if (p.path == PIPE_PATH_PUT) return p.window + p.off_stage;
    return c.next ? c.next + p.off_ring : nullptr;
}

// The line form of a batch (LL and LL128, always one chunk, h): the lines,
// then the credit (not stage 0) and the stamps, taken where the leader's
// line was stored (stage 0) or had arrived and been checked (ll_slice,
// ll128_slice).
template <nixl_gpu_level_t L>
__device__ bool pipe_ll_chunk(const PipeParams &p, const Channel &c, const Team &t, uint64_t h) {
    const bool last = p.stage + 1 == p.stages;
    const bool stamp = t.rank == 0 && (pipe_stamped(p, c, h, false) || (last && pipe_stamped(p, c, h, true)));
    uint64_t at = 0;
    const bool ok = p.path == PIPE_PATH_LL128 ? ll128_slice(p, c, t, h, stamp, at) : ll_slice(p, c, t, h, stamp, at);
    if (!t.all(ok)) return false;
    if (p.stage > 0) pipe_credit<L>(p, c, t, h, 1);
    if (t.rank != 0) return true;
    if (pipe_stamped(p, c, h, false)) pipe_stamp(p, c, h, 1, false, at);
    pipe_stamp(p, c, h, 1, true, last ? at : pipe_clock(p, c, h, 1, true));
    return true;
}

// One batch through this stage, one team: the leader waits for chunks
// h, h + 1, ... (not stage 0) and for room downstream (not the last
// stage) and says how many it takes; the team moves them, credits
// upstream and forwards, one handshake for all. Returns the batch's
// size; 0 once a wait gave up (which stops the other channels too:
// pipe_stop).
template <nixl_gpu_level_t L>
__device__ uint32_t pipe_batch(const PipeParams &p, const Channel &c, const Team &t, uint64_t h, Carry &k,
                               uint32_t *shared) {
    const bool first = p.stage == 0, last = p.stage + 1 == p.stages, lead = t.rank == 0;
    const uint32_t n = t.share(lead ? pipe_turn(p, c, h, k) : 0, shared);
    if (n == 0) return 0;
    k.handshakes += lead;
    if (pipe_lines(p.path)) return pipe_ll_chunk<L>(p, c, t, h) ? 1 : 0;
    if (lead) pipe_stamp(p, c, h, n, false, pipe_clock(p, c, h, n, false));
    move_batch(p, c, t, h, n, pipe_dst(p, c));
    // The last stage's clock is read now (checked: the chunks are through)
    // and written after the credit, so the credit's fence does not wait
    // for the stamp's store.
    const uint64_t now = lead && last ? pipe_clock(p, c, h, n, true) : 0;
    if (p.path == PIPE_PATH_STORE) store_signal(p, c, t, h, n);
    else if (!first) pipe_credit<L>(p, c, t, h, n);
    if (p.path == PIPE_PATH_PUT && !last) pipe_forward<L>(p, c, h, n);
    if (lead) pipe_stamp(p, c, h, n, true, last ? now : pipe_clock(p, c, h, n, true));
    return n;
}

// The stall (SM clock cycles, pipe_room) in ns: the leader's SM clock
// against %globaltimer over the whole run.
__device__ uint64_t stall_ns(const Carry &k, uint64_t c0, uint64_t t0) {
    const uint64_t dc = clock64() - c0, dt = globaltimer_ns() - t0;
    return dc == 0 ? 0 : uint64_t(double(k.stall) * double(dt) / double(dc));
}

// One kernel per level and path: the path a constant (`q.path`, folded
// into every function above), so each kernel holds only its path's code
// and registers. With the three paths in one kernel, pipe_block spilled.
template <nixl_gpu_level_t L, uint32_t P>
__device__ void pipe_stage(const PipeParams &p) {
    __shared__ uint32_t batch;  // the block team's batch size (Team::share)
    PipeParams q = p;
    q.path = P;
    Channel c;
    if (!pipe_channel<L>(q, c) || c.len == 0) return;  // unmapped neighbour, or no data for this channel
    const Team t = pipe_team<L>(q, c);
    if (t.rank >= t.size) return;  // a lane the slice does not need
    Carry k{0, 0, 0};
    const uint64_t c0 = clock64(), t0 = globaltimer_ns();
    for (uint64_t g = 0, n = 1; g < q.chunks && n != 0; g += n) n = pipe_batch<L>(q, c, t, g, k, &batch);
    if (t.rank == 0) {
        atomicAdd(reinterpret_cast<unsigned long long *>(&q.report->stall_ns), stall_ns(k, c0, t0));
        if (c.index == 0) q.report->handshakes = k.handshakes;
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
// LL128 needs a warp to a quad of lines: no thread-level kernel (the
// host refuses --level thread with --path ll128).
PIPE_ENTRY(pipe_warp_ll128, nixl_gpu_level_t::WARP, PIPE_PATH_LL128)
PIPE_ENTRY(pipe_block_ll128, nixl_gpu_level_t::BLOCK, PIPE_PATH_LL128)
