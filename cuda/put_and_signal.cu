// The device-API pattern at its smallest (examples/put_and_signal.rs runs it):
// the initiator's blocks each write their slice of a buffer into the target's
// GPU memory and then raise the target's 8-byte signal; the target's kernel
// waits until every block has signalled.
//
// Two ways to write, one way to signal-after-data:
// - put_and_signal: nixlPut + nixlAtomicAdd. Works over any UCX device
//   transport (cuda_ipc within a node, RDMA across nodes).
// - store_and_signal: nixlGetPtr gives the peer's buffer mapped into our
//   address space; plain 16-byte stores, then a release and an atomic add.
//   Only where the transport maps peer memory (cuda_ipc, NVLink or PCIe).
//
// One self-contained file on purpose: the other kernels share
// cuda/device_common.cuh; this one spells out all it needs.

// NIXL's device API: <gpu/ucx/nixl_device.cuh> in NIXL 1.x, the
// backend-neutral <gpu/nixl_device.cuh> after it (the build defines which).
#if NIXL_DEVICE_API_GENERIC
#include <gpu/nixl_device.cuh>
#else
#include <gpu/ucx/nixl_device.cuh>
#endif

#include <cuda/atomic>
#include <cstdint>

// Bytes block b writes: an even split rounded up to 16 bytes, so every
// slice starts 16-byte aligned (the vectorised path). The host computes the
// same split to know how many blocks will signal.
__device__ uint64_t slice_of(uint64_t size) {
    const uint64_t even = (size + gridDim.x - 1) / gridDim.x;
    return (even + 15) / 16 * 16;
}

// Path 1: every thread of the block calls nixlPut and nixlAtomicAdd with the
// same arguments (BLOCK-level calls are collective), each block on its own
// channel so blocks do not serialise on one.
extern "C" __global__ void put_and_signal(nixlMemViewElem src, nixlMemViewElem dst,
                                          nixlMemViewElem signal, uint64_t size,
                                          unsigned long long *errors) {
    const uint64_t slice = slice_of(size);
    const uint64_t start = blockIdx.x * slice;
    if (start >= size) return;  // more blocks than slices: this block idles (and does not signal)
    src.offset += start;
    dst.offset += start;
    const nixl_status_t put =
        nixlPut<nixl_gpu_level_t::BLOCK>(src, dst, min(slice, size - start), blockIdx.x);
    // On cuda_ipc a put is plain stores by this block's threads, and the atomic
    // add orders nothing before it. So: the block syncs (every thread's stores
    // happen before what any thread does next), then each thread releases at
    // system scope; whichever thread performs the add, the data is visible to
    // the peer before the signal is.
    __syncthreads();
    cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_system);
    const nixl_status_t add = nixlAtomicAdd<nixl_gpu_level_t::BLOCK>(1, signal, blockIdx.x);
    if (threadIdx.x == 0 && (put < 0 || add < 0)) atomicAdd(errors, 1ull);
}

// Path 2: the same transfer as plain stores through the peer pointer. `from`
// is our own source (a local pointer; nixlGetPtr maps remote views only).
extern "C" __global__ void store_and_signal(const int4 *from, nixlMemViewElem dst,
                                            nixlMemViewElem signal, uint64_t size,
                                          unsigned long long *errors) {
    auto *to = static_cast<int4 *>(nixlGetPtr(dst.mvh, dst.index));
    auto *counter = static_cast<unsigned long long *>(nixlGetPtr(signal.mvh, signal.index));
    if (to == nullptr || counter == nullptr) {  // the transport maps no peer memory (RDMA)
        if (threadIdx.x == 0) atomicAdd(errors, 1ull);
        return;
    }
    const uint64_t slice = slice_of(size);
    const uint64_t start = blockIdx.x * slice;
    if (start >= size) return;
    const uint64_t end = min(start + slice, size);  // the host keeps size a multiple of 16
    for (uint64_t i = start / 16 + threadIdx.x; i < end / 16; i += blockDim.x) to[i] = from[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        // Cumulative release: the stores the block synchronised with above
        // become visible system-wide before the add.
        cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> c(*counter);
        c.fetch_add(1, cuda::memory_order_release);
    }
}

__device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The target, one thread: waits until the signal reaches `expected` or
// `timeout_ns` passes (a wait on another process must never hang), then
// acquires, so the host's later read of the data sees what was signalled.
// Writes the last value seen to *seen.
extern "C" __global__ void wait_signal(uint64_t *signal, uint64_t expected, uint64_t timeout_ns,
                                       uint64_t *seen) {
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system> s(*signal);
    const uint64_t deadline = globaltimer_ns() + timeout_ns;
    uint64_t v = s.load(cuda::memory_order_relaxed);
    for (uint32_t n = 1; v < expected; ++n) {
        if ((n & 63) == 0 && globaltimer_ns() > deadline) break;  // the clock every 64 polls
        v = s.load(cuda::memory_order_relaxed);
    }
    cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_system);
    *seen = v;
}
