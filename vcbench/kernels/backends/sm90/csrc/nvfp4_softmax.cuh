// The NVFP4 instances' online softmax: the running max, P~ (two-level: under its per-row
// scale s1), P~'s NVFP4 quantization in registers (per 16 keys an E4M3 microscale, E2M1
// codes), the codes dequantized exactly into the FP16 A fragment of the PV wgmma, and the
// accumulator's rescale. The emulation's order (reference.engine.run, and the Triton kernel
// nvfp4_attention.py):
//
//     m' = max(m, rowmax s);  alpha = exp2(m - m');  p = exp2(s - m');  r = rowsum p
//     P  = NVFP4(p / s1), s1 = rowmax(p) / 2688   (two-level; else NVFP4(p))
//     acc = alpha acc + (P V_j) s1 [+ r mean_j];  l = alpha l + r;  O = acc / l
//
// The PV wgmma accumulates into acc itself (no tile block and no FP32 merge on the CUDA
// cores: 64 registers and 64 FFMA a tile fewer, which is what lets three consumer warpgroups
// fit 160 registers). So acc is kept in the units of the tile's s1: with
// u = max(t, m' - 64), t the tile's row max, the tile's P~ / s1 is x = 2688 exp2(s - u) and
// acc' = acc / s1 takes acc' = beta acc' + P V_j with beta = exp2(u_prev - u) (alpha s1_prev /
// s1, exactly). The floor m' - 64 bounds beta and acc' (s1 >= 2^-64 / 2688); it binds only on
// a tile whose every score is 64 below the running max, whose share of the row is below
// 2^-64, where x's scale then differs from the emulation's. Without two levels acc' = acc.
//
// Where it differs, and why that stays inside the tests' rule (tests/test_gpu_nvfp4.py): p is
// MUFU's exp2 (as in every GPU kernel); p / s1 is computed as one exp2, 2688 exp2(s - t) (the
// quotient's value, within a few ulps of the rounded division); x / microscale is a product by
// the microscale's reciprocal (within an ulp of the quotient). Each moves a code only where the
// quotient lies within those ulps of an E2M1 rounding boundary, the same mechanism, and
// smaller, than MUFU's exp2 against torch's. The PV sums are the tensor core's, in FP32, in
// its order rather than the emulation's tile-then-merge order (the rule's (a)).
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
// (triton/nvfp4.py round_e2m1_nonneg, the same arithmetic and the same bits). The magic number
// 1.5 * 2^(22 + max(e, 0)) is 1.5 * 2^22 * m with m = 2^max(e, 0): y's bits floored at 1.0's
// (one IMNMX), the exponent field kept (one LOP3). The product by 1.5 * 2^22 is exact, so each
// FFMA rounds once, as an add of the magic number would: one integer op an element fewer than
// building the magic number's bits (tests/test_compiled.py holds the two equal).
__device__ __forceinline__ float round_e2m1(float y) {
  const float mag = fminf(y, 6.f);
  const float m = __int_as_float(max(__float_as_int(mag), 0x3f800000) & 0x7f800000);
  const float t = __fmaf_rn(m, 6291456.f, mag);  // mag + magic, rounded to the quantum
  return __fmaf_rn(-m, 6291456.f, t);            // minus the magic number: exact
}

// The E4M3 microscales of two groups from their amax: formats.scale_for (amax times the FP32
// reciprocal of 6), rounded to E4M3 by the hardware's RNE, saturating conversion (a NaN amax
// stays NaN), read back exactly as an FP16 pair (low half amax0's).
__device__ __forceinline__ __half2 microscales(float amax0, float amax1) {
  uint16_t codes;
  uint32_t halves;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(codes) : "f"(amax1 * (1.f / 6.f)),
      "f"(amax0 * (1.f / 6.f)));
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(halves) : "h"(codes));
  return *reinterpret_cast<const __half2*>(&halves);
}

__device__ __forceinline__ uint32_t as_u32(__half2 h) {
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// Key (0..127 of the tile) in S column 8c + 2q + b, which is row 8c + 2q + b of the K and V
// tiles (triton/nvfp4.py sm90_row writes them so): with c = c' + 8u, key b + 2c' + 16q + 64u.
// A thread (quad lane q) then holds keys 16q..16q+15 (blocks c < 8) and 64+16q..64+16q+15
// (c >= 8) of its two rows: P's microscale groups of 16 consecutive keys are each one thread's
// sixteen scores, and their amax needs no shuffle. The accumulator's layout is still the PV A
// fragment's (P needs no shuffle either); V's rows in the same order keep P V the same sum.
__device__ __forceinline__ int key_of(int c, int q, int b) {
  return b + 2 * (c & 7) + 16 * q + 64 * (c >> 3);
}

// The mean step's A fragment (k = 16, two columns used): column 0 the row sums of P~ in FP16
// (their head), column 1 what FP16 dropped (their tail), so that the FP32 products with the
// mean (B's rows 0 and 1) carry 22 bits of the sum. Only lanes q == 0 hold columns 0 and 1.
// Its registers 0 and 1 (rows r and r + 8, columns 2q, 2q + 1); registers 2 and 3 (columns 8 +
// 2q, 9 + 2q) meet B's zero rows 8..15, so issue_pv passes registers 0 and 1 again there
// instead of two more registers of zeros (a NaN there is a NaN row's own).
__device__ __forceinline__ void mean_fragment(uint32_t (&a)[2], const float (&xs)[2], int q) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float head = __half2float(__float2half_rn(xs[h]));
    a[h] = q == 0 ? pack_half2(head, xs[h] - head) : 0u;
  }
}

// P's A fragment for the 8 PV k-steps from the dequantized values: p[4G + {0..3}] for S
// columns 16G..16G+15 (the mma.m16n8k16 A layout: rows r, r + 8 x columns 2q + {0,1}, then 8 +
// 2q + {0,1}), i.e. S blocks 2G (rows r, r + 8), then 2G + 1; V's rows 16G.. hold their keys.
__device__ __forceinline__ void pack_p(uint32_t (&p)[32], const float (&s)[64]) {
#pragma unroll
  for (int G = 0; G < 8; ++G)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int i0 = 4 * (2 * G) + 2 * h, i1 = 4 * (2 * G + 1) + 2 * h;
      p[4 * G + h] = pack_half2(s[i0], s[i0 + 1]);
      p[4 * G + 2 + h] = pack_half2(s[i1], s[i1 + 1]);
    }
}

// The per-row state across tiles: the running max m, the tile unit u (two-level), and the
// row sum l in acc's units (l' = l / s1: l' = beta l' + rowsum(x), as acc' takes its tile; O =
// acc' / (PSCALE l'), the s1 cancelling). The emulation keeps l in the running max's units (l =
// alpha l + s1 rowsum(x)): the same sum, rounded otherwise (a few FP32 ulps of l), for two
// registers (s1) and four MUFU a tile and thread fewer.
struct RowState {
  float m[2] = {-INFINITY, -INFINITY};
  float u[2] = {-INFINITY, -INFINITY};
  float l[2] = {0.f, 0.f};
};

// One S tile (FP32 dot products of the dequantized codes: s[4c + 2h + b] = row r + 8h, column 8c +
// 2q + b) into P's dequantized NVFP4 values as the PV wgmma's A fragment p (each an exact FP16
// value, times PSCALE; register 2c + h the pair of block c, row h). Without V-Smooth a pair's
// codes are dequantized by one HMUL2; with it by FP32 products that pack_p packs, the same values:
// HMUL2 made those instances 1.5-3.3% faster and the V-Smooth one 5.4% slower (docs/perf/log.md).
// c: q_outer * k_outer (1 without outer scales), which the scores are still to be multiplied by;
// with Q smoothing they carry its score term already (load_bias started their accumulator with
// it). On return acc is rescaled into this tile's units (ready for its PV), the row state is
// updated (l with this tile's row sums), and with V-Smooth a_mean is the tile's mean step A
// fragment.
template <class T, bool MASK>
__device__ __forceinline__ void softmax_tile(float (&s)[64], float (&acc)[64], uint32_t (&p)[32],
                                             RowState& st, uint32_t (&a_mean)[2], float c,
                                             int n_valid, int q) {
  float t[2] = {-INFINITY, -INFINITY};
  const int lim = n_valid - 16 * q;  // key_of(cc, q, b) is past the last iff key_of - 16q >= lim
#pragma unroll
  for (int cc = 0; cc < 16; ++cc) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        float v = s[4 * cc + 2 * h + b];
        if (MASK && key_of(cc, 0, b) >= lim) v = -INFINITY;
        s[4 * cc + 2 * h + b] = v;
        t[h] = fmaxf(t[h], v);
      }
  }
  float bias_x[2], beta[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    t[h] = fmaxf(t[h], __shfl_xor_sync(0xffffffffu, t[h], 1));
    t[h] = fmaxf(t[h], __shfl_xor_sync(0xffffffffu, t[h], 2));
    t[h] *= c;  // the scores are still to be multiplied by c (c > 0)
    const float m_new = fmaxf(st.m[h], t[h]);
    if constexpr (T::TWO_LEVEL) {
      const float u = fmaxf(t[h], m_new - 64.f);
      beta[h] = ex2(st.u[h] - u);    // alpha s1_prev / s1; 0 at the first tile (u = -inf)
      bias_x[h] = LOG2_P_OUTER - u;  // x = 2688 exp2(s - u)
      st.u[h] = u;
    } else {
      beta[h] = ex2(st.m[h] - m_new);  // alpha; 0 at the first tile (m = -inf, m_new finite)
      bias_x[h] = -m_new;              // x = p = exp2(s - m')
    }
    st.m[h] = m_new;
  }
  // acc's rescale as soon as beta is known, before the scores' exponentials take registers
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] *= beta[(i >> 1) & 1];
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int h = (i >> 1) & 1;
    s[i] = ex2(fmaf(s[i], c, bias_x[h]));
    sum[h] += s[i];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 1);
    sum[h] += __shfl_xor_sync(0xffffffffu, sum[h], 2);
    st.l[h] = st.l[h] * beta[h] + sum[h];
  }
  if constexpr (T::VSMOOTH) {
    const float xs[2] = {sum[0] * T::PSCALE, sum[1] * T::PSCALE};
    mean_fragment(a_mean, xs, q);
  }
  // The 16-key groups (key_of): the thread's blocks 8u .. 8u + 7 of row h, sixteen values.
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    float amax[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // x >= 0, so the largest x has the largest bits as an integer: the amax by the integer
      // pipe's three-input max, a tree of eight, the same value as float maxes
      int a[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) a[i] = __float_as_int(s[4 * (8 * u + i / 2) + 2 * h + i % 2]);
      const int m0 = __vimax3_s32(a[0], a[1], a[2]), m1 = __vimax3_s32(a[3], a[4], a[5]),
                m2 = __vimax3_s32(a[6], a[7], a[8]), m3 = __vimax3_s32(a[9], a[10], a[11]),
                m4 = __vimax3_s32(a[12], a[13], a[14]);
      amax[h] = __int_as_float(max(__vimax3_s32(m0, m1, m2), __vimax3_s32(m3, m4, a[15])));
    }
    const __half2 sc = microscales(amax[0], amax[1]);
    const float scale[2] = {__low2float(sc), __high2float(sc)};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // a zero microscale: every x of the group is below 6 * 2^-10, its codes 0
      const float inv = scale[h] > 0.f ? rcp(scale[h]) : 0.f;
      if constexpr (T::VSMOOTH) {  // FP32 products, packed below
        const float deq = scale[h] * T::PSCALE;  // exact: a power-of-two multiple
#pragma unroll
        for (int c = 8 * u; c < 8 * u + 8; ++c) {
          const int i = 4 * c + 2 * h;
          s[i] = round_e2m1(s[i] * inv) * deq;
          s[i + 1] = round_e2m1(s[i + 1] * inv) * deq;
        }
      } else {
        // PSCALE is 1 here; each code times its microscale is exact in FP16
        // (tests/test_compiled.py), so one HMUL2 a pair gives what an FP32 product would
        static_assert(T::PSCALE == 1.f, "P's FP16 products take no PSCALE");
        const __half2 deq = h == 0 ? __low2half2(sc) : __high2half2(sc);
#pragma unroll
        for (int c = 8 * u; c < 8 * u + 8; ++c) {
          const int i = 4 * c + 2 * h;
          p[2 * c + h] = as_u32(__hmul2(__floats2half2_rn(round_e2m1(s[i] * inv),
                                                          round_e2m1(s[i + 1] * inv)), deq));
        }
      }
    }
  }
  if constexpr (T::VSMOOTH) pack_p(p, s);
}

}  // namespace nvfp4

}  // namespace vc
