// gpuval NCCL check kernels, compiled at run time by NVRTC. Inputs are small integers that
// depend on rank, element index and seed (the same functions as verify.rs); the check kernel
// recomputes what each output element must be and compares the bits.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

// murmur3 finaliser.
__device__ __forceinline__ u32 mix32(u32 x) {
    x ^= x >> 16; x *= 0x85ebca6bu;
    x ^= x >> 13; x *= 0xc2b2ae35u;
    return x ^ (x >> 16);
}

// What `rank` sends at element `index`: an integer in 1..=range.
__device__ __forceinline__ u32 nccl_value(u32 rank, u64 index, u32 seed, u32 range) {
    u32 hi = mix32((u32)(index >> 32) + rank * 0x85ebca6bu + seed);
    u32 h = mix32((u32)index * 0x9e3779b1u ^ hi);
    return 1u + h % range;
}

// Collective codes, as the host passes them.
#define GV_ALL_REDUCE 0
#define GV_ALL_GATHER 1
#define GV_REDUCE_SCATTER 2
#define GV_BROADCAST 3
#define GV_ALL_TO_ALL 4

__device__ __forceinline__ u32 nccl_expected(u32 coll, u64 j, u32 rank, u32 nranks, u64 count,
                                             u32 seed, u32 range, u32 root) {
    u32 s = 0;
    switch (coll) {
    case GV_ALL_REDUCE:
        for (u32 k = 0; k < nranks; k++) s += nccl_value(k, j, seed, range);
        return s;
    case GV_ALL_GATHER:
        return nccl_value((u32)(j / count), j % count, seed, range);
    case GV_REDUCE_SCATTER:
        for (u32 k = 0; k < nranks; k++) s += nccl_value(k, (u64)rank * count + j, seed, range);
        return s;
    case GV_BROADCAST:
        return nccl_value(root, j, seed, range);
    default:
        return nccl_value((u32)(j / count), (u64)rank * count + j % count, seed, range);
    }
}

// Integers up to 256 are exact in both types; bf16 is the top half of the fp32 bits.
__device__ __forceinline__ u32 fp32_bits(u32 v) { return __float_as_uint((float)v); }

// Writes what `rank` sends: n elements (dtype 0 = fp32, 1 = bf16).
extern "C" __global__ void gv_nccl_fill(void* buf, u64 n, u32 dtype, u32 rank, u32 seed, u32 range) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        u32 bits = fp32_bits(nccl_value(rank, i, seed, range));
        if (dtype == 1) ((u16*)buf)[i] = (u16)(bits >> 16);
        else ((u32*)buf)[i] = bits;
    }
}

// Compares n output elements with what they must be. result[0]: wrong elements;
// result[1]: lowest wrong index (left at its initial all-ones when none).
extern "C" __global__ void gv_nccl_check(const void* out, u64 n, u32 dtype, u32 coll, u32 rank,
                                         u32 nranks, u64 count, u32 seed, u32 range, u32 root,
                                         u64* result) {
    const u64 stride = (u64)gridDim.x * blockDim.x;
    u64 bad = 0, first = ~0ull;
    for (u64 j = (u64)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += stride) {
        u32 want = fp32_bits(nccl_expected(coll, j, rank, nranks, count, seed, range, root));
        u32 got;
        if (dtype == 1) { got = ((const u16*)out)[j]; want >>= 16; }
        else got = ((const u32*)out)[j];
        if (got != want) { bad++; if (j < first) first = j; }
    }
    if (bad) {
        atomicAdd(&result[0], bad);
        atomicMin(&result[1], first);
    }
}
