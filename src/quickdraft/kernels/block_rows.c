/* Rows times a weight held in a GGUF file's own blocks (Q4_K, Q6_K, Q4_0, Q8_0), on an x86 CPU
 * with AVX2 (and AVX-512 BW + VNNI where it has them).
 *
 * y[r][n] = sum_k x[r][k] * w[n][k], where row n of the weight is the file's row of blocks, read
 * as the file holds it (ggml's layouts, `block_q4_K` etc. in ggml-common.h):
 *
 *   Q4_K, 144 bytes per 256 weights: fp16 d, fp16 dmin, 12 bytes of 6-bit scales sc[8] and mins
 *         m[8], 128 bytes of 4-bit q. Sub-block j (32 weights): w = d*sc[j]*q - dmin*m[j].
 *         Byte l of qs[32c .. 32c+31] holds weight 64c+l in its low nibble, 64c+32+l in its high.
 *   Q6_K, 210 bytes per 256: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], fp16 d.
 *         Sub-block j (16 weights): w = d*scales[j]*(q - 32), q in [0, 63].
 *   Q4_0, 18 bytes per 32: fp16 d, 16 bytes: w = d*(q - 8); byte l: weight l low, l+16 high.
 *   Q8_0, 34 bytes per 32: fp16 d, int8 q[32]: w = d*q.
 *
 * As ggml computes it, each row of x is first quantized to int8 per 256 inputs (a scale
 * dx = amax / 127 per block, and the sums of each 16 consecutive int8 values), so that a
 * sub-block's product is an integer dot product of the weight's unsigned (or signed) bytes with
 * the activation's signed bytes (_mm256_maddubs_epi16; VNNI's dpbusd), scaled by the sub-block's
 * integer scale (_mm256_madd_epi16; VNNI's dpwssd), and turned to float once per 256 weights:
 *
 *   Q4_K: sum_k x[k] w[k] ~= dx * (d * sum_j sc[j] sum_{k in j} q[k] xq[k]  -  dmin * sum_j m[j] xsum[j])
 *
 * The offsets (Q4_K's mins, Q6_K's and Q4_0's 32 and 8) come from the 16-input sums of xq. Q4_K's
 * mins, float in ggml too, multiply those sums already scaled by dx (xsums, made once per row):
 * one fused multiply-add per row and block instead of an integer product, a conversion and a
 * scaling, which matters where the per-row work bounds the product (many rows). The weights'
 * integers are never re-rounded: the model multiplied is the file's.
 *
 * A step that verifies several positions multiplies several rows: each block of the weight is
 * read and unpacked once for up to MAX_ROWS rows (the unpacked block stays in registers), so a
 * few rows cost little more than one when the step is bound by the memory's speed. More rows (a
 * prompt) run MAX_ROWS at a time over the same weight row, which stays in the core's cache.
 * Each row is quantized and summed on its own, so a row's result does not depend on the rows
 * beside it.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QK 256          /* inputs per activation block (and per K-quant block) */
#define MAX_ROWS 16     /* rows that share one pass over a weight row */

/* ggml's type numbers (GGMLQuantizationType) */
enum { TYPE_Q4_0 = 2, TYPE_Q8_0 = 8, TYPE_Q4_K = 12, TYPE_Q6_K = 14 };

static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);  /* F16C: every AVX2 CPU has it */
}

/* s[j] (j = 0..7): 16 int16 lanes of `values`' lane j, for values' first 8 lanes held in both
 * 128-bit halves (a shuffle per vector: no trip through a general register). */
static const uint8_t BROADCAST_LANE[8][32] = {
#define LANE(j) {2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, \
                 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1, 2*j, 2*j+1}
    LANE(0), LANE(1), LANE(2), LANE(3), LANE(4), LANE(5), LANE(6), LANE(7)
#undef LANE
};
/* PAIR_LANES[j]: lanes 0-7 from lane 2j of a 128-bit half, lanes 8-15 from lane 2j+1. */
static const uint8_t PAIR_LANES[4][32] = {
#define PAIR(j) {4*j, 4*j+1, 4*j, 4*j+1, 4*j, 4*j+1, 4*j, 4*j+1, 4*j, 4*j+1, 4*j, 4*j+1, 4*j, 4*j+1, 4*j, 4*j+1, \
                 4*j+2, 4*j+3, 4*j+2, 4*j+3, 4*j+2, 4*j+3, 4*j+2, 4*j+3, 4*j+2, 4*j+3, 4*j+2, 4*j+3, 4*j+2, 4*j+3, 4*j+2, 4*j+3}
    PAIR(0), PAIR(1), PAIR(2), PAIR(3)
#undef PAIR
};

static inline __m256i broadcast_lane(__m256i values, int j) {
    return _mm256_shuffle_epi8(values, _mm256_loadu_si256((const __m256i *)BROADCAST_LANE[j]));
}

static inline float lane_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The activations of up to MAX_ROWS rows, quantized per QK inputs. */
typedef struct {
    const int8_t *q;      /* [rows][padded] */
    const float *d;       /* [rows][blocks] */
    const int16_t *sums;  /* [rows][blocks][16]: sums of each 16 consecutive q */
    const float *xsums;   /* [rows][blocks][16]: those sums times the block's scale d */
    int64_t padded, blocks;
} Acts;

/* x float32 [rows][in] -> int8 per QK inputs (zeros past in), scales, 16-input sums (as integers
 * and times the scale). */
static void quantize_rows(const float *x, int8_t *q, float *d, int16_t *sums, float *xsums, int64_t rows,
                          int64_t in, int64_t padded) {
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    float block[QK];
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t b = 0; b < padded / QK; b++) {
            const int64_t start = b * QK, count = in - start < QK ? in - start : QK;
            memset(block, 0, sizeof block);
            memcpy(block, x + r * in + start, (size_t)count * sizeof(float));
            __m256 top = _mm256_setzero_ps();
            for (int k = 0; k < QK; k += 8) top = _mm256_max_ps(top, _mm256_and_ps(_mm256_loadu_ps(block + k), magnitude));
            __m128 m = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
            m = _mm_max_ps(m, _mm_movehl_ps(m, m));
            m = _mm_max_ss(m, _mm_movehdup_ps(m));
            const float amax = _mm_cvtss_f32(m);
            const float scale = amax > 0.0f ? amax / 127.0f : 0.0f;
            const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            int8_t *qb = q + r * padded + start;
            for (int k = 0; k < QK; k += 32) {
                /* round to nearest, then int32 -> int16 -> int8 with packs, whose lane
                 * interleaving the permutation undoes; |value| <= 127 */
                const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(block + k), inv));
                const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(block + k + 8), inv));
                const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(block + k + 16), inv));
                const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(block + k + 24), inv));
                const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
                _mm256_storeu_si256((__m256i *)(qb + k), _mm256_permutevar8x32_epi32(bytes, order));
            }
            d[r * (padded / QK) + b] = scale;
            int16_t *sb = sums + (r * (padded / QK) + b) * 16;
            float *xb = xsums + (r * (padded / QK) + b) * 16;
            for (int j = 0; j < 16; j++) {
                int s = 0;
                for (int k = 0; k < 16; k++) s += qb[16 * j + k];
                sb[j] = (int16_t)s;
                xb[j] = scale * (float)s;
            }
        }
    }
}

/* ---- Q4_K ---------------------------------------------------------------------------------- */

/* The 8 scales and 8 mins of a Q4_K block's 12 packed bytes (ggml's get_scale_min_k4), as
 * bytes 0-7 and 8-15 of a 128-bit vector: ggml's bit shuffle on three 32-bit words. */
static inline __m128i q4k_scales_mins(const uint8_t *packed) {
    uint32_t u[4];
    memcpy(u, packed, 12);
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    u[3] = ((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4);
    const uint32_t mins = u[1] & low6;
    u[1] = (u[2] & low4) | (((u[0] >> 6) & low2) << 4);
    u[2] = mins;
    u[0] &= low6;
    return _mm_set_epi32((int)u[3], (int)u[2], (int)u[1], (int)u[0]);
}

/* The scalar form, for dequantizing. */
static inline void q4k_scales(const uint8_t *packed, uint8_t sc[8], uint8_t m[8]) {
    uint8_t bytes[16];
    _mm_storeu_si128((__m128i *)bytes, q4k_scales_mins(packed));
    memcpy(sc, bytes, 8);
    memcpy(m, bytes + 8, 8);
}

/* A Q4_K block's scales as 16-bit lanes (s[j]: 16 lanes of scale j) and its mins each twice
 * (lane k: min k / 2, one per 16-input sum of the activations). */
static inline __m256i q4k_unpack_scales(const uint8_t *packed, __m256i s[8]) {
    const __m256i both = _mm256_cvtepu8_epi16(q4k_scales_mins(packed));  /* lanes 0-7 scales, 8-15 mins */
    const __m256i scales = _mm256_permute4x64_epi64(both, 0x44);  /* the scales in both halves */
    for (int j = 0; j < 8; j++) s[j] = broadcast_lane(scales, j);
    const __m128i mins = _mm256_extracti128_si256(both, 1);
    return _mm256_setr_m128i(_mm_unpacklo_epi16(mins, mins), _mm_unpackhi_epi16(mins, mins));
}

/* A Q4_K block's mins times dmin, each twice (lane k: min k / 2, as q4k_unpack_scales), in two halves. */
static inline void q4k_float_mins(__m256i m16, float dmin, __m256 m[2]) {
    const __m256 scale = _mm256_set1_ps(dmin);
    m[0] = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(m16))));
    m[1] = _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(m16, 1))));
}

static inline __attribute__((always_inline)) void q4k_avx2_rows(const uint8_t *w, const Acts *a, int rows, float *out) {
    __m256 acc[MAX_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0xF);
    for (int64_t b = 0; b < a->blocks; b++) {
        const uint8_t *block = w + b * 144;
        const float d = half_to_float(block), dmin = half_to_float(block + 2);
        __m256i q[8], s[8];  /* the block's 256 weights as 8 x 32 unsigned bytes, each's scale */
        __m256 m[2];
        q4k_float_mins(q4k_unpack_scales(block + 4, s), dmin, m);
        for (int c = 0; c < 4; c++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(block + 16 + 32 * c));
            q[2 * c] = _mm256_and_si256(bits, low);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low);
        }
        for (int r = 0; r < rows; r++) {
            const int8_t *xq = a->q + r * a->padded + b * QK;
            __m256i sumi = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {
                const __m256i p = _mm256_maddubs_epi16(q[j], _mm256_loadu_si256((const __m256i *)(xq + 32 * j)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s[j], p));
            }
            const float *xsums = a->xsums + (r * a->blocks + b) * 16;
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d * a->d[r * a->blocks + b]), acc[r]);
            acc[r] = _mm256_fnmadd_ps(m[0], _mm256_loadu_ps(xsums), acc[r]);
            acc[r] = _mm256_fnmadd_ps(m[1], _mm256_loadu_ps(xsums + 8), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) out[r] = lane_sum(acc[r]);
}

/* The VNNI paths multiply 64 weights by 64 activations with one vpdpbusd (unsigned weight bytes
 * times signed activation bytes, four products summed per 32-bit lane): lanes 0-7 then hold one
 * sub-block's partial sums, lanes 8-15 the next's (Q4_K: two sub-blocks of 32; Q6_K: lanes 4i ..
 * 4i+3 one of 16). A lane's sum fits 16 bits (Q6_K's largest: 4 x 63 x 127 = 32004), so two such
 * vectors pack into one of 16-bit lanes (vpackssdw, exact) and one vpdpwssd applies each lane's
 * sub-block scale: 6 multiplying instructions per 256 weights and row where vpmaddubsw then
 * vpdpwssd take 8, which is what bounds a product of several rows. PACKED_SCALE[type][p]: the
 * sub-block whose scale 16-bit lane k of pack(chunk 2p, chunk 2p + 1) takes (vpackssdw
 * interleaves its two inputs per 128 bits: four lanes of the first, four of the second). */
static const int16_t PACKED_SCALE[2][2][32] = {
    {{0, 0, 0, 0, 2, 2, 2, 2, 0, 0, 0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 3, 3, 3, 3, 1, 1, 1, 1, 3, 3, 3, 3},    /* Q4_K */
     {4, 4, 4, 4, 6, 6, 6, 6, 4, 4, 4, 4, 6, 6, 6, 6, 5, 5, 5, 5, 7, 7, 7, 7, 5, 5, 5, 5, 7, 7, 7, 7}},
    {{0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5, 2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7, 7, 7},    /* Q6_K */
     {8, 8, 8, 8, 12, 12, 12, 12, 9, 9, 9, 9, 13, 13, 13, 13, 10, 10, 10, 10, 14, 14, 14, 14, 11, 11, 11, 11, 15, 15, 15, 15}},
};

/* sum over the block's sub-blocks of scale x (weights . activations), as 16 int32 lanes: q[c]
 * the weights 64c .. 64c+63 as unsigned bytes, xq the row's 256 activations, s[p] the scales as
 * PACKED_SCALE places them. */
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) __attribute__((always_inline))
static inline __m512i vnni_block_dot(const __m512i q[4], const int8_t *xq, const __m512i s[2]) {
    __m512i sumi = _mm512_setzero_si512();
    for (int p = 0; p < 2; p++) {
        const __m512i d0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[2 * p], _mm512_loadu_si512(xq + 128 * p));
        const __m512i d1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[2 * p + 1], _mm512_loadu_si512(xq + 128 * p + 64));
        sumi = _mm512_dpwssd_epi32(sumi, _mm512_packs_epi32(d0, d1), s[p]);
    }
    return sumi;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) __attribute__((always_inline))
static inline void q4k_vnni_rows(const uint8_t *w, const Acts *a, int rows, float *out) {
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0xF);
    const __m512i pick[2] = {_mm512_loadu_si512(PACKED_SCALE[0][0]), _mm512_loadu_si512(PACKED_SCALE[0][1])};
    for (int64_t b = 0; b < a->blocks; b++) {
        const uint8_t *block = w + b * 144;
        const float d = half_to_float(block), dmin = half_to_float(block + 2);
        const __m128i scales_mins = q4k_scales_mins(block + 4);  /* bytes 0-7 scales, 8-15 mins */
        const __m512i scales = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(scales_mins));
        const __m512i s[2] = {_mm512_permutexvar_epi16(pick[0], scales), _mm512_permutexvar_epi16(pick[1], scales)};
        /* each min twice, one per 16-input sum of the activations, times dmin */
        const __m512 m = _mm512_mul_ps(_mm512_set1_ps(dmin),
                                       _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpackhi_epi8(scales_mins, scales_mins))));
        __m512i q[4];  /* chunk c: weights 64c .. 64c+63 in order (low nibbles, then high) */
        for (int c = 0; c < 4; c++) {
            const __m256i bits = _mm256_loadu_si256((const __m256i *)(block + 16 + 32 * c));
            q[c] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(bits, low)),
                                      _mm256_and_si256(_mm256_srli_epi16(bits, 4), low), 1);
        }
        for (int r = 0; r < rows; r++) {
            const __m512i sumi = vnni_block_dot(q, a->q + r * a->padded + b * QK, s);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(d * a->d[r * a->blocks + b]), acc[r]);
            acc[r] = _mm512_fnmadd_ps(m, _mm512_loadu_ps(a->xsums + (r * a->blocks + b) * 16), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
}

/* ---- Q6_K ---------------------------------------------------------------------------------- */

/* A Q6_K block's 16 int8 scales as 16-bit lanes: s[j] holds scale 2j in lanes 0-7 and 2j+1 in
 * lanes 8-15 (the two 16-weight sub-blocks of 32 weights); returns all 16 in order. */
static inline __m256i q6k_unpack_scales(const int8_t *scales, __m256i s[8]) {
    const __m256i all = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)scales));
    const __m256i low = _mm256_permute4x64_epi64(all, 0x44), high = _mm256_permute4x64_epi64(all, 0xEE);
    for (int j = 0; j < 4; j++) {
        const __m256i mask = _mm256_loadu_si256((const __m256i *)PAIR_LANES[j]);
        s[j] = _mm256_shuffle_epi8(low, mask);
        s[j + 4] = _mm256_shuffle_epi8(high, mask);
    }
    return all;
}

/* Q6_K's 256 weights as 8 x 32 unsigned bytes in [0, 63], in order (ggml's dequantize_row_q6_K). */
static inline void q6k_unpack(const uint8_t *block, __m256i q[8]) {
    const __m256i low = _mm256_set1_epi8(0xF), two = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = block + 64 * h, *qh = block + 128 + 32 * h;
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        const __m256i hi = _mm256_loadu_si256((const __m256i *)qh);
        const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(hi, two), 4);
        const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 2), two), 4);
        const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 4), two), 4);
        const __m256i h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hi, 6), two), 4);
        q[4 * h + 0] = _mm256_or_si256(_mm256_and_si256(l0, low), h0);
        q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, low), h1);
        q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low), h2);
        q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low), h3);
    }
}

static inline __attribute__((always_inline)) void q6k_avx2_rows(const uint8_t *w, const Acts *a, int rows, float *out) {
    __m256 acc[MAX_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < a->blocks; b++) {
        const uint8_t *block = w + b * 210;
        const int8_t *scales = (const int8_t *)(block + 192);
        const float d = half_to_float(block + 208);
        __m256i q[8], s[8];
        q6k_unpack(block, q);
        const __m256i all = q6k_unpack_scales(scales, s);
        for (int r = 0; r < rows; r++) {
            const int8_t *xq = a->q + r * a->padded + b * QK;
            __m256i sumi = _mm256_setzero_si256();
            for (int j = 0; j < 8; j++) {
                const __m256i p = _mm256_maddubs_epi16(q[j], _mm256_loadu_si256((const __m256i *)(xq + 32 * j)));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(s[j], p));
            }
            /* q - 32: subtract 32 * sum_j scales[j] * (the row's sum over sub-block j) */
            const __m256i sums = _mm256_loadu_si256((const __m256i *)(a->sums + (r * a->blocks + b) * 16));
            sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(all, sums), 5));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d * a->d[r * a->blocks + b]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) out[r] = lane_sum(acc[r]);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) __attribute__((always_inline))
static inline void q6k_vnni_rows(const uint8_t *w, const Acts *a, int rows, float *out) {
    __m512 acc[MAX_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    const __m512i pick[2] = {_mm512_loadu_si512(PACKED_SCALE[1][0]), _mm512_loadu_si512(PACKED_SCALE[1][1])};
    for (int64_t b = 0; b < a->blocks; b++) {
        const uint8_t *block = w + b * 210;
        const float d = half_to_float(block + 208);
        const __m256i all = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(block + 192)));  /* 16 scales */
        const __m512i s[2] = {_mm512_permutexvar_epi16(pick[0], _mm512_castsi256_si512(all)),
                              _mm512_permutexvar_epi16(pick[1], _mm512_castsi256_si512(all))};
        __m256i q8[8];
        q6k_unpack(block, q8);
        __m512i q[4];  /* chunk c: weights 64c .. 64c+63, sub-blocks 4c .. 4c+3 */
        for (int c = 0; c < 4; c++) q[c] = _mm512_inserti64x4(_mm512_castsi256_si512(q8[2 * c]), q8[2 * c + 1], 1);
        for (int r = 0; r < rows; r++) {
            __m512i sumi = vnni_block_dot(q, a->q + r * a->padded + b * QK, s);
            /* q - 32: subtract 32 * sum_j scales[j] * (the row's sum over sub-block j) */
            const __m256i sums = _mm256_loadu_si256((const __m256i *)(a->sums + (r * a->blocks + b) * 16));
            const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(all, sums), 5);
            sumi = _mm512_sub_epi32(sumi, _mm512_zextsi256_si512(offset));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), _mm512_set1_ps(d * a->d[r * a->blocks + b]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) out[r] = _mm512_reduce_add_ps(acc[r]);
}

/* One row is the decode step: a copy compiled for it keeps every accumulator in a register. */
static void q4k_avx2(const uint8_t *w, const Acts *a, int rows, float *out) {
    if (rows == 1) q4k_avx2_rows(w, a, 1, out); else q4k_avx2_rows(w, a, rows, out);
}
static void q6k_avx2(const uint8_t *w, const Acts *a, int rows, float *out) {
    if (rows == 1) q6k_avx2_rows(w, a, 1, out); else q6k_avx2_rows(w, a, rows, out);
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
static void q4k_vnni(const uint8_t *w, const Acts *a, int rows, float *out) {
    if (rows == 1) q4k_vnni_rows(w, a, 1, out); else q4k_vnni_rows(w, a, rows, out);
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
static void q6k_vnni(const uint8_t *w, const Acts *a, int rows, float *out) {
    if (rows == 1) q6k_vnni_rows(w, a, 1, out); else q6k_vnni_rows(w, a, rows, out);
}

/* ---- Q4_0 and Q8_0 (blocks of 32; eight to an activation block) ----------------------------- */

static void q40_avx2(const uint8_t *w, const Acts *a, int64_t in_blocks, int rows, float *out) {
    __m256 acc[MAX_ROWS];
    float offsets[MAX_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps(), offsets[r] = 0.0f;
    const __m128i low = _mm_set1_epi8(0xF);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < in_blocks; i++) {
        const uint8_t *block = w + i * 18;
        const float d = half_to_float(block);
        const __m128i bits = _mm_loadu_si128((const __m128i *)(block + 2));
        const __m256i q = _mm256_setr_m128i(_mm_and_si128(bits, low), _mm_and_si128(_mm_srli_epi16(bits, 4), low));
        const int64_t b = i / 8, part = i % 8;
        for (int r = 0; r < rows; r++) {
            const int8_t *xq = a->q + r * a->padded + 32 * i;
            const __m256i p = _mm256_madd_epi16(ones, _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)xq)));
            const float scale = d * a->d[r * a->blocks + b];
            const int16_t *sums = a->sums + (r * a->blocks + b) * 16 + 2 * part;
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(scale), acc[r]);
            offsets[r] += scale * (float)(8 * (sums[0] + sums[1]));  /* q - 8 */
        }
    }
    for (int r = 0; r < rows; r++) out[r] = lane_sum(acc[r]) - offsets[r];
}

static void q80_avx2(const uint8_t *w, const Acts *a, int64_t in_blocks, int rows, float *out) {
    __m256 acc[MAX_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t i = 0; i < in_blocks; i++) {
        const uint8_t *block = w + i * 34;
        const float d = half_to_float(block);
        const __m256i q = _mm256_loadu_si256((const __m256i *)(block + 2));
        /* maddubs takes one unsigned operand: |q| times x with q's sign (|-128| reads as 128) */
        const __m256i magnitude = _mm256_abs_epi8(q);
        for (int r = 0; r < rows; r++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(a->q + r * a->padded + 32 * i));
            const __m256i p = _mm256_madd_epi16(ones, _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(x, q)));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a->d[r * a->blocks + i / 8]), acc[r]);
        }
    }
    for (int r = 0; r < rows; r++) out[r] = lane_sum(acc[r]);
}

/* ---- entry points --------------------------------------------------------------------------- */

/* Whether this CPU has AVX-512 VNNI and BW (the VNNI paths). */
int block_has_vnni(void) {
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
}

/* Bytes of one row of `in` weights of `type`, or 0 for a type this file does not run. */
int64_t block_row_bytes(int type, int64_t in) {
    switch (type) {
    case TYPE_Q4_K: return in % QK ? 0 : in / QK * 144;
    case TYPE_Q6_K: return in % QK ? 0 : in / QK * 210;
    case TYPE_Q4_0: return in % 32 ? 0 : in / 32 * 18;
    case TYPE_Q8_0: return in % 32 ? 0 : in / 32 * 34;
    default: return 0;
    }
}

/* x float32 [rows][in] times the weight w (`out` rows of block_row_bytes(type, in) bytes)
 * -> y float32 [rows][out]. vnni: run the AVX-512 VNNI paths (the caller checked the CPU). */
void block_rows_linear(int type, const uint8_t *w, const float *x, float *y, int64_t rows, int64_t out, int64_t in,
                       int threads, int vnni) {
    const int64_t padded = (in + QK - 1) / QK * QK, blocks = padded / QK, row_bytes = block_row_bytes(type, in);
    int8_t *q = aligned_alloc(64, (size_t)((rows * padded + 63) / 64 * 64));
    float *d = malloc((size_t)(rows * blocks) * sizeof(float));
    int16_t *sums = malloc((size_t)(rows * blocks * 16) * sizeof(int16_t));
    float *xsums = malloc((size_t)(rows * blocks * 16) * sizeof(float));
    quantize_rows(x, q, d, sums, xsums, rows, in, padded);
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < out; n++) {
        const uint8_t *wn = w + n * row_bytes;
        float result[MAX_ROWS];
        for (int64_t r0 = 0; r0 < rows; r0 += MAX_ROWS) {
            const int count = rows - r0 < MAX_ROWS ? (int)(rows - r0) : MAX_ROWS;
            const Acts a = {q + r0 * padded, d + r0 * blocks, sums + r0 * blocks * 16, xsums + r0 * blocks * 16, padded,
                            blocks};
            switch (type) {
            case TYPE_Q4_K: (vnni ? q4k_vnni : q4k_avx2)(wn, &a, count, result); break;
            case TYPE_Q6_K: (vnni ? q6k_vnni : q6k_avx2)(wn, &a, count, result); break;
            case TYPE_Q4_0: q40_avx2(wn, &a, in / 32, count, result); break;
            default: q80_avx2(wn, &a, in / 32, count, result); break;
            }
            for (int i = 0; i < count; i++) y[(r0 + i) * out + n] = result[i];
        }
    }
    free(q);
    free(d);
    free(sums);
    free(xsums);
}

/* One row of `in` weights of `type` as float32, as ggml's dequantize_row_* computes it. */
static void dequantize_row(int type, const uint8_t *row, float *y, int64_t in) {
    if (type == TYPE_Q4_K) {
        for (int64_t b = 0; b < in / QK; b++, y += QK) {
            const uint8_t *block = row + b * 144;
            const float d = half_to_float(block), dmin = half_to_float(block + 2);
            uint8_t sc[8], m[8];
            q4k_scales(block + 4, sc, m);
            for (int c = 0; c < 4; c++) {
                const uint8_t *qs = block + 16 + 32 * c;
                const float d1 = d * sc[2 * c], m1 = dmin * m[2 * c], d2 = d * sc[2 * c + 1], m2 = dmin * m[2 * c + 1];
                for (int l = 0; l < 32; l++) {
                    y[64 * c + l] = d1 * (qs[l] & 0xF) - m1;
                    y[64 * c + 32 + l] = d2 * (qs[l] >> 4) - m2;
                }
            }
        }
    } else if (type == TYPE_Q6_K) {
        for (int64_t b = 0; b < in / QK; b++, y += QK) {
            const uint8_t *block = row + b * 210;
            const int8_t *scales = (const int8_t *)(block + 192);
            const float d = half_to_float(block + 208);
            for (int h = 0; h < 2; h++) {
                const uint8_t *ql = block + 64 * h, *qh = block + 128 + 32 * h;
                const int8_t *sc = scales + 8 * h;
                float *yh = y + 128 * h;
                for (int l = 0; l < 32; l++) {
                    const int is = l / 16;
                    yh[l] = d * sc[is] * (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                    yh[l + 32] = d * sc[is + 2] * (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    yh[l + 64] = d * sc[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    yh[l + 96] = d * sc[is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
        }
    } else if (type == TYPE_Q4_0) {
        for (int64_t i = 0; i < in / 32; i++, y += 32) {
            const uint8_t *block = row + i * 18;
            const float d = half_to_float(block);
            for (int l = 0; l < 16; l++) {
                y[l] = d * ((block[2 + l] & 0xF) - 8);
                y[l + 16] = d * ((block[2 + l] >> 4) - 8);
            }
        }
    } else {
        for (int64_t i = 0; i < in / 32; i++, y += 32) {
            const uint8_t *block = row + i * 34;
            const float d = half_to_float(block);
            for (int l = 0; l < 32; l++) y[l] = d * (int8_t)block[2 + l];
        }
    }
}

/* Rows index[0 .. count) of the weight w as float32 into y [count][in] (an embedding's lookup;
 * a block of outputs for a product of many rows). */
void block_dequantize(int type, const uint8_t *w, const int64_t *index, float *y, int64_t count, int64_t in,
                      int threads) {
    const int64_t row_bytes = block_row_bytes(type, in);
    #pragma omp parallel for num_threads(threads) schedule(static) if (count > 1)
    for (int64_t i = 0; i < count; i++) dequantize_row(type, w + index[i] * row_bytes, y + i * in, in);
}
