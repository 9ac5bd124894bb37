// What SMs can move over NVLink, beside the copy engine.
//
// Pair: GPU 0's buffer lands in GPU 1's memory (peer access in one process,
// the same NVLink path a cuda_ipc mapping uses) by
//   - the copy engine (cudaMemcpyPeerAsync),
//   - GPU 0's SM 16-byte stores, write-back and streaming (st.global.cs),
//   - GPU 0's bulk-copy engine: cp.async.bulk from global to shared memory
//     and from shared memory to the peer (Hopper's TMA, as NVSHMEM 3.7
//     added for NVLink puts), one thread a block driving a ring of stages,
//   - GPU 1's SM 16-byte loads from GPU 0's memory (a pull: the data
//     crosses the link as read replies, not as writes).
// All-to-all: every GPU of the first n (2, 3, ... all) sends an equal slice
// to every other at once, as ep's dispatch and combine do, with the copy
// engine (one stream a peer), one store kernel a GPU (push) or one load
// kernel a GPU (each pulls its slices from the others); GB/s is each GPU's
// egress (what leaves it, received by the others) over the host wall time of
// back-to-back rounds on all GPUs (a launch and a sync of ~20 µs in >= 5 ms).
// Every variant's output is compared with the source, byte for byte. GB/s =
// 1e9 B/s; the pair's over the GPU time of back-to-back copies (CUDA events).
// Exit 0, 1 without two GPUs or on a CUDA error, 3 on a mismatch.
#include <cuda/barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <vector>

using barrier = cuda::barrier<cuda::thread_scope_block>;
namespace cde = cuda::device::experimental;

#define CK(x)                                                                            \
    do {                                                                                 \
        cudaError_t e = (x);                                                             \
        if (e != cudaSuccess) {                                                          \
            fprintf(stderr, "link_ceiling: %s: %s\n", #x, cudaGetErrorString(e));        \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

// Chunks first, first + step, ... of src go to dst; each thread moves
// 16-byte vectors, four loads in flight.
template <bool kStreaming>
__device__ void copy_chunks(uint8_t *dst, const uint8_t *src, size_t chunks, uint32_t chunk, size_t first,
                            size_t step) {
    const uint32_t n = chunk / 16, t = blockDim.x;
    for (size_t c = first; c < chunks; c += step) {
        const int4 *s = reinterpret_cast<const int4 *>(src + c * chunk);
        int4 *d = reinterpret_cast<int4 *>(dst + c * chunk);
        uint32_t i = threadIdx.x;
        for (; i + 3 * t < n; i += 4 * t) {
            const int4 v[4] = {s[i], s[i + t], s[i + 2 * t], s[i + 3 * t]};
            for (int j = 0; j < 4; ++j) {
                if (kStreaming) __stcs(d + i + j * t, v[j]);
                else d[i + j * t] = v[j];
            }
        }
        for (; i < n; i += t) d[i] = s[i];
    }
}

// Blocks take chunks round-robin.
template <bool kStreaming>
__global__ void store_copy(uint8_t *dst, const uint8_t *src, size_t bytes, uint32_t chunk) {
    copy_chunks<kStreaming>(dst, src, bytes / chunk, chunk, blockIdx.x, gridDim.x);
}

constexpr int kMostGpus = 8;
// One GPU's copies in an all-to-all, one a peer: a push writes this GPU's
// slice for the peer into the peer's receive buffer; a pull reads the
// peer's slice for this GPU into this GPU's own.
struct Copies {
    uint8_t *dst[kMostGpus - 1];
    const uint8_t *src[kMostGpus - 1];
};

// All-to-all: block b serves peer b % peers; the blocks of one peer take
// its chunks round-robin.
__global__ void copy_all_to_all(Copies c, int peers, size_t slice, uint32_t chunk) {
    const int p = blockIdx.x % peers;
    copy_chunks<false>(c.dst[p], c.src[p], slice / chunk, chunk, blockIdx.x / peers, gridDim.x / peers);
}

// One thread a block: chunk k is loaded into stage k % kStages (an mbarrier
// counts its bytes in), then stored from there to the peer; a stage is
// reloaded once the store before has read it (wait_group.read).
template <int kStages>
__global__ void bulk_copy(uint8_t *dst, const uint8_t *src, size_t bytes, uint32_t chunk) {
    extern __shared__ __align__(128) uint8_t stage[];
#pragma nv_diag_suppress static_var_with_dynamic_init
    __shared__ barrier loaded[kStages];
    if (threadIdx.x != 0) return;
    for (int s = 0; s < kStages; s++) init(&loaded[s], 1);
    cde::fence_proxy_async_shared_cta();
    const size_t chunks = bytes / chunk, first = blockIdx.x, step = gridDim.x;
    const size_t n = first < chunks ? (chunks - first + step - 1) / step : 0;
    barrier::arrival_token token[kStages];
    auto load = [&](size_t k) {
        const int s = k % kStages;
        cde::cp_async_bulk_global_to_shared(stage + s * chunk, src + (first + k * step) * chunk, chunk, loaded[s]);
        token[s] = cuda::device::barrier_arrive_tx(loaded[s], 1, chunk);
    };
    for (size_t k = 0; k < n && k < kStages; k++) load(k);
    for (size_t k = 0; k < n; k++) {
        const int s = k % kStages;
        loaded[s].wait(std::move(token[s]));
        cde::cp_async_bulk_shared_to_global(dst + (first + k * step) * chunk, stage + s * chunk, chunk);
        cde::cp_async_bulk_commit_group();
        if (k + kStages < n) {
            cde::cp_async_bulk_wait_group_read<0>();
            load(k + kStages);
        }
    }
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

struct Variant {
    const char *name;
    int kind;  // 0 copy engine, 1 stores, 2 streaming stores, 3 bulk (4 stages), 4 GPU 1's loads
    uint32_t chunk, grid, threads;
};

static uint8_t pattern(size_t i, int gpu) { return uint8_t(i * 7 + 3 + (i >> 13) + gpu * 31); }

// GPU 0 -> GPU 1, every variant at 4 MiB - 1 GiB; returns the mismatches.
static int pair_table() {
    const size_t most = size_t(1) << 30;
    uint8_t *src, *dst;
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&dst, most));
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&src, most));
    std::vector<uint8_t> want(most), got(most);
    for (size_t i = 0; i < most; i++) want[i] = pattern(i, 0);
    CK(cudaMemcpy(src, want.data(), most, cudaMemcpyDefault));
    CK(cudaFuncSetAttribute(bulk_copy<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 32768));
    // A pull runs on GPU 1 and is timed there.
    cudaStream_t st, st1;
    cudaEvent_t e0, e1, p0, p1;
    CK(cudaSetDevice(1));
    CK(cudaStreamCreate(&st1));
    CK(cudaEventCreate(&p0));
    CK(cudaEventCreate(&p1));
    CK(cudaSetDevice(0));
    CK(cudaStreamCreate(&st));
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const Variant variants[] = {
        {"copy engine", 0, 0, 0, 0},
        {"stores 264x512", 1, 65536, 264, 512},
        {"stores 132x1024", 1, 65536, 132, 1024},
        {"streaming 264x512", 2, 65536, 264, 512},
        {"bulk 132x16K", 3, 16384, 132, 32},
        {"bulk 264x16K", 3, 16384, 264, 32},
        {"bulk 132x32K", 3, 32768, 132, 32},
        {"loads 264x512", 4, 65536, 264, 512},
        {"loads 132x1024", 4, 65536, 132, 1024},
    };
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("# %s GPU 0 -> GPU 1, GB/s (1e9 B/s), every byte checked\n", prop.name);
    printf("%9s  %-18s %9s\n", "MiB", "variant", "GB/s");
    int bad = 0;
    for (size_t bytes : {size_t(4) << 20, size_t(16) << 20, size_t(64) << 20, size_t(256) << 20, most}) {
        for (const Variant &v : variants) {
            const bool pull = v.kind == 4;
            cudaStream_t s = pull ? st1 : st;
            CK(cudaSetDevice(pull ? 1 : 0));
            auto copy = [&] {
                if (v.kind == 0) CK(cudaMemcpyPeerAsync(dst, 1, src, 0, bytes, s));
                // The same copy loop pushes from GPU 0 (kind 1) or pulls from GPU 1 (kind 4).
                if (v.kind == 1 || v.kind == 4)
                    store_copy<false><<<v.grid, v.threads, 0, s>>>(dst, src, bytes, v.chunk);
                if (v.kind == 2) store_copy<true><<<v.grid, v.threads, 0, s>>>(dst, src, bytes, v.chunk);
                if (v.kind == 3) bulk_copy<4><<<v.grid, v.threads, 4 * v.chunk, s>>>(dst, src, bytes, v.chunk);
            };
            CK(cudaMemsetAsync(dst, 0, bytes, s));
            const int iters = bytes >= (size_t(256) << 20) ? 8 : 40;
            for (int i = 0; i < 3; i++) copy();  // warm-up
            CK(cudaStreamSynchronize(s));
            CK(cudaGetLastError());
            CK(cudaEventRecord(pull ? p0 : e0, s));
            for (int i = 0; i < iters; i++) copy();
            CK(cudaEventRecord(pull ? p1 : e1, s));
            CK(cudaStreamSynchronize(s));
            float ms;
            CK(cudaEventElapsedTime(&ms, pull ? p0 : e0, pull ? p1 : e1));
            CK(cudaSetDevice(0));
            CK(cudaMemcpy(got.data(), dst, bytes, cudaMemcpyDefault));
            const bool ok = memcmp(got.data(), want.data(), bytes) == 0;
            bad += !ok;
            printf("%9zu  %-18s %9.1f%s\n", bytes >> 20, v.name, bytes * double(iters) / (ms * 1e6),
                   ok ? "" : "  MISMATCH");
            fflush(stdout);
        }
    }
    CK(cudaFree(src));
    CK(cudaSetDevice(1));
    CK(cudaFree(dst));
    return bad;
}

// Per GPU: its source (`most` bytes of its pattern, and the same bytes on
// the host to check against), its receive buffer (a slot of
// `most / (n - 1)` a sender) and a stream per peer.
struct Rig {
    size_t most;
    std::vector<uint8_t *> src, dst;
    std::vector<std::vector<cudaStream_t>> streams;  // [gpu][peer]
    std::vector<std::vector<uint8_t>> want;          // [gpu]
};

// Slot of sender g in receiver p's buffer, and g's peer index of p.
static int slot(int g, int p) { return g < p ? g : g - 1; }

static void sync_all(int n) {
    for (int g = 0; g < n; g++) {
        CK(cudaSetDevice(g));
        CK(cudaDeviceSynchronize());
    }
}

// One round: each of the first n GPUs sends `slice` bytes to every other.
// kind 0 copy engine, 1 one store kernel a GPU of `grid` x 512 (push),
// 2 one load kernel a GPU of `grid` x 512 (pull). Slice k of GPU g's source
// goes to its k-th peer p, into slot(g, p) of p's receive buffer.
static void round_all_to_all(const Rig &r, int n, size_t slice, int kind, int grid) {
    const int peers = n - 1;
    for (int g = 0; g < n; g++) {
        CK(cudaSetDevice(g));
        Copies c{};
        for (int p = 0, k = 0; p < n; p++) {
            if (p == g) continue;
            if (kind == 2) {  // g pulls its slot from p: p's slice for g
                c.dst[k] = r.dst[g] + slot(p, g) * slice;
                c.src[k] = r.src[p] + slot(g, p) * slice;
            } else {
                c.dst[k] = r.dst[p] + slot(g, p) * slice;
                c.src[k] = r.src[g] + k * slice;
            }
            if (kind == 0) CK(cudaMemcpyPeerAsync(c.dst[k], p, c.src[k], g, slice, r.streams[g][k]));
            k++;
        }
        if (kind != 0) copy_all_to_all<<<grid / peers * peers, 512, 0, r.streams[g][0]>>>(c, peers, slice, 65536);
    }
}

// Every slot of the first n GPUs as its sender wrote it; returns the
// mismatches.
static int check_all_to_all(const Rig &r, int n, size_t slice) {
    std::vector<uint8_t> got(slice);
    int bad = 0;
    for (int p = 0; p < n; p++)
        for (int g = 0; g < n; g++) {
            if (g == p) continue;
            CK(cudaMemcpy(got.data(), r.dst[p] + slot(g, p) * slice, slice, cudaMemcpyDefault));
            const size_t base = size_t(slot(p, g)) * slice;  // p's peer index in g's list
            bad += memcmp(got.data(), r.want[g].data() + base, slice) != 0;
        }
    return bad;
}

// The first n GPUs in an all-to-all, n = 2 .. gpus, per-GPU egress GB/s.
static int all_to_all_table(int gpus) {
    Rig r{size_t(768) << 20, {}, {}, {}, std::vector<std::vector<uint8_t>>(gpus)};
    for (int g = 0; g < gpus; g++) {
        CK(cudaSetDevice(g));
        uint8_t *s, *d;
        CK(cudaMalloc(&s, r.most));
        CK(cudaMalloc(&d, r.most));
        r.want[g].resize(r.most);
        for (size_t i = 0; i < r.most; i++) r.want[g][i] = pattern(i, g);
        CK(cudaMemcpy(s, r.want[g].data(), r.most, cudaMemcpyDefault));
        r.src.push_back(s);
        r.dst.push_back(d);
        r.streams.emplace_back(gpus - 1);
        for (auto &st : r.streams.back()) CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    }
    printf("# all-to-all: each of n GPUs sends MiB in all, 1/(n-1) to each other GPU, at once;\n"
           "# GB/s = one GPU's egress over the wall time of all (1e9 B/s), every byte checked\n");
    printf("%3s %9s  %-18s %9s\n", "n", "MiB", "variant", "GB/s");
    int bad = 0;
    for (int n = 2; n <= gpus; n++) {
        for (size_t total : {size_t(48) << 20, size_t(192) << 20, r.most}) {
            const size_t slice = total / (n - 1) / 65536 * 65536, sent = slice * (n - 1);
            for (int v = 0; v < 4; v++) {
                const int kind = v == 0 ? 0 : v == 3 ? 2 : 1, grid = v == 1 ? 132 : 264;
                const char *names[] = {"copy engine", "stores 132x512", "stores 264x512", "loads 264x512"};
                const char *name = names[v];
                for (int g = 0; g < n; g++) {
                    CK(cudaSetDevice(g));
                    CK(cudaMemset(r.dst[g], 0, r.most));
                }
                const int iters = std::max<int>(4, int((size_t(2) << 30) / sent));
                round_all_to_all(r, n, slice, kind, grid);  // warm-up
                sync_all(n);
                CK(cudaGetLastError());
                const auto t0 = std::chrono::steady_clock::now();
                for (int i = 0; i < iters; i++) round_all_to_all(r, n, slice, kind, grid);
                sync_all(n);
                const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
                const int wrong = check_all_to_all(r, n, slice);
                bad += wrong;
                printf("%3d %9zu  %-18s %9.1f%s\n", n, sent >> 20, name, sent * double(iters) / (s * 1e9),
                       wrong ? "  MISMATCH" : "");
                fflush(stdout);
            }
        }
    }
    return bad;
}

int main() {
    int gpus = 0;
    CK(cudaGetDeviceCount(&gpus));
    if (gpus < 2) {
        fprintf(stderr, "link_ceiling: needs two GPUs (this machine has %d)\n", gpus);
        return 1;
    }
    gpus = std::min(gpus, kMostGpus);
    for (int g = 0; g < gpus; g++) {
        CK(cudaSetDevice(g));
        for (int p = 0; p < gpus; p++)
            if (p != g) CK(cudaDeviceEnablePeerAccess(p, 0));
    }
    const int bad = pair_table() + all_to_all_table(gpus);
    return bad ? 3 : 0;
}
