/* A few rows times a bfloat16 weight, for x86 CPUs with AVX2 and FMA but no bfloat16 instructions.
 *
 * y[r][n] = sum_k x[r][k] * w[n][k]: x float32 [rows][in], w bfloat16 [out][in] (row-major, as
 * nn.Linear holds it), y float32 [rows][out].
 *
 * Each weight is read once for up to ROW_BLOCK rows and widened in registers (a bfloat16 is the
 * top half of a float32), so that a product of a few rows costs about what reading the weight
 * costs, as a one-row step does. Every row's sum runs in the same order whatever the number of
 * rows (eight lanes over `in` in steps of eight, the lanes added pairwise, then the tail): a
 * row's result does not depend on the rows beside it, so verifying drafts computes what plain
 * decoding computes, bit for bit.
 */
#include <immintrin.h>
#include <stdint.h>

/* Rows sharing one read of a weight row: 2 weight rows x 4 inputs = 8 accumulators, and the
 * loads, in the 16 vector registers. */
#define ROW_BLOCK 4

static inline __m256 widen8(const uint16_t *p) {
    __m128i half = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}

static inline float widen1(uint16_t h) {
    union { uint32_t u; float f; } v = {(uint32_t)h << 16};
    return v.f;
}

static inline float lane_sum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

void bf16_rows_linear(const float *x, const uint16_t *w, float *y,
                      int64_t rows, int64_t out, int64_t in, int threads) {
    #pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t n = 0; n < out; n += 2) {
        const int pair = n + 1 < out;  /* an odd last row is computed twice, stored once */
        const uint16_t *w0 = w + n * in, *w1 = w + (n + pair) * in;
        for (int64_t r0 = 0; r0 < rows; r0 += ROW_BLOCK) {
            const int block = rows - r0 < ROW_BLOCK ? (int)(rows - r0) : ROW_BLOCK;
            __m256 a0[ROW_BLOCK], a1[ROW_BLOCK];
            for (int i = 0; i < ROW_BLOCK; i++) {
                a0[i] = _mm256_setzero_ps();
                a1[i] = _mm256_setzero_ps();
            }
            int64_t k = 0;
            for (; k + 8 <= in; k += 8) {
                const __m256 v0 = widen8(w0 + k), v1 = widen8(w1 + k);
                for (int i = 0; i < ROW_BLOCK; i++) {
                    if (i < block) {
                        const __m256 xv = _mm256_loadu_ps(x + (r0 + i) * in + k);
                        a0[i] = _mm256_fmadd_ps(xv, v0, a0[i]);
                        a1[i] = _mm256_fmadd_ps(xv, v1, a1[i]);
                    }
                }
            }
            for (int i = 0; i < block; i++) {
                const float *xr = x + (r0 + i) * in;
                float s0 = lane_sum(a0[i]), s1 = lane_sum(a1[i]);
                for (int64_t j = k; j < in; j++) {
                    s0 += xr[j] * widen1(w0[j]);
                    s1 += xr[j] * widen1(w1[j]);
                }
                y[(r0 + i) * out + n] = s0;
                if (pair) y[(r0 + i) * out + n + 1] = s1;
            }
        }
    }
}
