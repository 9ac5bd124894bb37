// What a kernel tells the host when it is done: one per launch, in device
// memory, zeroed by the host before the launch. Shared by every kernel file
// (kernels.cu, and ep_common.cuh's EpReport, which begins with one) and by
// the Rust host (src/gpu/kernels.rs KernelReport; src/gpu/run.rs raises
// `cancel` from another stream). Plain C++: tests/ep_abi.rs compiles it
// without nvcc.

#pragma once

#include <cstddef>
#include <cstdint>

struct KernelReport {
    uint64_t t_start_ns;   // %globaltimer when the timed iterations began
    uint64_t t_end_ns;     // %globaltimer when the final acknowledgement / signal was seen
    uint64_t observed;     // last value seen by the waiting thread (ack or signal)
    uint32_t errors;       // NIXL device calls that did not return NIXL_IN_PROG / NIXL_SUCCESS
    int32_t first_status;  // the first such status
    uint32_t timed_out;    // 1: a wait reached its deadline; 2: the host cancelled it
    uint32_t cancel;       // set by the host (from another stream) to stop a wait early
};
static_assert(sizeof(KernelReport) == 40, "KernelReport layout is shared with the host");
static_assert(offsetof(KernelReport, cancel) == 36, "the host raises KernelReport.cancel at byte 36");
