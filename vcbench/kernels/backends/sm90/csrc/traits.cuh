// What one instance of the kernel is: its tile shape, its warpgroups and their registers, its
// pipeline depth and its shared-memory layout, as named constants of one traits struct per
// (P encoding, V-Smooth, score format, V scale) choice, and the kernel's runtime parameters.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

#include "forward.cuh"

namespace vc {

constexpr int D = 128;   // head dim
constexpr int BN = 128;  // keys per KV tile = K scale block = V-Smooth block

// What the kernel reads besides the tensor maps (launch.cu fills it from ForwardArgs).
struct Params {
  const float* q_scale;
  const float* k_scale;
  const float* v_scale;
  const __half* v_mean;
  void* out;
  long long out_sb, out_sh, out_sn;
  int heads, n, n_pad, n_tiles, q_rows, out_bf16;
  float expcast_bias, log2_p_scale;
  uint64_t desc_zero;  // 0, which ptxas cannot see (mainloop.cuh's descriptors say why)
};

// The tile rule: a CTA holds 192 query rows, three consumer warpgroups of 64 rows that each run
// QK, softmax and PV in order on their tile (each scheduler then has three independent chains),
// fed by one producer warpgroup through a 3-stage ring of 128-key K/V tiles; the producer gives
// its registers to the consumers (setmaxnreg), 160 a consumer thread. Measured and rejected
// (docs/perf.md):
//   2 consumer warpgroups that take turns on the tensor core (ping-pong): 9-16% slower.
//   128 query rows per warpgroup: S and the accumulator alone need 256 registers a thread.
//   4 stages: no faster, 204 KB of shared memory.
//   PV in two column halves: not faster, and ptxas spilled.
//   QK in two halves of 64 keys, the first's max and I2FP beside the second: slower.
//   The three warpgroups' QK issues taken in turn (a ring of named barriers): slower for ExpCast.
template <bool EXPCAST_, bool VSMOOTH_, bool QK_FP8_ = false, bool V_PER_TILE_ = false>
struct Traits {
  static constexpr bool EXPCAST = EXPCAST_;  // P by ExpCast-FP8, else by exp2 then E4M3
  static constexpr bool VSMOOTH = VSMOOTH_;  // V-Smooth's mean term restored in the kernel
  static constexpr bool QK_FP8 = QK_FP8_;    // Q, K in E4M3 (FP32 scores), else INT8
  static constexpr bool V_PER_TILE = V_PER_TILE_;  // one V scale per KV tile, else per channel
  static_assert(!(V_PER_TILE && VSMOOTH), "V-Smooth's V is scaled per channel");

  static constexpr int CONSUMERS = 3;  // consumer warpgroups
  static constexpr int ROWS_PER_CONSUMER = 64;
  static constexpr int BM = ROWS_PER_CONSUMER * CONSUMERS;  // query rows per CTA
  static constexpr int THREADS = 128 * (CONSUMERS + 1);     // + the producer warpgroup
  static constexpr int PRODUCER_REGS = 32;
  static constexpr int CONSUMER_REGS = 160;
  static constexpr int STAGES = 3;  // K/V tiles in flight
  static_assert(128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= 65536, "register file");

  static constexpr int PV_N = EXPCAST ? 136 : 128;  // + ones column (ExpCast's row sum)
  static constexpr int NACC = PV_N / 2;             // PV accumulator registers per thread

  // Shared memory, from a 1024-byte aligned base: Q, the stages (K, then V^T and, for
  // ExpCast, its 8 extra rows: ones, zeros), V-Smooth's two mean buffers, its (r, m) slots and
  // weight tiles, the mbarriers, each stage's K scale, and the parked row sums.
  static constexpr int Q_BYTES = BM * D;
  static constexpr int K_BYTES = BN * D;
  static constexpr int V_BYTES = D * BN + (EXPCAST ? 1024 : 0);
  static constexpr int STAGE_BYTES = K_BYTES + V_BYTES;
  static constexpr int Q_OFF = 0;
  static constexpr int STAGE_OFF = Q_OFF + Q_BYTES;
  static constexpr int MBUF_OFF = STAGE_OFF + STAGES * STAGE_BYTES;
  static constexpr int MBUF_BYTES = VSMOOTH ? 2 * MEAN_BATCH * D * 2 : 0;  // 2 x 16 x 128 fp16
  static constexpr int RBUF_OFF = MBUF_OFF + MBUF_BYTES;
  // (r, m) per row and tile of a batch, and a 17th slot (the last tile's, when it opens a batch)
  static constexpr int RM_SLOTS = MEAN_BATCH + 1;
  static constexpr int RBUF_BYTES = VSMOOTH ? CONSUMERS * RM_SLOTS * 64 * 8 : 0;
  // the mean weights, per warpgroup (A of the mean product's wgmma)
  static constexpr int WBUF_OFF = RBUF_OFF + RBUF_BYTES;
  static constexpr int WBUF_BYTES = VSMOOTH ? CONSUMERS * 64 * MEAN_BATCH * 2 : 0;
  static constexpr int BAR_OFF = WBUF_OFF + WBUF_BYTES;  // full[STAGES], empty[STAGES], q
  static constexpr int BAR_BYTES = (2 * STAGES + 1) * 8;
  static constexpr int KS_OFF = BAR_OFF + BAR_BYTES;  // each stage's K scale
  static constexpr int KS_BYTES = STAGES * 4;
  // V_PER_TILE: each stage's (ratio, inv) of merge_tile_scaled
  static constexpr int VS_OFF = (KS_OFF + KS_BYTES + 7) / 8 * 8;
  static constexpr int VS_BYTES = V_PER_TILE ? STAGES * 8 : 0;
  // each consumer thread's row sums, parked across the cold tiles
  static constexpr int PARK_OFF = (VS_OFF + VS_BYTES + 15) / 16 * 16;
  static constexpr int PARK_BYTES = 128 * CONSUMERS * 8;
  static constexpr int ALLOC = PARK_OFF + PARK_BYTES + 1024;  // + base alignment
  static_assert(STAGE_BYTES % 1024 == 0 && Q_BYTES % 1024 == 0, "128B-swizzle atoms");
  static_assert(STAGES >= 2 && STAGES < MEAN_BATCH, "mean buffers are reused every 2 batches");
};

}  // namespace vc
