// The NVFP4 kernel: a producer warpgroup that loads Q once and the K / V tiles (with
// V-Smooth's mean step and Q smoothing's bias rows) into the stage rings by TMA, and three
// consumer warpgroups that each run QK, the softmax with P's NVFP4 quantization, and PV in
// order on their 64 query rows, tile after tile, then the epilogue.
//
// Every 16-bit tile is two halves of 64 channels, rows of 128 bytes under the 128-byte swizzle.
// Q and K are K-major operands of S = Q K^T (desc_sw128): k-step kk (16 channels, 32 bytes) is
// half kk / 4 at byte (kk % 4) * 32 of its rows, the 8-bit kernel's k-step arithmetic. V, rows
// of keys as K's, is the N-major B operand of P V (desc_sw128_nmajor): k-step kk is rows 16kk
// .. 16kk + 15 of both halves. K's and V's rows come in key_of's order (the preprocessing
// writes them so), the order of P's columns: a thread's scores then hold whole microscale
// groups. The TMA maps address them in bytes (nvfp4_launch.cu).
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <math.h>

#include "mma.cuh"
#include "nvfp4_softmax.cuh"
#include "nvfp4_traits.cuh"
#include "pipeline.cuh"

namespace vc {

namespace nvfp4 {

template <class T>
__device__ __forceinline__ void produce(const CUtensorMap& tm_q, const CUtensorMap& tm_k,
                                        const CUtensorMap& tm_v, const Params& prm,
                                        uint32_t base, StageBarriers<T::STAGES> kb,
                                        StageBarriers<T::STAGES> vb, int m_block, int bh) {
  prefetch_tensormap(&tm_q);
  prefetch_tensormap(&tm_k);
  prefetch_tensormap(&tm_v);
  const uint32_t s_q = base + T::Q_OFF;
  mbar_expect_tx(kb.q(), T::Q_BYTES);
  const int q_row = bh * prm.nq_pad + m_block * T::BM;  // rows past the head's are not written
#pragma unroll
  for (int r = 0; r < T::BM / 64; ++r) {  // boxes of 64 rows
    tma_load_2d(s_q + r * 64 * 128, &tm_q, kb.q(), 0, q_row + 64 * r);
    tma_load_2d(s_q + T::Q_HALF + r * 64 * 128, &tm_q, kb.q(), 128, q_row + 64 * r);
  }
  // the score term's rows: the query blocks of the CTA's first and last row (the last clamped
  // to the head's blocks: rows past them are not written)
  const int qb0 = m_block * T::BM / QBLOCK;
  const int qb1 = min((m_block * T::BM + T::BM - 1) / QBLOCK, prm.q_blocks - 1);
  const int n_tiles = prm.n_tiles;
  for (int j = 0; j < n_tiles; ++j) {
    const int st = j % T::STAGES, free = ((j / T::STAGES) & 1) ^ 1;
    const uint32_t stage = base + T::STAGE_OFF + st * T::STAGE_BYTES;
    // K_j and Q smoothing's row (both read by QK_j's softmax), then V_j and its mean step
    mbar_wait(kb.empty(st), free);
    mbar_expect_tx(kb.full(st), T::TILE_BYTES + T::BIAS_BYTES);
    const int k_row = bh * prm.nk_pad + j * BN;
    tma_load_2d(stage + T::K_OFF, &tm_k, kb.full(st), 0, k_row);
    tma_load_2d(stage + T::K_OFF + T::HALF, &tm_k, kb.full(st), 128, k_row);
    if constexpr (T::BIAS) {
      const size_t key0 = static_cast<size_t>(j) * BN;
      const size_t row = static_cast<size_t>(bh) * prm.q_blocks;
      bulk_load(stage + T::BIAS_OFF, prm.bias + (row + qb0) * prm.nk_pad + key0, BN * 4,
                kb.full(st));
      bulk_load(stage + T::BIAS_OFF + BN * 4, prm.bias + (row + qb1) * prm.nk_pad + key0, BN * 4,
                kb.full(st));
    }
    mbar_wait(vb.empty(st), free);
    mbar_expect_tx(vb.full(st), T::TILE_BYTES + T::MEAN_BYTES);
    tma_load_2d(stage + T::V_OFF, &tm_v, vb.full(st), 0, k_row);
    tma_load_2d(stage + T::V_OFF + T::HALF, &tm_v, vb.full(st), 128, k_row);
    if constexpr (T::VSMOOTH)
      bulk_load(stage + T::MEAN_OFF, prm.mean + (static_cast<size_t>(bh) * n_tiles + j) * 2048,
                T::MEAN_BYTES, vb.full(st));
  }
}

// S = Q K_j^T for a warpgroup's 64 rows: 8 k-steps of 16 channels. With Q smoothing's score
// term the product accumulates onto s, which holds the tile's bias row (load_bias).
template <class T>
__device__ __forceinline__ void issue_qk(float (&s)[64], uint32_t s_q, uint32_t s_k) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint64_t dq = desc_sw128(s_q + (kk / 4) * T::Q_HALF) + 2 * (kk % 4);
    const uint64_t dk = desc_sw128(s_k + (kk / 4) * T::HALF) + 2 * (kk % 4);
    if (kk == 0 && !T::BIAS)
      wgmma_f16_ss_n128_first(s, dq, dk);
    else
      wgmma_f16_ss_n128(s, dq, dk);
  }
}

// Q smoothing's score term for tile j's keys into the QK accumulator before QK_j: every row of
// the warpgroup's query block takes the same bias row, in key order in shared memory: S
// columns 8c + 2q + {0, 1} hold keys key_of(c, q, {0, 1}), one 8-byte load a row and block
// (16-byte loads of two blocks' four keys spilled: their four registers must be consecutive).
// The tensor core then adds Q K_j^T to it, so the scores come out final, with no add of their
// own (64 FFMA a tile and thread fewer: the softmax issues every instruction it saves). The
// term comes only without outer scales of Q and K (c = 1, the units the term is in): the NVFP4
// preprocessing takes no plan with both, and the launcher refuses them too.
// Each row's pair is loaded on its own (volatile: not merged into one load), which costs one
// load a pair where a copy into the second row would cost two moves.
__device__ __forceinline__ void load_bias(float (&s)[64], uint32_t bias, int q) {
#pragma unroll
  for (int c = 0; c < 16; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      asm volatile("ld.volatile.shared.v2.f32 {%0, %1}, [%2];\n"
                   : "=f"(s[4 * c + 2 * h]), "=f"(s[4 * c + 2 * h + 1])
                   : "r"(bias + 4 * key_of(c, q, 0)));
}

// acc += P V_j: 8 k-steps of 16 keys, P from registers; with V-Smooth one more, the tile's row
// sums times its mean.
template <class T>
__device__ __forceinline__ void issue_pv(float (&acc)[64], const uint32_t (&p)[32], uint32_t s_v,
                                         [[maybe_unused]] const uint32_t (&a_mean)[2],
                                         [[maybe_unused]] uint32_t s_mean) {
  const uint64_t dv = desc_sw128_nmajor(s_v, T::HALF);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {  // k-step kk: 16 rows of 128 bytes on, 128 in 16-byte units
    const uint32_t a[4] = {p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3]};
    wgmma_f16_rs_n128_nmajor(acc, a, dv + 128 * kk);
  }
  if constexpr (T::VSMOOTH) {
    const uint32_t a[4] = {a_mean[0], a_mean[1], a_mean[0], a_mean[1]};  // mean_fragment: why
    wgmma_f16_rs_n128(acc, a, desc_means(s_mean));
  }
}

template <class T>
__device__ __forceinline__ void consume(const Params& prm, uint32_t base,
                                        StageBarriers<T::STAGES> kb, StageBarriers<T::STAGES> vb,
                                        int m_block, int bh, int wg, int tid) {
  const int cw = __shfl_sync(0xffffffffu, wg - 1, 0);  // warp-uniform
  const int warp = tid / 32, lane = tid % 32, q = lane & 3, g = lane >> 2;
  const int row0 = m_block * T::BM + cw * 64 + warp * 16 + g;  // rows row0, row0 + 8
  const uint32_t s_q = base + T::Q_OFF + cw * 64 * 128;        // this warpgroup's 64 rows
  // which of the stage's two score-term rows this warpgroup's query block reads
  const int bias_row = (m_block * T::BM + cw * 64) / QBLOCK - m_block * T::BM / QBLOCK;
  // the scores' outer scale; 1 with Q smoothing's term, which comes only without outer scales
  const float c = !T::BIAS && prm.q_outer != nullptr ? prm.q_outer[bh] * prm.k_outer[bh] : 1.f;

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  float s[64];
  uint32_t p[32], a_mean[2] = {0u, 0u};
  RowState row;
  const int last = prm.n_tiles - 1;
  static_assert(T::STAGES == 2, "stage j & 1, parity (j >> 1) & 1");
  // One tile: QK_j, the softmax, acc's rescale, PV_j, in order; the other warpgroups' products
  // and softmaxes run beside each step.
  mbar_wait(kb.q(), 0);
  for (int j = 0; j <= last; ++j) {
    const uint32_t stage = base + T::STAGE_OFF + (j & 1) * T::STAGE_BYTES;
    mbar_wait(kb.full(j & 1), (j >> 1) & 1);
    if constexpr (T::BIAS) {
      load_bias(s, stage + T::BIAS_OFF + bias_row * BN * 4, q);
      reg_fence(s);  // defined before the fence, as the PV operands are (C7513)
    }
    wgmma_fence();
    issue_qk<T>(s, s_q, stage + T::K_OFF);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(s);
    mbar_arrive(kb.empty(j & 1));  // K_j and its bias rows read
    // The keys past n: with Q smoothing's term, its -inf there (triton/nvfp4.py score_term)
    // masks them before the softmax; else the masked softmax for the last tile (a branch
    // without a wgmma in it: a second softmax in the loop costs registers).
    if (T::BIAS || j < last)
      softmax_tile<T, false>(s, acc, p, row, a_mean, c, BN, q);
    else
      softmax_tile<T, true>(s, acc, p, row, a_mean, c, prm.n - j * BN, q);
    mbar_wait(vb.full(j & 1), (j >> 1) & 1);
    // every register the PV wgmmas read is defined before their fence: otherwise ptxas may
    // schedule a definition inside the wgmma stage and serialize it (C7513)
    reg_fence(acc);
    reg_fence(p);
    if constexpr (T::VSMOOTH) reg_fence(a_mean);
    wgmma_fence();
    issue_pv<T>(acc, p, stage + T::V_OFF, a_mean, stage + T::MEAN_OFF);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(acc);
    mbar_arrive(vb.empty(j & 1));  // V_j and its mean step read
  }

  // O = acc / (PSCALE l) * v_outer (acc and l in the last tile's units), rows past n (the
  // padding) not written
  const float v_outer = prm.v_outer != nullptr ? prm.v_outer[bh] : 1.f;
  const int b = bh / prm.heads, hd = bh % prm.heads;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row_n = row0 + 8 * h;
    const float scale = (1.f / T::PSCALE) * v_outer / row.l[h];
    if (row_n >= prm.n) continue;
    const long long off = b * prm.out_sb + hd * prm.out_sh + row_n * prm.out_sn;
#pragma unroll
    for (int cc = 0; cc < 16; ++cc) {
      const int col = 8 * cc + 2 * q;
      const float o0 = acc[4 * cc + 2 * h] * scale, o1 = acc[4 * cc + 2 * h + 1] * scale;
      if (prm.out_kind == OUT_BF16)
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(prm.out) + off + col) =
            __floats2bfloat162_rn(o0, o1);
      else if (prm.out_kind == OUT_FP16)
        *reinterpret_cast<__half2*>(static_cast<__half*>(prm.out) + off + col) =
            __floats2half2_rn(o0, o1);
      else
        *reinterpret_cast<float2*>(static_cast<float*>(prm.out) + off + col) = make_float2(o0, o1);
    }
  }
}

template <class T>
__global__ void __launch_bounds__(T::THREADS, 1)
    nvfp4_attention_kernel(const __grid_constant__ CUtensorMap tm_q,
                           const __grid_constant__ CUtensorMap tm_k,
                           const __grid_constant__ CUtensorMap tm_v, const Params prm) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const StageBarriers<T::STAGES> kb{base + T::BAR_OFF}, vb{base + T::VBAR_OFF};
  const int m_block = blockIdx.x, bh = blockIdx.y;
  const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    kb.init(128 * T::CONSUMERS);
    vb.init(128 * T::CONSUMERS);
  }
  __syncthreads();
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(T::PRODUCER_REGS));
    if (tid == 0) produce<T>(tm_q, tm_k, tm_v, prm, base, kb, vb, m_block, bh);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(T::CONSUMER_REGS));
    consume<T>(prm, base, kb, vb, m_block, bh, wg, tid);
  }
}

}  // namespace nvfp4

}  // namespace vc
