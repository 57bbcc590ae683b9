/* A few rows times an int4 weight: a draft model's linear layers on an x86 CPU (AVX2, or AVX-512
 * with VNNI; any number of rows with AMX, below).
 *
 * y[r][n] = sum_k x[r][k] * w[n][k], with w held as 4-bit integers q in [-8, 7] and one float32
 * scale per GROUP consecutive inputs of a row: w[n][k] = scale[n][k / GROUP] * q[n][k]. The
 * inputs are padded with zeros to a multiple of PAIR = 2 * GROUP. Each PAIR of inputs is PAIR / 2
 * bytes: byte j holds the first group's q[j] + 8 in its low nibble and the second group's
 * q[j] + 8 in its high nibble, so that one load and two masks give two groups' integers.
 *
 * A one-token step of a draft reads every weight once and little else, so its cost is the bytes
 * of its weights over the memory bandwidth: 0.56 bytes a weight here against int8's 1. Each row
 * of x is quantized to int8 with one scale, dx = amax / 127, and offset by 128 to an unsigned
 * byte, so that a group's product is one dot product of unsigned and signed bytes
 * (_mm256_maddubs_epi16, or VNNI's dpbusd) scaled once:
 *
 *   sum_k x[k] w[k] ~= dx * sum_g scale[g] * sum_{k in g} (xu[k] - 128) q[k]
 *                    = dx * (sum_g scale[g] * sum_{k in g} xu[k] q[k]  -  corr[n]),
 *   corr[n] = 128 * sum_g scale[g] * sum_{k in g} q[k]   (a constant of the weight).
 *
 * Each pair of groups is read and unpacked once for up to ROW_BLOCK rows of x, and prefetched
 * PREFETCH bytes ahead: without it the demo draft's layers were read at half the memory's speed.
 * Each row is quantized and summed on its own, so a row's result does not depend on the rows
 * beside it.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GROUP 64
#define PAIR (2 * GROUP)
#define ROW_BLOCK 4
/* 1 KiB ahead: 10.4 ms for the demo draft's layers; 4 KiB: 7.6; 16 KiB: 8.8 (AMX Xeon, 2 threads). */
#define PREFETCH 4096

static inline float lane_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float lane_max(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* x float32 [rows][in] -> xu uint8 [rows][padded] (round(x / dx) + 128, the padding 128, i.e.
 * zero), dx float32 [rows]. Vectorised: on the demo draft's 4864 inputs the scalar loop cost as
 * much as a quarter of the layer's product. */
static void quantize_rows(const float *x, uint8_t *xu, float *dx, int64_t rows, int64_t in, int64_t padded) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), offset = _mm256_set1_epi8((char)0x80);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * in;
        uint8_t *ur = xu + r * padded;
        __m256 top = _mm256_setzero_ps();
        int64_t k = 0;
        for (; k + 8 <= in; k += 8) top = _mm256_max_ps(top, _mm256_and_ps(_mm256_loadu_ps(xr + k), magnitude));
        float amax = lane_max(top);
        for (; k < in; k++) amax = fmaxf(amax, fabsf(xr[k]));
        const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
        const float inverse = 1.0f / scale;
        const __m256 inv = _mm256_set1_ps(inverse);
        dx[r] = scale;
        k = 0;
        for (; k + 32 <= in; k += 32) {
            /* round to nearest (the default rounding mode), then int32 -> int16 -> int8 with
             * packs, whose lane interleaving the permutation undoes; |value| <= 127 */
            const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + k), inv));
            const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + k + 8), inv));
            const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + k + 16), inv));
            const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xr + k + 24), inv));
            const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            const __m256i ordered = _mm256_permutevar8x32_epi32(bytes, order);
            _mm256_storeu_si256((__m256i *)(ur + k), _mm256_xor_si256(ordered, offset));  /* + 128 */
        }
        for (; k < in; k++) ur[k] = (uint8_t)((int)nearbyintf(xr[k] * inverse) + 128);
        for (; k < padded; k++) ur[k] = 128;
    }
}

/* A pair of groups' integers, AVX2: a0, a1 the first group's 64, b0, b1 the second's. */
#define UNPACK_AVX2(wp)                                                                          \
    const __m256i v0 = _mm256_loadu_si256((const __m256i *)(wp));                                \
    const __m256i v1 = _mm256_loadu_si256((const __m256i *)((wp) + 32));                         \
    const __m256i a0 = _mm256_sub_epi8(_mm256_and_si256(v0, low4), eight);                       \
    const __m256i a1 = _mm256_sub_epi8(_mm256_and_si256(v1, low4), eight);                       \
    const __m256i b0 = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v0, 4), low4), eight); \
    const __m256i b1 = _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v1, 4), low4), eight)

/* One group's int32 sums of xu * q, AVX2: a pair of products is at most 2 * 255 * 8 = 4080 in
 * magnitude, two pairs 8160, so the int16 sums do not saturate. */
static inline __m256i group_avx2(const uint8_t *xg, __m256i q0, __m256i q1, __m256i ones) {
    return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)xg), q0),
                                              _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(xg + 32)), q1)),
                             ones);
}

/* Sums for one output over rows [r0, r0 + block) of xu, AVX2. Two accumulators a row, one per
 * group of a pair: one would chain every multiply-add on the one before it. */
static inline void rows_avx2(const uint8_t *wn, const float *sn, const uint8_t *xu, float *sums,
                             int64_t r0, int block, int64_t padded) {
    const __m256i low4 = _mm256_set1_epi8(15), eight = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
    __m256 acc_a[ROW_BLOCK], acc_b[ROW_BLOCK];
    for (int i = 0; i < ROW_BLOCK; i++) acc_a[i] = acc_b[i] = _mm256_setzero_ps();
    for (int64_t p = 0; p < padded / PAIR; p++) {
        _mm_prefetch((const char *)(wn + p * (PAIR / 2) + PREFETCH), _MM_HINT_T0);
        UNPACK_AVX2(wn + p * (PAIR / 2));
        const __m256 sa = _mm256_broadcast_ss(sn + 2 * p), sb = _mm256_broadcast_ss(sn + 2 * p + 1);
        for (int i = 0; i < block; i++) {
            const uint8_t *xg = xu + (r0 + i) * padded + p * PAIR;
            acc_a[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(group_avx2(xg, a0, a1, ones)), sa, acc_a[i]);
            acc_b[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(group_avx2(xg + GROUP, b0, b1, ones)), sb, acc_b[i]);
        }
    }
    for (int i = 0; i < block; i++) sums[i] = lane_sum(_mm256_add_ps(acc_a[i], acc_b[i]));
}

/* The same with AVX-512 and VNNI: one 64-byte load is a pair of groups, one dpbusd a group. */
__attribute__((target("avx512f,avx512bw,avx512vnni")))
static inline void rows_vnni(const uint8_t *wn, const float *sn, const uint8_t *xu, float *sums,
                             int64_t r0, int block, int64_t padded) {
    const __m512i low4 = _mm512_set1_epi8(15), eight = _mm512_set1_epi8(8), zero = _mm512_setzero_si512();
    __m512 acc_a[ROW_BLOCK], acc_b[ROW_BLOCK];
    for (int i = 0; i < ROW_BLOCK; i++) acc_a[i] = acc_b[i] = _mm512_setzero_ps();
    for (int64_t p = 0; p < padded / PAIR; p++) {
        _mm_prefetch((const char *)(wn + p * (PAIR / 2) + PREFETCH), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512((const void *)(wn + p * (PAIR / 2)));
        const __m512i a = _mm512_sub_epi8(_mm512_and_si512(v, low4), eight);
        const __m512i b = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), eight);
        const __m512 sa = _mm512_set1_ps(sn[2 * p]), sb = _mm512_set1_ps(sn[2 * p + 1]);
        for (int i = 0; i < block; i++) {
            const uint8_t *xg = xu + (r0 + i) * padded + p * PAIR;
            const __m512i pa = _mm512_dpbusd_epi32(zero, _mm512_loadu_si512((const void *)xg), a);
            const __m512i pb = _mm512_dpbusd_epi32(zero, _mm512_loadu_si512((const void *)(xg + GROUP)), b);
            acc_a[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pa), sa, acc_a[i]);
            acc_b[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(pb), sb, acc_b[i]);
        }
    }
    for (int i = 0; i < block; i++) sums[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc_a[i], acc_b[i]));
}

/* Whether this CPU has AVX-512 VNNI (and the BW instructions the VNNI path also uses). */
int int4_has_vnni(void) {
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
}

/* x float32 [rows][in], w uint8 [out][padded / 2], scale float32 [out][padded / GROUP], corr
 * float32 [out] -> y float32 [rows][out]; padded = in rounded up to a multiple of PAIR. vnni: use
 * the AVX-512 VNNI path (the caller checked the CPU has it). */
void int4_rows_linear(const float *x, const uint8_t *w, const float *scale, const float *corr, float *y,
                      int64_t rows, int64_t out, int64_t in, int threads, int vnni) {
    const int64_t padded = (in + PAIR - 1) / PAIR * PAIR;
    uint8_t *xu = aligned_alloc(64, (size_t)(rows * padded + 64) / 64 * 64);
    float *dx = malloc((size_t)rows * sizeof(float));
    quantize_rows(x, xu, dx, rows, in, padded);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < out; n++) {
        const uint8_t *wn = w + n * (padded / 2);
        const float *sn = scale + n * (padded / GROUP);
        float sums[ROW_BLOCK];
        for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
            const int block = rows - r0 < ROW_BLOCK ? (int)(rows - r0) : ROW_BLOCK;
            if (vnni) rows_vnni(wn, sn, xu, sums, r0, block, padded);
            else rows_avx2(wn, sn, xu, sums, r0, block, padded);
            for (int i = 0; i < block; i++) y[(r0 + i) * out + n] = dx[r0 + i] * (sums[i] - corr[n]);
        }
    }
    free(xu);
    free(dx);
}

/* -- AMX: many rows ------------------------------------------------------------------------
 *
 * The paths above spend, per row, a multiply-add, a conversion and a scaling on every output and
 * group: 16 rows cost 8.9 one-row products. With AMX one tile product multiplies 16 outputs'
 * group (A: 16 x 64 unsigned bytes) by up to 16 rows' group (B: 64 x 16 signed bytes, four
 * consecutive inputs per column) into C (16 outputs x 16 rows, int32), and the scaling is one
 * fused multiply-add per output and group for all 16 rows at once.
 *
 * Here the weight's unsigned nibbles (q + 8, 0..15) are A as they are, and each row of x is
 * quantized to signed bytes xs (the same dx as above), so a group's product carries 8 times the
 * group's sum of xs too, subtracted before scaling:
 *
 *   sum_k x[k] w[k] ~= dx * sum_g scale[g] * (C_g - 8 * sum_{k in g} xs[k]).
 *
 * C_g and the correction are integers below 2^24, so their difference is exact in float32; the
 * rounding then differs from the paths above only in the order of the scaled sums. Rows remain
 * independent: a row alone and the same row among others give the same bits on this path. */

#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11)
#include "amx.h"
#define TILE 16  /* outputs a tile row block, and rows of x a tile column block */

/* Whether the CPU has AMX int8 and this process may use its tiles. */
int int4_has_amx(void) { return amx_permitted(AMX_INT8_BIT); }

/* x float32 [rows][in] -> xb int8 in B tiles: for each block of TILE rows and group g, TILE * 4 x 16
 * bytes where byte [j][r * 4 + i] is row r's input g * GROUP + 4 j + i (rows past the end and
 * inputs past in are 0); eight float32 [blocks][groups][TILE]: 8 * the group's sum of xs; dx
 * float32 [rows]. Rows are quantized as quantize_rows does (xs = xu - 128). */
__attribute__((target("avx512f,avx512bw")))
static void quantize_tiles(const float *x, int8_t *xb, float *eight, float *dx, int64_t rows, int64_t in,
                           int64_t padded) {
    const int64_t groups = padded / GROUP, blocks = (rows + TILE - 1) / TILE;
    uint8_t *xu = aligned_alloc(64, (size_t)(rows * padded + 64) / 64 * 64);
    quantize_rows(x, xu, dx, rows, in, padded);
    memset(xb, 0, (size_t)(blocks * groups * GROUP * TILE));
    memset(eight, 0, (size_t)(blocks * groups * TILE) * sizeof(float));
    const __m512i offset = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    const __m512i rows_of_tile = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                    _mm512_set1_epi32(TILE));  /* dword j of a group -> tile row j */
    for (int64_t r = 0; r < rows; r++) {
        const int64_t block = r / TILE, column = r % TILE;
        for (int64_t g = 0; g < groups; g++) {
            const __m512i u = _mm512_loadu_si512((const void *)(xu + r * padded + g * GROUP));
            int8_t *tile = xb + (block * groups + g) * GROUP * TILE;
            _mm512_i32scatter_epi32((void *)(tile + column * 4), rows_of_tile, _mm512_xor_si512(u, offset), 4);
            const int64_t sum = _mm512_reduce_add_epi64(_mm512_sad_epu8(u, zero)) - 128 * GROUP;
            eight[(block * groups + g) * TILE + column] = 8.0f * (float)sum;
        }
    }
    free(xu);
}

/* Unpack outputs [n0, n0 + TILE) of pair p into two A tiles (64 bytes a row): the first group's
 * nibbles and the second's; outputs past the end are 0. */
__attribute__((target("avx512f,avx512bw")))
static inline void unpack_tiles(const uint8_t *w, int64_t n0, int64_t out, int64_t p, int64_t padded,
                                uint8_t *first, uint8_t *second) {
    const __m512i low4 = _mm512_set1_epi8(15);
    for (int n = 0; n < TILE; n++) {
        __m512i v = _mm512_setzero_si512();
        if (n0 + n < out) {
            const uint8_t *wp = w + (n0 + n) * (padded / 2) + p * (PAIR / 2);
            _mm_prefetch((const char *)(wp + 4 * (PAIR / 2)), _MM_HINT_T0);
            v = _mm512_loadu_si512((const void *)wp);
        }
        _mm512_store_si512((void *)(first + n * GROUP), _mm512_and_si512(v, low4));
        _mm512_store_si512((void *)(second + n * GROUP), _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
    }
}

/* acc[n] (lanes: rows) += scale[n0 + n][g] * (C[n] - eight); C int32 [TILE][TILE] as stored. */
__attribute__((target("avx512f,avx512bw")))
static inline void scale_group(__m512 *acc, const int32_t *c, const float *eight, const float *scale, int64_t n0,
                               int64_t out, int64_t groups, int64_t g) {
    const __m512 correction = _mm512_loadu_ps(eight);
    for (int n = 0; n < TILE && n0 + n < out; n++) {
        const __m512 sums = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void *)(c + n * TILE))), correction);
        acc[n] = _mm512_fmadd_ps(sums, _mm512_set1_ps(scale[(n0 + n) * groups + g]), acc[n]);
    }
}

/* The same product as int4_rows_linear for any number of rows, with AMX tiles (the caller checked
 * int4_has_amx). */
__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw")))
void int4_rows_linear_amx(const float *x, const uint8_t *w, const float *scale, float *y,
                          int64_t rows, int64_t out, int64_t in, int threads) {
    const int64_t padded = (in + PAIR - 1) / PAIR * PAIR, groups = padded / GROUP;
    const int64_t blocks = (rows + TILE - 1) / TILE, n_blocks = (out + TILE - 1) / TILE;
    int8_t *xb = aligned_alloc(64, (size_t)(blocks * groups * GROUP * TILE));
    float *eight = aligned_alloc(64, (size_t)(blocks * groups * TILE) * sizeof(float));
    float *dx = malloc((size_t)rows * sizeof(float));
    quantize_tiles(x, xb, eight, dx, rows, in, padded);
    #pragma omp parallel num_threads(threads)
    {
        /* tiles 0, 1: C of the pair's two groups; 2, 3: their weights (A); 4, 5: their inputs (B) */
        amx_configure();
        /* An n-block's weights are unpacked once (for the first block of rows) into tiles kept for
         * the next blocks; a pair is unpacked, and the pair before it scaled, while the tiles
         * multiply. */
        const int64_t pairs = padded / PAIR;
        uint8_t *weights = aligned_alloc(64, (size_t)(pairs * 2 * TILE * GROUP));  /* [pair][group][TILE][GROUP] */
        int32_t products[2][2][TILE * TILE] __attribute__((aligned(64)));  /* [pair & 1][group of the pair] */
        float sums[TILE * TILE] __attribute__((aligned(64)));
        #pragma omp for schedule(static)
        for (int64_t nb = 0; nb < n_blocks; nb++) {
            const int64_t n0 = nb * TILE;
            for (int64_t block = 0; block < blocks; block++) {
                const int8_t *xt = xb + block * groups * GROUP * TILE;
                const float *et = eight + block * groups * TILE;
                __m512 acc[TILE];
                for (int n = 0; n < TILE; n++) acc[n] = _mm512_setzero_ps();
                if (block == 0) unpack_tiles(w, n0, out, 0, padded, weights, weights + TILE * GROUP);
                for (int64_t p = 0; p < pairs; p++) {
                    const int b = p & 1;
                    const uint8_t *wt = weights + 2 * p * TILE * GROUP;
                    _tile_loadd(2, wt, GROUP);
                    _tile_loadd(3, wt + TILE * GROUP, GROUP);
                    _tile_loadd(4, xt + 2 * p * GROUP * TILE, TILE * 4);
                    _tile_loadd(5, xt + (2 * p + 1) * GROUP * TILE, TILE * 4);
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_dpbusd(0, 2, 4);
                    _tile_dpbusd(1, 3, 5);
                    _tile_stored(0, products[b][0], TILE * 4);
                    _tile_stored(1, products[b][1], TILE * 4);
                    if (block == 0 && p + 1 < pairs)
                        unpack_tiles(w, n0, out, p + 1, padded, wt + 2 * TILE * GROUP, wt + 3 * TILE * GROUP);
                    if (p > 0) {
                        scale_group(acc, products[!b][0], et + 2 * (p - 1) * TILE, scale, n0, out, groups, 2 * (p - 1));
                        scale_group(acc, products[!b][1], et + (2 * p - 1) * TILE, scale, n0, out, groups, 2 * p - 1);
                    }
                }
                const int last = (pairs - 1) & 1;
                scale_group(acc, products[last][0], et + 2 * (pairs - 1) * TILE, scale, n0, out, groups, 2 * (pairs - 1));
                scale_group(acc, products[last][1], et + (2 * pairs - 1) * TILE, scale, n0, out, groups, 2 * pairs - 1);
                for (int n = 0; n < TILE; n++) _mm512_store_ps(sums + n * TILE, acc[n]);
                for (int64_t r = block * TILE; r < rows && r < (block + 1) * TILE; r++)
                    for (int64_t n = n0; n < out && n < n0 + TILE; n++)
                        y[r * out + n] = dx[r] * sums[(n - n0) * TILE + (r - block * TILE)];
            }
        }
        free(weights);
        _tile_release();
    }
    free(xb);
    free(eight);
    free(dx);
}

#else  /* a compiler without AMX intrinsics: the VNNI and AVX2 paths only */
int int4_has_amx(void) { return 0; }
void int4_rows_linear_amx(const float *x, const uint8_t *w, const float *scale, float *y, int64_t rows, int64_t out,
                          int64_t in, int threads) { (void)x; (void)w; (void)scale; (void)y; (void)rows; (void)out; (void)in; (void)threads; abort(); }
#endif

/* Eight weights of a group as float32: the low (shift 0) or high (shift 4) nibbles of 8 bytes. */
static inline __m256 widen8(const uint8_t *bytes, int shift, __m256 scale) {
    const __m256i q = _mm256_sub_epi32(
        _mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bytes)), shift),
                         _mm256_set1_epi32(15)),
        _mm256_set1_epi32(8));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale);
}

/* float32 -> bfloat16, rounded to nearest even (the values are finite). */
static inline __m128i narrow8(__m256 v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    return _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));
}

/* One row of the weight widened, AVX-512: a group's 16 possible values (q * scale, q = -8..7) are
 * computed once and each nibble looks its value up (vpermps, vpermw), 16 or 32 at a time. The
 * values are those of widen8 and narrow8, bit for bit. */
__attribute__((target("avx512f,avx512bw")))
static void widen_row_avx512(const uint8_t *wn, const float *sn, float *df, uint16_t *dh, int64_t in, int bf16) {
    const __m512i low4 = _mm512_set1_epi8(15);
    const __m512 levels = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t p = 0; p * PAIR < in; p++) {
        const __m512i v = _mm512_loadu_si512((const void *)(wn + p * (PAIR / 2)));
        const __m512i nibbles[2] = {_mm512_and_si512(v, low4), _mm512_and_si512(_mm512_srli_epi16(v, 4), low4)};
        for (int h = 0; h < 2; h++) {
            const int64_t k0 = p * PAIR + h * GROUP;  /* the group's first input */
            if (k0 >= in) break;
            const int64_t left = in - k0 < GROUP ? in - k0 : GROUP;
            const __m512 values = _mm512_mul_ps(levels, _mm512_set1_ps(sn[2 * p + h]));
            if (bf16) {
                const __m512i bits = _mm512_castps_si512(values);
                const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
                const __m512i rounded = _mm512_srli_epi32(
                    _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
                const __m512i table = _mm512_castsi256_si512(_mm512_cvtepi32_epi16(rounded));
                const __m256i halves[2] = {_mm512_castsi512_si256(nibbles[h]), _mm512_extracti64x4_epi64(nibbles[h], 1)};
                for (int j = 0; j < 2 && 32 * j < left; j++) {
                    const int64_t count = left - 32 * j < 32 ? left - 32 * j : 32;
                    const __mmask32 mask = count == 32 ? 0xffffffffu : (1u << count) - 1;
                    const __m512i out = _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(halves[j]), table);
                    _mm512_mask_storeu_epi16(dh + k0 + 32 * j, mask, out);
                }
            } else {
                const __m128i quarters[4] = {
                    _mm512_extracti32x4_epi32(nibbles[h], 0), _mm512_extracti32x4_epi32(nibbles[h], 1),
                    _mm512_extracti32x4_epi32(nibbles[h], 2), _mm512_extracti32x4_epi32(nibbles[h], 3)};
                for (int j = 0; j < 4 && 16 * j < left; j++) {
                    const int64_t count = left - 16 * j < 16 ? left - 16 * j : 16;
                    const __mmask16 mask = count == 16 ? 0xffff : (__mmask16)((1u << count) - 1);
                    const __m512 out = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(quarters[j]), values);
                    _mm512_mask_storeu_ps(df + k0 + 16 * j, mask, out);
                }
            }
        }
    }
}

/* Outputs [start, stop) of the weight, dequantized into dst [stop - start][in]: float32, or
 * bfloat16 where bf16 is set (for a bfloat16 product on a CPU with bfloat16 matrix units).
 * avx512: the lookup path (the caller checked the CPU has AVX-512 BW), one table lookup for 16
 * or 32 weights where the AVX2 path converts and scales each eight. */
void int4_dequantize(const uint8_t *w, const float *scale, void *dst, int64_t start, int64_t stop, int64_t in,
                     int bf16, int avx512, int threads) {
    const int64_t padded = (in + PAIR - 1) / PAIR * PAIR;
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = start; n < stop; n++) {
        const uint8_t *wn = w + n * (padded / 2);
        const float *sn = scale + n * (padded / GROUP);
        float *df = (float *)dst + (n - start) * in;
        uint16_t *dh = (uint16_t *)dst + (n - start) * in;
        if (avx512) {
            widen_row_avx512(wn, sn, df, dh, in, bf16);
            continue;
        }
        for (int64_t k = 0; k < in; k += 8) {
            /* input k: pair k / PAIR, group (k % PAIR) / GROUP (the high nibbles for the second),
             * byte k % GROUP of the pair; 8 inputs never straddle a group */
            const int high = k % PAIR >= GROUP;
            const __m256 v = widen8(wn + k / PAIR * (PAIR / 2) + k % GROUP, high ? 4 : 0, _mm256_set1_ps(sn[k / GROUP]));
            if (k + 8 <= in) {
                if (bf16) _mm_storeu_si128((__m128i *)(dh + k), narrow8(v));
                else _mm256_storeu_ps(df + k, v);
            } else {  /* the last inputs of a row not a multiple of 8 */
                float tail[8];
                uint16_t tail16[8];
                _mm256_storeu_ps(tail, v);
                _mm_storeu_si128((__m128i *)tail16, narrow8(v));
                for (int64_t j = k; j < in; j++) {
                    if (bf16) dh[j] = tail16[j - k];
                    else df[j] = tail[j - k];
                }
            }
        }
    }
}
