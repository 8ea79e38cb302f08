/* RMSNorm and rotary embedding, one pass each, rounding as transformers does.
 *
 * rms_norm: y = w * bf16(x * rsqrt(mean(x^2) + eps)), statistics in fp32
 * (LlamaRMSNorm). rope: x1' = x1*cos - x2*sin, x2' = x2*cos + x1*sin on the
 * two halves of each head, in place; in bf16 each product and sum is rounded
 * as transformers' `q * cos + rotate_half(q) * sin` rounds it. Vector bodies
 * take 16 lanes at a time, scalar tails the rest.
 */
#include "common.h"
#include "kernels.h"

#define RMS_BODY(DT, LOADV, LD, STV, ST, ROUNDV, ROUND)                                  \
    for (int64_t t = 0; t < T; t++) {                                                    \
        const DT *xr = x + t * ldx;                                                      \
        DT *yr = y + t * ldy;                                                            \
        f32x16 acc = {0};                                                                \
        int64_t k = 0;                                                                   \
        for (; k + 16 <= D; k += 16) { f32x16 v = LOADV(xr + k); acc += v * v; }         \
        float s = hsum(acc);                                                             \
        for (; k < D; k++) s += LD(xr[k]) * LD(xr[k]);                                   \
        float r = 1.f / sqrtf(s / (float)D + eps);                                       \
        for (k = 0; k + 16 <= D; k += 16)                                                \
            STV(yr + k, LOADV(w + k) * ROUNDV(LOADV(xr + k) * r));                       \
        for (; k < D; k++) yr[k] = ST(LD(w[k]) * ROUND(LD(xr[k]) * r));                  \
    }                                                                                    \
    return 0;

#define ID(v) (v)

static inline float round1(float f) { return bf16_to_f32(f32_to_bf16(f)); }

int rms_norm_bf16(const uint16_t *x, int64_t ldx, const uint16_t *w, uint16_t *y, int64_t ldy,
                  int64_t T, int64_t D, float eps) {
    RMS_BODY(uint16_t, ld_bf16, bf16_to_f32, st_bf16, f32_to_bf16, round_bf16, round1)
}

int rms_norm_f32(const float *x, int64_t ldx, const float *w, float *y, int64_t ldy,
                 int64_t T, int64_t D, float eps) {
    RMS_BODY(float, ld_f32, ID, st_f32, ID, ID, ID)
}

/* x: [T, heads, d] with token stride ldx (elements), heads contiguous; cos, sin: [T, d]. */
#define ROPE_BODY(DT, LOADV, LD, STV, ST, ROUNDV, ROUND)                                 \
    int64_t half = d / 2;                                                                \
    for (int64_t t = 0; t < T; t++) {                                                    \
        const DT *c = cos + t * d, *s = sin + t * d;                                     \
        for (int64_t h = 0; h < heads; h++) {                                            \
            DT *v = x + t * ldx + h * d;                                                 \
            int64_t i = 0;                                                               \
            for (; i + 16 <= half; i += 16) {                                            \
                f32x16 x1 = LOADV(v + i), x2 = LOADV(v + half + i);                      \
                f32x16 a = ROUNDV(x1 * LOADV(c + i)), b = ROUNDV(-x2 * LOADV(s + i));    \
                f32x16 e = ROUNDV(x2 * LOADV(c + half + i));                             \
                f32x16 f = ROUNDV(x1 * LOADV(s + half + i));                             \
                STV(v + i, a + b);                                                       \
                STV(v + half + i, e + f);                                                \
            }                                                                            \
            for (; i < half; i++) {                                                      \
                float x1 = LD(v[i]), x2 = LD(v[i + half]);                               \
                float a = ROUND(x1 * LD(c[i])), b = ROUND(-x2 * LD(s[i]));               \
                float e = ROUND(x2 * LD(c[i + half])), f = ROUND(x1 * LD(s[i + half]));  \
                v[i] = ST(a + b);                                                        \
                v[i + half] = ST(e + f);                                                 \
            }                                                                            \
        }                                                                                \
    }                                                                                    \
    return 0;

int rope_bf16(uint16_t *x, int64_t ldx, const uint16_t *cos, const uint16_t *sin,
              int64_t T, int64_t heads, int64_t d) {
    ROPE_BODY(uint16_t, ld_bf16, bf16_to_f32, st_bf16, f32_to_bf16, round_bf16, round1)
}

int rope_f32(float *x, int64_t ldx, const float *cos, const float *sin,
             int64_t T, int64_t heads, int64_t d) {
    ROPE_BODY(float, ld_f32, ID, st_f32, ID, ID, ID)
}

/* RoPE on q and k of a fused [T, (H + 2 * Hkv) * d] q/k/v buffer (token stride ldx), then k
 * and v written to their cache slots: kc, vc: [Hkv, NB, bs, d]; slots: [T] (block * bs + offset). */
#define ROPE_WRITE_BODY(DT, SFX)                                                          \
    int rc = rope_##SFX(qkv, ldx, cos, sin, T, H + Hkv, d);                               \
    for (int64_t t = 0; t < T; t++)                                                      \
        for (int64_t j = 0; j < Hkv; j++) {                                               \
            int64_t dst = (j * NB * bs + slots[t]) * d;                                   \
            memcpy(kc + dst, qkv + t * ldx + (H + j) * d, sizeof(DT) * d);                \
            memcpy(vc + dst, qkv + t * ldx + (H + Hkv + j) * d, sizeof(DT) * d);          \
        }                                                                                \
    return rc;

int rope_write_bf16(uint16_t *qkv, int64_t ldx, const uint16_t *cos, const uint16_t *sin,
                    int64_t T, int64_t H, int64_t Hkv, int64_t d, uint16_t *kc, uint16_t *vc,
                    int64_t NB, int64_t bs, const int64_t *slots) {
    ROPE_WRITE_BODY(uint16_t, bf16)
}

int rope_write_f32(float *qkv, int64_t ldx, const float *cos, const float *sin, int64_t T,
                   int64_t H, int64_t Hkv, int64_t d, float *kc, float *vc, int64_t NB,
                   int64_t bs, const int64_t *slots) {
    ROPE_WRITE_BODY(float, f32)
}
