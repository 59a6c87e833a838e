// What one NVFP4 instance of the kernel is: the NVFP4 fidelity path on FP16 wgmma. Q, K and V
// arrive as exactly dequantized NVFP4 values in FP16 (an E2M1 code times its E4M3 microscale
// has at most 6 significant bits in [2^-10, 2688]), so QK is an FP16 wgmma whose products are
// exact; P is quantized to NVFP4 in registers and dequantized exactly to FP16 for the PV wgmma.
#pragma once
#include <cuda_fp16.h>
#include <stdint.h>

namespace vc {

namespace nvfp4 {

constexpr int D = 128;   // head dim
constexpr int BN = 128;  // keys per KV tile = V-Smooth block
// (448 * 6): the two-level P scale s1 = rowmax(P~) / P_OUTER spans E4M3 x E2M1
constexpr float P_OUTER = 2688.f;
constexpr float LOG2_P_OUTER = 11.392317422778761f;  // log2(2688), rounded to FP32
// V-Smooth's mean term rides the PV wgmma as one more k-step whose A is the tile's row sums
// of P~ / s1 (up to 128 * 2688, past FP16's 65504): with P's values and those sums scaled by
// 2^-6 (exact: P's dequantized values stay at or above 2^-16, exact FP16 subnormals), both fit.
constexpr float P_SHIFT = 0.015625f;

// What the kernel reads besides the tensor maps (launch.cu fills it from Nvfp4Args).
struct Params {
  const float* q_outer;   // per (batch, head), or null (then 1)
  const float* k_outer;
  const float* v_outer;
  const float* bias;      // Q smoothing's score term per (query block, key), or null
  const __half* mean;     // V-Smooth's mean steps, 2048 halves a tile, or null
  void* out;
  long long out_sb, out_sh, out_sn;
  int heads, n, nq_pad, nk_pad, n_tiles, q_blocks, out_kind;
};
constexpr int OUT_FP16 = 0, OUT_BF16 = 1, OUT_FP32 = 2;  // Params::out_kind

// The tile rule: a CTA holds 128 query rows, two consumer warpgroups of 64 rows, each running
// the next tile's QK and softmax beside this tile's PV (nvfp4_mainloop.cuh), fed by one
// producer warpgroup through 2-stage rings of 128-key K and V^T tiles (FP16: 32 KB each). At 16
// bits a third stage does not fit beside Q (227 KB). While the softmax runs, a consumer thread
// holds the accumulator (64 registers, the PV wgmma's), P's A fragment (32, read by it), the
// scores (64) and the softmax's own: ptxas needs more than 232, so two consumer warpgroups at
// 240, not the 8-bit kernel's three at 160 (measured: 24 registers spilled at 232).
template <bool TWO_LEVEL_, bool VSMOOTH_, bool BIAS_>
struct Traits {
  static constexpr bool TWO_LEVEL = TWO_LEVEL_;  // P under a per-row scale s1 (sage3, vc-4bit)
  static constexpr bool VSMOOTH = VSMOOTH_;      // V-Smooth's mean term as one more PV k-step
  static constexpr bool BIAS = BIAS_;            // Q smoothing's score term added to S

  static constexpr int CONSUMERS = 2;
  static constexpr int BM = 64 * CONSUMERS;  // query rows per CTA = Q smoothing's block
  static constexpr int THREADS = 128 * (CONSUMERS + 1);
  // setmaxnreg moves registers between the CTA's warpgroups and never adds any: the CTA holds
  // what its launch allocated, 168 a thread for 384 threads (65536 / 384, down to a multiple
  // of 8), and a consumer's increase waits until the producer's decrease has freed enough.
  static constexpr int PRODUCER_REGS = 24;
  static constexpr int CONSUMER_REGS = 240;
  static constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
  static_assert(128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= LAUNCH_REGS * THREADS,
                "the launch's registers");
  static constexpr int STAGES = 2;

  // P's dequantized values times P_SHIFT with V-Smooth (the mean step's sums fit FP16), else 1
  static constexpr float PSCALE = VSMOOTH ? P_SHIFT : 1.f;

  // Shared memory from a 1024-byte aligned base. Every 16-bit tile of 128 rows x 128 columns
  // is two halves of 64 columns (128 bytes a row, one 128-byte swizzle atom wide), 16 KB each:
  // Q (rows = queries), and per stage K (rows = keys), V^T (rows = channels, columns = keys),
  // the mean step's B operand (16 x 128 f16, K-major without swizzle), the bias row.
  static constexpr int HALF = 128 * 128;                   // bytes of a 64-column half
  static constexpr int TILE_BYTES = 2 * HALF;              // 32 KB
  static constexpr int MEAN_BYTES = VSMOOTH ? 4096 : 0;    // 16 x 128 f16
  static constexpr int BIAS_BYTES = BIAS ? BN * 4 : 0;     // 128 FP32
  static constexpr int Q_OFF = 0;
  static constexpr int STAGE_OFF = TILE_BYTES;
  static constexpr int K_OFF = 0, V_OFF = TILE_BYTES, MEAN_OFF = 2 * TILE_BYTES;
  static constexpr int BIAS_OFF = MEAN_OFF + MEAN_BYTES;
  static constexpr int STAGE_BYTES = (BIAS_OFF + BIAS_BYTES + 1023) / 1024 * 1024;
  // K's ring and V's ring (full[], empty[], q each; Q's barrier is K's): a stage's K is free
  // once the next QK has read it, its V only once PV has, a tile later
  static constexpr int BAR_OFF = STAGE_OFF + STAGES * STAGE_BYTES;
  static constexpr int BAR_BYTES = (2 * STAGES + 1) * 8;
  static constexpr int VBAR_OFF = BAR_OFF + BAR_BYTES;
  static constexpr int ALLOC = VBAR_OFF + BAR_BYTES + 1024;  // + base alignment
  static_assert(ALLOC <= 227 * 1024, "shared memory");
};

}  // namespace nvfp4

}  // namespace vc
