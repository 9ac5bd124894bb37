// The suite's device vocabulary: what kernels.cu, ep.cu and collectives.cu
// say the same way. NIXL's device header (included here and nowhere else),
// the clock every deadline reads, the loads and stores a signal is made of,
// the scoped release/acquire that orders data before its signal, the one
// bounded spin-wait, and the report a kernel leaves for the host.
//
// cuda/put_and_signal.cu includes none of this on purpose: that example is
// one self-contained file a reader can take away whole.

#pragma once

// NIXL's device API. NIXL 1.x installs it as <gpu/ucx/nixl_device.cuh>;
// upstream's main replaces that with a backend-neutral <gpu/nixl_device.cuh>
// (the same nixlPut / nixlAtomicAdd / nixlGetPtr / nixlMemViewElem). The
// build says which layout it found by defining NIXL_DEVICE_API_GENERIC
// (build/cuda_kernels.rs); left undefined, the header decides.
#ifndef NIXL_DEVICE_API_GENERIC
#if __has_include(<gpu/nixl_device.cuh>)
#define NIXL_DEVICE_API_GENERIC 1
#else
#define NIXL_DEVICE_API_GENERIC 0
#endif
#endif
#if NIXL_DEVICE_API_GENERIC
#include <gpu/nixl_device.cuh>
#else
#include <gpu/ucx/nixl_device.cuh>
#endif

#include <cuda/atomic>
#include <cstdint>

#include "kernel_report.h"

// ----------------------------------------------------------------- clock

// Nanoseconds of the GPU's global timer: the same clock on every SM, so a
// deadline set by one thread holds for the whole grid.
__device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// ---------------------------------------------------- loads and stores

// The polling load: relaxed, system scope. An acquire load on every poll
// would order (and slow) each one; the acquire is paid once, by a fence or
// an acquire load, where data is read after the wait.
__device__ __forceinline__ uint64_t load_relaxed_system(const uint64_t *p) {
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system> ref(*const_cast<uint64_t *>(p));
    return ref.load(cuda::memory_order_relaxed);
}

// An acquire load: sees stores another GPU (or process) made visible with
// a release, and orders our later reads after it; GPU scope where every
// party shares this GPU. The system-scope one is the 1.x replacement for
// the old nixlGpuReadSignal. After a relaxed spin it costs less than
// fence_acquire, which first waits for all of this thread's own
// outstanding loads and stores (on sm_90: a strong load and an L1
// invalidation, against a MEMBAR.ALL.SYS more).
__device__ __forceinline__ uint64_t load_acquire(const uint64_t *p, bool gpu_scope = false) {
    uint64_t *w = const_cast<uint64_t *>(p);
    if (gpu_scope) return cuda::atomic_ref<uint64_t, cuda::thread_scope_device>(*w).load(cuda::memory_order_acquire);
    return cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*w).load(cuda::memory_order_acquire);
}

// A bare flag: a relaxed store that orders nothing, for a message that
// carries no data (an acknowledgement, a barrier arrival).
__device__ __forceinline__ void store_relaxed_system(uint64_t *p, uint64_t v) {
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system> ref(*p);
    ref.store(v, cuda::memory_order_relaxed);
}

// Wrap-safe "reached": a counter or epoch at or past `target`.
__device__ __forceinline__ bool reached(uint64_t v, uint64_t target) { return int64_t(v - target) >= 0; }

// ------------------------------------------- signal after data (scoped)
//
// `gpu_scope`: every process that observes runs on this GPU, so ordering
// through its memory system suffices; otherwise a peer observes through the
// link and only system scope orders for it.

// A signal that follows data: one release reduction. It is posted like a
// store (an atom would wait for the old value it returns), and its release
// orders every store this thread made, or saw made before a __syncthreads,
// ahead of the add.
__device__ __forceinline__ void release_add(uint64_t *p, uint64_t v, bool gpu_scope) {
    if (gpu_scope) asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
    else asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// A signal that follows data, as a store of the new value (only one writer).
__device__ __forceinline__ void release_store(uint64_t *p, uint64_t v, bool gpu_scope) {
    if (gpu_scope) cuda::atomic_ref<uint64_t, cuda::thread_scope_device>(*p).store(v, cuda::memory_order_release);
    else cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_release);
}

// The release before a signal that is not itself a release (nixlAtomicAdd).
__device__ __forceinline__ void fence_release(bool gpu_scope) {
    if (gpu_scope) cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_device);
    else cuda::atomic_thread_fence(cuda::memory_order_release, cuda::thread_scope_system);
}

// Paid once after a relaxed wait, before the data the signal guards is read.
__device__ __forceinline__ void fence_acquire(bool gpu_scope) {
    if (gpu_scope) cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
    else cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_system);
}

// ------------------------------------------- programmatic dependent launch
//
// A kernel launched with CUDA's programmatic-stream-serialization attribute
// (src/gpu/launch.rs, `launch_as` with `pdl`) may start while the kernel
// before it on the stream is still running: once every block of that one
// has called allow_next_launch (or exited). It must call
// wait_previous_grid before it touches anything an earlier kernel writes;
// the wait returns when that kernel has completed and its memory is
// visible. Work before the wait (the launch itself, loads of what no
// kernel writes) overlaps the previous kernel's tail. Launched without the
// attribute, both are no-ops. Hopper's griddepcontrol (sm_90).

__device__ __forceinline__ void allow_next_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_previous_grid() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// --------------------------------------------------------------- report

// Counts a NIXL device call that did not return NIXL_IN_PROG / NIXL_SUCCESS
// and keeps the first such status.
__device__ __forceinline__ void record_status(KernelReport *r, nixl_status_t s) {
    if (s == NIXL_IN_PROG || s == NIXL_SUCCESS) return;
    if (atomicAdd(&r->errors, 1u) == 0) r->first_status = s;
}

// Why a bounded wait must stop now: 1 its deadline passed, 2 the host
// raised the cancel flag (from another stream), 0 neither.
__device__ __forceinline__ uint32_t wait_expired(const KernelReport *r, uint64_t deadline) {
    if (globaltimer_ns() > deadline) return 1;
    if (*static_cast<const volatile uint32_t *>(&r->cancel)) return 2;
    return 0;
}

// ------------------------------------------------------ the bounded wait

// Spins (one thread) until *word reaches `target` or `stop(seen)` says to
// give up; returns the value seen last (reached(result, target): it came).
// `stop` is asked every 64 polls only (the poll itself is the latency-
// critical path); it checks the deadline and the cancel flag
// (wait_expired), plus whatever the program adds, and records why it gave
// up. `nap_ns` naps between polls where other warps of the SM have work.
// Every spin on a 64-bit word goes through here; the waits on 16-byte LL
// lines poll the same way and ask the same checks (ll_poll, cuda/ll.cuh).
// None outlives its deadline.
template <class Stop>
__device__ __forceinline__ uint64_t spin_wait(const uint64_t *word, uint64_t target, Stop &&stop,
                                              uint32_t nap_ns = 0) {
    uint64_t v = load_relaxed_system(word);
    for (uint32_t n = 1; !reached(v, target); ++n) {
        if (nap_ns != 0) __nanosleep(nap_ns);
        if ((n & 63) == 0 && stop(v)) return v;
        v = load_relaxed_system(word);
    }
    return v;
}
