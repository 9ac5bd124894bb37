// What launching a kernel costs on one GPU, by how it is launched: the part
// of a small call's time that no kernel body can shorten.
//
// Every variant launches an empty kernel (it only waits for the grid before
// it and lets the next one launch, as every collective call does: Hopper's
// griddepcontrol, a no-op unless launched with programmatic serialization)
// and times it three ways, as `collectives` times its calls and NCCL's:
//   - per call: an event before and after each launch (p50 over the calls);
//   - batch: the calls back to back between two events (mean per call);
//   - graph: the same calls captured once into a CUDA graph, the graph's
//     second launch between two events (mean per call).
// Each of the three is queued behind a gate of its own (a one-thread kernel
// polling a host word, bounded by a deadline), so the GPU runs it at its own
// pace, not at the rate the host launches; a stream holds about 1,000
// pending launches before the host blocks, hence at most 300 calls.
// Events resolve to about 0.5 µs, so the per-call column is coarse where
// the batch and graph means (over the calls) are not; with an event between
// every two kernels, PDL overlaps nothing per call: its gain shows only
// batched and from the graph. Before the table the GPU runs the first
// variant for about half a second (its clocks up); after it, the first
// variant again, as a check that they did not drift.
//
// The variants change one thing at a time from the first row: the block
// (32 or 512 threads), the size of the kernel's parameter (8 bytes, the 328
// of `collectives`' CollParams, 4 KiB as NCCL's kernel arguments reach), the
// launch call (cudaLaunchKernel or cudaLaunchKernelEx), and the attributes
// NCCL sets on sm90 (the remote memory-synchronization domain) or
// `collectives --pdl` sets (programmatic stream serialization).
//
// Exit 0; 1 on a CUDA error or a gate that timed out; 2 on a bad argument.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#define CK(x)                                                                            \
    do {                                                                                 \
        cudaError_t ck_ = (x);                                                           \
        if (ck_ != cudaSuccess) {                                                        \
            fprintf(stderr, "launch_floor: %s: %s\n", #x, cudaGetErrorString(ck_));      \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

template <int N>
struct Params {
    uint8_t bytes[N];
};

// The kernel under test: the start and end every collective call has.
template <int N>
__global__ void empty(Params<N>) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Holds the stream until the host sets *open (or the deadline passes: then
// *late is set and the work behind it runs anyway, and the host fails).
__global__ void gate(const volatile int *open, int *late, uint64_t deadline_ns) {
    const uint64_t end = globaltimer_ns() + deadline_ns;
    while (*open == 0) {
        if (globaltimer_ns() > end) {
            *late = 1;
            return;
        }
    }
}

// How one variant launches.
struct Variant {
    const char *name;
    int threads;
    int param_bytes;
    bool ex;      // cudaLaunchKernelEx (else cudaLaunchKernel)
    bool remote;  // + the remote memory-synchronization domain
    bool pdl;     // + programmatic stream serialization
};

template <int N>
void launch_n(const Variant &v, cudaStream_t s) {
    static Params<N> p{};
    if (!v.ex) {
        void *args[] = {&p};
        CK(cudaLaunchKernel((const void *)empty<N>, dim3(1), dim3(v.threads), args, 0, s));
        return;
    }
    cudaLaunchAttribute attrs[2];
    int n = 0;
    if (v.remote) {
        attrs[n].id = cudaLaunchAttributeMemSyncDomain;
        attrs[n++].val.memSyncDomain = cudaLaunchMemSyncDomainRemote;
    }
    if (v.pdl) {
        attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    cudaLaunchConfig_t c{};
    c.gridDim = dim3(1);
    c.blockDim = dim3(v.threads);
    c.stream = s;
    c.attrs = n ? attrs : nullptr;
    c.numAttrs = n;
    CK(cudaLaunchKernelEx(&c, empty<N>, p));
}

void launch(const Variant &v, cudaStream_t s) {
    switch (v.param_bytes) {
        case 8: return launch_n<8>(v, s);
        case 328: return launch_n<328>(v, s);
        default: return launch_n<4096>(v, s);
    }
}

// The host word the gate polls, and the flag it raises when late.
struct Gate {
    int *host = nullptr;  // pinned, mapped: the host's side of the word
    int *open = nullptr;  // the GPU's side of it
    int *late = nullptr;  // device
    uint64_t deadline_ns = 0;

    void close(cudaStream_t s) {
        *reinterpret_cast<volatile int *>(host) = 0;
        gate<<<1, 1, 0, s>>>(open, late, deadline_ns);
        CK(cudaGetLastError());
    }
    void release_and_wait(cudaStream_t s) {
        *reinterpret_cast<volatile int *>(host) = 1;
        CK(cudaStreamSynchronize(s));
        int was_late = 0;
        CK(cudaMemcpy(&was_late, late, sizeof(int), cudaMemcpyDeviceToHost));
        if (was_late) {
            fprintf(stderr, "launch_floor: the gate timed out before the host had queued the work: the host blocked "
                            "(lower --calls) or the GPU is busy with other work\n");
            exit(1);
        }
    }
};

struct Times {
    double per_call_p50_us, batch_us, graph_us;
};

float ms(cudaEvent_t a, cudaEvent_t b) {
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    return t;
}

// The GPU time from a to b, µs.
double us(cudaEvent_t a, cudaEvent_t b) { return ms(a, b) * 1e3; }

// One variant timed the three ways, each behind a gate of its own.
Times measure(const Variant &v, cudaStream_t s, Gate &g, int calls) {
    std::vector<cudaEvent_t> ev(2 * calls + 4);
    for (auto &e : ev) CK(cudaEventCreate(&e));
    // Captured while the stream is idle, before any gate (a kernel's module
    // loads at its first use, which must not wait behind a closed gate).
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
    for (int i = 0; i < calls; ++i) launch(v, s);
    CK(cudaStreamEndCapture(s, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    CK(cudaGraphUpload(exec, s));
    g.close(s);
    for (int i = 0; i < calls; ++i) {
        CK(cudaEventRecord(ev[2 * i], s));
        launch(v, s);
        CK(cudaEventRecord(ev[2 * i + 1], s));
    }
    g.release_and_wait(s);
    cudaEvent_t *b = &ev[2 * calls];
    g.close(s);
    CK(cudaEventRecord(b[0], s));
    for (int i = 0; i < calls; ++i) launch(v, s);
    CK(cudaEventRecord(b[1], s));
    g.release_and_wait(s);
    g.close(s);
    CK(cudaGraphLaunch(exec, s));  // the first launch of a graph is not timed
    CK(cudaEventRecord(b[2], s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(b[3], s));
    g.release_and_wait(s);
    std::vector<double> per;
    for (int i = 2; i < calls; ++i) per.push_back(us(ev[2 * i], ev[2 * i + 1]));  // the first two warm
    std::sort(per.begin(), per.end());
    Times t{per[per.size() / 2], us(b[0], b[1]) / calls, us(b[2], b[3]) / calls};
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    for (auto &e : ev) CK(cudaEventDestroy(e));
    return t;
}

int usage(const char *why) {
    fprintf(stderr, "launch_floor: %s\nusage: launch_floor [--calls N (10-300, default 200)] [--device D]\n", why);
    return 2;
}

int main(int argc, char **argv) {
    int calls = 200, device = 0;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "-h" || a == "--help") {
            printf("launch_floor [--calls N] [--device D]: what launching an empty kernel costs on one GPU, per call "
                   "between events, batched and from a graph, by block size, parameter size, launch call and "
                   "attribute (remote memory-synchronization domain, programmatic serialization).\n");
            return 0;
        }
        if ((a == "--calls" || a == "--device") && i + 1 < argc) {
            char *end = nullptr;
            const char *text = argv[++i];
            const long n = strtol(text, &end, 10);
            if (end == text || *end != 0 || n < 0 || n > 100000)
                return usage(("not a number we take: " + std::string(text)).c_str());
            (a == "--calls" ? calls : device) = int(n);
            continue;
        }
        return usage(("unknown argument or missing value: " + a).c_str());
    }
    if (calls < 10 || calls > 300) return usage("--calls: want 10 to 300 (a stream holds about 1,000 pending launches)");
    int n = 0;
    const cudaError_t found = cudaGetDeviceCount(&n);
    if (found != cudaSuccess || n == 0) {
        fprintf(stderr, "launch_floor: no usable NVIDIA GPU here (%s): run it on a GPU machine\n",
                found != cudaSuccess ? cudaGetErrorString(found) : "no device");
        return 1;
    }
    if (device < 0 || device >= n) return usage("--device: no such GPU");
    CK(cudaSetDevice(device));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, device));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    Gate g;
    CK(cudaHostAlloc(&g.host, sizeof(int), cudaHostAllocMapped));
    CK(cudaHostGetDevicePointer(&g.open, g.host, 0));
    CK(cudaMalloc(&g.late, sizeof(int)));
    CK(cudaMemsetAsync(g.late, 0, sizeof(int), s));
    CK(cudaStreamSynchronize(s));
    g.deadline_ns = 5'000'000'000ull;
    const Variant variants[] = {
        {"plain, 32 threads, 8-byte parameter", 32, 8, false, false, false},
        {"plain, 512 threads, 8-byte parameter", 512, 8, false, false, false},
        {"plain, 512 threads, 328-byte parameter (collectives)", 512, 328, false, false, false},
        {"plain, 512 threads, 4 KiB parameter", 512, 4096, false, false, false},
        {"Ex, 512 threads, 328 bytes, no attribute", 512, 328, true, false, false},
        {"Ex, remote sync domain (as NCCL on sm90)", 512, 328, true, true, false},
        {"Ex, PDL (as collectives --pdl)", 512, 328, true, false, true},
        {"Ex, remote sync domain and PDL", 512, 328, true, true, true},
    };
    printf("# %s (sm_%d%d), %d calls a variant; us; ratios to the first row\n", prop.name, prop.major, prop.minor,
           calls);
    printf("%-55s %10s %8s %10s %8s %10s %8s\n", "variant", "per call", "/first", "batch", "/first", "graph",
           "/first");
    // The clocks up: the first variant for about half a second.
    const auto warm_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (std::chrono::steady_clock::now() < warm_until) measure(variants[0], s, g, calls);
    Times first{};
    const auto row = [&](const char *name, const Times &t) {
        printf("%-55s %10.2f %8.2f %10.2f %8.2f %10.2f %8.2f\n", name, t.per_call_p50_us,
               t.per_call_p50_us / first.per_call_p50_us, t.batch_us, t.batch_us / first.batch_us, t.graph_us,
               t.graph_us / first.graph_us);
    };
    for (const Variant &v : variants) {
        measure(v, s, g, calls);  // warm-up: the module, the graph path
        const Times t = measure(v, s, g, calls);
        if (&v == variants) first = t;
        row(v.name, t);
    }
    row("the first row again (a drift check)", measure(variants[0], s, g, calls));
    return 0;
}
