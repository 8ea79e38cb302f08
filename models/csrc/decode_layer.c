/* One whole decoder layer for a few decode rows, in one call (no per-op dispatch).
 *
 * The same kernels, in the same order and with the same rounding, as
 * `models.layers.decoder_layer` runs them one by one with native choices:
 * RMSNorm -> q/k/v GEMV -> RoPE on q and k -> K/V written to their cache slots ->
 * paged attention -> o GEMV + residual -> RMSNorm -> gate GEMV with SiLU ->
 * up GEMV times it -> down GEMV + residual.
 * x, out: [M, D]; cos, sin: [M, hd]; kc, vc: [Hkv, NB, bs, hd]; slots: [M];
 * tables: [M, nbt]; lens: [M]; pf: the GEMVs' prefetch level (gemv.c).
 */
#include "common.h"
#include "kernels.h"

#define LAYER_ARGS(DT)                                                                     \
    const DT *x, DT *out, int64_t M, int64_t D, int64_t H, int64_t Hkv, int64_t hd,         \
    int64_t I, const DT *in_norm, const DT *post_norm, float eps, const DT *w_qkv,          \
    const DT *b_qkv, const DT *w_o, const DT *b_o, const DT *w_gate, const DT *w_up,        \
    const DT *w_down, const DT *cos, const DT *sin, DT *kc, DT *vc, int64_t NB, int64_t bs, \
    const int64_t *slots, const int64_t *tables, int64_t nbt, const int64_t *lens, int pf

#define LAYER_BODY(DT, SFX)                                                                \
    int64_t nqkv = (H + 2 * Hkv) * hd, rc = 0;                                              \
    DT *hn = malloc(sizeof(DT) * M * D), *qkv = malloc(sizeof(DT) * M * nqkv);              \
    DT *att = malloc(sizeof(DT) * M * H * hd), *h = malloc(sizeof(DT) * M * D);             \
    DT *g = malloc(sizeof(DT) * M * I), *a = malloc(sizeof(DT) * M * I);                    \
    if (!hn || !qkv || !att || !h || !g || !a) { rc = -2; goto done; }                      \
    rms_norm_##SFX(x, D, in_norm, hn, D, M, D, eps);                                        \
    if ((rc = gemv_##SFX(hn, D, w_qkv, b_qkv, qkv, nqkv, NULL, 0,                           \
            M, nqkv, D, EPI_NONE, pf))) goto done;                                          \
    rope_write_##SFX(qkv, nqkv, cos, sin, M, H, Hkv, hd, kc, vc, NB, bs, slots);            \
    rc = decode_attn_##SFX(qkv, nqkv, kc, vc, Hkv, NB, bs, hd, tables, nbt, lens, att,      \
                           H * hd, M, H, 1.f / sqrtf((float)hd));                           \
    if (rc) goto done;                                                                     \
    if ((rc = gemv_##SFX(att, H * hd, w_o, b_o, h, D, x, D,                                 \
            M, D, H * hd, EPI_ADD, pf))) goto done;                                         \
    rms_norm_##SFX(h, D, post_norm, hn, D, M, D, eps);                                      \
    if ((rc = gemv_##SFX(hn, D, w_gate, NULL, g, I, NULL, 0,                                \
            M, I, D, EPI_SILU, pf))) goto done;                                             \
    if ((rc = gemv_##SFX(hn, D, w_up, NULL, a, I, g, I,                                     \
            M, I, D, EPI_MUL, pf))) goto done;                                              \
    if ((rc = gemv_##SFX(a, I, w_down, NULL, out, D, h, D,                                  \
            M, D, I, EPI_ADD, pf))) goto done;                                              \
done:                                                                                      \
    free(hn); free(qkv); free(att); free(h); free(g); free(a);                             \
    return (int)rc;

int decode_layer_bf16(LAYER_ARGS(uint16_t)) { LAYER_BODY(uint16_t, bf16) }

int decode_layer_f32(LAYER_ARGS(float)) { LAYER_BODY(float, f32) }
