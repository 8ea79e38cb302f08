/* Causal prefill attention straight from the paged KV cache, flash style.
 *
 * One sequence: n new queries at positions past .. past + n - 1; query i of head
 * h attends the cached tokens c <= past + i of its KV head h / (H / Hkv)
 * (block table[c / bs], slot c % bs). The new tokens' K/V are in the cache.
 * q: [n, H, d] (query stride ldq); kc, vc: [Hkv, NB, bs, d] contiguous;
 * table: [nbt] int64; out: [n, H, d] (query stride ldo).
 *
 * NOTE: per KV head the context's keys are laid out once as fp32 tiles of 16
 * tokens transposed ([d][16]) and its values as fp32 rows, so that eight query
 * rows score 16 keys with one broadcast FMA per head dimension and no
 * horizontal sums; the softmax runs online over the tiles (running max and
 * sum per row, rescaled only when the max moves), probabilities and sums in
 * fp32 (`exp16`, common.h), the output rounded once.
 */
#include "common.h"

#define PTILE 16 /* keys per tile */
#define ROWS 8   /* query rows per block */
#define PMAX_DIM 256

/* The context's keys of one head as transposed fp32 tiles kt[tile][e][t] and its values
 * as fp32 rows vf[c][e]; tokens past ctx are zero. */
#define LAYOUT(DT, TOF)                                                                    \
    for (int64_t c = 0; c < tiles * PTILE; c++) {                                          \
        float *vr = vf + c * d;                                                            \
        float *kt_tile = kt + (c / PTILE) * d * PTILE;                                     \
        if (c >= ctx) {                                                                    \
            for (int64_t e = 0; e < d; e++) kt_tile[e * PTILE + c % PTILE] = vr[e] = 0.f;  \
            continue;                                                                      \
        }                                                                                  \
        int64_t slot = (table[c / bs] * bs + c % bs) * d;                                  \
        const DT *kr = kbase + slot, *vsrc = vbase + slot;                                 \
        for (int64_t e = 0; e < d; e++) {                                                  \
            kt_tile[e * PTILE + c % PTILE] = TOF(kr[e]);                                   \
            vr[e] = TOF(vsrc[e]);                                                          \
        }                                                                                  \
    }

/* One block of up to ROWS query rows of one head, over the key tiles it sees; nv = d / 16
 * (a constant where inlined, so the row sums stay in registers). */
static inline __attribute__((always_inline)) void block_nv(
        const float *qs, const int64_t *lim, int rows, const float *kt, const float *vf,
        float *res, const int64_t nv) {
    int64_t d = nv * 16, last = 0;
    for (int r = 0; r < rows; r++) last = lim[r] > last ? lim[r] : last;
    f32x16 acc[ROWS][PMAX_DIM / 16];
    float m[ROWS], l[ROWS];
    float p[ROWS][PTILE] __attribute__((aligned(64))) = {{0}}; /* rows past `rows` stay 0 */
    for (int r = 0; r < ROWS; r++) {
        m[r] = -INFINITY, l[r] = 0.f;
        for (int64_t i = 0; i < nv; i++) acc[r][i] = (f32x16){0};
    }
    const f32x16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int64_t c0 = 0; c0 <= last; c0 += PTILE) {
        const float *kt_tile = kt + (c0 / PTILE) * d * PTILE;
        f32x16 s[ROWS] = {{0}};
        for (int64_t e = 0; e < d; e++) {
            f32x16 k = ld_f32(kt_tile + e * PTILE);
            for (int r = 0; r < ROWS; r++) s[r] += qs[r * d + e] * k;
        }
        for (int r = 0; r < rows; r++) {
            i32x16 out = {0}; /* lanes of keys past this row's query (in its last tiles) */
            if (c0 + PTILE - 1 > lim[r]) {
                out = lane + (float)c0 > (float)lim[r];
                s[r] = (f32x16)(((i32x16)s[r] & ~out) | ((i32x16)splat(-INFINITY) & out));
            }
            float mt = hmax(s[r]);
            if (mt > m[r]) { /* a new running max: rescale what was summed so far */
                float alpha = m[r] == -INFINITY ? 0.f : expf(m[r] - mt);
                l[r] *= alpha;
                for (int64_t i = 0; i < nv; i++) acc[r][i] *= alpha;
                m[r] = mt;
            }
            f32x16 pv = (f32x16)((i32x16)exp16(s[r] - m[r]) & ~out);
            st_f32(p[r], pv);
            l[r] += hsum(pv);
        }
        int64_t tn = last - c0 + 1 < PTILE ? last - c0 + 1 : PTILE;
        for (int64_t i = 0; i < nv; i++) { /* NOTE: ROWS sums live at a time, not ROWS * nv */
            f32x16 a[ROWS];
            for (int r = 0; r < ROWS; r++) a[r] = acc[r][i];
            for (int64_t t = 0; t < tn; t++) {
                f32x16 v = ld_f32(vf + (c0 + t) * d + i * 16);
                for (int r = 0; r < ROWS; r++) a[r] += p[r][t] * v;
            }
            for (int r = 0; r < ROWS; r++) acc[r][i] = a[r];
        }
    }
    for (int r = 0; r < rows; r++)
        for (int64_t i = 0; i < nv; i++) st_f32(res + r * d + i * 16, acc[r][i] * (1.f / l[r]));
}

static void block(const float *qs, const int64_t *lim, int rows, const float *kt,
                  const float *vf, int64_t d, float *res) {
    switch (d / 16) {
    case 4: block_nv(qs, lim, rows, kt, vf, res, 4); break;
    case 8: block_nv(qs, lim, rows, kt, vf, res, 8); break;
    default: block_nv(qs, lim, rows, kt, vf, res, d / 16); break;
    }
}

#define PREFILL_BODY(DT, TOF, FROMF)                                                       \
    if (d % 16 || d > PMAX_DIM || H % Hkv) return -1;                                      \
    int64_t g = H / Hkv, ctx = past + n, tiles = (ctx + PTILE - 1) / PTILE;                \
    float *kt = aligned_alloc(64, sizeof(float) * (size_t)(tiles * PTILE * d));            \
    float *vf = aligned_alloc(64, sizeof(float) * (size_t)(tiles * PTILE * d));            \
    float *qs = aligned_alloc(64, sizeof(float) * ROWS * (size_t)d);                       \
    float *res = aligned_alloc(64, sizeof(float) * ROWS * (size_t)d);                      \
    if (!kt || !vf || !qs || !res) { free(kt); free(vf); free(qs); free(res); return -2; } \
    for (int64_t hk = 0; hk < Hkv; hk++) {                                                 \
        const DT *kbase = kc + hk * NB * bs * d, *vbase = vc + hk * NB * bs * d;           \
        LAYOUT(DT, TOF)                                                                    \
        for (int64_t h = hk * g; h < (hk + 1) * g; h++)                                    \
            for (int64_t i0 = 0; i0 < n; i0 += ROWS) {                                     \
                int rows = n - i0 < ROWS ? (int)(n - i0) : ROWS;                           \
                int64_t lim[ROWS];                                                         \
                for (int r = 0; r < ROWS; r++) {                                           \
                    int64_t i = i0 + (r < rows ? r : rows - 1);                            \
                    lim[r] = past + i;                                                     \
                    for (int64_t e = 0; e < d; e++)                                        \
                        qs[r * d + e] = TOF(q[i * ldq + h * d + e]) * scale;               \
                }                                                                          \
                block(qs, lim, rows, kt, vf, d, res);                                      \
                for (int r = 0; r < rows; r++)                                             \
                    for (int64_t e = 0; e < d; e++)                                        \
                        out[(i0 + r) * ldo + h * d + e] = FROMF(res[r * d + e]);           \
            }                                                                              \
    }                                                                                      \
    free(kt); free(vf); free(qs); free(res);                                               \
    return 0;

#define F32_ID(v) (v)

int prefill_attn_bf16(const uint16_t *q, int64_t ldq, const uint16_t *kc, const uint16_t *vc,
                      int64_t Hkv, int64_t NB, int64_t bs, int64_t d, const int64_t *table,
                      int64_t past, int64_t n, uint16_t *out, int64_t ldo, int64_t H,
                      float scale) {
    PREFILL_BODY(uint16_t, bf16_to_f32, f32_to_bf16)
}

int prefill_attn_f32(const float *q, int64_t ldq, const float *kc, const float *vc,
                     int64_t Hkv, int64_t NB, int64_t bs, int64_t d, const int64_t *table,
                     int64_t past, int64_t n, float *out, int64_t ldo, int64_t H,
                     float scale) {
    PREFILL_BODY(float, F32_ID, F32_ID)
}
