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
constexpr int QBLOCK = 128;  // Q smoothing's query block: one score-term row for its 128 rows
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

// The tile rule: a CTA holds 192 query rows, three consumer warpgroups of 64 rows that each run
// QK, the softmax with P's NVFP4 quantization, and PV in order on their tile (each scheduler
// then has three independent chains), fed by one producer warpgroup through 2-stage rings of
// 128-key K and V tiles (FP16: 32 KB each; a third stage does not fit beside 192 rows of Q),
// their rows in key_of's order (so a thread's scores hold whole microscale groups of P).
// A consumer thread holds the accumulator (64 registers, the PV wgmma's) and the scores (64,
// then P's A fragment, 32): 160 a thread, the producer's given to the consumers (setmaxnreg).
// What makes that fit: one softmax in the loop (Q smoothing's term masks the padded keys, so
// its instances need no masked copy), the row sum kept in acc's units (no s1 across tiles),
// and the mean step's A fragment in two registers. Measured and replaced (docs/perf.md): two
// consumer warpgroups at 240 registers, each issuing the next tile's QK beside this tile's PV
// and softmax: 2.2% slower for sage3-4bit and vc-4bit, tied for attnqat-tf.
template <bool TWO_LEVEL_, bool VSMOOTH_, bool BIAS_>
struct Traits {
  static constexpr bool TWO_LEVEL = TWO_LEVEL_;  // P under a per-row scale s1 (sage3, vc-4bit)
  static constexpr bool VSMOOTH = VSMOOTH_;      // V-Smooth's mean term as one more PV k-step
  static constexpr bool BIAS = BIAS_;            // Q smoothing's score term added to S

  static constexpr int CONSUMERS = 3;
  static constexpr int BM = 64 * CONSUMERS;  // query rows per CTA
  static constexpr int THREADS = 128 * (CONSUMERS + 1);
  static constexpr int PRODUCER_REGS = 24;
  static constexpr int CONSUMER_REGS = 160;
  static_assert(128 * PRODUCER_REGS + 128 * CONSUMERS * CONSUMER_REGS <= 65536, "register file");
  static constexpr int STAGES = 2;

  // P's dequantized values times P_SHIFT with V-Smooth (the mean step's sums fit FP16), else 1
  static constexpr float PSCALE = VSMOOTH ? P_SHIFT : 1.f;

  // Shared memory from a 1024-byte aligned base. Every 16-bit tile is two halves of 64 columns
  // (128 bytes a row, one 128-byte swizzle atom wide): Q (BM rows = queries, 24 KB a half), and
  // per stage K and V (128 rows = keys, in key_of's order), 16 KB a half, the
  // mean step's B operand (16 x 128 f16, K-major without swizzle), and the score term's rows of
  // the two query blocks the CTA's rows meet (a 192-row CTA starts at row 0 or 64 of a block).
  static constexpr int HALF = 128 * 128;                   // bytes of a K or V half
  static constexpr int TILE_BYTES = 2 * HALF;              // 32 KB
  static constexpr int Q_HALF = BM * 128;                  // bytes of a Q half
  static constexpr int Q_BYTES = 2 * Q_HALF;
  static constexpr int MEAN_BYTES = VSMOOTH ? 4096 : 0;    // 16 x 128 f16
  static constexpr int BIAS_ROWS = 2;
  static constexpr int BIAS_BYTES = BIAS ? BIAS_ROWS * BN * 4 : 0;  // FP32 rows
  static_assert(BM % 64 == 0 && BM <= 2 * QBLOCK - 64, "a CTA meets at most two query blocks");
  static constexpr int Q_OFF = 0;
  static constexpr int STAGE_OFF = Q_BYTES;
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
