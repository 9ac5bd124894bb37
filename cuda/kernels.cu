// GPU-initiated write + signal through the NIXL device API (NIXL 1.x).
//
// Compiled by nvcc from build.rs into a fatbin (sm_90 SASS + compute_90 PTX)
// that the Rust host embeds and loads with cudarc. Every kernel is extern "C"
// so the host finds it by name; src/simple_write/kernels.rs mirrors the structs below
// field for field, and the static_asserts here pin what the host assumes.
//
// The pattern, in one sentence: a group of threads (one thread, one warp or
// one block) puts its slice of the source into the peer's buffer with
// nixlPut, makes those stores visible system-wide, then its first thread
// bumps the peer's signal with nixlAtomicAdd; the peer's kernel spins on the signal with
// system-scope acquire loads and, once every group of an iteration has
// signalled, answers with an acknowledgement the sender's kernel waits for.
// KERNEL_GUIDE.md walks through it.

#include <cuda/atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

// NIXL's device header, the clock, signals, the bounded wait, KernelReport.
#include "device_common.cuh"
// The LL line: its store, its load, the bounded poll of one line.
#include "ll.cuh"

// The host passes nixlMemViewElem by value; its layout is part of our ABI.
static_assert(sizeof(nixlMemViewElem) == 24, "nixlMemViewElem changed size");
static_assert(offsetof(nixlMemViewElem, mvh) == 0, "nixlMemViewElem.mvh moved");
static_assert(offsetof(nixlMemViewElem, index) == 8, "nixlMemViewElem.index moved");
static_assert(offsetof(nixlMemViewElem, offset) == 16, "nixlMemViewElem.offset moved");

// Parameters of the initiator's write + signal kernels.
struct WriteParams {
    nixlMemViewElem src;     // local view; index 0 and 1 are the two source buffers
    nixlMemViewElem dst;     // remote view of the target's data buffer (index 0)
    nixlMemViewElem signal;  // remote view of the target's 8-byte signal (index 0)
    uint64_t *ack;           // local 8-byte word the target's kernel increments
    KernelReport *report;
    uint64_t *iter_cycles;   // ping-pong: iters + 2 slots (round trips in SM cycles, then the
                             // clock64 at start and end, to calibrate against %globaltimer)
    uint64_t size;           // bytes per iteration, whole grid
    uint64_t slice;          // bytes per group (a multiple of 16 except for tiny sizes)
    uint64_t ack_base;       // ack value before this launch
    uint64_t timeout_ns;     // give up waiting for an ack after this long
    uint32_t warmup;         // untimed iterations
    uint32_t iters;          // timed iterations
    uint32_t first_iter;     // global index of the first iteration (selects the source buffer)
    uint32_t flags;          // WRITE_* below
    uint32_t stamp_index;    // WRITE_STAMP: slot of iter_cycles that gets %globaltimer at start
    uint32_t slots;          // --hbm kernels: iteration i uses slot i % slots (slot_of below)
    const uint8_t *src_addr[2];  // store path: the two sources, as local pointers
    uint64_t chunk;          // 0: each group puts one contiguous slice; else chunks of this many
                             // bytes dealt round-robin to the groups (see Layout below)
    uint64_t signal_base;    // flag path: iteration `iter` stores signal_base + iter + 1
    uint64_t *phase_cycles;  // nullable; ping-pong: 4 slots per timed iteration (Phases below)
    uint64_t slot_bytes;     // --hbm kernels: bytes from one slot to the next
};
static_assert(sizeof(WriteParams) == 200, "WriteParams layout is shared with the host");
static_assert(offsetof(WriteParams, slot_bytes) == 192, "WriteParams layout is shared with the host");
static_assert(offsetof(WriteParams, phase_cycles) == 184, "WriteParams layout is shared with the host");
static_assert(offsetof(WriteParams, signal_base) == 176, "WriteParams layout is shared with the host");
static_assert(offsetof(WriteParams, src_addr) == 152, "WriteParams layout is shared with the host");
static_assert(offsetof(WriteParams, ack) == 72, "WriteParams layout is shared with the host");
static_assert(offsetof(WriteParams, warmup) == 128, "WriteParams layout is shared with the host");

// Wait for the target's acknowledgement after every iteration (latency).
constexpr uint32_t WRITE_PINGPONG = 1;
// Never spin on the acknowledgement: the host queues stream waits
// (cuStreamWaitValue64) between launches instead. Two processes sharing one
// GPU cannot run kernels at the same time, so a spinning kernel on either
// side would hold the GPU for whole time slices.
constexpr uint32_t WRITE_HOST_SEQUENCED = 2;
// Record %globaltimer at kernel start in iter_cycles[stamp_index].
constexpr uint32_t WRITE_STAMP = 4;
// Both processes use this GPU: a GPU-scope release orders the data before
// the signal for every observer there. Across GPUs only a system-scope
// release does (the default).
constexpr uint32_t WRITE_GPU_SCOPE = 8;

// The scope of the release before a signal (device_common.cuh).
__device__ __forceinline__ bool gpu_scope(uint32_t flags) { return (flags & WRITE_GPU_SCOPE) != 0; }

// Parameters of the target's wait kernel. Iteration i of the round is
// complete when the signal reaches base + (i + 1) * step.
struct WaitParams {
    nixlMemViewElem ack;   // remote view of the initiator's ack word (index 0)
    uint64_t *signal;      // local signal word the initiator increments
    KernelReport *report;
    uint64_t *iter_ns;     // nullable: %globaltimer when each timed iteration completed
    uint64_t base;         // signal value before this round
    uint64_t step;         // signals per iteration (one per group that has data)
    uint64_t timeout_ns;   // give up after this long without reaching a threshold
    uint32_t warmup;
    uint32_t iters;
    uint32_t pong;         // 1: acknowledge every iteration (ping-pong), else after warm-up and at the end
    uint32_t ack_mode;     // ACK_* below
    uint64_t ack_base;     // the initiator's ack word before this round (the flag stores ack_base + n)
    const uint4 *lines;    // LL path: our data buffer, as 16-byte lines
    uint64_t line_count;   // LL path: lines per iteration
    uint32_t first_seq;    // LL path: sequence number of the round's first iteration
    uint32_t reserved;
    uint32_t *done;        // LL128 bandwidth over a grid: [2] blocks past each wait, zeroed per round
};
static_assert(sizeof(WaitParams) == 128, "WaitParams layout is shared with the host");
static_assert(offsetof(WaitParams, ack_base) == 88, "WaitParams layout is shared with the host");
static_assert(offsetof(WaitParams, first_seq) == 112, "WaitParams layout is shared with the host");

// How the target acknowledges. An acknowledgement carries no data, so it
// needs no release: a bare flag (a relaxed store of the new count through
// the peer pointer) is the cheapest answer there is. The put path takes it
// where the transport maps the initiator's memory (cuda_ipc) and falls back
// to nixlAtomicAdd where it maps nothing (RDMA), so it still runs anywhere;
// the store, LL and flag paths need the pointer anyway.
constexpr uint32_t ACK_FLAG_OR_NIXL = 0;
constexpr uint32_t ACK_FLAG = 2;

// The write kernels' data paths (template argument P below; the host's
// Path enum in the same order).
constexpr uint32_t PATH_PUT = 0;    // nixlPut + fence + nixlAtomicAdd
constexpr uint32_t PATH_STORE = 1;  // stores through nixlGetPtr + a release add
constexpr uint32_t PATH_LL = 2;     // LL lines through nixlGetPtr, no fence, no signal
constexpr uint32_t PATH_LL128 = 3;  // LL128 lines through nixlGetPtr, no fence, no signal
constexpr uint32_t PATH_FLAG = 4;   // no data: one relaxed store of a flag (the floor)

// Spin until *word >= threshold, the deadline passes, or the host cancels;
// records the value seen last. Called by one thread. Returns whether the
// threshold was reached.
__device__ bool wait_at_least(const uint64_t *word, uint64_t threshold, uint64_t deadline,
                              KernelReport *r) {
    const uint64_t v = spin_wait(word, threshold, [&](uint64_t) {
        const uint32_t why = wait_expired(r, deadline);
        if (why != 0) r->timed_out = why;
        return why != 0;
    });
    r->observed = v;
    return reached(v, threshold);
}

template <nixl_gpu_level_t L> struct Group;
// THREAD: every thread is a group of one.
template <> struct Group<nixl_gpu_level_t::THREAD> {
    __device__ static unsigned index() { return blockIdx.x * blockDim.x + threadIdx.x; }
    __device__ static unsigned count() { return gridDim.x * blockDim.x; }
    __device__ static unsigned rank() { return 0; }
    __device__ static unsigned size() { return 1; }
    __device__ static void sync() {}
};
// WARP: each warp; every lane calls nixlPut with the same arguments.
template <> struct Group<nixl_gpu_level_t::WARP> {
    __device__ static unsigned index() { return (blockIdx.x * blockDim.x + threadIdx.x) / 32; }
    __device__ static unsigned count() { return gridDim.x * blockDim.x / 32; }
    __device__ static unsigned rank() { return threadIdx.x % 32; }
    __device__ static unsigned size() { return 32; }
    __device__ static void sync() { __syncwarp(); }
};
// BLOCK: each block; every thread of the block calls nixlPut with the same arguments.
template <> struct Group<nixl_gpu_level_t::BLOCK> {
    __device__ static unsigned index() { return blockIdx.x; }
    __device__ static unsigned count() { return gridDim.x; }
    __device__ static unsigned rank() { return threadIdx.x; }
    __device__ static unsigned size() { return blockDim.x; }
    __device__ static void sync() { __syncthreads(); }
};

// Which bytes a group moves in one iteration. Contiguous (chunk == 0): one
// slice per group, an even split rounded up to 16 bytes. Interleaved
// (chunk > 0): chunks of `chunk` bytes dealt round-robin, group g taking
// chunks g, g + G, g + 2G, ...; at any moment the groups then work on
// neighbouring chunks rather than on G regions spread over the buffer,
// which keeps the pages in flight few (the source's and the peer's).
// The host (Round::signals_per_iter) counts the groups with data alike.
struct Layout {
    uint64_t first, step, len, end;  // chunks at first, first+step, ... below end, each len bytes
};

template <nixl_gpu_level_t L>
__device__ Layout layout_of(const WriteParams &p) {
    const uint64_t g = Group<L>::index();
    if (p.chunk == 0) return Layout{g * p.slice, p.size, p.slice, p.size};
    return Layout{g * p.chunk, Group<L>::count() * p.chunk, p.chunk, p.size};
}

// Where a source is read through the read-only path (ld.global.nc, __ldg)
// and why: no kernel writes the sources while it runs (the host fills them
// before the launch). The LL copy gained from it on an H200 (64 MiB:
// 840 -> 1,250 GB/s); the store path's vectors lost (64 MiB: 2,040 ->
// 1,840 GB/s), so they stay plain loads. A small message's only load, the
// tail, is read-only on both paths; what it still costs shows in
// `simple_write --pingpong --breakdown` (the `data` phase).

// The copy of the store path: the group's threads move 16-byte vectors,
// four loads in flight per thread before the stores, then the tail bytes.
template <nixl_gpu_level_t L>
__device__ void group_copy(uint8_t *to, const uint8_t *from, uint64_t len) {
    const unsigned lane = Group<L>::rank(), n = Group<L>::size();
    const uint64_t vecs = len / 16;
    const int4 *src = reinterpret_cast<const int4 *>(from);
    int4 *dst = reinterpret_cast<int4 *>(to);
    uint64_t i = lane;
#pragma unroll 1
    for (; i + 3 * n < vecs; i += 4 * n) {
        const int4 a = src[i], b = src[i + n], c = src[i + 2 * n], d = src[i + 3 * n];
        dst[i] = a;
        dst[i + n] = b;
        dst[i + 2 * n] = c;
        dst[i + 3 * n] = d;
    }
#pragma unroll 1
    for (; i < vecs; i += n) dst[i] = src[i];
    // The tail (under 16 bytes): an 8-byte word if there is one (an 8-byte
    // message is then one store over the link, not eight), then bytes.
    uint64_t b = vecs * 16;
    if (len - b >= 8) {
        if (lane == 0) *reinterpret_cast<uint64_t *>(to + b) = __ldg(reinterpret_cast<const unsigned long long *>(from + b));
        b += 8;
    }
    for (b += lane; b < len; b += n) to[b] = __ldg(from + b);
}

// Where one ping-pong message's time goes on the initiator (`--breakdown`):
// clock64 when the message began, when its data was issued, when the fence
// before the signal returned and when the signal was issued, stored as they
// happen into the iteration's four slots (`at`: null when not recording, or
// not the timing thread). One pointer, not four clocks held in registers:
// the put kernel needs every register it has. A path without a fence or a
// separate signal stamps them together.
struct Phases {
    uint64_t *at = nullptr;
    __device__ void at_data() { if (at) at[1] = at[2] = clock64(); }
    __device__ void at_fence() { if (at) at[2] = clock64(); }
    __device__ void at_signal() { if (at) at[3] = clock64(); }
    __device__ void at_all() { if (at) at[1] = at[2] = at[3] = clock64(); }
};
// Bandwidth rounds stamp nothing: the same calls, compiled away.
struct NoPhases {
    __device__ void at_data() {}
    __device__ void at_fence() {}
    __device__ void at_signal() {}
    __device__ void at_all() {}
};

// One iteration for one group, put path: nixlPut each of the group's
// chunks, then fence and signal once.
// `slot`: where this iteration's bytes start in both the sources and the
// destination (--hbm, slot_of below; else 0).
template <nixl_gpu_level_t L, class Ph>
__device__ void put_and_signal(const WriteParams &p, uint32_t iter, uint64_t slot, Ph &ph) {
    using G = Group<L>;
    const Layout at = layout_of<L>(p);
    if (at.first >= at.end) return;  // more groups than data: this one idles
    // Each group on its own channel, so groups do not serialise on one.
    const unsigned channel = G::index();
    nixlMemViewElem src = p.src;
    src.index = iter & 1;  // alternate sources: a stale iteration cannot pass verification
    nixlMemViewElem dst = p.dst;
    for (uint64_t off = at.first; off < at.end; off += at.step) {
        src.offset = slot + off;
        dst.offset = p.dst.offset + slot + off;
        record_status(p.report, nixlPut<L>(src, dst, min(at.len, at.end - off), channel));
    }
    ph.at_data();
    // On cuda_ipc a put is plain stores by the calling threads, and the
    // atomic add orders nothing before it (UCX fences *after* the add). So:
    // the group syncs, which orders every member's stores before what its
    // first thread does next; that thread alone issues a system-scope
    // release fence, which is cumulative (the stores it has synchronized
    // with become visible to the peer first), and the add at thread level.
    // A group-level add would fence in every member and hold the whole
    // group at a barrier behind UCX's trailing fence; at thread level the
    // other members start the next iteration's copy meanwhile.
    G::sync();
    if (G::rank() == 0) {
        fence_release(gpu_scope(p.flags));
        ph.at_fence();
        record_status(p.report, nixlAtomicAdd<nixl_gpu_level_t::THREAD>(1, p.signal, channel));
    }
    ph.at_signal();
}

// The peer's memory as a pointer in our address space (cuda_ipc maps it),
// or null where the transport maps nothing (RDMA).
__device__ __forceinline__ uint8_t *peer_ptr(const nixlMemViewElem &e) {
    uint8_t *base = static_cast<uint8_t *>(nixlGetPtr(e.mvh, e.index));
    return base == nullptr ? nullptr : base + e.offset;
}

// One iteration for one group, store path: plain vector stores through the
// peer pointer, then one release add on the peer's signal. Same layout,
// same signal count as the put path.
template <nixl_gpu_level_t L, class Ph>
__device__ void store_and_signal(const WriteParams &p, uint32_t iter, uint64_t slot, uint8_t *dst,
                                 unsigned long long *signal, Ph &ph) {
    using G = Group<L>;
    const Layout at = layout_of<L>(p);
    if (at.first >= at.end) return;
    const uint8_t *src = p.src_addr[iter & 1] + slot;
    dst += slot;
    for (uint64_t off = at.first; off < at.end; off += at.step) {
        group_copy<L>(dst + off, src + off, min(at.len, at.end - off));
    }
    ph.at_data();
    // Sync, then one thread's release: cumulative over the stores of every
    // member it synchronized with, so the data is visible before the count.
    G::sync();
    if (G::rank() == 0) release_add(reinterpret_cast<uint64_t *>(signal), 1, gpu_scope(p.flags));
    ph.at_signal();
}

// Up to 4 bytes at p as a little-endian word, zero-padded: one aligned
// load when all 4 are there (p is 4-byte aligned), else byte loads. Kept in
// registers: an array indexed at run time would live in local memory and
// add its latency to every small message.
__device__ __forceinline__ uint32_t tail_word(const uint8_t *p, int64_t n) {
    if (n >= 4) return __ldg(reinterpret_cast<const unsigned int *>(p));
    uint32_t w = 0;
#pragma unroll
    for (int j = 0; j < 3; ++j) {
        if (j < n) w |= uint32_t(__ldg(p + j)) << (8 * j);
    }
    return w;
}

// The LL copy: each thread loads 16 payload bytes and writes them as two
// lines (32 contiguous bytes), four loads in flight per thread, then one
// lane writes the zero-padded tail (under 16 bytes, the last group only).
template <nixl_gpu_level_t L>
__device__ void ll_copy(uint4 *lines, const uint8_t *from, uint64_t len, uint32_t seq) {
    const unsigned lane = Group<L>::rank(), n = Group<L>::size();
    const uint64_t vecs = len / 16;
    const uint4 *src = reinterpret_cast<const uint4 *>(from);
    uint64_t i = lane;
#pragma unroll 1
    for (; i + 3 * n < vecs; i += 4 * n) {
        const uint4 v[4] = {__ldg(src + i), __ldg(src + i + n), __ldg(src + i + 2 * n), __ldg(src + i + 3 * n)};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            ll_store(lines + 2 * (i + k * n), v[k].x, v[k].y, seq);
            ll_store(lines + 2 * (i + k * n) + 1, v[k].z, v[k].w, seq);
        }
    }
#pragma unroll 1
    for (; i < vecs; i += n) {
        const uint4 v = __ldg(src + i);
        ll_store(lines + 2 * i, v.x, v.y, seq);
        ll_store(lines + 2 * i + 1, v.z, v.w, seq);
    }
    const uint64_t done = vecs * 16;
    if (lane == 0 && done < len) {
        const uint8_t *t = from + done;  // 16-byte aligned
        const int64_t rest = len - done;
        ll_store(lines + 2 * vecs, tail_word(t, rest), tail_word(t + 4, rest - 4), seq);
        if (rest > 8) ll_store(lines + 2 * vecs + 1, tail_word(t + 8, rest - 8), tail_word(t + 12, rest - 12), seq);
    }
}

// A ping-pong's messages are known in advance, so the next one can be read
// while this one's acknowledgement is awaited (ping_pong's `Ahead`): read()
// loads message `iter` into registers, send() stores it stamped with `seq`.
// NoAhead reads inside the round trip (the path's iteration).
struct NoAhead {
    static constexpr bool kOn = false;
    __device__ void read(const WriteParams &, uint32_t) {}
    __device__ void send(uint8_t *, uint32_t) const {}
};
// LL, a message of one line (up to 8 bytes): its two 4-byte halves,
// zero-padded, stored by the one thread that has the line.
struct LlAhead {
    static constexpr bool kOn = true;
    uint32_t lo = 0, hi = 0;
    __device__ void read(const WriteParams &p, uint32_t iter) {
        const uint8_t *src = p.src_addr[iter & 1];
        lo = tail_word(src, p.size);
        hi = tail_word(src + 4, int64_t(p.size) - 4);
    }
    __device__ void send(uint8_t *dst, uint32_t seq) const { ll_store(reinterpret_cast<uint4 *>(dst), lo, hi, seq); }
};

// One iteration for one group, LL path: the group's payload as lines
// stamped with this iteration's seq. Nothing follows: no sync, no fence,
// no signal; the lines are the signal. (A spinning ping-pong takes
// shorter ways: line_ping_pong below.)
template <nixl_gpu_level_t L>
__device__ void ll_write(const WriteParams &p, uint32_t iter, uint4 *lines) {
    const Layout at = layout_of<L>(p);
    if (at.first >= at.end) return;
    const uint8_t *src = p.src_addr[iter & 1];
    const uint32_t seq = iter + 1;
    for (uint64_t off = at.first; off < at.end; off += at.step) {
        ll_copy<L>(lines + off / 8, src + off, min(at.len, at.end - off), seq);
    }
}

// Whether this thread stores any line of its group's message (ll_copy:
// lane i takes 16-byte vectors i, i + n, ...; lane 0 also the tail).
template <nixl_gpu_level_t L>
__device__ bool ll_has_lines(const WriteParams &p) {
    if (p.size <= 8) return Group<L>::index() == 0 && Group<L>::rank() == 0;
    const Layout at = layout_of<L>(p);
    if (at.first >= at.end) return false;
    const uint64_t vecs = min(at.len, at.end - at.first) / 16;
    return Group<L>::rank() < max(vecs, uint64_t(1));
}

// Up to 8 payload bytes at byte `o` of a message of `len` bytes as one
// little-endian word, zero-padded (o is 8-byte aligned): one read-only
// 8-byte load when all 8 are there, else tail_word's.
__device__ __forceinline__ uint64_t payload_word(const uint8_t *src, uint64_t o, uint64_t len) {
    if (o + 8 <= len) return __ldg(reinterpret_cast<const unsigned long long *>(src + o));
    if (o >= len) return 0;
    const int64_t n = int64_t(len - o);
    return uint64_t(tail_word(src + o, n)) | (uint64_t(tail_word(src + o + 4, n - 4)) << 32);
}

// Which LL128 lines a group writes in one iteration: Layout's split in
// lines, not bytes, so that no line is shared by two groups. Contiguous
// (chunk == 0): an even split of the lines; interleaved: chunks of
// chunk / 128 lines (a chunk of wire bytes) dealt round-robin.
template <nixl_gpu_level_t L>
__device__ Layout ll128_layout_of(const WriteParams &p) {
    const uint64_t n = ll128_lines(p.size), g = Group<L>::index(), groups = Group<L>::count();
    if (p.chunk == 0) {
        const uint64_t per = (n + groups - 1) / groups;
        return Layout{g * per, n, per, n};
    }
    const uint64_t c = max(p.chunk / LL128_LINE_BYTES, uint64_t(1));
    return Layout{g * c, groups * c, c, n};
}

// The LL128 copy of lines [first, first + count) of a message of `len`
// bytes: each warp of the group takes four lines at a time (one store
// instruction, ll.cuh), four such quads in flight per warp. Lane 8j + c of
// a warp loads payload bytes 16c.. of its line j and stores them with one
// 16-byte store; lane 8j + 7 stores the line's last 8 bytes and the flag.
// The loop runs alike on every lane of a warp and the warp meets before
// its stores, so the eight lanes of a line store in one instruction (the
// tail's loads may take the lanes apart).
template <nixl_gpu_level_t L>
__device__ void ll128_copy(uint8_t *lines, const uint8_t *src, uint64_t len, uint64_t first, uint64_t count,
                           uint32_t seq) {
    constexpr int kQuads = 4;
    const unsigned t = Group<L>::rank(), warps = Group<L>::size() / 32;
    const unsigned warp = t / 32, line_of_lane = (t % 32) / LL128_LANES, part = t % LL128_LANES;
    const uint64_t flag = ll128_flag(seq);
#pragma unroll 1
    for (uint64_t q = warp; q * LL128_WARP_LINES < count; q += kQuads * warps) {
        uint64_t lo[kQuads], hi[kQuads];
        bool mine[kQuads];
        // Lines past the last one this pass covers: when all are in the
        // range and full, every load is a plain 8-byte one (the same for
        // the whole warp, so no lane branches apart from the others).
        const uint64_t past = (q + (kQuads - 1) * warps + 1) * LL128_WARP_LINES;
        const bool whole = past <= count && (first + past) * LL128_PAYLOAD <= len;
#pragma unroll
        for (int u = 0; u < kQuads; ++u) {
            const uint64_t k = (q + u * warps) * LL128_WARP_LINES + line_of_lane;  // line in the range
            const uint64_t o = (first + k) * LL128_PAYLOAD + 16 * part;
            const unsigned long long *w = reinterpret_cast<const unsigned long long *>(src + o);
            mine[u] = whole || k < count;
            if (whole) {
                lo[u] = __ldg(w);
                hi[u] = part == LL128_LANES - 1 ? flag : __ldg(w + 1);
            } else {
                lo[u] = mine[u] ? payload_word(src, o, len) : 0;
                hi[u] = part == LL128_LANES - 1 ? flag : (mine[u] ? payload_word(src, o + 8, len) : 0);
            }
        }
        __syncwarp();
#pragma unroll
        for (int u = 0; u < kQuads; ++u) {
            const uint64_t k = (q + u * warps) * LL128_WARP_LINES + line_of_lane;
            if (mine[u]) {
                ll128_store(reinterpret_cast<uint4 *>(lines + (first + k) * LL128_LINE_BYTES + 16 * part), lo[u],
                            hi[u]);
            }
        }
    }
}

// Whether this thread's warp stores any line of its group's first range
// (ll128_copy: warp w takes the quads w, w + warps, ...).
template <nixl_gpu_level_t L>
__device__ bool ll128_warp_has_lines(const WriteParams &p) {
    const Layout at = ll128_layout_of<L>(p);
    if (at.first >= at.end) return false;
    return uint64_t(Group<L>::rank() / 32) * LL128_WARP_LINES < min(at.len, at.end - at.first);
}

// One iteration for one group, LL128 path: the group's lines stamped with
// this iteration's seq. As on the LL path nothing follows: the lines are
// the signal.
template <nixl_gpu_level_t L>
__device__ void ll128_write(const WriteParams &p, uint32_t iter, uint8_t *lines) {
    const Layout at = ll128_layout_of<L>(p);
    const uint8_t *src = p.src_addr[iter & 1];
    for (uint64_t k = at.first; k < at.end; k += at.step) {
        ll128_copy<L>(lines, src, p.size, k, min(at.len, at.end - k), iter + 1);
    }
}

// One iteration of the floor: no data, one thread stores the flag (the
// peer's signal word) with a relaxed store. Nothing is cheaper.
__device__ void flag_write(const WriteParams &p, uint32_t iter, unsigned long long *signal) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    store_relaxed_system(reinterpret_cast<uint64_t *>(signal), p.signal_base + iter + 1);
}

// --hbm: iteration `iter` reads and writes slot iter % slots of sources and
// a destination that each span at least twice the L2 cache (the host sizes
// them, Round::slots), so a slot has left the cache before it comes round
// again and the round measures HBM. Put and store paths only.
__device__ __forceinline__ uint64_t slot_of(const WriteParams &p, uint32_t iter) {
    return uint64_t(iter % p.slots) * p.slot_bytes;
}

// One iteration on the round's path (PATH_* above); kSlots: --hbm.
template <nixl_gpu_level_t L, uint32_t P, bool kSlots = false>
struct Path {
    static constexpr bool kDst = P == PATH_STORE || P == PATH_LL || P == PATH_LL128;
    static constexpr bool kSignal = P == PATH_STORE || P == PATH_FLAG;
    uint8_t *dst;
    unsigned long long *signal;
    __device__ explicit Path(const WriteParams &p)
        : dst(kDst ? peer_ptr(p.dst) : nullptr),
          signal(kSignal ? reinterpret_cast<unsigned long long *>(peer_ptr(p.signal)) : nullptr) {}
    // Whether the path can run here (all but the put path need peer
    // pointers; LL128 needs whole warps to write its lines).
    __device__ bool usable(const WriteParams &p) const {
        const bool warps = P != PATH_LL128 || (L != nixl_gpu_level_t::THREAD && Group<L>::size() % 32 == 0);
        if (warps && (!kDst || dst != nullptr) && (!kSignal || signal != nullptr)) return true;
        if (threadIdx.x == 0 && blockIdx.x == 0) record_status(p.report, NIXL_ERR_NOT_SUPPORTED);
        return false;
    }
    template <class Ph>
    __device__ void iteration(const WriteParams &p, uint32_t iter, Ph &ph) const {
        const uint64_t slot = kSlots ? slot_of(p, iter) : 0;
        if (P == PATH_PUT) put_and_signal<L>(p, iter, slot, ph);
        if (P == PATH_STORE) store_and_signal<L>(p, iter, slot, dst, signal, ph);
        if (P == PATH_LL) ll_write<L>(p, iter, reinterpret_cast<uint4 *>(dst));
        if (P == PATH_LL128) ll128_write<L>(p, iter, dst);
        if (P == PATH_FLAG) flag_write(p, iter, signal);
        if (P == PATH_LL || P == PATH_LL128 || P == PATH_FLAG) ph.at_all();
    }
};

// Waits (one thread per block) for the ack to reach `target`; the block then
// proceeds together. Returns false on timeout.
__device__ bool block_wait_ack(const WriteParams &p, uint64_t target, uint64_t deadline) {
    __shared__ int ok;
    if (threadIdx.x == 0) ok = wait_at_least(p.ack, target, deadline, p.report);
    __syncthreads();
    return ok;
}

// Bandwidth: every group streams its slice `iters` times without waiting;
// the target acknowledges once after warm-up and once at the end.
template <nixl_gpu_level_t L, uint32_t P, bool kS>
__device__ void stream_rounds(const WriteParams &p, const Path<L, P, kS> &path, uint64_t deadline) {
    const bool timer = blockIdx.x == 0 && threadIdx.x == 0;
    const bool spin = !(p.flags & WRITE_HOST_SEQUENCED);
    uint64_t ack_target = p.ack_base;
    NoPhases none;

    for (uint32_t i = 0; i < p.warmup; ++i) path.iteration(p, p.first_iter + i, none);
    if (p.iters == 0) return;  // host-sequenced warm-up launch
    if (p.warmup > 0 && spin) {
        // The target acknowledges once every group's warm-up signals have
        // landed: a grid-wide barrier that also excludes warm-up from timing.
        if (!block_wait_ack(p, ++ack_target, deadline)) return;
    }
    if (timer) p.report->t_start_ns = globaltimer_ns();
    for (uint32_t i = 0; i < p.iters; ++i) path.iteration(p, p.first_iter + p.warmup + i, none);
    // Bandwidth stops when the receiver has everything, which we learn from
    // its acknowledgement (one extra one-way signal latency, see the guide).
    // Host-sequenced: a stream wait and nixl_stamp take that role.
    if (spin && blockIdx.x == 0) {
        if (block_wait_ack(p, ++ack_target, deadline) && timer) p.report->t_end_ns = globaltimer_ns();
    }
}

// Ping-pong's wait for the acknowledgement: every thread polls the word
// itself. A block barrier after one thread's wait puts the barrier's cost
// (and a warp diverged around it) into every round trip; with every warp
// polling one word, the floor row (this loop too) went from 0.36 to
// 0.30 us a half round trip in one call on an H200. Only thread 0
// writes the report. A thread that gives up at the deadline exits; the
// barriers of the next iteration wait for non-exited threads only, and
// every later wait gives up at once, so the block ends together.
__device__ bool each_wait_ack(const WriteParams &p, uint64_t target, uint64_t deadline) {
    const bool lead = threadIdx.x == 0 && blockIdx.x == 0;
    const uint64_t v = spin_wait(p.ack, target, [&](uint64_t) {
        const uint32_t why = wait_expired(p.report, deadline);
        if (why != 0 && lead) p.report->timed_out = why;
        return why != 0;
    });
    if (!reached(v, target) && lead) p.report->observed = v;
    return reached(v, target);
}

// Latency: one group puts and signals, then waits for the target's
// acknowledgement before the next iteration; each round trip is timed with
// clock64 (cycle resolution), calibrated against %globaltimer by the host.
// The floor row runs this same loop with a bare flag as the message, so
// every row's round trip is timed between the same two clock reads: before
// the message's first instruction and after its acknowledgement is seen.
//
// Ahead (LlAhead, Ll128Ahead: a message of one pass): the next message's
// payload is read while the ack of this one is awaited, so a round trip
// holds the lines' stores, as the floor's holds the flag's, and not the
// loads before them. The store and put paths read theirs inside the round
// trip (NoAhead).
template <nixl_gpu_level_t L, uint32_t P, class Ahead, bool kS>
__device__ void ping_pong(const WriteParams &p, const Path<L, P, kS> &path, uint64_t deadline) {
    const bool timer = threadIdx.x == 0;
    const uint32_t total = p.warmup + p.iters;
    uint64_t c_start = 0;
    Phases ph;
    Ahead next;
    next.read(p, p.first_iter);
    for (uint32_t i = 0; i < total; ++i) {
        if (i == p.warmup && timer) {
            p.report->t_start_ns = globaltimer_ns();
            c_start = clock64();
        }
        const bool stamp = timer && p.phase_cycles != nullptr && i >= p.warmup;
        ph.at = stamp ? p.phase_cycles + 4 * uint64_t(i - p.warmup) : nullptr;
        const uint64_t c0 = clock64();
        if (stamp) ph.at[0] = c0;
        if (Ahead::kOn) {
            next.send(path.dst, p.first_iter + i + 1);
            ph.at_all();
            if (i + 1 < total) next.read(p, p.first_iter + i + 1);
        } else {
            path.iteration(p, p.first_iter + i, ph);
        }
        if (!each_wait_ack(p, p.ack_base + i + 1, deadline)) return;
        const uint64_t c1 = clock64();
        if (timer && i >= p.warmup) p.iter_cycles[i - p.warmup] = c1 - c0;
    }
    if (timer) {
        p.report->observed = p.ack_base + total;
        p.report->t_end_ns = globaltimer_ns();
        p.iter_cycles[p.iters] = c_start;
        p.iter_cycles[p.iters + 1] = clock64();
    }
}

template <nixl_gpu_level_t L, uint32_t P, bool kSlots = false>
__device__ void write_signal(const WriteParams &p) {
    const uint64_t deadline = globaltimer_ns() + p.timeout_ns;
    if ((p.flags & WRITE_STAMP) && blockIdx.x == 0 && threadIdx.x == 0) {
        p.iter_cycles[p.stamp_index] = globaltimer_ns();
    }
    const Path<L, P, kSlots> path(p);
    if (!path.usable(p)) return;
    if ((p.flags & WRITE_PINGPONG) && !(p.flags & WRITE_HOST_SEQUENCED)) {
        ping_pong<L, P, NoAhead, kSlots>(p, path, deadline);
    } else {
        // Host-sequenced ping-pong is one iteration per launch.
        stream_rounds<L, P>(p, path, deadline);
    }
}

// LL128, a message whose lines the group's warps store in one pass (at
// most one quad, four lines, per warp; ll128_copy's first pass): this
// lane's 16 bytes of its line, the flag half stamped at send().
template <nixl_gpu_level_t L>
struct Ll128Ahead {
    static constexpr bool kOn = true;
    uint64_t lo = 0, hi = 0;
    uint64_t at = 0;  // this lane's 16 bytes in the lines
    bool mine = false, flag = false;  // flag: the lane holds its line's flag
    __device__ void read(const WriteParams &p, uint32_t iter) {
        const Layout g = ll128_layout_of<L>(p);
        const unsigned t = Group<L>::rank(), part = t % LL128_LANES;
        const uint64_t k = (t / 32) * LL128_WARP_LINES + (t % 32) / LL128_LANES;  // line in the range
        mine = g.first < g.end && k < min(g.len, g.end - g.first);
        flag = part == LL128_LANES - 1;
        const uint8_t *src = p.src_addr[iter & 1];
        const uint64_t o = (g.first + k) * LL128_PAYLOAD + 16 * part;
        lo = mine ? payload_word(src, o, p.size) : 0;
        hi = mine && !flag ? payload_word(src, o + 8, p.size) : 0;
        at = (g.first + k) * LL128_LINE_BYTES + 16 * part;
    }
    __device__ void send(uint8_t *lines, uint32_t seq) const {
        // The eight lanes of a line store in one instruction (ll128_copy).
        __syncwarp();
        if (mine) ll128_store(reinterpret_cast<uint4 *>(lines + at), lo, flag ? ll128_flag(seq) : hi);
    }
};

// Whether the group's lines fit one pass of its warps (Ll128Ahead): a
// ping-pong message of up to 480 bytes a warp, in one range.
template <nixl_gpu_level_t L>
__device__ bool ll128_one_pass(const WriteParams &p) {
    const Layout g = ll128_layout_of<L>(p);
    return g.first >= g.end ||
           (g.first + g.step >= g.end && min(g.len, g.end - g.first) <= LL128_WARP_LINES * (Group<L>::size() / 32));
}

// The line paths' spinning ping-pong has kernels of its own
// (nixl_ll_pingpong_*, nixl_ll128_pingpong_*), with the shortcuts for
// small messages. Built into write_signal, the same shortcuts changed how
// the bandwidth kernels' copy loop compiled (its source unchanged), and LL
// lost a third of its bandwidth at 16-64 MiB on an H200. The host picks
// the kernel (Kernels::launch_write).
template <nixl_gpu_level_t L, uint32_t P>
__device__ void line_ping_pong(const WriteParams &p) {
    const uint64_t deadline = globaltimer_ns() + p.timeout_ns;
    const Path<L, P> path(p);
    if (!path.usable(p)) return;
    if (!(p.flags & WRITE_PINGPONG) || (p.flags & WRITE_HOST_SEQUENCED)) {
        // Spinning ping-pong only: the host launched the wrong kernel.
        if (threadIdx.x == 0 && blockIdx.x == 0) record_status(p.report, NIXL_ERR_INVALID_PARAM);
        return;
    }
    // A thread (LL128: a warp) without a line of the message has nothing
    // to send, and nothing waits for it: it leaves rather than poll the
    // ack beside the one that times (thread 0 always has a line). A
    // message read ahead gets its own copy of the loop, so the payload in
    // registers does not take them from the other.
    if constexpr (P == PATH_LL) {
        if (!ll_has_lines<L>(p)) return;
        if (p.size <= 8) ping_pong<L, P, LlAhead, false>(p, path, deadline);
        else ping_pong<L, P, NoAhead, false>(p, path, deadline);
    } else {
        if (!ll128_warp_has_lines<L>(p)) return;
        if (ll128_one_pass<L>(p)) ping_pong<L, P, Ll128Ahead<L>, false>(p, path, deadline);
        else ping_pong<L, P, NoAhead, false>(p, path, deadline);
    }
}

// Put path: nixlPut + nixlAtomicAdd. Every write kernel is bounded to 64
// registers a thread (__launch_bounds__(1024)): at 80, as the store and
// check code otherwise compiles, an SM holds one 512-thread block instead
// of two, and the grid that keeps NVLink busy halves.
#define WRITE_KERNEL extern "C" __global__ void __launch_bounds__(1024)
WRITE_KERNEL nixl_write_signal_thread(WriteParams p) {
    write_signal<nixl_gpu_level_t::THREAD, PATH_PUT>(p);
}
WRITE_KERNEL nixl_write_signal_warp(WriteParams p) {
    write_signal<nixl_gpu_level_t::WARP, PATH_PUT>(p);
}
WRITE_KERNEL nixl_write_signal_block(WriteParams p) {
    write_signal<nixl_gpu_level_t::BLOCK, PATH_PUT>(p);
}
// Store path: nixlGetPtr + vector stores + a release add.
WRITE_KERNEL nixl_store_signal_thread(WriteParams p) {
    write_signal<nixl_gpu_level_t::THREAD, PATH_STORE>(p);
}
WRITE_KERNEL nixl_store_signal_warp(WriteParams p) {
    write_signal<nixl_gpu_level_t::WARP, PATH_STORE>(p);
}
WRITE_KERNEL nixl_store_signal_block(WriteParams p) {
    write_signal<nixl_gpu_level_t::BLOCK, PATH_STORE>(p);
}

// --hbm (slot_of above): the put and store paths rotating through slots.
WRITE_KERNEL nixl_write_signal_hbm_thread(WriteParams p) {
    write_signal<nixl_gpu_level_t::THREAD, PATH_PUT, true>(p);
}
WRITE_KERNEL nixl_write_signal_hbm_warp(WriteParams p) {
    write_signal<nixl_gpu_level_t::WARP, PATH_PUT, true>(p);
}
WRITE_KERNEL nixl_write_signal_hbm_block(WriteParams p) {
    write_signal<nixl_gpu_level_t::BLOCK, PATH_PUT, true>(p);
}
WRITE_KERNEL nixl_store_signal_hbm_thread(WriteParams p) {
    write_signal<nixl_gpu_level_t::THREAD, PATH_STORE, true>(p);
}
WRITE_KERNEL nixl_store_signal_hbm_warp(WriteParams p) {
    write_signal<nixl_gpu_level_t::WARP, PATH_STORE, true>(p);
}
WRITE_KERNEL nixl_store_signal_hbm_block(WriteParams p) {
    write_signal<nixl_gpu_level_t::BLOCK, PATH_STORE, true>(p);
}

// LL path: nixlGetPtr + 16-byte lines that carry their own flag. Bandwidth
// (and host-sequenced ping-pong), then the spinning ping-pong.
WRITE_KERNEL nixl_ll_write_thread(WriteParams p) {
    write_signal<nixl_gpu_level_t::THREAD, PATH_LL>(p);
}
WRITE_KERNEL nixl_ll_write_warp(WriteParams p) {
    write_signal<nixl_gpu_level_t::WARP, PATH_LL>(p);
}
WRITE_KERNEL nixl_ll_write_block(WriteParams p) {
    write_signal<nixl_gpu_level_t::BLOCK, PATH_LL>(p);
}
// LL128 path: nixlGetPtr + 128-byte lines, one warp store per four lines.
// The thread-level kernel refuses (NIXL_ERR_NOT_SUPPORTED): one thread
// cannot store a line at once. Ping-pong runs write_signal's loop.
WRITE_KERNEL nixl_ll128_write_thread(WriteParams p) {
    write_signal<nixl_gpu_level_t::THREAD, PATH_LL128>(p);
}
WRITE_KERNEL nixl_ll128_write_warp(WriteParams p) {
    write_signal<nixl_gpu_level_t::WARP, PATH_LL128>(p);
}
WRITE_KERNEL nixl_ll128_write_block(WriteParams p) {
    write_signal<nixl_gpu_level_t::BLOCK, PATH_LL128>(p);
}
WRITE_KERNEL nixl_ll_pingpong_thread(WriteParams p) {
    line_ping_pong<nixl_gpu_level_t::THREAD, PATH_LL>(p);
}
WRITE_KERNEL nixl_ll_pingpong_warp(WriteParams p) {
    line_ping_pong<nixl_gpu_level_t::WARP, PATH_LL>(p);
}
WRITE_KERNEL nixl_ll_pingpong_block(WriteParams p) {
    line_ping_pong<nixl_gpu_level_t::BLOCK, PATH_LL>(p);
}
// The thread-level kernel refuses, as nixl_ll128_write_thread does.
WRITE_KERNEL nixl_ll128_pingpong_thread(WriteParams p) {
    line_ping_pong<nixl_gpu_level_t::THREAD, PATH_LL128>(p);
}
WRITE_KERNEL nixl_ll128_pingpong_warp(WriteParams p) {
    line_ping_pong<nixl_gpu_level_t::WARP, PATH_LL128>(p);
}
WRITE_KERNEL nixl_ll128_pingpong_block(WriteParams p) {
    line_ping_pong<nixl_gpu_level_t::BLOCK, PATH_LL128>(p);
}
// The floor: a bare flag, one thread.
WRITE_KERNEL nixl_flag_write(WriteParams p) {
    write_signal<nixl_gpu_level_t::THREAD, PATH_FLAG>(p);
}

// Host-sequenced waits end in this one-thread kernel: it records when the
// stream wait before it was satisfied (which = 0: t_start, 1: t_end) and the
// value of `word` then.
extern "C" __global__ void nixl_stamp(KernelReport *r, const uint64_t *word, uint32_t which) {
    const uint64_t now = globaltimer_ns();
    if (which == 0) r->t_start_ns = now;
    if (which == 1) r->t_end_ns = now;
    r->observed = load_acquire(word);
}

// The target's acknowledgement when host-sequenced: a stream wait on the
// signal, then this kernel puts +1 into the initiator's ack word (and stamps
// as nixl_stamp does; which = 2 stamps nothing).
extern "C" __global__ void nixl_ack(nixlMemViewElem ack, KernelReport *r, const uint64_t *signal, uint32_t which) {
    const uint64_t now = globaltimer_ns();
    if (which == 0) r->t_start_ns = now;
    if (which == 1) r->t_end_ns = now;
    r->observed = load_acquire(signal);
    record_status(r, nixlAtomicAdd<nixl_gpu_level_t::THREAD>(1, ack));
}

// The target's acknowledgement (ACK_* above). Sent by one thread; counts
// what it sent, so the flag can carry the new total.
struct Ack {
    unsigned long long *ptr;
    uint64_t sent = 0;
    __device__ explicit Ack(const WaitParams &p)
        : ptr(reinterpret_cast<unsigned long long *>(peer_ptr(p.ack))) {}
    __device__ bool usable(const WaitParams &p) const { return p.ack_mode != ACK_FLAG || ptr != nullptr; }
    __device__ void send(const WaitParams &p) {
        ++sent;
        if (ptr == nullptr) {
            record_status(p.report, nixlAtomicAdd<nixl_gpu_level_t::THREAD>(1, p.ack));
            return;
        }
        store_relaxed_system(reinterpret_cast<uint64_t *>(ptr), p.ack_base + sent);
    }
};

// The target, one thread: follows the signal iteration by iteration,
// timestamps each completed timed iteration, and acknowledges after the
// warm-up and at the end (or, in ping-pong, after every iteration).
// Launched <<<1, 1>>>.
extern "C" __global__ void nixl_wait_signal(WaitParams p) {
    const uint64_t deadline = globaltimer_ns() + p.timeout_ns;
    const uint32_t total = p.warmup + p.iters;
    Ack ack(p);
    if (!ack.usable(p)) {
        record_status(p.report, NIXL_ERR_NOT_SUPPORTED);
        return;
    }
    for (uint32_t i = 0; i < total; ++i) {
        if (i == p.warmup) {
            if (p.warmup > 0 && !p.pong) ack.send(p);
            p.report->t_start_ns = globaltimer_ns();
        }
        if (!wait_at_least(p.signal, p.base + uint64_t(i + 1) * p.step, deadline, p.report)) return;
        // Ping-pong: answer first, bookkeeping after; the answer is the
        // latency-critical path.
        if (p.pong && i + 1 < total) ack.send(p);
        if (i >= p.warmup && p.iter_ns) p.iter_ns[i - p.warmup] = globaltimer_ns();
    }
    // Acquire: the data (read by the host once this kernel is done) is
    // ordered after the signal count we saw. Then the final acknowledgement.
    fence_acquire(false);
    p.report->t_end_ns = globaltimer_ns();
    ack.send(p);
}

// Where a wait on lines gave up: why (wait_expired), and the oldest seq
// this thread saw on a line that was not there yet.
__device__ void record_lines_expired(KernelReport *r, uint32_t why, const uint4 &v) {
    r->observed = min(v.y, v.w);
    r->timed_out = why;
}

// The block polls every line of the iteration, each thread its own
// (strided, so a warp reads contiguous lines), four at a time: the four
// loads are in flight together, and only a line not there yet is polled
// again. Each warp polls as one (a vote per poll, over all 32 lanes: the
// host launches whole warps), so no lane spins apart from its warp; a block
// barrier follows only where there is more than one warp. A ping-pong
// message of up to 32 lines has one (a stand-alone probe on an H200 put
// that barrier at about 0.1 us a message). True when all carry `seq`.
__device__ bool block_wait_lines(const WaitParams &p, uint32_t seq, uint64_t deadline) {
    const uint64_t n = p.line_count, stride = blockDim.x;
    bool ok = true;
    for (uint64_t base = 0; ok && base < n; base += 4 * stride) {
        const uint64_t k = base + threadIdx.x;
        uint4 v[4];
        bool ready[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const bool mine = k + j * stride < n;
            if (mine) v[j] = ll_load(p.lines + k + j * stride);
            ready[j] = !mine || ll_ready(v[j], seq);
        }
        for (uint32_t polls = 1; __any_sync(~0u, !(ready[0] && ready[1] && ready[2] && ready[3])); ++polls) {
            const uint32_t why = (polls & 63) == 0 ? wait_expired(p.report, deadline) : 0;
            if (__any_sync(~0u, why != 0)) {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    if (!ready[j]) record_lines_expired(p.report, why != 0 ? why : 1, v[j]);
                }
                ok = false;
                break;
            }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (!ready[j]) {
                    v[j] = ll_load(p.lines + k + j * stride);
                    ready[j] = ll_ready(v[j], seq);
                }
            }
        }
    }
    return blockDim.x > 32 ? __syncthreads_and(ok) : ok;
}

// Ping-pong, at most one line per thread: each thread polls its own line
// as spin_wait polls a word (a load and a compare), and the block meets
// once, after. A thread past the last line polls the last line too (the
// same address: one request for the warp): the warp polls as one and
// meets at the vote together, where idle lanes waiting at the vote kept
// the warp diverged around the one lane's loop. Bandwidth rounds keep
// block_wait_lines (nixl_ll_wait below).
__device__ bool wait_own_line(const WaitParams &p, uint32_t seq, uint64_t deadline) {
    bool ok = true;
    if (p.line_count > 0) {
        const uint4 *line = p.lines + min(uint64_t(threadIdx.x), p.line_count - 1);
        uint4 v;
        ok = ll_poll<ll_ready>(line, seq, v, [&](const uint4 &seen) {
            const uint32_t why = wait_expired(p.report, deadline);
            if (why != 0) record_lines_expired(p.report, why, seen);
            return why != 0;
        });
    }
    return blockDim.x > 32 ? __syncthreads_and(ok) : __all_sync(~0u, ok);
}

// Whether this thread is the lead of the grid's last block past wait `i`
// (0: the warm-up's, 1: the round's end), which then acknowledges and
// stamps for the grid. One block: its lead. A grid (LL128 bandwidth rounds
// on a GPU of the target's own) counts its blocks in p.done[i]. The
// warm-up's acknowledgement waits for every block, and the blocks past it
// wait for data sent after it, so the grid must be resident at once: the
// host launches at most 16 blocks of 512 threads, on a GPU nothing else
// of the run uses. The fences on both sides of the count order each
// block's copy of its lines, and the acknowledgement an earlier last block
// stored, before the one this block stores now.
__device__ bool grid_last(const WaitParams &p, int i) {
    if (threadIdx.x != 0) return false;
    if (gridDim.x == 1) return true;
    __threadfence();
    const bool last = atomicAdd(p.done + i, 1u) == gridDim.x - 1;
    if (last) __threadfence();
    return last;
}

// The target's rounds on a line path (LL, LL128): polls the lines
// themselves (there is no signal), acknowledges with a bare flag, and
// timestamps like nixl_wait_signal. Bandwidth: every line must carry the
// last warm-up iteration's seq (the barrier), then the last iteration's;
// LL128 may spread the lines over a grid (grid_last). Ping-pong: every
// iteration's, one block. `wait(seq, deadline, last, pong)` waits until
// every line (of this block's share) carries `seq` (`last`: the round's
// last iteration, after which nothing more is written; `pong`:
// std::true_type in ping-pong rounds, so a wait can differ there at
// compile time); the host verifies the lines once the kernel is done.
template <class WaitLines>
__device__ __forceinline__ void line_rounds(const WaitParams &p, WaitLines &&wait) {
    const uint64_t deadline = globaltimer_ns() + p.timeout_ns;
    const uint32_t total = p.warmup + p.iters, last = p.first_seq + total - 1;
    const bool lead = threadIdx.x == 0;
    Ack ack(p);
    // Whole warps only: the line waits vote over all 32 lanes.
    if (!ack.usable(p) || blockDim.x % 32 != 0) {
        if (lead) record_status(p.report, NIXL_ERR_NOT_SUPPORTED);
        return;
    }
    if (p.pong) {
        for (uint32_t i = 0; i < total; ++i) {
            if (i == p.warmup && lead) p.report->t_start_ns = globaltimer_ns();
            if (!wait(p.first_seq + i, deadline, i + 1 == total, std::true_type{})) return;
            if (!lead) continue;
            ack.send(p);
            if (i >= p.warmup && p.iter_ns) p.iter_ns[i - p.warmup] = globaltimer_ns();
        }
    } else {
        if (p.warmup > 0 && !wait(p.first_seq + p.warmup - 1, deadline, false, std::false_type{})) return;
        if (grid_last(p, 0)) {
            if (p.warmup > 0) ack.send(p);
            p.report->t_start_ns = globaltimer_ns();
        }
        if (!wait(last, deadline, true, std::false_type{}) || !grid_last(p, 1)) return;
        ack.sent = p.warmup > 0;  // the block that acknowledges now may not be the one that did after the warm-up
    }
    if (!lead) return;
    p.report->t_end_ns = globaltimer_ns();
    p.report->observed = last;
    if (!p.pong) ack.send(p);
}

// The target on the LL path (line_rounds): in nixl_ll_pong_wait,
// ping-pong rounds of no more lines than threads poll one line a thread
// (wait_own_line); every other wait is block_wait_lines.
template <bool kOwnLine>
__device__ void ll_wait(const WaitParams &p) {
    const bool own = kOwnLine && p.line_count <= blockDim.x;
    line_rounds(p, [&](uint32_t seq, uint64_t deadline, bool, auto pong) {
        if constexpr (kOwnLine && decltype(pong)::value) {
            if (own) return wait_own_line(p, seq, deadline);
        }
        return block_wait_lines(p, seq, deadline);
    });
}
// Bandwidth rounds wait in nixl_ll_wait (block_wait_lines); ping-pong
// rounds in nixl_ll_pong_wait, where each thread polls its own line
// (wait_own_line) when there are no more lines than threads. Two kernels
// for the reason the writers have two (line_ping_pong above).
extern "C" __global__ void __launch_bounds__(1024) nixl_ll_wait(WaitParams p) { ll_wait<false>(p); }
extern "C" __global__ void __launch_bounds__(1024) nixl_ll_pong_wait(WaitParams p) { ll_wait<true>(p); }

// Where a wait on LL128 lines gave up: why, and the older half of the
// flag word this lane saw last.
__device__ void record_ll128_expired(KernelReport *r, uint32_t why, uint64_t flag) {
    r->observed = min(uint32_t(flag), uint32_t(flag >> 32));
    r->timed_out = why;
}

// The block polls every LL128 line of the iteration: warp w takes the
// quads (four lines, one 512-byte warp load) w, w + warps, ..., four quads
// in flight at once (as the LL wait keeps four lines a thread). The lane
// holding a line's flag checks it; a line whose flag is not current is
// loaded again by all eight of its lanes, because its data and its flag
// must come from the same load; the warp polls until every line of its
// four quads is current (a vote). With `keep` (the round's last iteration,
// after which nothing more is written) each lane also stores the 16 bytes
// it read with the current flag into the copy after the lines
// (`p.lines + line_count` lines on): the host checks that copy, which
// nothing else writes, so a line whose payload lagged its flag (a split
// 128-byte write, which LL128 assumes never happens) fails the check even
// if the late bytes land later. True when all carry `seq`.
__device__ bool block_wait_ll128(const WaitParams &p, uint32_t seq, uint64_t deadline, bool keep) {
    constexpr int kQuads = 4;
    const uint64_t n = p.line_count;
    // The grid's warps deal the quads among them (one block, or a grid on
    // a GPU of the target's own: line_rounds).
    const uint64_t warp = uint64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    const uint64_t warps = uint64_t(gridDim.x) * (blockDim.x / 32);
    const unsigned line_of_lane = (threadIdx.x % 32) / LL128_LANES, part = threadIdx.x % LL128_LANES;
    const unsigned flag_lane = (threadIdx.x % 32) | (LL128_LANES - 1);
    const bool holds_flag = part == LL128_LANES - 1;
    // Our own data buffer: the lines, then the copy only this kernel writes.
    uint8_t *lines = const_cast<uint8_t *>(reinterpret_cast<const uint8_t *>(p.lines));
    uint8_t *seen = lines + n * LL128_LINE_BYTES;
    bool ok = true;
    for (uint64_t q = warp; ok && q * LL128_WARP_LINES < n; q += kQuads * warps) {
        uint64_t lo[kQuads], hi[kQuads];
        bool mine[kQuads], got[kQuads];
        // This lane's 16 bytes of its line in quad u (recomputed: registers
        // are what four quads in flight are short of).
        const auto at = [&](uint8_t *base, int u) {
            const uint64_t k = (q + u * warps) * LL128_WARP_LINES + line_of_lane;
            return reinterpret_cast<uint4 *>(base + k * LL128_LINE_BYTES + 16 * part);
        };
        __syncwarp();
#pragma unroll
        for (int u = 0; u < kQuads; ++u) {
            mine[u] = (q + u * warps) * LL128_WARP_LINES + line_of_lane < n;
            lo[u] = hi[u] = 0;
            if (mine[u]) ll128_load(at(lines, u), lo[u], hi[u]);
        }
#pragma unroll
        for (int u = 0; u < kQuads; ++u) {
            got[u] = __shfl_sync(~0u, !mine[u] || !holds_flag || ll128_ready(hi[u], seq), flag_lane);
        }
        for (uint32_t polls = 1; __any_sync(~0u, !(got[0] && got[1] && got[2] && got[3])); ++polls) {
            const uint32_t why = (polls & 63) == 0 ? wait_expired(p.report, deadline) : 0;
            if (__any_sync(~0u, why != 0)) {
#pragma unroll
                for (int u = 0; u < kQuads; ++u) {
                    if (!got[u] && holds_flag) record_ll128_expired(p.report, why != 0 ? why : 1, hi[u]);
                }
                ok = false;
                break;
            }
#pragma unroll
            for (int u = 0; u < kQuads; ++u) {
                if (!got[u]) ll128_load(at(lines, u), lo[u], hi[u]);
            }
#pragma unroll
            for (int u = 0; u < kQuads; ++u) {
                got[u] = __shfl_sync(~0u, !mine[u] || !holds_flag || ll128_ready(hi[u], seq), flag_lane);
            }
        }
        if (!ok || !keep) continue;
#pragma unroll
        for (int u = 0; u < kQuads; ++u) {
            if (mine[u]) ll128_store(at(seen, u), lo[u], hi[u]);
        }
    }
    return blockDim.x > 32 ? __syncthreads_and(ok) : ok;
}

// Ping-pong, at most one quad (four lines) a warp: each lane polls its 16
// bytes of its line with one load, the flag lane tells the line's other
// seven (a shuffle), and the warp polls until its lines are current, as
// wait_own_line does for LL. A lane past the last line polls the last line
// too (the same address, so the warp keeps one request per poll). With
// `keep`, as block_wait_ll128's.
__device__ bool wait_own_quad(const WaitParams &p, uint32_t seq, uint64_t deadline, bool keep) {
    const uint64_t n = p.line_count;
    const unsigned lane = threadIdx.x % 32, part = lane % LL128_LANES;
    const uint64_t k = uint64_t(threadIdx.x / 32) * LL128_WARP_LINES + lane / LL128_LANES;
    const bool holds_flag = part == LL128_LANES - 1;
    uint8_t *lines = const_cast<uint8_t *>(reinterpret_cast<const uint8_t *>(p.lines));
    const uint64_t at = min(k, n - 1) * LL128_LINE_BYTES + 16 * part;
    uint64_t lo, hi;
    ll128_load(reinterpret_cast<const uint4 *>(lines + at), lo, hi);
    bool got = __shfl_sync(~0u, !holds_flag || ll128_ready(hi, seq), lane | (LL128_LANES - 1));
    bool ok = true;
    for (uint32_t polls = 1; !__all_sync(~0u, got); ++polls) {
        const uint32_t why = (polls & 63) == 0 ? wait_expired(p.report, deadline) : 0;
        if (__any_sync(~0u, why != 0)) {
            if (!got && holds_flag) record_ll128_expired(p.report, why != 0 ? why : 1, hi);
            ok = false;
            break;
        }
        if (!got) ll128_load(reinterpret_cast<const uint4 *>(lines + at), lo, hi);
        got = __shfl_sync(~0u, !holds_flag || ll128_ready(hi, seq), lane | (LL128_LANES - 1));
    }
    if (ok && keep && k < n) ll128_store(reinterpret_cast<uint4 *>(lines + n * LL128_LINE_BYTES + at), lo, hi);
    return blockDim.x > 32 ? __syncthreads_and(ok) : ok;
}

// The target on the LL128 path (line_rounds): the last iteration's lines
// are copied as read, after the lines, for the host to check (`keep`).
// Bandwidth rounds wait in nixl_ll128_wait (block_wait_ll128); ping-pong
// rounds in nixl_ll128_pong_wait, where each warp polls its own quad
// (wait_own_quad) when the message has no more (two kernels, as LL's).
template <bool kOwnQuad>
__device__ void ll128_wait(const WaitParams &p) {
    const bool own = kOwnQuad && p.line_count > 0 && p.line_count <= uint64_t(blockDim.x / 32) * LL128_WARP_LINES;
    line_rounds(p, [&](uint32_t seq, uint64_t deadline, bool last, auto pong) {
        if constexpr (kOwnQuad && decltype(pong)::value) {
            if (own) return wait_own_quad(p, seq, deadline, last);
        }
        return block_wait_ll128(p, seq, deadline, last);
    });
}
extern "C" __global__ void __launch_bounds__(1024) nixl_ll128_wait(WaitParams p) { ll128_wait<false>(p); }
extern "C" __global__ void __launch_bounds__(1024) nixl_ll128_pong_wait(WaitParams p) { ll128_wait<true>(p); }
