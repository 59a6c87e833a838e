// The epilogue: O = acc * v_scale / l for this thread's two rows (per-channel V scale; with one
// per tile the merge has applied it), written as bf16 or fp16 pairs through the output's
// strides (rows past n, the padding, are not written).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "traits.cuh"

namespace vc {

// acc: the accumulator (rows row0 and row0 + 8, columns 8c + 2q + {0, 1}); l: the rows'
// normalisers, which with ExpCast only the q == 0 lane of each quad holds (the ones column).
template <class T>
__device__ __forceinline__ void store_output(const float (&acc)[64], float (&l)[2],
                                             const Params& prm, int bh, int row0, int lane,
                                             int q) {
  if constexpr (T::EXPCAST) {
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = __shfl_sync(0xffffffffu, l[h], lane & ~3);
  }
  const float* vs = prm.v_scale + static_cast<size_t>(bh) * D;
  const int b = bh / prm.heads, hd = bh % prm.heads;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    const float inv_l = 1.f / l[h];  // (acc * v_scale) / l as one reciprocal per row
    if (row >= prm.n) continue;
    const long long off = b * prm.out_sb + hd * prm.out_sh + row * prm.out_sn;
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      const int col = 8 * c + 2 * q;
      const float2 sc =
          T::V_PER_TILE ? make_float2(1.f, 1.f) : *reinterpret_cast<const float2*>(vs + col);
      const float o0 = acc[4 * c + 2 * h] * sc.x * inv_l;
      const float o1 = acc[4 * c + 2 * h + 1] * sc.y * inv_l;
      if (prm.out_bf16) {
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(prm.out) + off + col) =
            __floats2bfloat162_rn(o0, o1);
      } else {
        *reinterpret_cast<__half2*>(static_cast<__half*>(prm.out) + off + col) =
            __floats2half2_rn(o0, o1);
      }
    }
  }
}

}  // namespace vc
