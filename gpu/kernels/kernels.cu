// Kernels the GPU decoder runs around nvCOMP: the walk of every LZ4 block
// before nvCOMP reads it; after it, the XXH64 of zstd frames decoded into
// device memory the host never reads, blosc unshuffle and bitunshuffle,
// scattered copies for blosc's stored (raw) and misaligned streams, and byte
// swapping for big-endian data.
//
// Plain C kernels with extern "C" names so the driver API finds them by name.
// They use nothing newer than sm_75, the oldest target CUDA 13 compiles for.
// Regenerate kernels.ptx (checked in, embedded with go:embed) on a machine
// with the CUDA 13 toolkit, from the repository root:
//
//   nvcc -ptx -arch=sm_75 -O3 -o gpu/kernels/kernels.ptx gpu/kernels/kernels.cu
//
// (NVRTC of the same release, with --gpu-architecture=compute_75 and
// -default-device, writes the same PTX: it needs no GPU.)
//
// The descriptors mirror the Go structs in gpu/kernels.go field for field.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

struct CopyDesc {
    u64 src;
    u64 dst;
    u64 len;
};

// One thread block per descriptor (grid-strided), threads striding over its
// bytes. Raw blosc streams are rare and small, so plain byte copies suffice.
extern "C" __global__ void scatter_copy(const CopyDesc* __restrict__ descs, u32 n)
{
    for (u32 d = blockIdx.x; d < n; d += gridDim.x) {
        const u8* src = (const u8*)descs[d].src;
        u8* dst = (u8*)descs[d].dst;
        u64 len = descs[d].len;
        for (u64 i = threadIdx.x; i < len; i += blockDim.x) {
            dst[i] = src[i];
        }
    }
}

// ShuffleDesc describes one blosc chunk to unshuffle from src (the
// concatenated decompressed blocks, still shuffled) into dst.
struct ShuffleDesc {
    u64 src;
    u64 dst;
    u64 nbytes;    // decoded size of the whole chunk
    u32 blocksize; // blosc block size; a multiple of typesize
    u32 typesize;
    u32 mode;      // 1 byte shuffle, 2 bit shuffle
    u32 bitround;  // bit shuffle: 1 = round the element count down to a multiple of 8 (frame version >= 3), 0 = copy blocks whose count is not a multiple of 8
};

// Geometry of block b: where it starts, its size, the number of elements
// transposed, and the number of work units (transposition units followed by
// one unit per leftover byte copied as is).
__device__ __forceinline__ void block_geom(const ShuffleDesc& d, u64 b, u64* start, u64* bsize, u64* nelem, u64* units)
{
    *start = b * (u64)d.blocksize;
    u64 rest = d.nbytes - *start;
    *bsize = rest < d.blocksize ? rest : d.blocksize;
    u64 n = *bsize / d.typesize;
    u64 tunits;
    if (d.mode == 1) {
        tunits = n; // one unit per element: gathers typesize bytes
    } else {
        if (d.bitround) {
            n -= n % 8;
        } else if (n % 8 != 0) {
            n = 0;
        }
        tunits = (n / 8) * d.typesize; // one unit per (8 elements, byte lane)
    }
    *nelem = n;
    *units = tunits + (*bsize - n * d.typesize);
}

// unshuffle: blockIdx.y selects the chunk; threads grid-stride over the work
// units of all its blocks. Byte shuffle stores byte j of element i of a block
// at j*n + i; bit shuffle stores bit k of byte j of element i as bit (i%8) of
// byte ((j*8+k)*n + i)/8 of the block (rows of n bits, least significant bit
// first), which is the layout of the bitshuffle library blosc embeds.
extern "C" __global__ void unshuffle(const ShuffleDesc* __restrict__ descs)
{
    const ShuffleDesc d = descs[blockIdx.y];
    if (d.nbytes == 0 || d.blocksize == 0 || d.typesize == 0) {
        return;
    }
    u64 nblocks = (d.nbytes + d.blocksize - 1) / d.blocksize;
    u64 fstart, fbsize, fn, funits;
    block_geom(d, 0, &fstart, &fbsize, &fn, &funits);
    u64 lstart, lbsize, ln, lunits;
    block_geom(d, nblocks - 1, &lstart, &lbsize, &ln, &lunits);
    u64 total = (nblocks - 1) * funits + lunits;
    const u8* __restrict__ src = (const u8*)d.src;
    u8* __restrict__ dst = (u8*)d.dst;
    const u32 T = d.typesize;

    for (u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x; u < total; u += (u64)gridDim.x * blockDim.x) {
        u64 b, r, start, bsize, n, units;
        if (u < (nblocks - 1) * funits) {
            b = u / funits;
            r = u - b * funits;
            start = b * (u64)d.blocksize;
            bsize = fbsize;
            n = fn;
            units = funits;
        } else {
            r = u - (nblocks - 1) * funits;
            start = lstart;
            bsize = lbsize;
            n = ln;
            units = lunits;
        }
        u64 tunits = units - (bsize - n * T);
        const u8* s = src + start;
        u8* o = dst + start;
        if (r >= tunits) {
            u64 off = n * T + (r - tunits);
            o[off] = s[off];
            continue;
        }
        if (d.mode == 1) {
            u64 i = r;
            for (u32 j = 0; j < T; j++) {
                o[i * T + j] = s[(u64)j * n + i];
            }
        } else {
            u64 rowbytes = n / 8;
            u64 j = r / rowbytes;
            u64 g = r - j * rowbytes;
            // Gather the 8 bit-rows of byte lane j at column byte g: row k
            // holds bit k of byte j of elements g*8 .. g*8+7.
            u64 rows = 0;
            for (u32 k = 0; k < 8; k++) {
                rows |= (u64)s[(j * 8 + k) * rowbytes + g] << (8 * k);
            }
            for (u32 e = 0; e < 8; e++) {
                u32 v = 0;
                for (u32 k = 0; k < 8; k++) {
                    v |= (u32)((rows >> (8 * k + e)) & 1) << k;
                }
                o[(g * 8 + e) * T + j] = (u8)v;
            }
        }
    }
}

// byteswap reverses the bytes of every size-byte element in [p, p+nelem*size).
extern "C" __global__ void byteswap(u8* p, u64 nelem, u32 size)
{
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < nelem; i += (u64)gridDim.x * blockDim.x) {
        u8* e = p + i * size;
        if (size == 2) {
            unsigned short* q = (unsigned short*)e;
            unsigned short x = *q;
            *q = (unsigned short)((x >> 8) | (x << 8));
        } else if (size == 4) {
            u32* q = (u32*)e;
            *q = __byte_perm(*q, 0, 0x0123);
        } else if (size == 8) {
            u64* q = (u64*)e;
            u64 x = *q;
            u32 lo = (u32)x, hi = (u32)(x >> 32);
            *q = ((u64)__byte_perm(lo, 0, 0x0123) << 32) | (u64)__byte_perm(hi, 0, 0x0123);
        } else {
            for (u32 a = 0, z = size - 1; a < z; a++, z--) {
                u8 t = e[a];
                e[a] = e[z];
                e[z] = t;
            }
        }
    }
}

// An LZ4 block of one token and no literals: it decodes to 0 bytes. A block
// the walk rejects is replaced by it, so that nvCOMP never reads damaged
// input (whose decoding it leaves undefined), and its decoded size (0, where
// every segment expects at least one byte) sends the chunk to the CPU.
__device__ __align__(16) u8 lz4_empty_block[16];

// lz4_length adds to *v the length bytes at src[*si:] (255 means: another
// follows), moving *si past them: validate.go's lz4Length. It returns 0
// when the block ends first.
__device__ __forceinline__ int lz4_length(const u8* __restrict__ src, long long len, long long* si, long long* v)
{
    for (;;) {
        if (*si >= len) {
            return 0;
        }
        u32 x = src[(*si)++];
        *v += x;
        if (x != 255) {
            return 1;
        }
    }
}

// lz4_walk is gpu/validate.go's lz4Check, rule for rule: it accepts a block
// only if the CPU decoder accepts it and it decodes to exactly n bytes, and
// the block keeps LZ4's end-of-block rules. Lengths are signed 64-bit, as
// Go's int64 there.
__device__ int lz4_walk(const u8* __restrict__ src, long long len, long long n)
{
    if (len <= 0) {
        return 0;
    }
    long long si = 0, di = 0, last_match = -1, last_len = 0;
    int ends_in_lit = 0;
    while (si < len) {
        u32 tok = src[si++];
        long long lit = tok >> 4;
        if (lit == 15 && !lz4_length(src, len, &si, &lit)) {
            return 0; // literal length runs past the block's end
        }
        if (lit > len - si || lit > n - di) {
            return 0; // the literal run overruns the block or the output
        }
        si += lit;
        di += lit;
        if (si == len) {
            if ((tok & 15) != 0) {
                return 0; // a match length and no offset
            }
            ends_in_lit = 1;
            break;
        }
        if (len - si < 2) {
            return 0; // match offset truncated
        }
        long long off = (long long)src[si] | ((long long)src[si + 1] << 8);
        si += 2;
        if (off == 0 || off > di) {
            return 0;
        }
        long long ml = (long long)(tok & 15) + 4;
        if ((tok & 15) == 15 && !lz4_length(src, len, &si, &ml)) {
            return 0; // match length runs past the block's end
        }
        if (ml > n - di) {
            return 0; // the match decodes past the output
        }
        last_match = di;
        last_len = ml;
        di += ml;
    }
    if (di != n) {
        return 0;
    }
    if (last_match >= 0 && (!ends_in_lit || last_match > n - 12 || last_match + last_len > n - 5)) {
        return 0;
    }
    return 1;
}

// lz4_check walks the n LZ4 segments of a round, one thread each, before
// nvCOMP decodes them. arrs holds nvCOMP's arrays for the segments: input
// pointers, input sizes, then output capacities (each segment's exact
// decoded size). verdict[i] is set to 0 for a block the walk accepts, 1 for
// one it rejects, whose input pointer and size are then pointed at
// lz4_empty_block.
extern "C" __global__ void lz4_check(u64* arrs, u32 n, u32* verdict)
{
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int ok = lz4_walk((const u8*)arrs[i], (long long)arrs[n + i], (long long)arrs[2 * (u64)n + i]);
        verdict[i] = ok ? 0 : 1;
        if (!ok) {
            arrs[i] = (u64)lz4_empty_block;
            arrs[n + i] = 1;
        }
    }
}

// XXH64 (seed 0) of zstd frames decoded straight into device memory, for
// their content checksum, which the host cannot compute over bytes it
// never sees. emuXXH64 in gpu/xxh64_test.go is this code step for step,
// checked there against github.com/cespare/xxhash.
#define XXH_P1 11400714785074694791ULL
#define XXH_P2 14029467366897019727ULL
#define XXH_P3 1609587929392839161ULL
#define XXH_P4 9650029242287828579ULL
#define XXH_P5 2870177450012600261ULL

struct HashDesc {
    u64 src; // the decoded bytes (device memory)
    u64 len;
};

__device__ __forceinline__ u64 xxh_rotl(u64 x, u32 r) { return (x << r) | (x >> (64 - r)); }

__device__ __forceinline__ u64 xxh_round(u64 acc, u64 in)
{
    acc += in * XXH_P2;
    acc = xxh_rotl(acc, 31);
    return acc * XXH_P1;
}

__device__ __forceinline__ u64 xxh_merge(u64 h, u64 v)
{
    h ^= xxh_round(0, v);
    return h * XXH_P1 + XXH_P4;
}

// Little-endian loads at any address: aligned words when p is aligned
// (decoded chunks are, 256 bytes), bytes otherwise.
__device__ __forceinline__ u64 xxh_read64(const u8* p)
{
    if (((u64)p & 7) == 0) {
        return *(const u64*)p;
    }
    u64 v = 0;
    for (int i = 0; i < 8; i++) {
        v |= (u64)p[i] << (8 * i);
    }
    return v;
}

__device__ __forceinline__ u32 xxh_read32(const u8* p)
{
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// xxh64_lane runs accumulator lane (0..3) of XXH64 over the whole stripes
// of [p, p+len): the four lanes are independent until they merge, so four
// threads share a chunk, each reading 8 bytes of every 32-byte stripe
// (together, one coalesced 32-byte read). A lane's rounds are a chain, its
// loads are not: the next XXH_G stripes are loaded while the rounds run on
// the last XXH_G, so that the chain, not the memory's latency, sets the
// pace.
#define XXH_G 16
__device__ u64 xxh64_lane(const u8* p, u64 len, u32 lane)
{
    u64 v = lane == 0 ? XXH_P1 + XXH_P2 : lane == 1 ? XXH_P2 : lane == 2 ? 0 : 0 - XXH_P1;
    u64 stripes = len / 32;
    const u8* q = p + 8 * lane;
    u64 s = 0;
    if (((u64)p & 7) == 0 && stripes >= XXH_G) {
        // Aligned (a decoded chunk is, 256 bytes): word loads, stripe s's
        // word of this lane at w[4 * s].
        const u64* w = (const u64*)q;
        u64 cur[XXH_G], nxt[XXH_G];
#pragma unroll
        for (int i = 0; i < XXH_G; i++) {
            cur[i] = w[4 * i];
        }
        for (s = XXH_G; s + XXH_G <= stripes; s += XXH_G) {
#pragma unroll
            for (int i = 0; i < XXH_G; i++) {
                nxt[i] = w[4 * (s + i)];
            }
#pragma unroll
            for (int i = 0; i < XXH_G; i++) {
                v = xxh_round(v, cur[i]);
                cur[i] = nxt[i];
            }
        }
#pragma unroll
        for (int i = 0; i < XXH_G; i++) {
            v = xxh_round(v, cur[i]);
        }
    }
    for (; s < stripes; s++) {
        v = xxh_round(v, xxh_read64(q + 32 * s));
    }
    return v;
}

// xxh64_finish merges the four lanes (when len >= 32) and hashes the tail
// past the last whole stripe, then avalanches.
__device__ u64 xxh64_finish(const u8* p, u64 len, const u64* v)
{
    u64 h;
    if (len >= 32) {
        h = xxh_rotl(v[0], 1) + xxh_rotl(v[1], 7) + xxh_rotl(v[2], 12) + xxh_rotl(v[3], 18);
        for (int i = 0; i < 4; i++) {
            h = xxh_merge(h, v[i]);
        }
    } else {
        h = XXH_P5;
    }
    h += len;
    u64 i = len / 32 * 32;
    for (; i + 8 <= len; i += 8) {
        h ^= xxh_round(0, xxh_read64(p + i));
        h = xxh_rotl(h, 27) * XXH_P1 + XXH_P4;
    }
    if (i + 4 <= len) {
        h ^= (u64)xxh_read32(p + i) * XXH_P1;
        h = xxh_rotl(h, 23) * XXH_P2 + XXH_P3;
        i += 4;
    }
    for (; i < len; i++) {
        h ^= (u64)p[i] * XXH_P5;
        h = xxh_rotl(h, 11) * XXH_P1;
    }
    h ^= h >> 33;
    h *= XXH_P2;
    h ^= h >> 29;
    h *= XXH_P3;
    h ^= h >> 32;
    return h;
}

// xxh64_check hashes the n chunks of descs, four threads each (blocks of
// 128 threads: 32 chunks a block), and writes the low 32 bits of each
// chunk's XXH64, what a zstd frame's content checksum holds, to sums[i];
// the host compares them with the frames' checksums.
extern "C" __global__ void xxh64_check(const HashDesc* __restrict__ descs, u32 n, u32* sums)
{
    __shared__ u64 acc[128];
    u32 chunk = blockIdx.x * (blockDim.x / 4) + threadIdx.x / 4;
    u32 lane = threadIdx.x % 4;
    const u8* p = 0;
    u64 len = 0;
    if (chunk < n) {
        p = (const u8*)descs[chunk].src;
        len = descs[chunk].len;
        acc[threadIdx.x] = xxh64_lane(p, len, lane);
    }
    __syncthreads();
    if (chunk < n && lane == 0) {
        sums[chunk] = (u32)xxh64_finish(p, len, &acc[threadIdx.x]);
    }
}
