/* Decode attention straight from the paged KV cache (no gather copy).
 *
 * For each sequence b and KV head: the g = H / Hkv query heads sharing it
 * score every cached token c < lens[b] (block tables[b][c / bs], slot c % bs),
 * softmax in fp32, and sum the values. Scores, probabilities and sums stay in
 * fp32; the output is rounded once.
 * q: [B, H, d] (sequence stride ldq); kc, vc: [Hkv, NB, bs, d] contiguous;
 * tables: [B, nbt] int64; lens: [B] int64; out: [B, H, d] (sequence stride ldo).
 */
#include "common.h"

#define MAX_GROUP 16
#define MAX_DIM 256

#define DECODE_BODY(DT, LOADV, LD, ST)                                                       \
    int64_t g = H / Hkv, nv = d / 16;                                                        \
    if (g > MAX_GROUP || d > MAX_DIM || d % 16) return -1;                                   \
    int64_t maxlen = 0;                                                                      \
    for (int64_t b = 0; b < B; b++) maxlen = lens[b] > maxlen ? lens[b] : maxlen;            \
    float *sc = malloc(sizeof(float) * (size_t)(g * (maxlen > 0 ? maxlen : 1)));             \
    if (!sc) return -2;                                                                      \
    for (int64_t b = 0; b < B; b++) {                                                        \
        int64_t len = lens[b];                                                               \
        const int64_t *tab = tables + b * nbt;                                               \
        for (int64_t hk = 0; hk < Hkv; hk++) {                                               \
            f32x16 qv[MAX_GROUP][MAX_DIM / 16], o[MAX_GROUP][MAX_DIM / 16];                  \
            for (int64_t j = 0; j < g; j++)                                                  \
                for (int64_t i = 0; i < nv; i++) {                                           \
                    qv[j][i] = LOADV(q + b * ldq + (hk * g + j) * d + i * 16) * scale;       \
                    o[j][i] = (f32x16){0};                                                   \
                }                                                                            \
            const DT *kbase = kc + hk * NB * bs * d, *vbase = vc + hk * NB * bs * d;         \
            for (int64_t c = 0; c < len; c++) {                                              \
                const DT *kr = kbase + (tab[c / bs] * bs + c % bs) * d;                      \
                f32x16 kv[MAX_DIM / 16];                                                     \
                for (int64_t i = 0; i < nv; i++) kv[i] = LOADV(kr + i * 16);                 \
                for (int64_t j = 0; j < g; j++) {                                            \
                    f32x16 a = qv[j][0] * kv[0];                                             \
                    for (int64_t i = 1; i < nv; i++) a += qv[j][i] * kv[i];                  \
                    sc[j * len + c] = hsum(a);                                               \
                }                                                                            \
            }                                                                                \
            float inv[MAX_GROUP];                                                            \
            for (int64_t j = 0; j < g; j++) {                                                \
                float *s = sc + j * len, mx = -INFINITY, sum = 0.f;                          \
                for (int64_t c = 0; c < len; c++) mx = s[c] > mx ? s[c] : mx;                \
                for (int64_t c = 0; c < len; c++) { s[c] = expf(s[c] - mx); sum += s[c]; }   \
                inv[j] = 1.f / sum;                                                          \
            }                                                                                \
            for (int64_t c = 0; c < len; c++) {                                              \
                const DT *vr = vbase + (tab[c / bs] * bs + c % bs) * d;                      \
                for (int64_t i = 0; i < nv; i++) {                                           \
                    f32x16 vv = LOADV(vr + i * 16);                                          \
                    for (int64_t j = 0; j < g; j++) o[j][i] += sc[j * len + c] * vv;         \
                }                                                                            \
            }                                                                                \
            for (int64_t j = 0; j < g; j++) {                                                \
                DT *orow = out + b * ldo + (hk * g + j) * d;                                 \
                for (int64_t i = 0; i < nv; i++)                                             \
                    for (int64_t e = 0; e < 16; e++) orow[i * 16 + e] = ST(o[j][i][e] * inv[j]); \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
    free(sc);                                                                                \
    return 0;

#define ID(v) (v)

int decode_attn_bf16(const uint16_t *q, int64_t ldq, const uint16_t *kc, const uint16_t *vc,
                     int64_t Hkv, int64_t NB, int64_t bs, int64_t d, const int64_t *tables,
                     int64_t nbt, const int64_t *lens, uint16_t *out, int64_t ldo, int64_t B,
                     int64_t H, float scale) {
    DECODE_BODY(uint16_t, ld_bf16, bf16_to_f32, f32_to_bf16)
}

int decode_attn_f32(const float *q, int64_t ldq, const float *kc, const float *vc,
                    int64_t Hkv, int64_t NB, int64_t bs, int64_t d, const int64_t *tables,
                    int64_t nbt, const int64_t *lens, float *out, int64_t ldo, int64_t B,
                    int64_t H, float scale) {
    DECODE_BODY(float, ld_f32, ID, ID)
}
