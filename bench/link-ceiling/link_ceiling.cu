// What SMs can push over the link between two GPUs, beside the copy engine:
// GPU 0 writes into GPU 1's memory (peer access in one process, the same
// NVLink path a cuda_ipc mapping uses) with
//   - the copy engine (cudaMemcpyPeerAsync),
//   - SM 16-byte stores, write-back and streaming (st.global.cs),
//   - the SM's bulk-copy engine: cp.async.bulk from global to shared memory
//     and from shared memory to the peer (Hopper's TMA, as NVSHMEM 3.7
//     added for NVLink puts), one thread a block driving a ring of stages.
// Every variant's output is compared with the source, byte for byte. GB/s =
// 1e9 B/s over the GPU time of back-to-back copies (CUDA events). Exit 0,
// 1 without two GPUs or on a CUDA error, 3 on a mismatch.
#include <cuda/barrier>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

// Blocks take chunks round-robin; each thread moves 16-byte vectors, four
// loads in flight.
template <bool kStreaming>
__global__ void store_copy(uint8_t *dst, const uint8_t *src, size_t bytes, uint32_t chunk) {
    const size_t chunks = bytes / chunk;
    const uint32_t n = chunk / 16, t = blockDim.x;
    for (size_t c = blockIdx.x; c < chunks; c += gridDim.x) {
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
    int kind;  // 0 copy engine, 1 stores, 2 streaming stores, 3 bulk (4 stages)
    uint32_t chunk, grid, threads;
};

int main() {
    int gpus = 0;
    CK(cudaGetDeviceCount(&gpus));
    if (gpus < 2) {
        fprintf(stderr, "link_ceiling: needs two GPUs (this machine has %d)\n", gpus);
        return 1;
    }
    CK(cudaSetDevice(1));
    CK(cudaDeviceEnablePeerAccess(0, 0));
    CK(cudaSetDevice(0));
    CK(cudaDeviceEnablePeerAccess(1, 0));
    const size_t most = size_t(1) << 30;
    uint8_t *src, *dst;
    CK(cudaSetDevice(1));
    CK(cudaMalloc(&dst, most));
    CK(cudaSetDevice(0));
    CK(cudaMalloc(&src, most));
    std::vector<uint8_t> want(most), got(most);
    for (size_t i = 0; i < most; i++) want[i] = uint8_t(i * 7 + 3 + (i >> 13));
    CK(cudaMemcpy(src, want.data(), most, cudaMemcpyDefault));
    CK(cudaFuncSetAttribute(bulk_copy<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * 32768));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1;
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
    };
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("# %s GPU 0 -> GPU 1, GB/s (1e9 B/s), every byte checked\n", prop.name);
    printf("%9s  %-18s %9s\n", "MiB", "variant", "GB/s");
    int bad = 0;
    for (size_t bytes : {size_t(4) << 20, size_t(16) << 20, size_t(64) << 20, size_t(256) << 20, most}) {
        for (const Variant &v : variants) {
            auto copy = [&] {
                if (v.kind == 0) CK(cudaMemcpyPeerAsync(dst, 1, src, 0, bytes, st));
                if (v.kind == 1) store_copy<false><<<v.grid, v.threads, 0, st>>>(dst, src, bytes, v.chunk);
                if (v.kind == 2) store_copy<true><<<v.grid, v.threads, 0, st>>>(dst, src, bytes, v.chunk);
                if (v.kind == 3) bulk_copy<4><<<v.grid, v.threads, 4 * v.chunk, st>>>(dst, src, bytes, v.chunk);
            };
            CK(cudaMemsetAsync(dst, 0, bytes, st));
            const int iters = bytes >= (size_t(256) << 20) ? 8 : 40;
            for (int i = 0; i < 3; i++) copy();  // warm-up
            CK(cudaStreamSynchronize(st));
            CK(cudaGetLastError());
            CK(cudaEventRecord(e0, st));
            for (int i = 0; i < iters; i++) copy();
            CK(cudaEventRecord(e1, st));
            CK(cudaStreamSynchronize(st));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            CK(cudaMemcpy(got.data(), dst, bytes, cudaMemcpyDefault));
            const bool ok = memcmp(got.data(), want.data(), bytes) == 0;
            bad += !ok;
            printf("%9zu  %-18s %9.1f%s\n", bytes >> 20, v.name, bytes * double(iters) / (ms * 1e6),
                   ok ? "" : "  MISMATCH");
            fflush(stdout);
        }
    }
    return bad ? 3 : 0;
}
