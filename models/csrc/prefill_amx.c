/* Causal prefill attention on AMX tiles (bf16), straight from the paged KV cache.
 *
 * Same contract as prefill_attn.c: n new queries at positions past .. past + n - 1,
 * query i of head h attends cached tokens c <= past + i of KV head h / (H / Hkv).
 * q: [n, H, d] (query stride ldq); kc, vc: [Hkv, NB, bs, d] contiguous; table: [nbt]
 * int64; out: [n, H, d] (query stride ldo).
 *
 * NOTE: a block of 16 query rows scores all the keys it sees with tile dot products
 * (S = Q K^T into an fp32 buffer), takes an exact softmax over each row in AVX-512
 * (max, exp, sum in fp32; probabilities rounded to bf16, as SDPA's bf16 kernel
 * does), then P V on tiles again, so nothing is rescaled. The tiles' work is a
 * smaller part of the time: the softmax's vector passes take about half. Per KV head
 * the keys are laid out once as tiles of 16 tokens in AMX's pair-interleaved B
 * layout (head dims padded to 32 with zeros) and the values as tiles of 32 tokens.
 * Built only where the compiler targets AMX-BF16 (`-march=native` on such a CPU);
 * elsewhere `amx_ready` says 0 and the kernel returns -1.
 */
#include "common.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define QROWS 16 /* query rows per block (a tile's rows) */
#define KT 16    /* keys per score tile */
#define VC 32    /* keys per P V step (a tile's bf16 pairs) */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} __attribute__((packed, aligned(64))) tilecfg;

/* Linux hands out the tile state per process on request; 1 once granted. */
static int permitted(void) {
    static int state; /* 0 unknown, 1 granted, -1 refused */
    int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);
    if (s == 0) {
        s = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
        __atomic_store_n(&state, s, __ATOMIC_RELEASE);
    }
    return s == 1;
}

int amx_ready(void) { return permitted(); }

/* Every tile 16 rows of 64 bytes: A = 16 x 32 bf16, B = 16 pairs x 16 x 2, C = 16 x 16 fp32.
 * NOTE: a constant in memory: GCC 12 drops stores to a stack copy before ldtilecfg (it does
 * not see the instruction read them). */
static const tilecfg TILES = {.palette = 1,
                              .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
                              .rows = {16, 16, 16, 16, 16, 16, 16, 16}};

static void tiles_on(void) { _tile_loadconfig(&TILES); }

typedef uint32_t u32a __attribute__((may_alias)); /* a pair of bf16 */

/* Keys of one head as B tiles kb[tile][chunk][pair][key][2] (dims padded to dp with zeros),
 * values as B tiles vb[chunk][group][pair][col][2]; tokens past ctx are zero. */
static void layout(const uint16_t *kbase, const uint16_t *vbase, const int64_t *table,
                   int64_t bs, int64_t d, int64_t dp, int64_t ctx, int64_t ktiles,
                   int64_t vchunks, uint16_t *kb, uint16_t *vb) {
    int64_t kch = dp / 32, groups = d / 16;
    memset(kb, 0, sizeof(uint16_t) * (size_t)(ktiles * KT * dp));
    memset(vb, 0, sizeof(uint16_t) * (size_t)(vchunks * VC * d));
    for (int64_t c = 0; c < ctx; c++) { /* key c's dim pairs to column c % KT of its tile */
        const u32a *kr = (const u32a *)(kbase + (table[c / bs] * bs + c % bs) * d);
        u32a *kt = (u32a *)(kb + (c / KT) * kch * 512) + c % KT;
        for (int64_t e2 = 0; e2 < d / 2; e2++) kt[(e2 / 16) * 256 + (e2 % 16) * 16] = kr[e2];
    }
    for (int64_t c = 0; c < ctx; c += 2) { /* tokens c and c + 1 interleaved per dim */
        const uint16_t *v0 = vbase + (table[c / bs] * bs + c % bs) * d;
        const uint16_t *v1 = c + 1 < ctx ? vbase + (table[(c + 1) / bs] * bs + (c + 1) % bs) * d
                                         : NULL;
        uint32_t *vt = (uint32_t *)(void *)(vb + (c / VC) * groups * 512) + ((c % VC) / 2) * 16;
        for (int64_t e = 0; e < d; e += 16) {
            __m512i lo = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(v0 + e)));
            __m512i hi = v1 ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(v1 + e)))
                            : _mm512_setzero_si512();
            _mm512_storeu_si512(vt + (e / 16) * 256, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
        }
    }
}

/* Scores of the block's 16 rows against its first `tiles` key tiles: s[r][c] (stride lds),
 * four key tiles at a time so that their dot products overlap. */
static void scores(const uint16_t *qb, const uint16_t *kb, int64_t kch, int64_t tiles,
                   float *s, int64_t lds) {
    for (int64_t t0 = 0; t0 < tiles; t0 += 4) {
        int64_t nt = tiles - t0 < 4 ? tiles - t0 : 4, step = kch * 512;
        _tile_zero(2);
        _tile_zero(3);
        _tile_zero(4);
        _tile_zero(5);
        for (int64_t ch = 0; ch < kch; ch++) {
            const uint16_t *b = kb + (t0 * kch + ch) * 512;
            _tile_loadd(0, qb + ch * 32, kch * 64);
            _tile_loadd(6, b, 64);
            _tile_dpbf16ps(2, 0, 6);
            if (nt > 1) { _tile_loadd(7, b + step, 64); _tile_dpbf16ps(3, 0, 7); }
            if (nt > 2) { _tile_loadd(6, b + 2 * step, 64); _tile_dpbf16ps(4, 0, 6); }
            if (nt > 3) { _tile_loadd(7, b + 3 * step, 64); _tile_dpbf16ps(5, 0, 7); }
        }
        float *out = s + t0 * KT;
        _tile_stored(2, out, lds * 4);
        if (nt > 1) _tile_stored(3, out + KT, lds * 4);
        if (nt > 2) _tile_stored(4, out + 2 * KT, lds * 4);
        if (nt > 3) _tile_stored(5, out + 3 * KT, lds * 4);
    }
}

/* 2^t (fp32 accuracy: a degree-5 fit on [-0.5, 0.5], ~2.3e-7 relative, then scalef). */
static inline __m512 exp2_16(__m512 t) {
    __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.33952798e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.67076313e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.55034068e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.40222117e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.93147200e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.00000005f));
    return _mm512_scalef_ps(p, n);
}

static inline void st_pbh(uint16_t *p, __m512 x) {
    _mm256_storeu_si256((void *)p, (__m256i)_mm512_cvtneps_pbh(x));
}

/* Row r's probabilities exp((s - max) * scale) over its `len` keys, as bf16 into p (zeros up
 * to `width`); returns their sum (of the fp32 values, as SDPA sums them). */
static float softmax_row(const float *s, int64_t len, int64_t width, float scale, uint16_t *p) {
    int64_t full = len / 16 * 16;
    __mmask16 tail = (__mmask16)((1u << (len - full)) - 1u);
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (int64_t c = 0; c < full; c += 16) mv = _mm512_max_ps(mv, _mm512_loadu_ps(s + c));
    if (tail) mv = _mm512_mask_max_ps(mv, tail, mv, _mm512_maskz_loadu_ps(tail, s + full));
    float m = _mm512_reduce_max_ps(mv), k = scale * 1.44269504088896341f;
    __m512 kv = _mm512_set1_ps(k), mk = _mm512_set1_ps(m * k), sum = _mm512_setzero_ps();
    int64_t c = 0;
    for (; c < full; c += 16) {
        __m512 e = exp2_16(_mm512_fmsub_ps(_mm512_loadu_ps(s + c), kv, mk));
        sum = _mm512_add_ps(sum, e);
        st_pbh(p + c, e);
    }
    if (tail) {
        __m512 e = exp2_16(_mm512_fmsub_ps(_mm512_maskz_loadu_ps(tail, s + c), kv, mk));
        e = _mm512_maskz_mov_ps(tail, e);
        sum = _mm512_add_ps(sum, e);
        st_pbh(p + c, e);
        c += 16;
    }
    for (; c < width; c += 16) _mm256_storeu_si256((void *)(p + c), _mm256_setzero_si256());
    return _mm512_reduce_add_ps(sum);
}

/* Up to four groups of 16 output dims for one chunk of 32 keys: C tiles 2.. += A(a) B. */
#define PV_STEP(A, pch, v)                                                                 \
    do {                                                                                   \
        _tile_loadd(A, pch, ldp * 2);                                                      \
        _tile_loadd(6, v, 64);                                                             \
        _tile_dpbf16ps(2, A, 6);                                                           \
        if (ng > 1) { _tile_loadd(7, (v) + 512, 64); _tile_dpbf16ps(3, A, 7); }            \
        if (ng > 2) { _tile_loadd(6, (v) + 1024, 64); _tile_dpbf16ps(4, A, 6); }           \
        if (ng > 3) { _tile_loadd(7, (v) + 1536, 64); _tile_dpbf16ps(5, A, 7); }           \
    } while (0)

/* res[16][d] (fp32) = P V over `chunks` value tiles; chunks alternate A tiles 0 and 1. */
static void values(const uint16_t *p, int64_t ldp, const uint16_t *vb, int64_t groups,
                   int64_t chunks, float *res, int64_t d) {
    for (int64_t g0 = 0; g0 < groups; g0 += 4) {
        int64_t ng = groups - g0 < 4 ? groups - g0 : 4;
        _tile_zero(2);
        _tile_zero(3);
        _tile_zero(4);
        _tile_zero(5);
        int64_t ch = 0;
        for (; ch + 1 < chunks; ch += 2) {
            PV_STEP(0, p + ch * VC, vb + (ch * groups + g0) * 512);
            PV_STEP(1, p + (ch + 1) * VC, vb + ((ch + 1) * groups + g0) * 512);
        }
        if (ch < chunks) PV_STEP(0, p + ch * VC, vb + (ch * groups + g0) * 512);
        float *r = res + g0 * 16;
        _tile_stored(2, r, d * 4);
        if (ng > 1) _tile_stored(3, r + 16, d * 4);
        if (ng > 2) _tile_stored(4, r + 32, d * 4);
        if (ng > 3) _tile_stored(5, r + 48, d * 4);
    }
}

typedef struct {
    int64_t n, past, d, dp, ldq, ldo, ldp, lds;
    float scale;
} shape;

/* One head's block of up to 16 query rows from i0: q rows copied (the last repeated past n). */
static void block(const uint16_t *q, uint16_t *out, int64_t i0, const shape *sh,
                  const uint16_t *kb, const uint16_t *vb, uint16_t *qb, float *s, uint16_t *p,
                  float *res) {
    int64_t d = sh->d, dp = sh->dp, rows = sh->n - i0 < QROWS ? sh->n - i0 : QROWS;
    for (int64_t r = 0; r < QROWS; r++) {
        const uint16_t *src = q + (i0 + (r < rows ? r : rows - 1)) * sh->ldq;
        memcpy(qb + r * dp, src, sizeof(uint16_t) * (size_t)d);
    }
    int64_t last = sh->past + i0 + rows - 1; /* the block's last visible key */
    int64_t chunks = last / VC + 1;
    scores(qb, kb, dp / 32, last / KT + 1, s, sh->lds);
    float l[QROWS];
    for (int64_t r = 0; r < QROWS; r++) {
        int64_t len = sh->past + i0 + (r < rows ? r : rows - 1) + 1;
        l[r] = softmax_row(s + r * sh->lds, len, chunks * VC, sh->scale, p + r * sh->ldp);
    }
    values(p, sh->ldp, vb, d / 16, chunks, res, d);
    for (int64_t r = 0; r < rows; r++) {
        f32x16 inv = splat(1.f / l[r]);
        for (int64_t e = 0; e < d; e += 16)
            st_bf16(out + (i0 + r) * sh->ldo + e, ld_f32(res + r * d + e) * inv);
    }
}

int prefill_amx_bf16(const uint16_t *q, int64_t ldq, const uint16_t *kc, const uint16_t *vc,
                     int64_t Hkv, int64_t NB, int64_t bs, int64_t d, const int64_t *table,
                     int64_t past, int64_t n, uint16_t *out, int64_t ldo, int64_t H,
                     float scale) {
    if (d % 16 || d > 256 || H % Hkv || n < 1) return -1;
    if (!permitted()) return -3;
    int64_t g = H / Hkv, ctx = past + n, dp = (d + 31) / 32 * 32;
    int64_t ktiles = (ctx + KT - 1) / KT, vchunks = (ctx + VC - 1) / VC;
    shape sh = {n, past, d, dp, ldq, ldo, vchunks * VC, vchunks * VC, scale};
    uint16_t *kb = aligned_alloc(64, sizeof(uint16_t) * (size_t)(ktiles * KT * dp));
    uint16_t *vb = aligned_alloc(64, sizeof(uint16_t) * (size_t)(vchunks * VC * d));
    uint16_t *qb = aligned_alloc(64, sizeof(uint16_t) * QROWS * (size_t)dp);
    float *s = aligned_alloc(64, sizeof(float) * QROWS * (size_t)sh.lds);
    uint16_t *p = aligned_alloc(64, sizeof(uint16_t) * QROWS * (size_t)sh.ldp);
    float *res = aligned_alloc(64, sizeof(float) * QROWS * (size_t)d);
    int rc = kb && vb && qb && s && p && res ? 0 : -2;
    if (rc == 0) {
        memset(qb, 0, sizeof(uint16_t) * QROWS * (size_t)dp); /* dims past d stay 0 */
        tiles_on();
        for (int64_t hk = 0; hk < Hkv; hk++) {
            layout(kc + hk * NB * bs * d, vc + hk * NB * bs * d, table, bs, d, dp, ctx, ktiles,
                   vchunks, kb, vb);
            for (int64_t h = hk * g; h < (hk + 1) * g; h++)
                for (int64_t i0 = 0; i0 < n; i0 += QROWS)
                    block(q + h * d, out + h * d, i0, &sh, kb, vb, qb, s, p, res);
        }
        _tile_release();
    }
    free(kb); free(vb); free(qb); free(s); free(p); free(res);
    return rc;
}

#else

int amx_ready(void) { return 0; }

int prefill_amx_bf16(const uint16_t *q, int64_t ldq, const uint16_t *kc, const uint16_t *vc,
                     int64_t Hkv, int64_t NB, int64_t bs, int64_t d, const int64_t *table,
                     int64_t past, int64_t n, uint16_t *out, int64_t ldo, int64_t H,
                     float scale) {
    (void)q, (void)ldq, (void)kc, (void)vc, (void)Hkv, (void)NB, (void)bs, (void)d;
    (void)table, (void)past, (void)n, (void)out, (void)ldo, (void)H, (void)scale;
    return -1;
}

#endif
