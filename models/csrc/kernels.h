/* The native kernels' entry points (each file's exported functions), for use across files. */
#ifndef SLICEGATE_KERNELS_H
#define SLICEGATE_KERNELS_H

#include <stdint.h>

int gemv_bf16(const uint16_t *x, int64_t ldx, const uint16_t *w, const uint16_t *bias,
              uint16_t *y, int64_t ldy, const uint16_t *other, int64_t ldo,
              int64_t M, int64_t N, int64_t K, int epi, int pf);
int gemv_f32(const float *x, int64_t ldx, const float *w, const float *bias,
             float *y, int64_t ldy, const float *other, int64_t ldo,
             int64_t M, int64_t N, int64_t K, int epi, int pf);
int rms_norm_bf16(const uint16_t *x, int64_t ldx, const uint16_t *w, uint16_t *y, int64_t ldy,
                  int64_t T, int64_t D, float eps);
int rms_norm_f32(const float *x, int64_t ldx, const float *w, float *y, int64_t ldy,
                 int64_t T, int64_t D, float eps);
int rope_bf16(uint16_t *x, int64_t ldx, const uint16_t *cos, const uint16_t *sin,
              int64_t T, int64_t heads, int64_t d);
int rope_f32(float *x, int64_t ldx, const float *cos, const float *sin,
             int64_t T, int64_t heads, int64_t d);
int rope_write_bf16(uint16_t *qkv, int64_t ldx, const uint16_t *cos, const uint16_t *sin,
                    int64_t T, int64_t H, int64_t Hkv, int64_t d, uint16_t *kc, uint16_t *vc,
                    int64_t NB, int64_t bs, const int64_t *slots);
int rope_write_f32(float *qkv, int64_t ldx, const float *cos, const float *sin, int64_t T,
                   int64_t H, int64_t Hkv, int64_t d, float *kc, float *vc, int64_t NB,
                   int64_t bs, const int64_t *slots);
int decode_attn_bf16(const uint16_t *q, int64_t ldq, const uint16_t *kc, const uint16_t *vc,
                     int64_t Hkv, int64_t NB, int64_t bs, int64_t d, const int64_t *tables,
                     int64_t nbt, const int64_t *lens, uint16_t *out, int64_t ldo, int64_t B,
                     int64_t H, float scale);
int decode_attn_f32(const float *q, int64_t ldq, const float *kc, const float *vc,
                    int64_t Hkv, int64_t NB, int64_t bs, int64_t d, const int64_t *tables,
                    int64_t nbt, const int64_t *lens, float *out, int64_t ldo, int64_t B,
                    int64_t H, float scale);

#endif
