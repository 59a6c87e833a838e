// The online softmax of a tile and how P leaves it: the running max and the accumulator's
// rescale, P encoded as E4M3 codes by ExpCast-FP8 (one FFMA and an add into the code's bits, no
// MUFU) or by exp2 then a cast, the codes packed into the PV wgmma's A fragment, and the
// two-level merge of each tile's product into the FP32 accumulator.
#pragma once
#include <stdint.h>
#include <math.h>

#include <climits>
#include <type_traits>

namespace vc {

// A score register: INT8 QK leaves the raw s32 dot product (converted here, I2FP), FP8 QK an
// FP32 one. The softmax writes P's code bytes back into the same registers (bits / put).
__device__ __forceinline__ float score(uint32_t v) { return static_cast<float>(static_cast<int>(v)); }
__device__ __forceinline__ float score(float v) { return v; }
__device__ __forceinline__ uint32_t bits(uint32_t v) { return v; }
__device__ __forceinline__ uint32_t bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ void put(uint32_t& d, uint32_t v) { d = v; }
__device__ __forceinline__ void put(float& d, uint32_t v) { d = __uint_as_float(v); }

__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// fma with the result clamped to [0, 1] (NaN to +0): FFMA.SAT, one instruction.
__device__ __forceinline__ float fma_sat(float a, float b, float c) {
  float d;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;\n" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
}

__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
}

// Four FP32 values to E4M3 bytes of one register, byte i from x_i (round to nearest even,
// saturating): two cvt into the 16-bit halves, which ptxas writes in place (F2FP ... MERGE_C).
// A 16-bit result instead leaves a zero-extension (LOP3) and a half insert (PRMT) per pair.
__device__ __forceinline__ uint32_t e4m3x4(float x0, float x1, float x2, float x3) {
  uint32_t d;
  asm("{\n.reg .b16 lo, hi;\n"
      "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
      "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}\n"
      : "=r"(d)
      : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
  return d;
}

// Key (0..127 within the tile) held in S column 8c + 2q + b, given the K row permutation.
__device__ __forceinline__ int key_of(int c, int q, int b) {
  return 16 * (c & 7) + 4 * q + 2 * (c >> 3) + b;
}

// The online softmax of one S tile. This thread holds rows r (h = 0) and r + 8 (h = 1), S
// columns 8c + 2q + b (s[4c + 2h + b]). On return m holds the new running max, alpha the
// rescale of the accumulator, rsum (exp2 path) the full row sums of P, and s the P bytes that
// pack_p makes the A fragment of: ExpCast, s[4c + 2h] the two bytes of block c (columns 8c + 2q,
// +1) in its low half; exp2, s[4c + 2h] (c < 8) all four bytes of fragment register 2c + h.
// c_scale: q_scale * k_scale (S = raw * c_scale, log2 units).
// ExpCast's clamp is folded into the FFMA, with bit-identical codes: the FFMA computes t/256 =
// fma(S, c8/256, bias/256) with .sat (scaling by 2^-8 commutes with the rounding, and
// t <= 120 + beta < 256 never reaches the upper clamp; t < 0 and NaN give 0), and an add of
// 1.5 * 2^15 is the magic add of the exact t: FFMA.SAT + FADD instead of FFMA + FMNMX + FADD.
// The ALU pipe (I2FP, the max, PRMT, half rate) is the softmax's busiest, so the byte pairs are
// built by IMAD on the FMA pipe.
// S: uint32_t (INT8 QK, raw s32 scores) or float (FP8 QK).
template <bool EXPCAST, bool MASK, class S>
__device__ __forceinline__ void softmax_tile(S (&s)[64], float (&m)[2], float (&alpha)[2],
                                             float (&rsum)[2], float c_scale, float expcast_bias,
                                             float log2_p_scale, int n_valid, int q) {
  constexpr bool INT = std::is_same_v<S, uint32_t>;
  int mx[2] = {INT_MIN, INT_MIN};         // INT8: an integer max, one convert per row
  float mxf[2] = {-INFINITY, -INFINITY};  // FP8
#pragma unroll
  for (int c = 0; c < 16; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        if constexpr (INT) {
          int v = static_cast<int>(s[4 * c + 2 * h + b]);
          if (MASK && key_of(c, q, b) >= n_valid) v = INT_MIN;
          mx[h] = max(mx[h], v);
        } else {
          float v = s[4 * c + 2 * h + b];
          if (MASK && key_of(c, q, b) >= n_valid) v = -INFINITY;
          mxf[h] = fmaxf(mxf[h], v);
        }
      }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if constexpr (INT) {
      mx[h] = max(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = max(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
    } else {
      mxf[h] = fmaxf(mxf[h], __shfl_xor_sync(0xffffffffu, mxf[h], 1));
      mxf[h] = fmaxf(mxf[h], __shfl_xor_sync(0xffffffffu, mxf[h], 2));
    }
  }
  float m_new[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float row_max = INT ? static_cast<float>(mx[h]) : mxf[h];  // of the raw scores
    m_new[h] = fmaxf(m[h], row_max * c_scale);  // c_scale >= 0
    // per row: MUFU allowed. ExpCast: no compare and select for an unchanged max, ex2(0) is
    // exactly 1 and the first tile's ex2(-inf) is 0 (m_new is finite: the scores are). The
    // exp2 path keeps the select: there the MUFU pipe carries P (slower without it).
    alpha[h] = EXPCAST || m_new[h] != m[h] ? ex2(m[h] - m_new[h]) : 1.f;
    m[h] = m_new[h];
  }
  if constexpr (EXPCAST) {
    // t = S*8 + (120 + beta - 8m): one FFMA from the raw score; the code is rne(max(t, 0)).
    // Both operands scaled by 2^-8 as the folded clamp needs, each in one instruction:
    // c8/256 = c_scale/32 and bias/256 = fma(m, -1/32, expcast_bias/256) (powers of two
    // commute with the rounding).
    const float eb_256 = expcast_bias * 0.00390625f;
    const float c8_256 = c_scale * 0.03125f;
    float bias_256[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) bias_256[h] = fmaf(m_new[h], -0.03125f, eb_256);
#pragma unroll
    for (int c = 0; c < 16; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t u[2];
#pragma unroll
        for (int b = 0; b < 2; ++b) {
          const float x = score(s[4 * c + 2 * h + b]);
          float t = fma_sat(x, c8_256, bias_256[h]);
          if (MASK && key_of(c, q, b) >= n_valid) t = 0.f;
          // low byte: rne(256 t), as an add with an immediate, t + 1.5 * 2^15, whose ulp is
          // 2^-8 (no register holding 256)
          u[b] = __float_as_uint(t + 49152.f);
        }
        // byte 0: column b = 0, byte 1: b = 1, by an IMAD, which runs on the FMA pipe (PRMT,
        // like I2FP and the max, on the ALU pipe, the softmax's busiest): u1 * 0x10100 puts
        // code 1 in byte 1 and nothing in byte 0, and u0's byte 1 is 0 (the magic's)
        put(s[4 * c + 2 * h], u[1] * 0x10100u + u[0]);
      }
  } else {
    // exp2(S - m + log2 P_SCALE), one FFMA into the exponent; P = E4M3(p), r = sum of p, as
    // two partial sums per row (blocks < 8 and >= 8) for a shorter FADD chain. Blocks c and
    // c + 8 go to one register: four bytes by two cvt, no 16-bit pairs to combine later
    // (32 LOP3 and 16 PRMT per tile fewer than pairs).
    const float bias[2] = {log2_p_scale - m_new[0], log2_p_scale - m_new[1]};
    float part[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float pf[2][2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {  // S blocks c and c + 8
          const int cb = c + 8 * e;
#pragma unroll
          for (int b = 0; b < 2; ++b) {
            float x = fmaf(score(s[4 * cb + 2 * h + b]), c_scale, bias[h]);
            if (MASK && key_of(cb, q, b) >= n_valid) x = -INFINITY;
            pf[e][b] = ex2(x);
            part[h][e] += pf[e][b];
          }
        }
        put(s[4 * c + 2 * h], e4m3x4(pf[0][0], pf[0][1], pf[1][0], pf[1][1]));
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      rsum[h] = part[h][0] + part[h][1];
      rsum[h] += __shfl_xor_sync(0xffffffffu, rsum[h], 1);
      rsum[h] += __shfl_xor_sync(0xffffffffu, rsum[h], 2);
    }
  }
}

// The FP8 A fragment of P for the 4 PV k-steps: register 4kk + 2half + h holds keys
// 32kk + 16half + 4q + {0..3} of row r + 8h: bytes {0,1} from S block c = 2kk + half, bytes
// {2,3} from block c + 8 (the K row permutation puts them there). The exp2 softmax left each
// register whole in s[4c + 2h]: a copy, which ptxas folds into the cvt's destination.
template <bool EXPCAST, class S>
__device__ __forceinline__ void pack_p(uint32_t (&p)[16], const S (&s)[64]) {
#pragma unroll
  for (int c = 0; c < 8; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      p[2 * c + h] = EXPCAST ? prmt(bits(s[4 * c + 2 * h]), bits(s[4 * (c + 8) + 2 * h]), 0x5410)
                             : bits(s[4 * c + 2 * h]);
}

// Tile j's row sums r_j (ExpCast: column 128 of the PV accumulator, its last 4 registers, read
// by the q == 0 lanes (the others read zero columns); exp2 path: the FP32 sums the softmax left
// in rsum).
template <bool EXPCAST, int NACC>
__device__ __forceinline__ void tile_rowsum(const float (&pv)[NACC], const float (&rsum)[2],
                                            float (&r)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) r[h] = EXPCAST ? pv[NACC - 4 + 2 * h] : rsum[h];  // column 128
}

// Two-level accumulation: acc = acc * alpha + PV_j (the tile's product, held in its own
// accumulator) and l = l * alpha + r_j, in FP32 on the CUDA cores, as the emulation does.
// Hopper's FP8 wgmma keeps only 13 mantissa bits of the accumulator it adds to (SageAttention2
// measured it; FlashAttention's FP8 forward lost accuracy on long sequences from it), so
// accumulating 4 x n_tiles wgmmas into one register block truncates it that many times.
// pv: PV_j's block (64 registers, or 68 with ExpCast's ones column); its register i is acc's
// register i, row g + 8 ((i >> 1) & 1).
template <int NACC>
__device__ __forceinline__ void merge_tile(float (&acc)[64], const float (&pv)[NACC],
                                           float (&l)[2], const float (&alpha)[2],
                                           const float (&r)[2]) {
  static_assert(NACC >= 64, "a whole PV block");
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = fmaf(acc[i], alpha[(i >> 1) & 1], pv[i]);
  l[0] = l[0] * alpha[0] + r[0];
  l[1] = l[1] * alpha[1] + r[1];
}

// The same with one V scale per tile (fp8-fa4), without a multiply per element: acc and l are
// kept divided by the current tile's scale v_j, so tile j rescales both by
// alpha * v_(j-1) / v_j (ratio) and adds PV_j as it comes and r_j / v_j (inv); O = acc / l
// needs no V scale. The producer computes ratio and inv per tile (vtile_scales).
template <int NACC>
__device__ __forceinline__ void merge_tile_scaled(float (&acc)[64], const float (&pv)[NACC],
                                                  float (&l)[2], const float (&alpha)[2],
                                                  const float (&r)[2], float ratio, float inv) {
  const float a[2] = {alpha[0] * ratio, alpha[1] * ratio};
  const float rv[2] = {r[0] * inv, r[1] * inv};
  merge_tile(acc, pv, l, a, rv);
}

}  // namespace vc
