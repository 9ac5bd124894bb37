// NVSHMEM baseline beside simple_write (issue 45, item 4): put+signal ping-pong
// half round trip (8 B .. 1 MiB) and one-way put+signal bandwidth (16 B .. 1 GiB)
// between two PEs, one per GPU, over NVLink P2P. Two processes (bench/nvshmem/run.sh
// starts both); unique-ID bootstrap through a file, no MPI/PMI. Rank 0 writes the JSON
// and the table; diagnostics go to stderr as "[nvshmem rank N] ...".
// Exit codes: 0 ok, 2 usage / no usable GPU, 3 NVSHMEM setup, 4 data mismatch, 5 timeout.
#include <nvshmem.h>
#include <nvshmemx.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

static int g_rank = -1;
// One write per line, so the two ranks' lines do not interleave.
static void vlog(const char *tag, const char *fmt, va_list ap) {
    char line[1024];
    int n = snprintf(line, sizeof line, "[nvshmem rank %d] %s", g_rank, tag);
    n += vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
    n = std::min(n, (int)sizeof line - 2);
    line[n++] = '\n';
    fwrite(line, 1, n, stderr); fflush(stderr);
}
static void logf(const char *fmt, ...) { va_list ap; va_start(ap, fmt); vlog("", fmt, ap); va_end(ap); }
[[noreturn]] static void die(int code, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt); vlog("error: ", fmt, ap); va_end(ap);
    fflush(stdout); _exit(code);  // no finalize: the peer may be gone or a kernel stuck
}
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) \
    die(3, "%s failed: %s (%s:%d)", #x, cudaGetErrorString(e_), __FILE__, __LINE__); } while (0)

enum Level { FLOOR = 0, THREAD = 1, BLOCK = 2 };
static const char *level_name(int l) { return l == FLOOR ? "floor" : l == THREAD ? "thread" : "block"; }

struct Report {                 // one per kernel, written by its lead thread
    unsigned long long t0, t1;  // %globaltimer, ns: start / end of the timed part
    unsigned long long c0, c1;  // clock64 at the same two points (calibration)
    unsigned long long stuck_at;  // signal value a timed-out wait wanted
    unsigned int timed_out;
};

__device__ __forceinline__ unsigned long long gtimer() {
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}
// Bounded wait: polls the signal word (volatile load, as nvshmem_signal_fetch) until
// it reaches v or the globaltimer passes the deadline. Lead thread only.
__device__ bool wait_ge(uint64_t *sig, uint64_t v, unsigned long long deadline, Report *r) {
    unsigned n = 0;
    while (nvshmem_signal_fetch(sig) < v) {
        if ((++n & 1023) == 0 && gtimer() > deadline) {
            r->timed_out = 1; r->stuck_at = v; return false;
        }
    }
    return true;
}

__global__ void fill_pattern(uint8_t *p, size_t n, size_t size) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        p[i] = (uint8_t)((i * 131 + size) & 0xff);
}
__global__ void check_pattern(const uint8_t *p, size_t n, size_t size, unsigned long long *first_bad) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        if (p[i] != (uint8_t)((i * 131 + size) & 0xff)) { atomicMin(first_bad, (unsigned long long)i); return; }
}

// Ping-pong, one kernel per side, persistent loop of warm + iters round trips.
// Message i carries sequence i+1 (NVSHMEM_SIGNAL_SET); the responder waits for it and
// sends the same sequence back. The initiator records each timed round trip in cycles.
struct PingPong {
    uint8_t *dest; const uint8_t *src; size_t bytes; uint64_t *sig;
    int peer, level, initiator, warm, iters;
    unsigned long long timeout_ns, *cycles; Report *rep;
};
__device__ __forceinline__ void pp_send(const PingPong &p, uint64_t seq) {
    if (p.level == BLOCK) {
        nvshmemx_putmem_signal_block(p.dest, p.src, p.bytes, p.sig, seq, NVSHMEM_SIGNAL_SET, p.peer);
    } else if (threadIdx.x == 0) {
        if (p.level == THREAD) nvshmem_putmem_signal(p.dest, p.src, p.bytes, p.sig, seq, NVSHMEM_SIGNAL_SET, p.peer);
        else nvshmemx_signal_op(p.sig, seq, NVSHMEM_SIGNAL_SET, p.peer);
    }
}
__global__ void pingpong_kernel(PingPong p) {
    __shared__ int abort_;
    const bool lead = threadIdx.x == 0;
    const unsigned long long deadline = gtimer() + p.timeout_ns;
    if (lead) abort_ = 0;
    __syncthreads();
    unsigned long long c = 0;
    for (int i = 0; i < p.warm + p.iters; i++) {
        const uint64_t seq = (uint64_t)i + 1;
        if (p.initiator) {
            if (lead) {
                if (i == p.warm) { p.rep->t0 = gtimer(); p.rep->c0 = clock64(); }
                c = clock64();
            }
            pp_send(p, seq);
            if (lead && !wait_ge(p.sig, seq, deadline, p.rep)) abort_ = 1;
            if (lead && i >= p.warm) p.cycles[i - p.warm] = clock64() - c;
            __syncthreads();
        } else {
            if (lead && !wait_ge(p.sig, seq, deadline, p.rep)) abort_ = 1;
            __syncthreads();
            if (!abort_) pp_send(p, seq);
        }
        if (abort_) return;
    }
    if (lead && p.initiator) { p.rep->c1 = clock64(); p.rep->t1 = gtimer(); }
}

// Bandwidth: the initiator's grid puts the size in chunks (chunk k by block k % blocks),
// one nvshmemx_putmem_signal_block per chunk with NVSHMEM_SIGNAL_ADD 1, warm + iters
// times back to back. The responder acks (ack = 1) once the warm-up's chunks all
// arrived and (ack = 2) after the last timed one; t0 = first timed put (after ack 1),
// t1 = the initiator seeing ack 2 (so one 8-byte ack flight is included).
struct Bandwidth {
    uint8_t *dest; const uint8_t *src; size_t bytes, chunk; uint64_t nchunks;
    uint64_t *sig, *ack; int peer, warm, iters;
    unsigned long long timeout_ns; Report *rep;
};
__global__ void bw_send_kernel(Bandwidth p) {
    __shared__ int abort_;
    const bool lead = threadIdx.x == 0;
    const unsigned long long deadline = gtimer() + p.timeout_ns;
    for (int i = 0; i < p.warm + p.iters; i++) {
        if (i == p.warm) {
            if (lead) abort_ = !wait_ge(p.ack, 1, deadline, p.rep);
            __syncthreads();
            if (abort_) return;
            if (lead && blockIdx.x == 0) p.rep->t0 = gtimer();
        }
        for (uint64_t k = blockIdx.x; k < p.nchunks; k += gridDim.x) {
            const size_t off = k * p.chunk, len = p.bytes - off < p.chunk ? p.bytes - off : p.chunk;
            nvshmemx_putmem_signal_block(p.dest + off, p.src + off, len, p.sig, 1, NVSHMEM_SIGNAL_ADD, p.peer);
        }
    }
    if (lead && blockIdx.x == 0 && wait_ge(p.ack, 2, deadline, p.rep)) p.rep->t1 = gtimer();
}
__global__ void bw_recv_kernel(Bandwidth p) {
    const unsigned long long deadline = gtimer() + p.timeout_ns;
    if (!wait_ge(p.sig, p.nchunks * p.warm, deadline, p.rep)) return;
    nvshmemx_signal_op(p.ack, 1, NVSHMEM_SIGNAL_SET, p.peer);
    if (!wait_ge(p.sig, p.nchunks * (uint64_t)(p.warm + p.iters), deadline, p.rep)) return;
    nvshmemx_signal_op(p.ack, 2, NVSHMEM_SIGNAL_SET, p.peer);
}

// Barrier between steps with a deadline: each side SETs the other's word to the epoch.
__global__ void barrier_kernel(uint64_t *bar, uint64_t epoch, int peer, unsigned long long timeout_ns, Report *rep) {
    const unsigned long long deadline = gtimer() + timeout_ns;
    nvshmemx_signal_op(bar, epoch, NVSHMEM_SIGNAL_SET, peer);
    wait_ge(bar, epoch, deadline, rep);
}

// ---------------------------------------------------------------- host side
struct Opts {
    int rank = -1; std::string uid_file, out; double timeout_s = 10, init_timeout_s = 60;
    size_t pp_min = 8, pp_max = 1 << 20, pp_factor = 8, thread_max = 64 << 10;
    size_t bw_min = 16, bw_max = (size_t)1 << 30, bw_factor = 4;
    int pp_threads = 256, bw_threads = 256, bw_max_blocks = 0, pp_iters = 1000;
    std::string gpu_a = "?", gpu_b = "?";
};
static const char *USAGE =
    "usage: nvshmem_bench --rank 0|1 --uid-file PATH [--out FILE.json] [options]\n"
    "  Two processes (bench/nvshmem/run.sh starts both), rank r on CUDA device r.\n"
    "  --timeout S          every GPU/host wait, seconds (10)    --init-timeout S  UID file wait (60)\n"
    "  --pp-min/--pp-max/--pp-factor N   ping-pong sizes (8, 1M, 8)   --pp-iters N  (1000)\n"
    "  --thread-max N       largest thread-level ping-pong size (64K)\n"
    "  --bw-min/--bw-max/--bw-factor N   bandwidth sizes (16, 1G, 4)\n"
    "  --pp-threads N / --bw-threads N   block size (256 / 256); --bw-max-blocks N (2 x SMs)\n"
    "  --initiator-gpu A --target-gpu B  physical GPU ids, for the JSON only\n"
    "  Sizes take K/M/G suffixes. Exit: 0 ok, 2 usage/no GPU, 3 NVSHMEM setup, 4 mismatch, 5 timeout.\n";
static size_t parse_size(const char *s) {
    char *e; double v = strtod(s, &e);
    size_t m = (*e == 'K' || *e == 'k') ? 1 << 10 : (*e == 'M' || *e == 'm') ? 1 << 20 : (*e == 'G' || *e == 'g') ? 1 << 30 : 1;
    if (e == s || v <= 0) die(2, "bad size '%s'", s);
    return (size_t)(v * m);
}
static Opts parse(int argc, char **argv) {
    Opts o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "-h" || a == "--help") { fputs(USAGE, stdout); exit(0); }
        if (i + 1 >= argc) die(2, "%s needs a value\n%s", a.c_str(), USAGE);
        const char *v = argv[++i];
        if (a == "--rank") o.rank = atoi(v);
        else if (a == "--uid-file") o.uid_file = v;
        else if (a == "--out") o.out = v;
        else if (a == "--timeout") o.timeout_s = atof(v);
        else if (a == "--init-timeout") o.init_timeout_s = atof(v);
        else if (a == "--pp-min") o.pp_min = parse_size(v);
        else if (a == "--pp-max") o.pp_max = parse_size(v);
        else if (a == "--pp-factor") o.pp_factor = std::max<size_t>(2, atoi(v));
        else if (a == "--pp-iters") o.pp_iters = std::max(10, atoi(v));
        else if (a == "--thread-max") o.thread_max = parse_size(v);
        else if (a == "--bw-min") o.bw_min = parse_size(v);
        else if (a == "--bw-max") o.bw_max = parse_size(v);
        else if (a == "--bw-factor") o.bw_factor = std::max<size_t>(2, atoi(v));
        else if (a == "--pp-threads") o.pp_threads = atoi(v);
        else if (a == "--bw-threads") o.bw_threads = atoi(v);
        else if (a == "--bw-max-blocks") o.bw_max_blocks = atoi(v);
        else if (a == "--initiator-gpu") o.gpu_a = v;
        else if (a == "--target-gpu") o.gpu_b = v;
        else die(2, "unknown option %s\n%s", a.c_str(), USAGE);
    }
    if ((o.rank != 0 && o.rank != 1) || o.uid_file.empty()) die(2, "--rank 0|1 and --uid-file are required\n%s", USAGE);
    return o;
}

struct Ctx {
    Opts o; int peer; cudaStream_t s; Report *rep; unsigned long long *bad;
    uint64_t *sigs;  // symmetric: [0] data signal, [1] ack, [2] barrier
    uint8_t *dest, *src; uint64_t epoch = 0;
};
// Waits for the stream with a host deadline, then checks the kernel's own timeout flag.
static Report finish(Ctx &c, const char *what) {
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(c.o.timeout_s + 5);
    cudaError_t e;
    while ((e = cudaStreamQuery(c.s)) == cudaErrorNotReady) {
        if (std::chrono::steady_clock::now() > end) die(5, "%s: GPU still busy after %.0f s (peer gone?)", what, c.o.timeout_s + 5);
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (e != cudaSuccess) die(3, "%s: kernel failed: %s", what, cudaGetErrorString(e));
    Report r; CK(cudaMemcpy(&r, c.rep, sizeof r, cudaMemcpyDeviceToHost));
    if (r.timed_out) die(5, "%s: no signal from the peer within %.1f s (waited for value %llu)", what, c.o.timeout_s, r.stuck_at);
    return r;
}
static unsigned long long tmo(const Ctx &c) { return (unsigned long long)(c.o.timeout_s * 1e9); }
// Resets this side's signals, report and (n bytes of) destination, then meets the peer.
static void step_begin(Ctx &c, size_t n, const char *what) {
    CK(cudaMemsetAsync(c.sigs, 0, 2 * sizeof(uint64_t), c.s));
    CK(cudaMemsetAsync(c.rep, 0, sizeof(Report), c.s));
    if (n) CK(cudaMemsetAsync(c.dest, 0, n, c.s));
    barrier_kernel<<<1, 1, 0, c.s>>>(c.sigs + 2, ++c.epoch, c.peer, tmo(c), c.rep);
    CK(cudaGetLastError()); finish(c, what);
    CK(cudaMemsetAsync(c.rep, 0, sizeof(Report), c.s));
}
static void verify(Ctx &c, size_t n, size_t size, const char *what) {
    unsigned long long first = ~0ull;
    CK(cudaMemcpyAsync(c.bad, &first, sizeof first, cudaMemcpyHostToDevice, c.s));
    check_pattern<<<1024, 256, 0, c.s>>>(c.dest, n, size, c.bad);
    CK(cudaMemcpyAsync(&first, c.bad, sizeof first, cudaMemcpyDeviceToHost, c.s));
    CK(cudaStreamSynchronize(c.s));
    if (first != ~0ull) {
        uint8_t got; CK(cudaMemcpy(&got, c.dest + first, 1, cudaMemcpyDeviceToHost));
        die(4, "data mismatch: %s, %zu bytes, offset %llu: got 0x%02x, want 0x%02x", what, size, first, got,
            (unsigned)((first * 131 + size) & 0xff));
    }
}
static void fill(Ctx &c, size_t n, size_t size) { fill_pattern<<<1024, 256, 0, c.s>>>(c.src, n, size); CK(cudaGetLastError()); }
static double pct(std::vector<double> v, double q) {
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, (size_t)std::floor(q * (v.size() - 1) + 0.5))];
}
// lo, lo*f, ... up to hi, and hi itself when the steps miss it (8..1M by 8 ends 256K, 1M).
static std::vector<size_t> sweep(size_t lo, size_t hi, size_t f) {
    std::vector<size_t> v;
    for (size_t x = lo; x <= hi; x *= f) v.push_back(x);
    if (v.empty() || v.back() != hi) v.push_back(hi);
    return v;
}

// A GPU id as JSON: a bare number when it is one, else a string.
static std::string jnum(const std::string &s) {
    bool digits = !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
    return digits ? s : "\"" + s + "\"";
}

int main(int argc, char **argv) {
    const auto t_start = std::chrono::steady_clock::now();
    Opts o = parse(argc, argv);
    g_rank = o.rank;
    int ndev = 0; cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev < 2)
        die(2, "need 2 visible CUDA devices (rank r uses device r), have %d%s%s", e == cudaSuccess ? ndev : 0,
            e == cudaSuccess ? "" : ": ", e == cudaSuccess ? "" : cudaGetErrorString(e));
    CK(cudaSetDevice(o.rank));
    int p2p = 0; CK(cudaDeviceCanAccessPeer(&p2p, o.rank, 1 - o.rank));
    if (!p2p) die(3, "devices 0 and 1 have no P2P access; this NVLink/P2P-only setup cannot run");
    // Single node, NVLink P2P only: no remote transport, no NVLS/MNNVL, no NCCL; bootstrap
    // sockets on loopback. The caller's environment wins (setenv does not overwrite).
    const char *defaults[8][2] = {{"NVSHMEM_REMOTE_TRANSPORT", "none"}, {"NVSHMEM_DISABLE_NVLS", "1"},
        {"NVSHMEM_DISABLE_MNNVL", "1"}, {"NVSHMEM_DISABLE_NCCL", "1"}, {"NVSHMEM_IB_ENABLE_IBGDA", "0"},
        {"NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo"}, {"NVSHMEM_BOOTSTRAP_UID_SOCK_FAMILY", "AF_INET"},
        {"NVSHMEM_SYMMETRIC_SIZE", nullptr}};
    // The heap holds the largest destination plus NVSHMEM's own bookkeeping.
    char heap[32]; snprintf(heap, sizeof heap, "%zu", std::max(o.pp_max, o.bw_max) + ((size_t)256 << 20));
    defaults[7][1] = heap;
    for (auto &d : defaults) setenv(d[0], d[1], 0);
    for (auto &d : defaults) logf("%s=%s", d[0], getenv(d[0]));
    if (getenv("NVSHMEM_DISABLE_CUDA_VMM")) logf("NVSHMEM_DISABLE_CUDA_VMM=%s", getenv("NVSHMEM_DISABLE_CUDA_VMM"));

    // Unique-ID bootstrap: rank 0 publishes the ID in a file (write + rename), rank 1 polls.
    nvshmemx_uniqueid_t uid = NVSHMEMX_UNIQUEID_INITIALIZER;
    if (o.rank == 0) {
        if (nvshmemx_get_uniqueid(&uid) != 0) die(3, "nvshmemx_get_uniqueid failed (is nvshmem_bootstrap_uid.so.3 on LD_LIBRARY_PATH?)");
        std::string tmp = o.uid_file + ".tmp";
        FILE *f = fopen(tmp.c_str(), "wb");
        if (!f || fwrite(&uid, sizeof uid, 1, f) != 1 || fclose(f) != 0 || rename(tmp.c_str(), o.uid_file.c_str()) != 0)
            die(3, "cannot write %s: %s", o.uid_file.c_str(), strerror(errno));
    } else {
        auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.init_timeout_s);
        FILE *f;
        while (!(f = fopen(o.uid_file.c_str(), "rb"))) {
            if (std::chrono::steady_clock::now() > end) die(5, "no unique ID in %s after %.0f s (rank 0 not started?)", o.uid_file.c_str(), o.init_timeout_s);
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        size_t got = fread(&uid, sizeof uid, 1, f); fclose(f);
        if (got != 1) die(3, "short unique ID file %s", o.uid_file.c_str());
    }
    logf("unique ID %s; nvshmemx_init_attr ...", o.rank == 0 ? "written" : "read");
    nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
    if (nvshmemx_set_attr_uniqueid_args(o.rank, 2, &uid, &attr) != 0) die(3, "nvshmemx_set_attr_uniqueid_args failed");
    if (nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) != 0) die(3, "nvshmemx_init_attr failed");
    if (nvshmem_my_pe() != o.rank || nvshmem_n_pes() != 2) die(3, "PE %d of %d, expected %d of 2", nvshmem_my_pe(), nvshmem_n_pes(), o.rank);
    int vmaj, vmin, vpatch; nvshmemx_vendor_get_version_info(&vmaj, &vmin, &vpatch);
    char version[32]; snprintf(version, sizeof version, "%d.%d.%d", vmaj, vmin, vpatch);
    logf("NVSHMEM %s (built against %d.%d.%d), PE %d of 2 on device %d", version, NVSHMEM_VENDOR_MAJOR_VERSION,
         NVSHMEM_VENDOR_MINOR_VERSION, NVSHMEM_VENDOR_PATCH_VERSION, o.rank, o.rank);

    Ctx c; c.o = o; c.peer = 1 - o.rank;
    const size_t buf = std::max(o.pp_max, o.bw_max);
    c.sigs = (uint64_t *)nvshmem_malloc(256);
    c.dest = (uint8_t *)nvshmem_malloc(buf);
    if (!c.sigs || !c.dest) die(3, "nvshmem_malloc of %zu bytes failed (raise NVSHMEM_SYMMETRIC_SIZE)", buf);
    if (!nvshmem_ptr(c.dest, c.peer)) die(3, "the peer's heap is not reachable by load/store (nvshmem_ptr is NULL): no P2P path");
    CK(cudaMalloc(&c.src, buf));
    CK(cudaMalloc(&c.rep, sizeof(Report)));
    CK(cudaMalloc(&c.bad, sizeof(unsigned long long)));
    CK(cudaStreamCreateWithFlags(&c.s, cudaStreamNonBlocking));
    unsigned long long *cycles; CK(cudaMalloc(&cycles, sizeof(unsigned long long) * o.pp_iters));
    cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, o.rank));
    const bool init = o.rank == 0;

    std::string json_pp, json_bw;
    if (init) printf("NVSHMEM %s, %s, GPU %s -> GPU %s\n%-7s %10s %7s %12s %12s %12s\n", version, prop.name,
                     o.gpu_a.c_str(), o.gpu_b.c_str(), "level", "bytes", "iters", "half p50 us", "half p99 us", "half mean us");
    // 1. Ping-pong: floor (bare signal), thread (<= thread_max), block.
    for (int level : {FLOOR, THREAD, BLOCK}) {
        std::vector<size_t> sizes = level == FLOOR ? std::vector<size_t>{0} : sweep(o.pp_min, o.pp_max, o.pp_factor);
        for (size_t size : sizes) {
            if (level == THREAD && size > o.thread_max) continue;
            char what[96]; snprintf(what, sizeof what, "ping-pong %s %zu B", level_name(level), size);
            // Thread level moves tens of MB/s: fewer round trips for large sizes.
            int iters = level == THREAD ? (int)std::clamp<double>(2.5e6 / std::max<size_t>(size, 1), 20, o.pp_iters) : o.pp_iters;
            int warm = std::max(1, iters / 10);
            fill(c, size, size);
            logf("%s: %d round trips + %d warm-up", what, iters, warm);
            step_begin(c, size, what);
            PingPong p{c.dest, c.src, size, c.sigs, c.peer, level, init, warm, iters, tmo(c), cycles, c.rep};
            pingpong_kernel<<<1, level == BLOCK ? o.pp_threads : 1, 0, c.s>>>(p);
            CK(cudaGetLastError());
            Report r = finish(c, what);
            if (size) verify(c, size, size, what);
            if (!init) continue;
            std::vector<unsigned long long> cyc(iters);
            CK(cudaMemcpy(cyc.data(), cycles, sizeof(unsigned long long) * iters, cudaMemcpyDeviceToHost));
            const double ns_per_cycle = (double)(r.t1 - r.t0) / (double)(r.c1 - r.c0);
            std::vector<double> half(iters);
            for (int i = 0; i < iters; i++) half[i] = cyc[i] * ns_per_cycle / 2e3;  // µs
            const double p50 = pct(half, 0.5), p99 = pct(half, 0.99), mn = pct(half, 0.0);
            const double mean = (double)(r.t1 - r.t0) / (2e3 * iters);
            printf("%-7s %10zu %7d %12.3f %12.3f %12.3f\n", level_name(level), size, iters, p50, p99, mean);
            fflush(stdout);
            char row[400];
            snprintf(row, sizeof row, "%s\n    {\"level\":\"%s\",\"bytes\":%zu,\"half_rtt_us_p50\":%.4f,\"half_rtt_us_p99\":%.4f,"
                     "\"half_rtt_us_min\":%.4f,\"half_rtt_us_mean\":%.4f,\"iters\":%d,\"warmup\":%d,\"threads\":%d,\"verified\":true}",
                     json_pp.empty() ? "" : ",", level_name(level), size, p50, p99, mn, mean, iters, warm, level == BLOCK ? o.pp_threads : 1);
            json_pp += row;
        }
    }
    // 2. Bandwidth, one way, rank 0 -> rank 1; rank 1 verifies the data.
    int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, bw_send_kernel, o.bw_threads, 0));
    const int resident = std::max(1, occ * prop.multiProcessorCount);
    const int max_blocks = std::min(resident, o.bw_max_blocks > 0 ? o.bw_max_blocks : 2 * prop.multiProcessorCount);
    if (init) printf("\n%-7s %10s %7s %7s %9s %10s\n", "level", "bytes", "blocks", "iters", "chunk", "GB/s");
    for (size_t size : sweep(o.bw_min, o.bw_max, o.bw_factor)) {
        // One block per 16 KiB (as simple_write), contiguous slices up to 256 KiB a block,
        // else 64 KiB chunks dealt round-robin.
        size_t blocks = std::clamp<size_t>((size + (16 << 10) - 1) >> 14, 1, max_blocks);
        size_t chunk = ((size + blocks - 1) / blocks + 15) / 16 * 16;
        if (chunk > (256 << 10)) chunk = 64 << 10;
        const uint64_t nchunks = (size + chunk - 1) / chunk;
        blocks = std::min<size_t>(blocks, nchunks);
        const double est_s = 2e-6 + size / (std::min(40.0 * blocks, 350.0) * 1e9);
        const int iters = (int)std::clamp(0.08 / est_s, 5.0, 20000.0), warm = std::max(1, iters / 10);
        char what[96]; snprintf(what, sizeof what, "bandwidth %zu B", size);
        logf("%s: %zu blocks x %d threads, chunk %zu, %d iterations + %d warm-up", what, blocks, o.bw_threads, chunk, iters, warm);
        if (init) fill(c, size, size);
        step_begin(c, init ? 0 : size, what);
        Bandwidth b{c.dest, c.src, size, chunk, nchunks, c.sigs, c.sigs + 1, c.peer, warm, iters, tmo(c), c.rep};
        if (init) bw_send_kernel<<<(unsigned)blocks, o.bw_threads, 0, c.s>>>(b);
        else bw_recv_kernel<<<1, 1, 0, c.s>>>(b);
        CK(cudaGetLastError());
        Report r = finish(c, what);
        if (!init) { verify(c, size, size, what); continue; }
        const double ns = (double)(r.t1 - r.t0), gbps = (double)size * iters / ns;
        printf("%-7s %10zu %7zu %7d %9zu %10.2f\n", "block", size, blocks, iters, chunk, gbps);
        fflush(stdout);
        char row[400];
        snprintf(row, sizeof row, "%s\n    {\"level\":\"block\",\"blocks\":%zu,\"threads\":%d,\"chunk\":%zu,\"bytes\":%zu,"
                 "\"gbps\":%.4f,\"gpu_ns\":%.0f,\"iters\":%d,\"warmup\":%d,\"verified_by_target\":true}",
                 json_bw.empty() ? "" : ",", blocks, o.bw_threads, chunk, size, gbps, ns, iters, warm);
        json_bw += row;
    }
    // The target's verdict on the last size reaches rank 0 through this final barrier:
    // a target that found a mismatch exits instead, and this barrier times out.
    step_begin(c, 0, "final barrier");
    if (init && !o.out.empty()) {
        FILE *f = fopen(o.out.c_str(), "w");
        if (!f) die(3, "cannot write %s: %s", o.out.c_str(), strerror(errno));
        fprintf(f, "{\"program\":\"nvshmem\",\"nvshmem_version\":\"%s\",\"built_with\":\"%d.%d.%d\",\n"
                " \"gpus\":{\"initiator\":%s,\"target\":%s,\"name\":\"%s\"},\n"
                " \"env\":{\"NVSHMEM_REMOTE_TRANSPORT\":\"%s\",\"NVSHMEM_DISABLE_CUDA_VMM\":\"%s\",\"NVSHMEM_DISABLE_NVLS\":\"%s\"},\n"
                " \"pingpong\":[%s],\n \"bandwidth\":[%s]}\n",
                version, NVSHMEM_VENDOR_MAJOR_VERSION, NVSHMEM_VENDOR_MINOR_VERSION, NVSHMEM_VENDOR_PATCH_VERSION,
                jnum(o.gpu_a).c_str(), jnum(o.gpu_b).c_str(), prop.name, getenv("NVSHMEM_REMOTE_TRANSPORT"),
                getenv("NVSHMEM_DISABLE_CUDA_VMM") ? getenv("NVSHMEM_DISABLE_CUDA_VMM") : "", getenv("NVSHMEM_DISABLE_NVLS"),
                json_pp.c_str(), json_bw.c_str());
        if (fclose(f) != 0) die(3, "cannot write %s", o.out.c_str());
        logf("wrote %s", o.out.c_str());
    }
    nvshmem_free(c.dest); nvshmem_free(c.sigs);
    nvshmem_finalize();
    logf("done in %.1f s", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count());
    return 0;
}
