// Elementwise kernels of the training check, compiled at run time by NVRTC. Tensors are bf16
// held as raw 16-bit words; the main kernels take 8 elements (16 bytes) per load, so every
// element count they see is a multiple of 8 (the shapes are multiples of 64).

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

__device__ __forceinline__ float bf_get(u16 v) { return __uint_as_float(((u32)v) << 16); }
__device__ __forceinline__ u16 bf_put(float f) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(f));
    return r;
}

// A counter-based hash (splitmix64's finaliser) giving a value in [-1, 1).
__device__ __forceinline__ float hashed(u64 i, u64 seed) {
    u64 z = i + seed * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 8388608.0f) - 1.0f;
}

// Eight bf16 values of one 16-byte word, unpacked to floats and back.
struct Eight { float v[8]; };
__device__ __forceinline__ Eight unpack(uint4 w) {
    Eight e;
    u32 p[4] = {w.x, w.y, w.z, w.w};
    #pragma unroll
    for (int k = 0; k < 4; k++) {
        e.v[2 * k] = bf_get((u16)(p[k] & 0xffffu));
        e.v[2 * k + 1] = bf_get((u16)(p[k] >> 16));
    }
    return e;
}
__device__ __forceinline__ uint4 pack(const Eight& e) {
    u32 p[4];
    #pragma unroll
    for (int k = 0; k < 4; k++)
        p[k] = (u32)bf_put(e.v[2 * k]) | ((u32)bf_put(e.v[2 * k + 1]) << 16);
    return make_uint4(p[0], p[1], p[2], p[3]);
}

#define GRID_STRIDE(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

// out[i] = scale * hash(i, seed): weights (the same seed on every replica) and input data.
extern "C" __global__ void gv_train_fill(u16* out, u64 n, u64 seed, float scale) {
    GRID_STRIDE(i, n) out[i] = bf_put(scale * hashed(i, seed));
}

// The tanh form of GELU and its derivative.
__device__ __forceinline__ float gelu(float x) {
    const float c = 0.7978845608f, a = 0.044715f;
    return 0.5f * x * (1.0f + tanhf(c * (x + a * x * x * x)));
}
__device__ __forceinline__ float gelu_grad(float x) {
    const float c = 0.7978845608f, a = 0.044715f;
    float t = tanhf(c * (x + a * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * c * (1.0f + 3.0f * a * x * x);
}

// z = gelu(a), n8 words of eight elements.
extern "C" __global__ void gv_train_gelu(const uint4* a, uint4* z, u64 n8) {
    GRID_STRIDE(i, n8) {
        Eight e = unpack(a[i]);
        #pragma unroll
        for (int k = 0; k < 8; k++) e.v[k] = gelu(e.v[k]);
        z[i] = pack(e);
    }
}

// g = g * gelu'(a) in place: the gradient through the activation.
extern "C" __global__ void gv_train_gelu_back(const uint4* a, uint4* g, u64 n8) {
    GRID_STRIDE(i, n8) {
        Eight x = unpack(a[i]), d = unpack(g[i]);
        #pragma unroll
        for (int k = 0; k < 8; k++) d.v[k] *= gelu_grad(x.v[k]);
        g[i] = pack(d);
    }
}

// dy = scale * y: the gradient of the loss scale/2 * sum(y^2).
extern "C" __global__ void gv_train_loss_grad(const uint4* y, uint4* dy, u64 n8, float scale) {
    GRID_STRIDE(i, n8) {
        Eight e = unpack(y[i]);
        #pragma unroll
        for (int k = 0; k < 8; k++) e.v[k] *= scale;
        dy[i] = pack(e);
    }
}

// Plain SGD: w = w - lr * g (lr = 0 leaves finite weights exactly as they were).
extern "C" __global__ void gv_train_sgd(uint4* w, const uint4* g, u64 n8, float lr) {
    GRID_STRIDE(i, n8) {
        Eight x = unpack(w[i]), d = unpack(g[i]);
        #pragma unroll
        for (int k = 0; k < 8; k++) x.v[k] -= lr * d.v[k];
        w[i] = pack(x);
    }
}

// A position-weighted sum of the raw 16-bit words, modulo 2^64: any single changed word
// changes it (the weight 2i+1 is odd, so invertible modulo 2^64); the order of additions does
// not matter, so equal weights give equal sums on every GPU.
extern "C" __global__ void gv_train_checksum(const u16* w, u64 n, u64* out) {
    u64 acc = 0;
    GRID_STRIDE(i, n) acc += ((u64)w[i] + 0x10001ull) * (2 * i + 1);
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, acc);
}

// The test-only planted corruption: flips the lowest bit of one weight.
extern "C" __global__ void gv_train_perturb(u16* w, u64 i) {
    if (blockIdx.x == 0 && threadIdx.x == 0) w[i] ^= (u16)1;
}
