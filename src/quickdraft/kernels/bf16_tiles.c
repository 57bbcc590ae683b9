/* Rows times a bfloat16 weight on AMX tiles: a target model's linear layers on a CPU with AMX-BF16.
 *
 * y[r][n] = bf16(sum_k x[r][k] * w[n][k] + bias[n]): x bfloat16 [rows][in], w bfloat16 [out][in],
 * bias float32 [out] or NULL, y bfloat16 [rows][out]. The sums are float32 (the tiles' own
 * multiply-adds, in the order of k), rounded once to bfloat16 at the end, to nearest even.
 *
 * A batched server verifies drafts over rows x positions: oneDNN's packed layers of the demo 1.5B
 * target took 107 ms for 16 rows and 134 for 32 (AMX Xeon, 2 threads), when reading the weights
 * alone takes about 90. One tile product multiplies a block of 16 outputs by 32 inputs (the weight) with
 * up to 16 rows' 32 inputs into 16 x 16 float32 sums (C), and the sums stay in the tiles over
 * all inputs: per 1 KiB of weights read, two tile products for 32 rows. Reading the weights stays
 * the cost up to dozens of rows.
 *
 * x's rows are the tiles' rows (A: 16 rows x 32 inputs, read from x as it is, padded per call to
 * whole tiles); the weight is held as B tiles (bf16_tiles_pack): for each block of 16 outputs and
 * block of 32 inputs, 16 rows of (16 outputs x 2 consecutive inputs), so that the product streams
 * each block's weights from one address forwards (outputs padded to a multiple of 32, inputs to
 * a multiple of 32, with zeros). The sums come out as rows of y. A row's sums do not depend on
 * the rows beside it: each output's sum runs over the inputs in the same order whatever the
 * number of rows.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx.h"

#define TILE 16   /* outputs, and rows of x, a tile holds */
#define DEPTH 32  /* inputs a tile product reads: 16 pairs of bfloat16 */
#define UNIT (TILE * DEPTH)  /* bfloat16 values in one tile */
/* Tiles of weights prefetched ahead of the product (2 KiB a step): 32 rows of the demo target's
 * layers took 123 ms without, 99 with 2 or 4 ahead, 101 with 8. */
#define AHEAD 2

/* Whether the CPU has AMX-BF16 and this process may use its tiles. */
int bf16_tiles_available(void) { return amx_permitted(AMX_BF16_BIT); }

static inline int64_t round_up(int64_t n, int64_t block) { return (n + block - 1) / block * block; }

/* Elements (bfloat16) of the tiled weight for out x in. */
int64_t bf16_tiles_size(int64_t out, int64_t in) { return round_up(out, 2 * TILE) * round_up(in, DEPTH); }

/* w bfloat16 [out][in] -> packed bfloat16 [out blocks][in blocks][DEPTH / 2][TILE][2]: input
 * pair j of block u of output n at [n / TILE][u][j][n % TILE] (bf16_tiles_size elements). */
void bf16_tiles_pack(const uint16_t *w, uint16_t *packed, int64_t out, int64_t in) {
    const int64_t blocks = round_up(in, DEPTH) / DEPTH, outs = round_up(out, 2 * TILE);
    memset(packed, 0, (size_t)(outs * blocks * DEPTH) * sizeof(uint16_t));
    #pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < out; n++)
        for (int64_t k = 0; k < in; k++)
            packed[((n / TILE) * blocks + k / DEPTH) * UNIT + (k % DEPTH) / 2 * (2 * TILE) + (n % TILE) * 2 + k % 2] =
                w[n * in + k];
}

/* 16 float32 sums (+ bias) -> 16 bfloat16 at y, rounded to nearest even as torch rounds. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static inline void narrow16(__m512 v, uint16_t *y, __mmask16 mask) {
    const __m512i bits = _mm512_castps_si512(v);
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff))), 16);
    _mm256_mask_storeu_epi16((void *)y, mask, _mm512_cvtepi32_epi16(rounded));
}

/* The product (see the top of the file); packed from bf16_tiles_pack. The caller checked
 * bf16_tiles_available. */
__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")))
void bf16_tiles_linear(const uint16_t *x, const uint16_t *packed, const float *bias, uint16_t *y,
                       int64_t rows, int64_t out, int64_t in, int threads) {
    const int64_t blocks = round_up(in, DEPTH) / DEPTH, padded = blocks * DEPTH;
    const int64_t row_blocks = round_up(rows, TILE) / TILE, out_pairs = round_up(out, 2 * TILE) / (2 * TILE);
    /* x in whole tiles: rows to a multiple of 16, inputs to a multiple of 32, zeros */
    uint16_t *xp = aligned_alloc(64, (size_t)(row_blocks * TILE * padded) * sizeof(uint16_t));
    memset(xp + rows * padded, 0, (size_t)((row_blocks * TILE - rows) * padded) * sizeof(uint16_t));
    for (int64_t r = 0; r < rows; r++) {
        memcpy(xp + r * padded, x + r * in, (size_t)in * sizeof(uint16_t));
        memset(xp + r * padded + in, 0, (size_t)(padded - in) * sizeof(uint16_t));
    }
    const int64_t stride = padded * (int64_t)sizeof(uint16_t);
    #pragma omp parallel num_threads(threads)
    {
        /* tiles 0-3: sums (two row blocks x two output blocks); 4, 5: the row blocks; 6, 7: the
         * output blocks' weights */
        amx_configure();
        float sums[4][TILE * TILE] __attribute__((aligned(64)));
        #pragma omp for schedule(static)
        for (int64_t op = 0; op < out_pairs; op++) {
            const uint16_t *w0 = packed + (2 * op) * blocks * UNIT, *w1 = w0 + blocks * UNIT;
            for (int64_t rb = 0; rb < row_blocks; rb += 2) {
                const int both = rb + 1 < row_blocks;
                const uint16_t *x0 = xp + rb * TILE * padded, *x1 = x0 + TILE * padded;
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
                for (int64_t u = 0; u < blocks; u++) {
                    if (u + AHEAD < blocks)
                        for (int line = 0; line < UNIT * 2; line += 64) {
                            _mm_prefetch((const char *)(w0 + (u + AHEAD) * UNIT) + line, _MM_HINT_T0);
                            _mm_prefetch((const char *)(w1 + (u + AHEAD) * UNIT) + line, _MM_HINT_T0);
                        }
                    _tile_loadd(6, w0 + u * UNIT, 64);
                    _tile_loadd(7, w1 + u * UNIT, 64);
                    _tile_loadd(4, x0 + u * DEPTH, stride);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    if (both) {
                        _tile_loadd(5, x1 + u * DEPTH, stride);
                        _tile_dpbf16ps(2, 5, 6);
                        _tile_dpbf16ps(3, 5, 7);
                    }
                }
                _tile_stored(0, sums[0], 64);
                _tile_stored(1, sums[1], 64);
                if (both) {
                    _tile_stored(2, sums[2], 64);
                    _tile_stored(3, sums[3], 64);
                }
                /* sums[2 b + h][r][n]: row block b, output block h of the pair */
                for (int h = 0; h < 2; h++) {
                    const int64_t n0 = (2 * op + h) * TILE;
                    if (n0 >= out) break;
                    const int count = out - n0 < TILE ? (int)(out - n0) : TILE;
                    const __mmask16 mask = (__mmask16)((1u << count) - 1);
                    const __m512 b16 = bias ? _mm512_maskz_loadu_ps(mask, bias + n0) : _mm512_setzero_ps();
                    for (int b = 0; b < 1 + both; b++)
                        for (int64_t r = (rb + b) * TILE; r < rows && r < (rb + b + 1) * TILE; r++)
                            narrow16(_mm512_add_ps(_mm512_load_ps(sums[2 * b + h] + (r % TILE) * TILE), b16),
                                     y + r * out + n0, mask);
                }
            }
        }
        _tile_release();
    }
    free(xp);
}
