// Device primitives that cuda/kernels.cu and cuda/ep.cu share: the clock
// every spin-wait deadline reads, and the system-scope loads and fences
// that pair a peer's signal with the data it guards.
//
// (cuda/put_and_signal.cu keeps its own copy of the clock: that example is
// one self-contained file on purpose.)

#pragma once

#include <cuda/atomic>
#include <cstdint>

// Nanoseconds of the GPU's global timer: the same clock on every SM, so a
// deadline set by one thread holds for the whole grid.
__device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The polling load: relaxed, system scope. An acquire load on every poll
// would order (and slow) each one; the acquire is paid once, by a fence or
// an acquire load, where data is read after the wait.
__device__ __forceinline__ uint64_t load_relaxed_system(const uint64_t *p) {
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system> ref(*const_cast<uint64_t *>(p));
    return ref.load(cuda::memory_order_relaxed);
}
