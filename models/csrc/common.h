/* Shared helpers of the native CPU kernels: bf16 <-> fp32 and 16-lane fp32 vectors.
 *
 * Vectors use GCC's vector extensions, so one source compiles to AVX512, AVX2
 * or NEON under -march=native; AVX512-BF16 paths use intrinsics.
 */
#ifndef SLICEGATE_COMMON_H
#define SLICEGATE_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef float f32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));

enum { EPI_NONE = 0, EPI_SILU = 1, EPI_MUL = 2, EPI_ADD = 3 };

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                      /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static inline f32x16 ld_bf16(const uint16_t *p) {
#if defined(__AVX512F__)
    __m512i w = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)p)), 16);
    return (f32x16)_mm512_castsi512_ps(w);
#else
    u16x16 h;
    memcpy(&h, p, sizeof h);
    u32x16 w = __builtin_convertvector(h, u32x16) << 16;
    f32x16 f;
    memcpy(&f, &w, sizeof f);
    return f;
#endif
}

typedef float f32x8 __attribute__((vector_size(32)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));

static inline float hsum8(f32x8 v) {
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

static inline f32x16 ld_f32(const float *p) {
    f32x16 f;
    memcpy(&f, p, sizeof f);
    return f;
}

/* Round 16 floats to bf16 (nearest even, NaN kept quiet). */
static inline u16x16 to_bf16x16(f32x16 f) {
#if defined(__AVX512BF16__)
    __m256bh h = _mm512_cvtneps_pbh((__m512)f);
    u16x16 out;
    memcpy(&out, &h, sizeof out);
    return out;
#else
    u32x16 u;
    memcpy(&u, &f, sizeof u);
    u32x16 r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    u32x16 nan = (u32x16)((u & 0x7fffffffu) > 0x7f800000u);
    r = (r & ~nan) | (0x7fc0u & nan);
    return __builtin_convertvector(r, u16x16);
#endif
}

static inline void st_bf16(uint16_t *p, f32x16 f) {
    u16x16 h = to_bf16x16(f);
    memcpy(p, &h, sizeof h);
}

static inline void st_f32(float *p, f32x16 f) { memcpy(p, &f, sizeof f); }

/* f rounded to bf16 and widened back: what a bf16 tensor would hold. */
static inline f32x16 round_bf16(f32x16 f) {
    u16x16 h = to_bf16x16(f);
#if defined(__AVX512F__)
    __m256i hi;
    memcpy(&hi, &h, sizeof hi);
    return (f32x16)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
#else
    u32x16 w = __builtin_convertvector(h, u32x16) << 16;
    f32x16 out;
    memcpy(&out, &w, sizeof out);
    return out;
#endif
}

static inline f32x16 splat(float v) { return (f32x16){0} + v; }

static inline f32x16 vmax(f32x16 a, f32x16 b) {
    i32x16 m = a < b;
    return (f32x16)(((i32x16)a & ~m) | ((i32x16)b & m));
}

/* e^x for x <= 0 (Cephes' expf polynomial; ~1 ulp); below -87.3 it gives ~1e-38. */
static inline f32x16 exp16(f32x16 x) {
    x = vmax(x, splat(-87.33654f));
    f32x16 n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f; /* round to nearest */
    f32x16 r = x - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    f32x16 p = splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    f32x16 y = p * (r * r) + r + 1.f;
    i32x16 e = (__builtin_convertvector(n, i32x16) + 127) << 23;
    return y * (f32x16)e;
}

static inline float hsum(f32x16 v) {
#if defined(__AVX512F__)
    return _mm512_reduce_add_ps((__m512)v);
#else
    float s = 0.f;
    for (int i = 0; i < 16; i++) s += v[i];
    return s;
#endif
}

static inline f32x16 fold(f32x16 a, f32x16 b, i32x16 lo, i32x16 hi) {
    return __builtin_shuffle(a, b, lo) + __builtin_shuffle(a, b, hi);
}

/* Lane t of the result = the sum of v[t]'s 16 lanes (a transpose tree of 15 folds). */
static inline f32x16 sum16(const f32x16 *v) {
    const i32x16 a0 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const i32x16 b0 = a0 + 8;
    const i32x16 a1 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
    const i32x16 b1 = a1 + 4;
    const i32x16 a2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
    const i32x16 b2 = a2 + 2;
    const i32x16 a3 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const i32x16 b3 = a3 + 1;
    f32x16 w[8], u[4], r[2];
    for (int k = 0; k < 8; k++) w[k] = fold(v[2 * k], v[2 * k + 1], a0, b0);
    for (int k = 0; k < 4; k++) u[k] = fold(w[2 * k], w[2 * k + 1], a1, b1);
    for (int k = 0; k < 2; k++) r[k] = fold(u[2 * k], u[2 * k + 1], a2, b2);
    return fold(r[0], r[1], a3, b3);
}

#if defined(__AVX512F__)
/* out[i][j] = the sum of a[i][j]'s 16 lanes for i < MT, j < 4: bit for bit what `hsum` gives
 * (`_mm512_reduce_add_ps` adds lanes i and i + 8, then i and i + 4, i and i + 2, i and i + 1:
 * `sum16`'s tree), so a row's sums do not depend on MT. NOTE: from 3 rows one transpose tree
 * (15 folds) for the whole tile beats 4 * MT reductions. */
static inline __attribute__((always_inline)) void tile_sums(f32x16 a[4][4], float out[4][4],
                                                             const int MT) {
    if (MT < 3) {
        for (int i = 0; i < MT; i++)
            for (int j = 0; j < 4; j++) out[i][j] = hsum(a[i][j]);
        return;
    }
    f32x16 v[16];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) v[i * 4 + j] = i < MT ? a[i][j] : (f32x16){0};
    f32x16 s = sum16(v);
    for (int i = 0; i < MT; i++)
        for (int j = 0; j < 4; j++) out[i][j] = s[i * 4 + j];
}
#endif

static inline float hmax(f32x16 v) {
#if defined(__AVX512F__)
    return _mm512_reduce_max_ps((__m512)v);
#else
    float m = v[0];
    for (int i = 1; i < 16; i++) m = v[i] > m ? v[i] : m;
    return m;
#endif
}

#endif
