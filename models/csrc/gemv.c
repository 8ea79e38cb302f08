/* Linear layers for a few rows (decode steps), weights streamed once from memory.
 *
 * y[m, n] = epi(sum_k x[m, k] * w[n, k] + bias[n]) for m < M, accumulated in fp32.
 * x: [M, K] with row stride ldx; w: [N, K] contiguous; y, other: [M, N] with row
 * strides ldy, ldo. Tiles of 4 weight rows x 4 input rows (5-6 where 5-6 rows are left,
 * `WIDE_TILE`); weight rows are prefetched PF_ROWS ahead (a single stream per tile is
 * too little for the hardware prefetcher to keep a core's memory bandwidth busy), into
 * L1 (pf 0) or into L2 (pf 1): which streams faster differs between CPUs (on one AMD
 * EPYC, L2 read 1.7x faster), so it is measured (`models.probes`). bf16 results are rounded
 * once, to nearest even.
 */
#include "common.h"

/* NOTE: the tails of the dot products (past the last full vector of k) are explicit fmaf:
 * left to contraction, GCC compiled one tile's tail as a vector multiply and in-order
 * scalar adds (no FMA) in one inlined copy and as FMAs in another, so a row's result
 * depended on its tile (seen on a -march=skylake-avx512 build). */

#define ID(v) (v)

#define PF_ROWS 16
#define BLOCK_N 16 /* outputs per block: a tile of 4 input rows runs over 16 weight rows */

/* NOTE: the locality hint must be a constant; PL is one in each inlined tile. PL 2: no
 * prefetch (a tile of later input rows over weight rows the first tile brought in). */
#define PREFETCH(p, PL) \
    do {                                                                               \
        if (PL == 1) __builtin_prefetch((p), 0, 2);                                    \
        else if (PL == 0) __builtin_prefetch((p), 0, 3);                               \
    } while (0)

static inline float epilogue(float acc, int epi, float other) {
    switch (epi) {
    case EPI_SILU: return acc / (1.f + expf(-acc));
    case EPI_MUL: return acc * other;
    case EPI_ADD: return acc + other;
    default: return acc;
    }
}

/* out[i][j] = dot(x row i, w row j) over K, for a 4 x 4 tile; x rows in fp32 or bf16. */
#if defined(__AVX512BF16__)
static inline __attribute__((always_inline)) void tile_bf16(
        const uint16_t *w, int64_t K, const uint16_t *const xr[4], const float *xs,
        float out[4][4], const int MT, const int PL) {
    (void)xs; /* split rows: only the 8-lane bf16 tile reads them */
    f32x16 a[4][4] = {{{0}}};
    int64_t k = 0;
    for (; k + 32 <= K; k += 32) {
        __m512bh wv[4];
        for (int j = 0; j < 4; j++) {
            PREFETCH(w + (PF_ROWS + j) * K + k, PL);
            wv[j] = (__m512bh)_mm512_loadu_si512(w + j * K + k);
        }
        for (int i = 0; i < MT; i++) {
            __m512bh xv = (__m512bh)_mm512_loadu_si512(xr[i] + k);
            for (int j = 0; j < 4; j++)
                a[i][j] = (f32x16)_mm512_dpbf16_ps((__m512)a[i][j], wv[j], xv);
        }
    }
    tile_sums(a, out, MT);
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < 4; j++)
            for (int64_t kk = k; kk < K; kk++)
                out[i][j] = fmaf(bf16_to_f32(w[j * K + kk]), bf16_to_f32(xr[i][kk]), out[i][j]);
}
#elif !defined(__AVX512F__)
#define SPLIT_X 1
/* 8 lanes: without AVX512 a 16-lane vector is two registers, and a tile's accumulators and
 * weight vectors would need more registers than AVX2's 16 (spilled on every step).
 * NOTE: the weights are not widened element by element: 16 bf16 read as 8 u32 pairs give the
 * even elements as fp32 by one shift and the odd ones by one mask, so x comes split the same
 * way (`split_rows`: per 16 elements, the 8 even ones then the 8 odd ones, in fp32), once per
 * call rather than once per tile. On an AMD EPYC with AVX2 only (a throwaway harness) a
 * one-row step over the default model's 269 MB of weights took 11.7 ms this way against 18.0
 * widening both sides per tile (both prefetching into L2; a plain read of them 9.3 ms). */
/* Rows i0, i0 + 1 (NI of them) of a tile, their x halves loaded once per step for all 4
 * weight rows: a whole 4 x 4 tile's 16 accumulators spilled on every step. NOTE: in a
 * throwaway harness over the default model's linear shapes (212 MB of bf16 weights,
 * prefetching into L2) 1 / 2 / 4 / 8 rows took 9.1 / 9.5 / 15.9 / 30.6 ms this way against
 * 10.3 / 11.1 / 19.2 / 36.4 with the 4 x 4 tile, on the same AVX2-only CPU. */
static inline __attribute__((always_inline)) void pair_bf16(
        const uint16_t *w, int64_t K, const uint16_t *const xr[4], const float *xs,
        float out[4][4], const int i0, const int NI, const int PL) {
    f32x8 a[2][4] = {{{0}}};
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        f32x8 xe[2], xo[2];
        for (int i = 0; i < NI; i++) {
            memcpy(&xe[i], xs + (i0 + i) * K + k, sizeof xe[i]);
            memcpy(&xo[i], xs + (i0 + i) * K + k + 8, sizeof xo[i]);
        }
        for (int j = 0; j < 4; j++) {
            if (!(k & 31)) PREFETCH(w + (PF_ROWS + j) * K + k, PL);
            u32x8 pairs, lo, hi;
            memcpy(&pairs, w + j * K + k, sizeof pairs);
            lo = pairs << 16;
            hi = pairs & 0xffff0000u;
            f32x8 even, odd;
            memcpy(&even, &lo, sizeof even);
            memcpy(&odd, &hi, sizeof odd);
            for (int i = 0; i < NI; i++) {
                a[i][j] += even * xe[i];
                a[i][j] += odd * xo[i];
            }
        }
    }
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < 4; j++) {
            float s = hsum8(a[i][j]);
            for (int64_t kk = k; kk < K; kk++)
                s = fmaf(bf16_to_f32(w[j * K + kk]), bf16_to_f32(xr[i0 + i][kk]), s);
            out[i0 + i][j] = s;
        }
}

static inline __attribute__((always_inline)) void tile_bf16(
        const uint16_t *w, int64_t K, const uint16_t *const xr[4], const float *xs,
        float out[4][4], const int MT, const int PL) {
    pair_bf16(w, K, xr, xs, out, 0, MT < 2 ? MT : 2, PL);
    if (MT > 2) pair_bf16(w, K, xr, xs, out, 2, MT - 2, PL);
}
#else
static inline __attribute__((always_inline)) void tile_bf16(
        const uint16_t *w, int64_t K, const uint16_t *const xr[4], const float *xs,
        float out[4][4], const int MT, const int PL) {
    (void)xs; /* split rows: only the 8-lane bf16 tile reads them */
    f32x16 a[4][4] = {{{0}}};
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        f32x16 wv[4];
        for (int j = 0; j < 4; j++) {
            PREFETCH(w + (PF_ROWS + j) * K + k, PL);
            wv[j] = ld_bf16(w + j * K + k);
        }
        for (int i = 0; i < MT; i++) {
            f32x16 xv = ld_bf16(xr[i] + k);
            for (int j = 0; j < 4; j++) a[i][j] += wv[j] * xv;
        }
    }
    tile_sums(a, out, MT);
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < 4; j++)
            for (int64_t kk = k; kk < K; kk++)
                out[i][j] = fmaf(bf16_to_f32(w[j * K + kk]), bf16_to_f32(xr[i][kk]), out[i][j]);
}
#endif

#if !defined(__AVX512F__)
/* Rows i0, i0 + 1 (NI of them) of a tile: 8 accumulators, 4 weight vectors and an input
 * vector fit AVX2's 16 registers, where a whole 4 x 4 tile's 16 accumulators lived on the
 * stack (every FMA a load and a store). NOTE: on an AMD EPYC with AVX2 only (a throwaway
 * harness over the default model's linear shapes, 425 MB of fp32 weights, prefetching into
 * L2) 1 / 2 / 4 rows took 22.0 / 19.0 / 28.4 ms this way against 41.8 / 49.2 / 61.8; the bf16 tile
 * above is split the same way. */
static inline __attribute__((always_inline)) void pair_f32(
        const float *w, int64_t K, const float *const xr[4], float out[4][4], const int i0,
        const int NI, const int PL) {
    f32x8 a[2][4] = {{{0}}};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        for (int j = 0; j < 4; j++) {
            if (!(k & 15)) PREFETCH(w + (PF_ROWS + j) * K + k, PL);
            f32x8 wv;
            memcpy(&wv, w + j * K + k, sizeof wv);
            for (int i = 0; i < NI; i++) {
                f32x8 xv;
                memcpy(&xv, xr[i0 + i] + k, sizeof xv);
                a[i][j] += wv * xv;
            }
        }
    }
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < 4; j++) {
            float s = hsum8(a[i][j]);
            for (int64_t kk = k; kk < K; kk++) s = fmaf(w[j * K + kk], xr[i0 + i][kk], s);
            out[i0 + i][j] = s;
        }
}

static inline __attribute__((always_inline)) void tile_f32(
        const float *w, int64_t K, const float *const xr[4], const float *xs,
        float out[4][4], const int MT, const int PL) {
    (void)xs; /* split rows: only the 8-lane bf16 tile reads them */
    pair_f32(w, K, xr, out, 0, MT < 2 ? MT : 2, PL);
    if (MT > 2) pair_f32(w, K, xr, out, 2, MT - 2, PL);
}
#else
static inline __attribute__((always_inline)) void tile_f32(
        const float *w, int64_t K, const float *const xr[4], const float *xs,
        float out[4][4], const int MT, const int PL) {
    (void)xs; /* split rows: only the 8-lane bf16 tile reads them */
    f32x16 a[4][4] = {{{0}}};
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {
        f32x16 wv[4];
        for (int j = 0; j < 4; j++) {
            PREFETCH(w + (PF_ROWS + j) * K + k, PL);
            wv[j] = ld_f32(w + j * K + k);
        }
        for (int i = 0; i < MT; i++) {
            f32x16 xv = ld_f32(xr[i] + k);
            for (int j = 0; j < 4; j++) a[i][j] += wv[j] * xv;
        }
    }
    tile_sums(a, out, MT);
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < 4; j++)
            for (int64_t kk = k; kk < K; kk++)
                out[i][j] = fmaf(w[j * K + kk], xr[i][kk], out[i][j]);
}
#endif

#if defined(__AVX512F__)
/* out[i][J0 + j] = the sum of a[i][j]'s 16 lanes for i < MT, j < NJ, by `sum16`'s tree per 16
 * accumulators (bit for bit `hsum`, as `tile_sums`). */
static inline __attribute__((always_inline)) void wide_sums(f32x16 a[6][4], float out[8][4],
                                                             const int MT, const int J0,
                                                             const int NJ) {
    f32x16 v[32];
    const int n = MT * NJ;
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < NJ; j++) v[i * NJ + j] = a[i][j];
    for (int c = n; c < 32; c++) v[c] = (f32x16){0};
    for (int c0 = 0; c0 < n; c0 += 16) {
        f32x16 s = sum16(v + c0);
        for (int i = 0; i < MT; i++)
            for (int j = 0; j < NJ; j++)
                if (i * NJ + j >= c0 && i * NJ + j < c0 + 16)
                    out[i][J0 + j] = s[i * NJ + j - c0];
    }
}

/* Weight rows J0 .. J0 + NJ - 1 of a wide tile against its MT (5-6) input rows: MT * NJ
 * accumulators (at most 24), NJ weight vectors and one x vector in AVX512's 32 registers.
 * Each output takes the 4 x 4 tile's steps (STEP elements at a time by MAC, lanes summed by
 * one tree, then the tail in k order), so it is bit for bit what a one-row call gives. */
#define WIDE_COLS(NAME, DT, STEP, VT, LDV, MAC, LD)                                     \
    static inline __attribute__((always_inline)) void NAME(                            \
            const DT *w, int64_t K, const DT *const xr[8], float out[8][4],            \
            const int MT, const int J0, const int NJ, const int PL) {                  \
        f32x16 a[6][4] = {{{0}}};                                                      \
        int64_t k = 0;                                                                 \
        for (; k + STEP <= K; k += STEP) {                                             \
            VT wv[4];                                                                  \
            for (int j = 0; j < NJ; j++) {                                             \
                PREFETCH(w + (PF_ROWS + J0 + j) * K + k, PL);                          \
                wv[j] = LDV(w + (J0 + j) * K + k);                                     \
            }                                                                          \
            for (int i = 0; i < MT; i++) {                                             \
                VT xv = LDV(xr[i] + k);                                                \
                for (int j = 0; j < NJ; j++) a[i][j] = MAC(a[i][j], wv[j], xv);        \
            }                                                                          \
        }                                                                              \
        wide_sums(a, out, MT, J0, NJ);                                                 \
        for (int i = 0; i < MT; i++)                                                   \
            for (int j = J0; j < J0 + NJ; j++)                                         \
                for (int64_t kk = k; kk < K; kk++)                                     \
                    out[i][j] = fmaf(LD(w[j * K + kk]), LD(xr[i][kk]), out[i][j]);     \
    }

#define FMA16(a, w, x) ((a) + (w) * (x)) /* contracted to one FMA, as the 4 x 4 tile's */
#define LD_BH(p) ((__m512bh)_mm512_loadu_si512(p))
#define DP_BH(a, w, x) ((f32x16)_mm512_dpbf16_ps((__m512)(a), (w), (x)))
#if defined(__AVX512BF16__)
WIDE_COLS(cols_bf16, uint16_t, 32, __m512bh, LD_BH, DP_BH, bf16_to_f32)
#else
WIDE_COLS(cols_bf16, uint16_t, 16, f32x16, ld_bf16, FMA16, bf16_to_f32)
#endif
WIDE_COLS(cols_f32, float, 16, f32x16, ld_f32, FMA16, ID)

/* A tile of 5-6 input rows: one pass over its 4 weight rows serves them all (24
 * accumulators). NOTE: before, rows 5-6 ran a second tile of 1-2 rows over each block of 16
 * weight rows, rereading its weight vectors from cache for little arithmetic (a 6-row call
 * over 200 MB of bf16 weights, prefetching into L2, 1.49x a one-row call, now 1.17x; fp32
 * 2.88x, now 1.95x; one AMD EPYC, noisy). 7-8 rows: see EIGHT_FN. */
#define WIDE_TILE(NAME, COLS, TILE, DT)                                                 \
    static inline __attribute__((always_inline)) void NAME(                            \
            const DT *w, int64_t K, const DT *const xr[8], const float *xs,            \
            float out[8][4], const int MT, const int PL) {                             \
        (void)xs;                                                                      \
        COLS(w, K, xr, out, MT, 0, 4, PL);                                             \
    }
#else
/* Without AVX512 (16 registers) a tile of 5-6 rows is two tiles, of 4 and 1-2 rows, the
 * second over the weight rows the first just brought into L1. */
#define WIDE_TILE(NAME, COLS, TILE, DT)                                                 \
    static inline __attribute__((always_inline)) void NAME(                            \
            const DT *w, int64_t K, const DT *const xr[8], const float *xs,            \
            float out[8][4], const int MT, const int PL) {                             \
        TILE(w, K, xr, xs, out, 4, PL);                                                \
        const DT *xt[4] = {xr[4], xr[5], xr[5], xr[5]};                                \
        float o[4][4];                                                                 \
        TILE(w, K, xt, xs ? xs + 4 * K : NULL, o, MT - 4, 2);                          \
        memcpy(out[4], o, sizeof(float) * 4 * (MT - 4));                               \
    }
#endif
WIDE_TILE(wide_bf16, cols_bf16, tile_bf16, uint16_t)
WIDE_TILE(wide_f32, cols_f32, tile_f32, float)

#define NO_EIGHT(...) ((void)0)
#if defined(__AVX512F__)
/* fp32 on AVX512: a tile of 7-8 input rows, a 6 x 4 tile and one of the 1-2 rows left over
 * its weight rows (from L1). NOTE: a function apart (one per rows and prefetch level), so
 * its loops get the general registers to themselves: inlined in the driver with the other
 * shapes, GCC spilled their row pointers. 8 rows over 200 MB of fp32 weights (prefetching
 * into L2) took ~1.8-2.0x a one-row call this way against ~2.9x as two tiles of 4 (one AMD
 * EPYC, noisy). bf16 keeps two tiles of 4 over each block: there this shape, an 8 x 2 tile
 * taken twice or two 4 x 4 tiles per 4 weight rows were no faster (~1.5x: one core's
 * dpbf16 rate, ~2.9 a ns measured, bounds 8 rows' dot products near that). */
#define EIGHT_FN(MT, PL)                                                                \
    static __attribute__((noinline)) void eight_f32_##MT##_##PL(                       \
            const float *w, int64_t K, const float *const xr[8], const float *xs,      \
            float out[8][4]) {                                                         \
        wide_f32(w, K, xr, xs, out, 6, PL);                                            \
        const float *xt[4] = {xr[6], xr[7], xr[7], xr[7]};                             \
        float o[4][4];                                                                 \
        tile_f32(w, K, xt, xs, o, MT - 6, 2);                                          \
        memcpy(out[6], o, sizeof(float) * 4 * (MT - 6));                               \
    }
EIGHT_FN(7, 0) EIGHT_FN(7, 1) EIGHT_FN(7, 2) EIGHT_FN(8, 0) EIGHT_FN(8, 1) EIGHT_FN(8, 2)
#define EIGHT_F32(w, K, xr, xs, out, MT, PL) eight_f32_##MT##_##PL(w, K, xr, xs, out)
#define MAXW_F32 8
#else
#define EIGHT_F32 NO_EIGHT
#define MAXW_F32 6
#endif

/* The tile for the rt rows from m0 (the 1-3 left; 4; 5-6; 7-8 in fp32 on AVX512: EIGHT),
 * prefetching into L1 (PL 0), L2 (PL 1) or not (2). */
#define TILES(TILE, WIDE, EIGHT, PL)                                                    \
    switch (M - m0 < rt ? M - m0 : rt) {                                                \
    case 1: TILE(wt, K, xr, xsm, acc, 1, PL); break;                                    \
    case 2: TILE(wt, K, xr, xsm, acc, 2, PL); break;                                    \
    case 3: TILE(wt, K, xr, xsm, acc, 3, PL); break;                                    \
    case 5: WIDE(wt, K, xr, xsm, acc, 5, PL); break;                                    \
    case 6: WIDE(wt, K, xr, xsm, acc, 6, PL); break;                                    \
    case 7: EIGHT(wt, K, xr, xsm, acc, 7, PL); break;                                   \
    case 8: EIGHT(wt, K, xr, xsm, acc, 8, PL); break;                                   \
    default: TILE(wt, K, xr, xsm, acc, 4, PL); break;                                   \
    }

#ifndef SPLIT_X
#define SPLIT_X 0
#endif

/* A tile's 6 rows of x in fp32 as tile_bf16's 8-lane pairs read them: per full 16-element
 * block, its 8 even elements, then its 8 odd ones. xs: [6, K]. */
static void split_rows(const uint16_t *const xr[8], int64_t K, float *xs) {
    for (int i = 0; i < 8; i++)
        for (int64_t k = 0; k + 16 <= K; k += 16)
            for (int e = 0; e < 8; e++) {
                xs[i * K + k + e] = bf16_to_f32(xr[i][k + 2 * e]);
                xs[i * K + k + 8 + e] = bf16_to_f32(xr[i][k + 2 * e + 1]);
            }
}

/* Input row m0 + i of x (the last row again past M: a tile has 6 pointers). */
#define XROWS(xr, m0)                                                                   \
    for (int i = 0; i < 8; i++) xr[i] = x + (m0 + i < M ? m0 + i : M - 1) * ldx;

/* The input rows of the tile from row m0: the 5..MAXW left in one tile, else 4 (or the 1-3
 * left). */
#define ROW_STEP(m0, MAXW) (M - (m0) >= 5 && M - (m0) <= MAXW ? M - (m0) : 4)

/* Row m's outputs n0 .. n0 + nw - 1 from their sums a: bias, epilogue, rounded once. A whole
 * block of 16 is done in vectors (SiLU's exp stays scalar expf): every row's block of these
 * outputs takes the same path, whatever M. */
#define EPI_ROW(DT, LD, ST, LDV, STV)                                                   \
    DT *yr = y + m * ldy + n0;                                                          \
    const DT *orow = other ? other + m * ldo + n0 : NULL;                               \
    if (nw == BLOCK_N) {                                                                \
        f32x16 v = ld_f32(a) + (bias ? LDV(bias + n0) : (f32x16){0});                   \
        if (epi == EPI_SILU) {                                                          \
            float t[16];                                                                \
            st_f32(t, v);                                                               \
            for (int e = 0; e < 16; e++) t[e] = epilogue(t[e], EPI_SILU, 0.f);          \
            v = ld_f32(t);                                                              \
        } else if (epi == EPI_MUL) {                                                    \
            v = v * LDV(orow);                                                          \
        } else if (epi == EPI_ADD) {                                                    \
            v = v + LDV(orow);                                                          \
        }                                                                               \
        STV(yr, v);                                                                     \
    } else {                                                                            \
        for (int64_t j = 0; j < nw; j++) {                                              \
            float v = a[j] + (bias ? LD(bias[n0 + j]) : 0.f);                           \
            yr[j] = ST(epilogue(v, epi, orow ? LD(orow[j]) : 0.f));                     \
        }                                                                               \
    }

/* One generic driver: DT is the element type, TILE the tile kernel (WIDE: of 5-6 rows, EIGHT:
 * of 7-8 where MAXW is 8), LD / ST load and store (LDV / STV: 16 at a time), SPLIT whether
 * the tiles read x's rows split by `split_rows`. NOTE: blocks of 16 weight rows are the
 * outer loop, and every tile of input rows (4, or the 5..MAXW left: `ROW_STEP`) runs over a
 * block before the next, so the weights stream from memory once whatever M (the first row
 * tile prefetches, the others read what it brought into cache; input rows outermost read
 * them once per 4 rows). Each output is one tile's dot product over K, in the same order
 * whatever M, its tile, the tile's shape or its place in it, and its epilogue depends on
 * its column only: a row's result does not depend on the rows beside it (speculative
 * decoding's verify rows compute what one-row decode steps do). The epilogue of a block
 * runs in vectors: one scalar bf16 rounding per output cost as much as the arithmetic of
 * a tile's sums. */
#define GEMV_BODY(DT, TILE, WIDE, EIGHT, MAXW, LD, ST, LDV, STV, SPLIT)                 \
    float *xs = SPLIT ? malloc(sizeof(float) * (M + 8) * K) : NULL;                     \
    if (SPLIT && !xs) return -2;                                                        \
    for (int64_t m0 = 0; SPLIT && m0 < M; m0 += ROW_STEP(m0, MAXW)) {                   \
        const DT *xr[8];                                                                \
        XROWS(xr, m0)                                                                   \
        split_rows((const uint16_t *const *)xr, K, xs + m0 * K);                        \
    }                                                                                   \
    for (int64_t n0 = 0; n0 < N; n0 += BLOCK_N) {                                       \
        int64_t nw = N - n0 < BLOCK_N ? N - n0 : BLOCK_N;                               \
        for (int64_t m0 = 0, rt; m0 < M; m0 += rt) {                                    \
            rt = ROW_STEP(m0, MAXW);                                                    \
            const DT *xr[8];                                                            \
            XROWS(xr, m0)                                                               \
            const float *xsm = SPLIT ? xs + m0 * K : NULL;                              \
            float blk[8][BLOCK_N];                                                      \
            for (int64_t n1 = 0; n1 < nw; n1 += 4) {                                    \
                const DT *wt = w + (n0 + n1) * K;                                       \
                float acc[8][4];                                                        \
                if (n1 + 4 <= nw) {                                                     \
                    if (m0) TILES(TILE, WIDE, EIGHT, 2)                                 \
                    else if (pf) TILES(TILE, WIDE, EIGHT, 1)                            \
                    else TILES(TILE, WIDE, EIGHT, 0)                                    \
                } else {                                                                \
                    for (int i = 0; i < rt; i++)                                        \
                        for (int64_t j = 0; j < nw - n1; j++) {                         \
                            float s = 0.f;                                              \
                            for (int64_t k = 0; k < K; k++)                             \
                                s += LD(wt[j * K + k]) * LD(xr[i][k]);                  \
                            acc[i][j] = s;                                              \
                        }                                                               \
                }                                                                       \
                for (int i = 0; i < rt; i++)                                            \
                    for (int64_t j = 0; j < 4 && n1 + j < nw; j++) blk[i][n1 + j] = acc[i][j]; \
            }                                                                           \
            for (int64_t i = 0; i < rt && m0 + i < M; i++) {                            \
                int64_t m = m0 + i;                                                     \
                const float *a = blk[i];                                                \
                EPI_ROW(DT, LD, ST, LDV, STV)                                           \
            }                                                                           \
        }                                                                               \
    }                                                                                   \
    free(xs);                                                                           \
    return 0;

int gemv_bf16(const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias,
              uint16_t *y, int64_t ldy, const uint16_t *other, int64_t ldo,
              int64_t M, int64_t N, int64_t K, int epi, int pf) {
    GEMV_BODY(uint16_t, tile_bf16, wide_bf16, NO_EIGHT, 6, bf16_to_f32, f32_to_bf16, ld_bf16,
              st_bf16, SPLIT_X)
}

int gemv_f32(const float *x, int64_t ldx, const float *w, const float *bias,
             float *y, int64_t ldy, const float *other, int64_t ldo,
             int64_t M, int64_t N, int64_t K, int epi, int pf) {
    GEMV_BODY(float, tile_f32, wide_f32, EIGHT_F32, MAXW_F32, ID, ID, ld_f32, st_f32, 0)
}
