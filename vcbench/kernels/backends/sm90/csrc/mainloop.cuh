// The kernel: a producer warpgroup that loads Q once and the K/V tiles (with V-Smooth's means)
// into the stage ring by TMA, and three consumer warpgroups that each run QK, the online
// softmax and PV in order on their 64 query rows, tile after tile, then the epilogue.
//
// Layout decisions (the measurements behind each: docs/perf.md):
//
// * P goes from the QK accumulator to the FP8 A operand of the PV wgmma without any shuffle.
//   The s32 accumulator gives thread (warp w, lane = 4g + q) the columns 8c + 2q + {0,1} of
//   rows 16w + g (+8); the 8-bit A fragment wants keys 32kk + 16h + 4q + {0..3}. Instead of
//   moving bytes between threads, the K tile is loaded into shared memory with its rows
//   permuted so that S column n = 64h + 8G + 2q' + b holds key 16G + 4q' + 2h + b: then the
//   thread's own columns of blocks c = G and c = 8 + G are exactly the four consecutive keys
//   its A register needs, and two PRMTs build each register. The permutation costs nothing:
//   it is two 4-D TMA boxes per K tile (box {128 channels, 2 keys, 4 key pairs, 8 groups of
//   16} over strides {128, 512, 2048} bytes, starting at key 0 and key 2 of the tile).
//
// * ExpCast-FP8 (softmax.cuh): no MUFU on the P path. The row sum of the decoded codes comes
//   from the tensor core: the PV wgmma is N = 136 with an extra V row of ones (E4M3 1.0 =
//   0x38) and seven of zeros, so column 128 of the accumulator is P's row sum in FP32. Those
//   four accumulator registers are zeroed before every PV, so each tile's row sum r_j is read
//   exactly (for Equation 6).
//
// * Accumulation is two-level: each tile's PV product comes in its own register block and is
//   merged into acc in FP32 (softmax.cuh's merge_tile says why).
//
// * V-Smooth's mean term: each tile's (r_j, m_j) goes to shared memory; at the first tile of
//   each batch of 16 after the first, one f16 wgmma adds sum_t f16(r_t 2^(m_t - m)) mu_t^T of
//   the batch before it to that tile's PV block (the means of 16 tiles come in by one bulk
//   copy, 4 KB, laid out as the wgmma's B operand). The weights 2^(m_t - m) are the products of
//   the alphas the accumulator saw since tile t. mma.sync instead would wait for every wgmma in
//   flight on the SM, which with three warpgroups is always another warpgroup's.
//
// * At 160 registers a consumer thread has none to spare: the masked last tile runs outside
//   the loop, the K scale comes through shared memory, the Q scale and the warpgroup index are
//   warp-uniform, V-Smooth's batch weights go through shared memory, and the row sums wait in
//   shared memory across the cold tiles. No local memory.
#pragma once
#include <cuda.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <math.h>

#include <type_traits>

#include "epilogue.cuh"
#include "forward.cuh"
#include "mma.cuh"
#include "pipeline.cuh"
#include "softmax.cuh"
#include "traits.cuh"
#include "vsmooth.cuh"

namespace vc {

// The cold tiles (the one that carries a batch's mean product, the masked last one) need a few
// registers more than the loop's, which at 160 a thread has none to spare: the row sums wait in
// shared memory (this thread's 8 bytes) from the tile's start to their update, instead of ptxas
// spilling something to local memory. volatile: the store and the load stay where they are
// written.
__device__ __forceinline__ void park(uint32_t slot, const float (&l)[2]) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(slot), "f"(l[0]), "f"(l[1]) : "memory");
}
__device__ __forceinline__ void unpark(uint32_t slot, float (&l)[2]) {
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(l[0]), "=f"(l[1]) : "r"(slot) : "memory");
}

// ---------------- producer: one thread issues every copy ----------------
// Q's rows once; per tile j, into stage j % STAGES once the consumers released it: K (rows
// permuted, two 4-D boxes), V^T, the tile's K scale, and at each batch's first tile the
// batch's means (blocked, whole batches, zero-padded).
template <class T>
__device__ __forceinline__ void produce(const CUtensorMap& tm_q, const CUtensorMap& tm_k0,
                                        const CUtensorMap& tm_k1, const CUtensorMap& tm_v,
                                        const Params& prm, uint8_t* smem, uint32_t base,
                                        StageBarriers<T::STAGES> bars, int m_block, int bh,
                                        int n_tiles) {
  constexpr int STAGES = T::STAGES;
  const uint32_t s_q = base + T::Q_OFF;
  const uint32_t s_stage = base + T::STAGE_OFF;  // stage st: K at +st*STAGE_BYTES, V after it
  const uint32_t s_mbuf = base + T::MBUF_OFF;
  prefetch_tensormap(&tm_q);
  prefetch_tensormap(&tm_k0);
  prefetch_tensormap(&tm_k1);
  prefetch_tensormap(&tm_v);
  mbar_expect_tx(bars.q(), T::Q_BYTES);
  tma_load_2d(s_q, &tm_q, bars.q(), 0, bh * prm.n_pad + m_block * T::BM);
  [[maybe_unused]] float v_prev = 1.f;  // V_PER_TILE: the previous tile's V scale
  const float* k_scales = prm.k_scale + static_cast<size_t>(bh) * n_tiles;
  [[maybe_unused]] const float* v_scales = prm.v_scale + static_cast<size_t>(bh) * n_tiles;
  for (int j = 0; j < n_tiles; ++j) {
    const int st = j % STAGES;
    // The tile's scales are loaded before the wait for its stage, so their global loads'
    // latency passes while the consumers still hold the stage, not between its release and
    // the copies into it (the scales are read-only inputs: nothing orders them after the wait).
    const float k_s = k_scales[j];
    [[maybe_unused]] float v = 1.f;
    if constexpr (T::V_PER_TILE) v = v_scales[j];
    mbar_wait(bars.empty(st), ((j / STAGES) & 1) ^ 1);
    uint32_t bytes = T::K_BYTES + D * BN;
    int mean_tiles = 0;
    if (T::VSMOOTH && j % MEAN_BATCH == 0) {
      mean_tiles = min(MEAN_BATCH, n_tiles - j);
      bytes += MEAN_BATCH * D * 2;
    }
    // the tile's K scale beside it (released by the arrive below)
    reinterpret_cast<float*>(smem + T::KS_OFF)[st] = k_s;
    if constexpr (T::V_PER_TILE) {
      // merge_tile_scaled's (v_(j-1) / v_j, 1 / v_j). An all-zero V tile has scale 0 and codes
      // 0: any positive scale gives it the same (zero) product, 1 keeps the ratios finite. A
      // NaN scale (a non-finite input in this batch and head) stays NaN, and so does O.
      v = v == 0.f ? 1.f : v;
      const float inv = 1.f / v;
      reinterpret_cast<float2*>(smem + T::VS_OFF)[st] = make_float2(v_prev * inv, inv);
      v_prev = v;
    }
    mbar_expect_tx(bars.full(st), bytes);
    const uint32_t s_k = s_stage + st * T::STAGE_BYTES;
    const int g0 = (bh * prm.n_pad + j * BN) / 16;
    tma_load_4d(s_k, &tm_k0, bars.full(st), 0, 0, 0, g0);                  // keys 16G + 4q + {0,1}
    tma_load_4d(s_k + T::K_BYTES / 2, &tm_k1, bars.full(st), 0, 0, 0, g0);  // 16G + 4q + {2,3}
    tma_load_2d(s_k + T::K_BYTES, &tm_v, bars.full(st), j * BN, bh * D);
    if (T::VSMOOTH && mean_tiles > 0) {
      // the means come blocked (compiled.blocked_means), whole batches, zero-padded
      const int rows = (n_tiles + MEAN_BATCH - 1) / MEAN_BATCH * MEAN_BATCH;
      const __half* src = prm.v_mean + (static_cast<size_t>(bh) * rows + j) * D;
      bulk_load(mean_buffer(s_mbuf, j / MEAN_BATCH), src, MEAN_BATCH * D * 2, bars.full(st));
    }
  }
}

// ---------------- consumers: 64 query rows each ----------------
template <class T>
__device__ __forceinline__ void consume(const Params& prm, uint8_t* smem, uint32_t base,
                                        StageBarriers<T::STAGES> bars, int m_block, int bh,
                                        int wg, int tid, int n_tiles) {
  constexpr bool EXPCAST = T::EXPCAST, VSMOOTH = T::VSMOOTH;
  constexpr int STAGES = T::STAGES;
  const uint32_t s_q = base + T::Q_OFF;
  const uint32_t s_stage = base + T::STAGE_OFF;
  const uint32_t s_mbuf = base + T::MBUF_OFF;
  const int cw = wg - 1;
  const int warp = tid / 32, lane = tid % 32, q = lane & 3, g = lane >> 2;
  const int row0 = m_block * T::BM + cw * 64 + warp * 16 + g;  // rows row0, row0 + 8
  // the last CTA of a head may hold rows past n_pad (computed, never written)
  const int q_row = min(row0, prm.n_pad - 1);
  const float q_scale_row =
      prm.q_scale[static_cast<size_t>(bh) * (prm.n_pad / prm.q_rows) + q_row / prm.q_rows];
  // The Q scale is the same across the warp (q_rows is 16 or 128, and a warp's 16 rows start
  // at a multiple of 16); through a shuffle ptxas knows it and keeps it in a uniform
  // register, one vector register fewer at 160.
  const float q_scale = __shfl_sync(0xffffffffu, q_scale_row, 0);
  const float* k_scale = prm.k_scale + static_cast<size_t>(bh) * n_tiles;
  // The warpgroup index through a shuffle, which ptxas knows is warp-uniform, so what is
  // derived from it (Q's descriptor, the (r, m) slots' base) lives in uniform registers
  // instead of being rebuilt from the thread index every tile or held in a register.
  const int cw_u = __shfl_sync(0xffffffffu, cw, 0);
  float* rbuf = reinterpret_cast<float*>(smem + T::RBUF_OFF) + cw_u * T::RM_SLOTS * 128;

  // acc: FP32 on the CUDA cores; each tile's product comes in its own block (pv).
  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f;
  reg_fence(acc);  // zeros in registers now: left as constants, ptxas places them late and
                   // then serializes the wgmmas that write them (C7511)
  // the scores: raw s32 (INT8 QK) or FP32 (FP8 QK); P's code bytes go back into them
  std::conditional_t<T::QK_FP8, float, uint32_t> s[64];
  uint32_t p[16];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2], rsum[2] = {0.f, 0.f};

  const uint64_t desc_q = desc_sw128(s_q + cw_u * 64 * D);
  // A volatile load whose value is never used (each tile's K scale comes through shared
  // memory); ptxas drops it, but it is part of the program ptxas allocates registers for:
  // without it, the exp2 + V-Smooth instance's allocation moves (the measured build has it).
  [[maybe_unused]] const float k_scale_0 = __ldg(k_scale);
  mbar_wait(bars.q(), 0);

  // One tile. The masked softmax only in the last tile, which runs outside the loop, so the
  // loop's registers are the unmasked path's (with the mask's predicates in it, ptxas spilled
  // at 160 registers). The stage and its phase are counted, not j divided by STAGES.
  int stage = 0, phase = 0;
  // The descriptors as opaque 64-bit values (plus desc_zero, which ptxas cannot know is 0):
  // each k-step's is then one 64-bit uniform add, where a known constant high word made
  // ptxas rebuild both words of every descriptor every tile. dk: the stage's K tile.
  const uint64_t dq = desc_q + prm.desc_zero, dk0 = desc_sw128(s_stage) + prm.desc_zero;
  uint64_t dk = dk0;
  // store_rm's base, written from base (through rbuf, ptxas allocates the V-Smooth
  // instances' registers differently)
  [[maybe_unused]] const uint32_t rm_lanes =
      base + T::RBUF_OFF + cw_u * T::RM_SLOTS * 512 - 128 * (cw_u + 1);
  // V-Smooth: each tile's (r, m) stored per row (lane q == 0) after its merge; at tile
  // j = 16k (k >= 1) the batch of tiles j - 16 .. j - 1 is complete: its weights, against m_j
  // (the max P_j is encoded against), go to shared memory after the softmax, and its product
  // is one f16 wgmma (A and B from shared memory) in PV_j's group, into PV_j's block, which
  // the merge rescales and adds like the rest. The last batch (and the one before it, when
  // the last tile opens a batch) goes into acc after the loop.
  auto tile = [&](int j, auto last, auto with_mean) {
    constexpr bool LAST = decltype(last)::value;
    // MEAN: j = 16k (k >= 1), the tile that adds the batch before it. A straight copy of the
    // tile, not a guard: a wgmma under a branch serializes the loop's (C7520), a guarded one
    // costs its dummy product.
    constexpr bool MEAN = decltype(with_mean)::value && VSMOOTH;
    static_assert(!(MEAN && LAST), "the last tile's batch goes into acc after the loop");
    // (r, m)'s slot: j's place in its batch, except a last tile that opens a batch, which
    // takes slot 16 so that the batch before it, still owed, stays whole until after the loop
    [[maybe_unused]] const int rm_slot =
        LAST && (j & (MEAN_BATCH - 1)) == 0 ? MEAN_BATCH : j & (MEAN_BATCH - 1);
    constexpr bool COLD = MEAN || LAST;
    const uint32_t l_slot = base + T::PARK_OFF + (threadIdx.x - 128) * 8;
    if constexpr (COLD) park(l_slot, l);
    const int st = stage;
    // FP8 scores with V-Smooth: the parity from j (uniform registers), because with the
    // counted phase ptxas kept it in a vector register in the ExpCast + V-Smooth instance and
    // spilled it. Without V-Smooth j is a vector register, and j / 3 a wide multiply and
    // three shifts in front of every tile's wait.
    mbar_wait(bars.full(st), T::QK_FP8 && VSMOOTH ? (j / STAGES) & 1 : phase);
    const uint64_t dk_j = dk;
    const uint64_t dv_j = dk + (T::K_BYTES >> 4);
    stage = stage == STAGES - 1 ? 0 : stage + 1;
    phase ^= stage == 0;
    dk = stage == 0 ? dk0 : dk + (T::STAGE_BYTES >> 4);
    wgmma_fence();
    issue_qk(s, dq, dk_j);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(s);
    // the K scale from the stage (the producer wrote it): no register across tiles
    const float c_scale = q_scale * reinterpret_cast<const float*>(smem + T::KS_OFF)[st];
    softmax_tile<EXPCAST, LAST>(s, m, alpha, rsum, c_scale, prm.expcast_bias, prm.log2_p_scale,
                                LAST ? prm.n - j * BN : BN, q);
    // the batch's weights against m_j into this warpgroup's A tile (S's 32 code registers
    // live, not the PV block's 68): nothing more is live while PV runs than in any tile
    if constexpr (MEAN)
      stage_batch_weights(smem + T::WBUF_OFF + cw_u * 64 * MEAN_BATCH * 2, rbuf, m, warp, lane);
    pack_p<EXPCAST>(p, s);
    // MEAN: the batch's product in PV_j's group, into PV_j's block (merged with it), the
    // weights from shared memory
    [[maybe_unused]] const uint64_t desc_mu = desc_means(mean_buffer(s_mbuf, (j >> 4) - 1));
    [[maybe_unused]] const uint64_t desc_w =
        desc_means(smem_u32(smem + T::WBUF_OFF) + cw_u * 64 * MEAN_BATCH * 2);
    float pv[T::NACC];
    reg_fence(p);
    wgmma_fence();
    issue_pv(pv, p, dv_j);
    if constexpr (MEAN) wgmma_f16_ss_n128(pv, desc_w, desc_mu);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(pv);
    reg_fence(p);
    [[maybe_unused]] float2 vtile;  // read before the stage is released
    if constexpr (T::V_PER_TILE) vtile = reinterpret_cast<const float2*>(smem + T::VS_OFF)[st];
    mbar_arrive(bars.empty(st));
    float r[2];
    tile_rowsum<EXPCAST>(pv, rsum, r);
    if constexpr (COLD) unpark(l_slot, l);
    if constexpr (T::V_PER_TILE)
      merge_tile_scaled(acc, pv, l, alpha, r, vtile.x, vtile.y);
    else
      merge_tile(acc, pv, l, alpha, r);
    if constexpr (VSMOOTH) store_rm(rm_lanes, rm_slot, r, m);
  };
  // tiles 0 .. last - 1 in batches; a batch's first tile (from the second batch on) carries
  // the previous batch's product: no branch around a wgmma
  const int last = n_tiles - 1;
  if constexpr (VSMOOTH) {
    int j = 0;
    for (const int e = min(MEAN_BATCH, last); j < e; ++j) tile(j, With<false>{}, With<false>{});
    while (j < last) {
      tile(j, With<false>{}, With<true>{});
      ++j;
      // the batch's other tiles, counted down (two instructions a tile; the bound
      // min(j + 15, last) was rebuilt every tile, three)
      for (int k = min(MEAN_BATCH - 1, last - j); k > 0; --k, ++j)
        tile(j, With<false>{}, With<false>{});
    }
  } else {
    for (int j = 0; j < last; ++j) tile(j, With<false>{}, With<false>{});
  }
  tile(last, With<true>{}, With<false>{});
  if constexpr (VSMOOTH) add_owed_batches(acc, rbuf, s_mbuf, m, last, warp, lane);
  store_output<T>(acc, l, prm, bh, row0, lane, q);
}

template <class T>
__global__ void __launch_bounds__(T::THREADS, 1)
    vc_attention_kernel(const __grid_constant__ CUtensorMap tm_q,
                        const __grid_constant__ CUtensorMap tm_k0,
                        const __grid_constant__ CUtensorMap tm_k1,
                        const __grid_constant__ CUtensorMap tm_v, const Params prm) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const StageBarriers<T::STAGES> bars{base + T::BAR_OFF};

  const int m_block = blockIdx.x;
  const int bh = blockIdx.y;
  const int wg = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  const int n_tiles = prm.n_tiles;

  if (threadIdx.x == 0) bars.init(128 * T::CONSUMERS);
  if constexpr (T::EXPCAST) {  // the 8 extra V rows: row 128 all E4M3 1.0 (0x38), 129..135 zero
    for (int i = threadIdx.x; i < T::STAGES * 256; i += T::THREADS) {
      const int st = i / 256, w = i % 256;
      uint32_t* ones = reinterpret_cast<uint32_t*>(smem + T::STAGE_OFF + st * T::STAGE_BYTES +
                                                   T::K_BYTES + D * BN);
      ones[w] = w < 32 ? 0x38383838u : 0u;
    }
  }
  if constexpr (T::VSMOOTH) {  // mean rows past the last tile are multiplied by 0: keep them finite
    uint32_t* mb = reinterpret_cast<uint32_t*>(smem + T::MBUF_OFF);
    for (int i = threadIdx.x; i < T::MBUF_BYTES / 4; i += T::THREADS) mb[i] = 0u;
  }
  fence_proxy_async();  // seen by wgmma / TMA
  __syncthreads();

  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(T::PRODUCER_REGS));
    if (tid == 0) produce<T>(tm_q, tm_k0, tm_k1, tm_v, prm, smem, base, bars, m_block, bh, n_tiles);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(T::CONSUMER_REGS));
    consume<T>(prm, smem, base, bars, m_block, bh, wg, tid, n_tiles);
  }
}

}  // namespace vc
