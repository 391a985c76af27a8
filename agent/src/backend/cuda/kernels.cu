// gpuval device kernels, compiled at run time by NVRTC for the GPU's architecture.
// Memory patterns depend on the address (a stuck or aliased address reads back a value that
// belongs elsewhere), and the verify kernel recomputes them instead of reading a reference.

typedef unsigned long long u64;
typedef unsigned int u32;

// murmur3 finaliser: a cheap 32-bit avalanche.
__device__ __forceinline__ u32 mix32(u32 x) {
    x ^= x >> 16; x *= 0x85ebca6bu;
    x ^= x >> 13; x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}

// The 16-byte pattern of vector index v for a seed; `inv` = 0xffffffff gives its inverse.
__device__ __forceinline__ uint4 pattern(u64 v, u32 seed, u32 inv) {
    u32 lo = (u32)v, hi = (u32)(v >> 32);
    u32 h = mix32(lo * 0x9e3779b1u ^ mix32(hi + seed));
    uint4 p;
    p.x = h ^ inv;
    p.y = (__funnelshift_l(h, h, 11) ^ lo) ^ inv;
    p.z = (~h + seed) ^ inv;
    p.w = (__funnelshift_l(h, h, 23) ^ (lo * 0x27d4eb2fu)) ^ inv;
    return p;
}

#define UNROLL 4

extern "C" __global__ void gv_fill(uint4* buf, u64 nvec, u32 seed, u32 inv) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 base = (u64)blockIdx.x * blockDim.x + threadIdx.x; base < nvec; base += stride * UNROLL) {
        #pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            u64 i = base + k * stride;
            if (i < nvec) __stcs(buf + i, pattern(i, seed, inv));
        }
    }
}

// Which bits of a wrong word flipped: bits[2*b] counts bit b read as 1 where 0 was written,
// bits[2*b+1] bit b read as 0 where 1 was written (64 counters).
__device__ __forceinline__ void tally_bits(u32 got, u32 want, u64* bits) {
    u32 diff = got ^ want;
    while (diff) {
        int b = __ffs(diff) - 1;
        diff &= diff - 1;
        atomicAdd(&bits[2 * b + (((got >> b) & 1u) ? 0 : 1)], 1ull);
    }
}

// counters[0]: mismatched 32-bit words; counters[1]: log slots claimed.
// log[2*s] = word index, log[2*s+1] = (expected << 32) | actual.
__device__ __forceinline__ u64 check_word(u32 got, u32 want, u64 word, u64* counters, u64* log, u32 max_log, u64* bits) {
    if (got == want) return 0;
    tally_bits(got, want, bits);
    u64 slot = atomicAdd(&counters[1], 1ull);
    if (slot < max_log) {
        log[2 * slot] = word;
        log[2 * slot + 1] = ((u64)want << 32) | got;
    }
    return 1;
}

// All four words of a vector checked against theirs; returns the wrong ones.
__device__ __forceinline__ u64 check_vec(uint4 got, uint4 w, u64 i, u64* counters, u64* log, u32 max_log, u64* bits) {
    if (got.x == w.x && got.y == w.y && got.z == w.z && got.w == w.w) return 0;
    return check_word(got.x, w.x, 4 * i + 0, counters, log, max_log, bits)
         + check_word(got.y, w.y, 4 * i + 1, counters, log, max_log, bits)
         + check_word(got.z, w.z, 4 * i + 2, counters, log, max_log, bits)
         + check_word(got.w, w.w, 4 * i + 3, counters, log, max_log, bits);
}

extern "C" __global__ void gv_verify(const uint4* buf, u64 nvec, u32 seed, u32 inv,
                                     u64* counters, u64* log, u32 max_log, u64* bits) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 bad = 0;
    for (u64 base = (u64)blockIdx.x * blockDim.x + threadIdx.x; base < nvec; base += stride * UNROLL) {
        uint4 got[UNROLL];
        #pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            u64 i = base + k * stride;
            if (i < nvec) got[k] = __ldcs(buf + i);
        }
        #pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            u64 i = base + k * stride;
            if (i >= nvec) continue;
            bad += check_vec(got[k], pattern(i, seed, inv), i, counters, log, max_log, bits);
        }
    }
    if (bad) atomicAdd(&counters[0], bad);
}

// --- memtest patterns ------------------------------------------------------------------------

// Every 32-bit word set to p (the start of a moving-inversions pattern).
extern "C" __global__ void gv_fill_const(uint4* buf, u64 nvec, u32 p) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const uint4 v = make_uint4(p, p, p, p);
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nvec; i += stride) __stcs(buf + i, v);
}

// One sweep of moving inversions: every word must read `want` and is then written `next`. The
// threads walk the buffer upward, or downward with `down` set (the order memtest uses for its
// second sweep, so that a write that disturbs a neighbour is read back in both directions).
extern "C" __global__ void gv_invert(uint4* buf, u64 nvec, u32 want, u32 next, u32 down,
                                     u64* counters, u64* log, u32 max_log, u64* bits) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const uint4 w = make_uint4(want, want, want, want);
    const uint4 n = make_uint4(next, next, next, next);
    u64 bad = 0;
    for (u64 base = (u64)blockIdx.x * blockDim.x + threadIdx.x; base < nvec; base += stride * UNROLL) {
        uint4 got[UNROLL];
        #pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            u64 j = base + k * stride;
            u64 i = down ? nvec - 1 - j : j;
            if (j < nvec) got[k] = __ldcs(buf + i);
        }
        #pragma unroll
        for (int k = 0; k < UNROLL; k++) {
            u64 j = base + k * stride;
            if (j >= nvec) continue;
            u64 i = down ? nvec - 1 - j : j;
            bad += check_vec(got[k], w, i, counters, log, max_log, bits);
            __stcs(buf + i, n);
        }
    }
    if (bad) atomicAdd(&counters[0], bad);
}

// A random number sequence: each thread runs its own xorshift stream from a seed mixed with its
// index, over the vectors it owns (fill and verify must be launched with the same grid).
__device__ __forceinline__ u32 stream_start(u32 seed, u64 t) {
    u32 s = mix32((u32)t * 0x9e3779b1u ^ mix32(seed + (u32)(t >> 32)));
    return s ? s : 0x6d2b79f5u;
}
__device__ __forceinline__ u32 xorshift32(u32& s) {
    s ^= s << 13; s ^= s >> 17; s ^= s << 5;
    return s;
}
__device__ __forceinline__ uint4 next_random(u32& s, u32 inv) {
    uint4 v;
    v.x = xorshift32(s) ^ inv; v.y = xorshift32(s) ^ inv;
    v.z = xorshift32(s) ^ inv; v.w = xorshift32(s) ^ inv;
    return v;
}

extern "C" __global__ void gv_random_fill(uint4* buf, u64 nvec, u32 seed, u32 inv) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u32 s = stream_start(seed, t);
    for (u64 i = t; i < nvec; i += stride) __stcs(buf + i, next_random(s, inv));
}

extern "C" __global__ void gv_random_verify(const uint4* buf, u64 nvec, u32 seed, u32 inv,
                                            u64* counters, u64* log, u32 max_log, u64* bits) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u32 s = stream_start(seed, t);
    u64 bad = 0;
    for (u64 i = t; i < nvec; i += stride) {
        uint4 got = __ldcs(buf + i);
        bad += check_vec(got, next_random(s, inv), i, counters, log, max_log, bits);
    }
    if (bad) atomicAdd(&counters[0], bad);
}

// Flips bits of `count` words spread over the buffer (self-test of the verify path).
extern "C" __global__ void gv_corrupt(u32* words, u64 nwords, u32 count) {
    u32 t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t < count) {
        u64 w = (nwords / (count + 1)) * (t + 1) + t;
        if (w < nwords) words[w] ^= (1u << (t % 32));
    }
}

// Uniform values in [-1, 1) from a hash of the element index, for GEMM inputs.
__device__ __forceinline__ float uniform(u64 i, u32 seed) {
    u32 h = mix32((u32)i * 0x9e3779b1u ^ mix32((u32)(i >> 32) + seed));
    return (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

extern "C" __global__ void gv_init_f32(float* out, u64 n, u32 seed) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        out[i] = uniform(i, seed);
}

// Half types as raw 16-bit values, converted by PTX (no headers needed under NVRTC).
typedef unsigned short u16;
__device__ __forceinline__ float f16_to_f32(u16 h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ u16 f32_to_f16(float f) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even (inputs are finite)
    return (u16)(u >> 16);
}

extern "C" __global__ void gv_init_f16(u16* out, u64 n, u32 seed) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        out[i] = f32_to_f16(uniform(i, seed));
}

extern "C" __global__ void gv_init_bf16(u16* out, u64 n, u32 seed) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        out[i] = f32_to_bf16(uniform(i, seed));
}

struct AsF32 { __device__ static float get(float v) { return v; } };
struct AsF16 { __device__ static float get(u16 v) { return f16_to_f32(v); } };
struct AsBf16 { __device__ static float get(u16 v) { return bf16_to_f32(v); } };

// Compares b against reference a: counts elements outside rtol*|a| + atol (NaN always counts)
// and keeps the largest relative difference (as float bits; non-negative floats order like ints).
template <typename Conv, typename T>
__device__ __forceinline__ void compare_impl(const T* a, const T* b, u64 n, float rtol, float atol,
                                             u64* mismatches, u32* max_rel_bits) {
    u64 bad = 0;
    float worst = 0.0f;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float x = Conv::get(a[i]), y = Conv::get(b[i]);
        float d = fabsf(x - y);
        if (!(d <= rtol * fabsf(x) + atol)) bad++;
        float rel = d / fmaxf(fabsf(x), 1e-20f);
        if (rel == rel) worst = fmaxf(worst, rel); else worst = 3.0e38f;
    }
    if (bad) atomicAdd(mismatches, bad);
    if (worst > 0.0f) atomicMax(max_rel_bits, __float_as_uint(worst));
}

extern "C" __global__ void gv_compare_f32(const float* a, const float* b, u64 n, float rtol, float atol, u64* mm, u32* mr) {
    compare_impl<AsF32>(a, b, n, rtol, atol, mm, mr);
}
extern "C" __global__ void gv_compare_f16(const u16* a, const u16* b, u64 n, float rtol, float atol, u64* mm, u32* mr) {
    compare_impl<AsF16>(a, b, n, rtol, atol, mm, mr);
}
extern "C" __global__ void gv_compare_bf16(const u16* a, const u16* b, u64 n, float rtol, float atol, u64* mm, u32* mr) {
    compare_impl<AsBf16>(a, b, n, rtol, atol, mm, mr);
}

// Elementwise transcendental burn: each element iterates sin/exp (both the accurate library
// versions and the special-function-unit intrinsics). Deterministic, so every run must match.
extern "C" __global__ void gv_transcendental(const float* in, float* out, u64 n, u32 rounds) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        float x = in[i];
        float acc = 0.0f;
        for (u32 r = 0; r < rounds; r++) {
            x = sinf(x) * expf(-0.5f * x * x) + __sinf(x + 1.0f) * 0.25f;
            acc += __expf(x * 0.125f);
        }
        out[i] = acc;
    }
}

// --- links -------------------------------------------------------------------------------

__device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Holds its stream until the host sets *flag (pinned, device-mapped memory) or max_ns pass,
// so a batch of copies queued behind it starts at once and their enqueue cost is not timed.
extern "C" __global__ void gv_spin(volatile u32* flag, u64 max_ns) {
    u64 start = global_ns();
    while (*flag == 0 && global_ns() - start < max_ns) {
        __nanosleep(200);
    }
}

// A cyclic chain of pointers through `nodes` slots `stride` bytes apart, starting at base:
// slot i points at slot (i + step) mod nodes, a large jump each time so neighbouring cache
// lines are not prefetched. `step` must be odd and `nodes` a power of two so the walk visits
// every slot before it repeats.
extern "C" __global__ void gv_chain_init(u64 base, u64 nodes, u64 stride, u64 step) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nodes; i += (u64)gridDim.x * blockDim.x) {
        u64 next = (i + step) & (nodes - 1);
        *(u64*)(base + i * stride) = base + next * stride;
    }
}

// One thread walks `steps` links of a chain (possibly in a peer GPU's memory) and writes the
// end pointer (so the walk cannot be optimised away) and the elapsed device time in ns.
extern "C" __global__ void gv_chase(u64 start, u64 steps, u64* out) {
    u64 p = start;
    u64 t0 = global_ns();
    for (u64 s = 0; s < steps; s++) {
        p = *(volatile u64*)p;
    }
    u64 t1 = global_ns();
    out[0] = p;
    out[1] = t1 - t0;
}
