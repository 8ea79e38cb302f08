/* Decode attention straight from the paged KV cache (no gather copy).
 *
 * For each sequence b and KV head: the g = H / Hkv query heads sharing it
 * score every cached token c < lens[b] (block tables[b][c / bs], slot c % bs),
 * softmax in fp32, and sum the values. Scores, probabilities and sums stay in
 * fp32; the output is rounded once.
 * q: [B, H, d] (sequence stride ldq); kc, vc: [Hkv, NB, bs, d] contiguous;
 * tables: [B, nbt] int64; lens: [B] int64; out: [B, H, d] (sequence stride ldo).
 *
 * NOTE: scores are taken 16 tokens at a time and their 16 dot products reduced
 * together (`sum16`), and the softmax's exp is a vector polynomial (`exp16`):
 * a horizontal sum and a scalar expf per score made this kernel compute-bound.
 * The rows of the next tile are prefetched: blocks lie anywhere in the cache.
 */
#include "common.h"

#define MAX_GROUP 16
#define MAX_DIM 256
#define TILE 16

/* Softmax weights of s[0..len) in place (s holds `cap` >= len floats, a whole number of
 * tiles); returns 1 / their sum. */
static float softmax_tiles(float *s, int64_t len, int64_t cap) {
    for (int64_t c = len; c < cap; c++) s[c] = -INFINITY;
    f32x16 m = splat(-INFINITY);
    for (int64_t c = 0; c < cap; c += TILE) m = vmax(m, ld_f32(s + c));
    float mx = m[0];
    for (int i = 1; i < 16; i++) mx = m[i] > mx ? m[i] : mx;
    for (int64_t c = 0; c < cap; c += TILE) st_f32(s + c, exp16(ld_f32(s + c) - mx));
    for (int64_t c = len; c < cap; c++) s[c] = 0.f;
    f32x16 acc = {0};
    for (int64_t c = 0; c < cap; c += TILE) acc += ld_f32(s + c);
    return 1.f / hsum(acc);
}

/* Ask for a token's K or V row ahead of its use (its blocks lie anywhere in the cache). */
static inline void prefetch_row(const void *row, int64_t bytes) {
    for (int64_t e = 0; e < bytes; e += 64) __builtin_prefetch((const char *)row + e);
}

/* Element offsets of a sequence's tokens in one head's [NB, bs, d] cache. */
static void token_offsets(const int64_t *tab, int64_t len, int64_t bs, int64_t d,
                          int64_t *off) {
    for (int64_t c = 0, blk = 0; c < len; blk++)
        for (int64_t o = 0; o < bs && c < len; o++, c++) off[c] = (tab[blk] * bs + o) * d;
}

#define DECODE_BODY(DT, LOADV, STV)                                                          \
    int64_t g = H / Hkv, nv = d / 16;                                                        \
    if (g > MAX_GROUP || d > MAX_DIM || d % 16) return -1;                                   \
    int64_t maxlen = 0;                                                                      \
    for (int64_t b = 0; b < B; b++) maxlen = lens[b] > maxlen ? lens[b] : maxlen;            \
    int64_t cap = (maxlen + TILE - 1) / TILE * TILE + TILE;                                  \
    float *sc = malloc(sizeof(float) * (size_t)(g * cap));                                   \
    int64_t *off = malloc(sizeof(int64_t) * (size_t)cap);                                    \
    if (!sc || !off) { free(sc); free(off); return -2; }                                     \
    for (int64_t b = 0; b < B; b++) {                                                        \
        int64_t len = lens[b], padded = (len + TILE - 1) / TILE * TILE;                      \
        token_offsets(tables + b * nbt, len, bs, d, off);                                    \
        for (int64_t hk = 0; hk < Hkv; hk++) {                                               \
            f32x16 qv[MAX_GROUP][MAX_DIM / 16], o[MAX_GROUP][MAX_DIM / 16];                  \
            for (int64_t j = 0; j < g; j++)                                                  \
                for (int64_t i = 0; i < nv; i++) {                                           \
                    qv[j][i] = LOADV(q + b * ldq + (hk * g + j) * d + i * 16) * scale;       \
                    o[j][i] = (f32x16){0};                                                   \
                }                                                                            \
            const DT *kbase = kc + hk * NB * bs * d, *vbase = vc + hk * NB * bs * d;         \
            for (int64_t c0 = 0; c0 < len; c0 += TILE) {                                     \
                int64_t n = len - c0 < TILE ? len - c0 : TILE;                               \
                f32x16 p[MAX_GROUP][TILE];                                                   \
                for (int64_t t = c0 + TILE; t < c0 + 2 * TILE && t < len; t++)               \
                    prefetch_row(kbase + off[t], d * (int64_t)sizeof(DT));                   \
                for (int64_t t = 0; t < TILE; t++) {                                         \
                    f32x16 kv[MAX_DIM / 16];                                                 \
                    for (int64_t i = 0; i < nv; i++)                                         \
                        kv[i] = t < n ? LOADV(kbase + off[c0 + t] + i * 16) : (f32x16){0};   \
                    for (int64_t j = 0; j < g; j++) {                                        \
                        f32x16 a = qv[j][0] * kv[0];                                         \
                        for (int64_t i = 1; i < nv; i++) a += qv[j][i] * kv[i];              \
                        p[j][t] = a;                                                         \
                    }                                                                        \
                }                                                                            \
                for (int64_t j = 0; j < g; j++) st_f32(sc + j * cap + c0, sum16(p[j]));      \
            }                                                                                \
            float inv[MAX_GROUP];                                                            \
            for (int64_t j = 0; j < g; j++) inv[j] = softmax_tiles(sc + j * cap, len, padded); \
            for (int64_t c = 0; c < len; c++) {                                              \
                const DT *vr = vbase + off[c];                                               \
                if (c + TILE < len)                                                          \
                    prefetch_row(vbase + off[c + TILE], d * (int64_t)sizeof(DT));            \
                for (int64_t i = 0; i < nv; i++) {                                           \
                    f32x16 vv = LOADV(vr + i * 16);                                          \
                    for (int64_t j = 0; j < g; j++) o[j][i] += sc[j * cap + c] * vv;         \
                }                                                                            \
            }                                                                                \
            for (int64_t j = 0; j < g; j++) {                                                \
                DT *orow = out + b * ldo + (hk * g + j) * d;                                 \
                for (int64_t i = 0; i < nv; i++) STV(orow + i * 16, o[j][i] * inv[j]);       \
            }                                                                                \
        }                                                                                    \
    }                                                                                        \
    free(sc);                                                                                \
    free(off);                                                                               \
    return 0;

int decode_attn_bf16(const uint16_t *q, int64_t ldq, const uint16_t *kc, const uint16_t *vc,
                     int64_t Hkv, int64_t NB, int64_t bs, int64_t d, const int64_t *tables,
                     int64_t nbt, const int64_t *lens, uint16_t *out, int64_t ldo, int64_t B,
                     int64_t H, float scale) {
    DECODE_BODY(uint16_t, ld_bf16, st_bf16)
}

int decode_attn_f32(const float *q, int64_t ldq, const float *kc, const float *vc,
                    int64_t Hkv, int64_t NB, int64_t bs, int64_t d, const int64_t *tables,
                    int64_t nbt, const int64_t *lens, float *out, int64_t ldo, int64_t B,
                    int64_t H, float scale) {
    DECODE_BODY(float, ld_f32, st_f32)
}
