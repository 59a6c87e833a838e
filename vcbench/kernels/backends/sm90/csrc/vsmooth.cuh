// V-Smooth's mean term (paper Equation 6): each tile's row sums and max (r_t, m_t) kept in
// shared memory slots, a batch's weights f16(r_t 2^(m_t - m)) built from them, the two
// alternating shared-memory buffers of the batches' means, and the products that add
// sum_t weight_t mu_t^T: in the loop one SS wgmma in a batch-carrying tile's PV group
// (mainloop.cuh), after it add_owed_batches.
#pragma once
#include <stdint.h>

#include "forward.cuh"
#include "mma.cuh"
#include "pipeline.cuh"
#include "softmax.cuh"
#include "traits.cuh"

namespace vc {

// Two FP32 values to an f16x2 (lo in the low half), round to nearest even.
__device__ __forceinline__ uint32_t f16x2(float hi, float lo) {
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// The A fragment of a batch's mean product (mma.m16n8k16's A layout per warp, which is also
// wgmma's register A): f16(r_t 2^(m_t - m_ref)) for the rows this thread holds, slots t <
// count, 0 beyond. The slots a thread reads (rows 16 warp + g, + 8) were written by lane 4g of
// its own warp, so a __syncwarp orders them. After it returns, every read is done (the next
// batch may write slot 0).
__device__ __forceinline__ void mean_weights_rows(uint32_t (&a)[4], const float* rbuf,
                                                  const float (&m_ref)[2], int count, int warp,
                                                  int lane) {
  const int q = lane & 3, i = warp * 8 + (lane >> 2);  // store_rm's index of this quad
  __syncwarp();  // the (r, m) slots written by the q == 0 lanes are visible
#pragma unroll
  for (int hk = 0; hk < 2; ++hk)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 2 * q + 8 * hk + e;
        const float r_t = rbuf[t * 128 + 32 * h + i], m_t = rbuf[t * 128 + 64 + 32 * h + i];
        v[e] = (t < count) ? r_t * ex2(m_t - m_ref[h]) : 0.f;
      }
      a[2 * hk + h] = f16x2(v[1], v[0]);
    }
  __syncwarp();  // every read done before the next batch writes slot 0
}

// This thread's mean weights (mean_weights_rows' fragment) into its warpgroup's A tile in
// shared memory, 64 rows x 16 tiles f16 in the layout desc_means names, for a wgmma that reads
// A from shared memory: no weight registers live while PV runs. The fence makes the stores
// visible to the wgmma (async proxy).
__device__ __forceinline__ void store_weights(uint8_t* wtile, const uint32_t (&a)[4], int warp,
                                              int lane) {
  const int q = lane & 3, g = lane >> 2;
#pragma unroll
  for (int hk = 0; hk < 2; ++hk)
#pragma unroll
    for (int h = 0; h < 2; ++h)  // row 16 warp + g + 8h, tiles 8hk + 2q, + 1
      *reinterpret_cast<uint32_t*>(wtile + (2 * warp + h) * 256 + hk * 128 + g * 16 + 4 * q) =
          a[2 * hk + h];
  fence_proxy_async();
}

// The shared-memory buffer of batch `batch` (tiles MEAN_BATCH * batch ...): two buffers that
// alternate.
__device__ __forceinline__ uint32_t mean_buffer(uint32_t mbuf_base, int batch) {
  return mbuf_base + (batch & 1) * (MEAN_BATCH * D * 2);
}

// Tile (r, m) into slot t of this warpgroup's rows. A slot is 128 floats: r of rows 16 warp + g,
// r of rows 16 warp + g + 8, m of the same, m of the same, 32 each at index i = 8 warp + g
// (g = lane / 4), which is the thread's index in its warpgroup over 4. The q == 0 lane of each
// quad holds the rows' r (ExpCast's ones column) and stores; for it, 4 i is its index in the
// warpgroup itself, so the byte offset needs no arithmetic beyond that and the stores take one
// base register with immediate offsets (no pair of registers to fill, as float2 stores need).
// rm_lanes: the warpgroup's slot 0 less 128 (cw + 1), so that + threadIdx.x is the thread's
// index in its warpgroup: uniform, the address one add to threadIdx.x.
__device__ __forceinline__ void store_rm(uint32_t rm_lanes, int t, const float (&r)[2],
                                         const float (&m)[2]) {
  uint32_t tid;  // read here (volatile): no register holds it, or the address, across the loop
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
  const uint32_t at = rm_lanes + t * 512 + tid;
  asm volatile(
      "{\n.reg .pred p;\n"
      "setp.eq.b32 p, %0, 0;\n"
      "@p st.shared.f32 [%1], %2;\n"
      "@p st.shared.f32 [%1+128], %3;\n"
      "@p st.shared.f32 [%1+256], %4;\n"
      "@p st.shared.f32 [%1+384], %5;\n}\n" ::"r"(tid & 3),
      "r"(at), "f"(r[0]), "f"(r[1]), "f"(m[0]), "f"(m[1])
      : "memory");
}

// In the tile that carries the batch before it: the batch's weights against m (the max the
// tile's P is encoded against) into this warpgroup's A tile at wtile, for the SS wgmma in the
// tile's PV group.
__device__ __forceinline__ void stage_batch_weights(uint8_t* wtile, const float* rbuf,
                                                    const float (&m)[2], int warp, int lane) {
  uint32_t w[4];
  mean_weights_rows(w, rbuf, m, MEAN_BATCH, warp, lane);
  store_weights(wtile, w, warp, lane);
  __syncwarp();  // a warp's weight rows are the A rows its part of the wgmma reads
}

// After the last tile: the batches still owed, against the final max m, into acc: the last
// tile's and, when the last tile opens a batch (its (r, m) then in slot 16), the batch before
// it (else a product of zero weights: no branch around a wgmma).
__device__ __forceinline__ void add_owed_batches(float (&acc)[64], const float* rbuf,
                                                 uint32_t mbuf_base, const float (&m)[2],
                                                 int last, int warp, int lane) {
  const bool opens = (last & (MEAN_BATCH - 1)) == 0;
  uint32_t w_prev[4], w[4];
  mean_weights_rows(w_prev, rbuf, m, opens && last > 0 ? MEAN_BATCH : 0, warp, lane);
  mean_weights_rows(w, opens ? rbuf + MEAN_BATCH * 128 : rbuf, m,
                    opens ? 1 : (last & (MEAN_BATCH - 1)) + 1, warp, lane);
  reg_fence(acc);
  wgmma_fence();
  wgmma_f16_rs_n128(acc, w_prev, desc_means(mean_buffer(mbuf_base, (last >> 4) - 1)));
  wgmma_f16_rs_n128(acc, w, desc_means(mean_buffer(mbuf_base, last >> 4)));
  wgmma_commit();
  wgmma_wait<0>();
  reg_fence(acc);
}

}  // namespace vc
