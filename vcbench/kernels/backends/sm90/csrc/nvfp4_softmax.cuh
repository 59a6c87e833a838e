// The NVFP4 instances' online softmax: the running max, P~ (two-level: under its per-row
// scale s1), P~'s NVFP4 quantization in registers (per 16 keys an E4M3 microscale, E2M1
// codes), the codes dequantized exactly into the FP16 A fragment of the PV wgmma, and the
// two-level merge of each tile's product into the FP32 accumulator. The emulation's order
// (reference.engine.run, and the Triton kernel nvfp4_attention.py):
//
//     m' = max(m, rowmax s);  alpha = exp2(m - m');  p = exp2(s - m');  r = rowsum p
//     P  = NVFP4(p / s1), s1 = rowmax(p) / 2688   (two-level; else NVFP4(p))
//     acc = alpha acc + (P V_j) s1 [+ r mean_j];  l = alpha l + r
//
// Where it differs, and why that stays inside the tests' rule (tests/test_gpu_nvfp4.py): p is
// MUFU's exp2 (as in every GPU kernel); p / s1 is computed as one exp2, 2688 exp2(s - t) with t
// the tile's row max (the quotient's value, within a few ulps of the rounded division); x /
// microscale is a product by the microscale's reciprocal (within an ulp of the quotient). Each
// moves a code only where the quotient lies within those ulps of an E2M1 rounding boundary,
// the same mechanism, and smaller, than MUFU's exp2 against torch's.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>
#include <math.h>

#include "nvfp4_traits.cuh"
#include "softmax.cuh"

namespace vc {

namespace nvfp4 {

__device__ __forceinline__ float rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// formats.round_e2m1 of y >= 0: min(y, 6) rounded to the multiple of its quantum (0.5 below 2,
// 1 on [2, 4), 2 from 4), ties to even, by one magic-number add whose exponent is read off y's
// (triton/nvfp4.py round_e2m1_nonneg, the same arithmetic).
__device__ __forceinline__ float round_e2m1(float y) {
  const float mag = fminf(y, 6.f);
  const int e = max(__float_as_int(mag) >> 23, 127);
  const float magic = __int_as_float(((e + 22) << 23) + 0x400000);
  return __fsub_rn(__fadd_rn(mag, magic), magic);  // two roundings, never contracted
}

// The E4M3 microscales of two groups from their amax: formats.scale_for (amax times the FP32
// reciprocal of 6), rounded to E4M3 by the hardware's RNE, saturating conversion (a NaN amax
// stays NaN), read back exactly.
__device__ __forceinline__ float2 microscales(float amax0, float amax1) {
  uint16_t codes;
  uint32_t halves;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(codes) : "f"(amax1 * (1.f / 6.f)),
      "f"(amax0 * (1.f / 6.f)));
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(codes));
  return __half22float2(*reinterpret_cast<const __half2*>(&halves));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Key (0..127 of the tile) in S column 8c + 2q + b: the natural order (16-bit operands need no
// K row permutation, the accumulator's layout is the A fragment's).
__device__ __forceinline__ int key_of(int c, int q, int b) { return 8 * c + 2 * q + b; }

// One S tile (FP32 dot products of the dequantized codes: s[4c + 2h + b] = row r + 8h, column
// 8c + 2q + b) into P's A fragment for the 8 PV k-steps, p[4G + {0..3}] for keys 16G..16G+15
// (the mma.m16n8k16 A layout: rows r, r + 8 x columns 2q + {0,1}, then 8 + 2q + {0,1}).
// c: q_outer * k_outer (1 without outer scales); bias: Q smoothing's term of this thread's
// row at this thread's first column (2q; columns 8c + 2q + b at bias[4c]) or unused; on return m is the new running max, alpha the accumulator's
// rescale, f the factor of this tile's product in the merge (s1 / PSCALE), r its row sums of
// p, and xs the row sums of P~ (p / s1) times PSCALE, the mean step's A.
template <class T, bool MASK>
__device__ __forceinline__ void softmax_tile(float (&s)[64], uint32_t (&p)[32], float (&m)[2],
                                             float (&alpha)[2], float (&f)[2], float (&r)[2],
                                             float (&xs)[2], float c, const float2* bias,
                                             int n_valid, int q) {
  float t[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int cc = 0; cc < 16; ++cc) {
    [[maybe_unused]] float2 bz;
    if constexpr (T::BIAS) bz = bias[4 * cc];  // columns 8cc + 2q + {0, 1}
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        float v = s[4 * cc + 2 * h + b];
        if constexpr (T::BIAS) v = fmaf(v, c, b ? bz.y : bz.x);  // the score, log2 units
        if (MASK && key_of(cc, q, b) >= n_valid) v = -INFINITY;
        s[4 * cc + 2 * h + b] = v;
        t[h] = fmaxf(t[h], v);
      }
  }
  // with the bias the scores are final; else still to be multiplied by c (c > 0)
  const float cs = T::BIAS ? 1.f : c;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    t[h] = fmaxf(t[h], __shfl_xor_sync(0xffffffffu, t[h], 1));
    t[h] = fmaxf(t[h], __shfl_xor_sync(0xffffffffu, t[h], 2));
    t[h] *= cs;
    const float m_new = fmaxf(m[h], t[h]);
    alpha[h] = ex2(m[h] - m_new);  // 0 at the first tile (m = -inf, m_new finite)
    if constexpr (T::TWO_LEVEL) {
      const float s1 = ex2(t[h] - m_new) * (1.f / P_OUTER);  // rowmax(p) / 2688
      f[h] = s1 * (1.f / T::PSCALE);
    } else {
      f[h] = 1.f / T::PSCALE;
    }
    m[h] = m_new;
  }
  // x = p / s1 = 2688 exp2(s - t) (two-level), else p = exp2(s - m'): one FFMA, one MUFU
  float bias_x[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) bias_x[h] = T::TWO_LEVEL ? LOG2_P_OUTER - t[h] : -m[h];
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int h = (i >> 1) & 1;
    s[i] = ex2(fmaf(s[i], cs, bias_x[h]));
    sum[h] += s[i];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
    sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
    // r = rowsum(p): s1 * rowsum(p / s1) two-level
    r[h] = T::TWO_LEVEL ? sum[h] * (f[h] * T::PSCALE) : sum[h];
    xs[h] = sum[h] * T::PSCALE;
  }
  // The 16-key groups: group G is S blocks 2G and 2G + 1, four values a thread and row, the
  // other twelve in the quad's other threads.
#pragma unroll
  for (int G = 0; G < 8; ++G) {
    float amax[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i0 = 4 * (2 * G) + 2 * h, i1 = 4 * (2 * G + 1) + 2 * h;
      float a = fmaxf(fmaxf(s[i0], s[i0 + 1]), fmaxf(s[i1], s[i1 + 1]));  // x >= 0: the amax
      a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
      amax[h] = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
    }
    const float2 sc = microscales(amax[0], amax[1]);
    const float scale[2] = {sc.x, sc.y};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // a zero microscale: every x of the group is below 6 * 2^-10, its codes 0
      const float inv = scale[h] > 0.f ? rcp(scale[h]) : 0.f;
      const float deq = scale[h] * T::PSCALE;  // exact: a power-of-two multiple
      const int i0 = 4 * (2 * G) + 2 * h, i1 = 4 * (2 * G + 1) + 2 * h;
      const float v00 = round_e2m1(s[i0] * inv) * deq, v01 = round_e2m1(s[i0 + 1] * inv) * deq;
      const float v10 = round_e2m1(s[i1] * inv) * deq, v11 = round_e2m1(s[i1 + 1] * inv) * deq;
      p[4 * G + h] = pack_half2(v00, v01);      // rows r (+8), keys 16G + 2q + {0,1}
      p[4 * G + 2 + h] = pack_half2(v10, v11);  // keys 16G + 8 + 2q + {0,1}
    }
  }
}

// The mean step's A fragment (k = 16, two of them used): column 0 the row sums of P~ in FP16
// (their head), column 1 what FP16 dropped (their tail), so that the FP32 products with the
// mean (B's rows 0 and 1) carry 22 bits of the sum. Only lanes q == 0 hold columns 0 and 1.
__device__ __forceinline__ void mean_fragment(uint32_t (&a)[4], const float (&xs)[2], int q) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float head = __half2float(__float2half_rn(xs[h]));
    a[h] = q == 0 ? pack_half2(head, xs[h] - head) : 0u;
  }
  a[2] = a[3] = 0u;
}

// acc = alpha acc + f PV_j (f = s1 / PSCALE: the tile's product back to p's units), l = alpha l
// + r, in FP32 on the CUDA cores, as the emulation merges. Register i is row r + 8((i >> 1) & 1).
__device__ __forceinline__ void merge_tile(float (&acc)[64], const float (&pv)[64], float (&l)[2],
                                           const float (&alpha)[2], const float (&f)[2],
                                           const float (&r)[2]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int h = (i >> 1) & 1;
    acc[i] = fmaf(pv[i], f[h], acc[i] * alpha[h]);
  }
  l[0] = l[0] * alpha[0] + r[0];
  l[1] = l[1] * alpha[1] + r[1];
}

}  // namespace nvfp4

}  // namespace vc
