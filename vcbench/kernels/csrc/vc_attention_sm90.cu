// VC-Attention forward for Hopper (sm_90a): INT8 QK^T and FP8 PV on wgmma, Q/K/V tiles by TMA
// into a multi-stage shared-memory pipeline on mbarriers, one producer warpgroup and two or
// three consumer warpgroups (64 query rows each), ExpCast-FP8 or exp2-then-cast for P, V-Smooth's
// mean restored in the same accumulator (paper Equation 6). Semantics: the Triton kernel
// (vcbench/kernels/triton/attention.py) and its oracle, the emulation (online.py).
//
// Layout decisions (each is argued in docs/perf.md, "compiled kernel (issue 7)"):
//
// * 64 query rows per consumer warpgroup. A 64x128 S tile is 64 s32 registers per thread and
//   the 64x128 output accumulator 64 fp32 more; 128 rows per warpgroup would need 256 for
//   those two alone, over the 255-register limit.
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
// * ExpCast-FP8: one FFMA from the integer score (converted by I2FP) to t = 8 S + 120 + beta
//   - 8 m, a max with 0, and the magic-number add whose low byte is rne(t): the E4M3 code.
//   No MUFU on the P path. The row sum of the decoded codes comes from the tensor core: the
//   PV wgmma is N = 136 with an extra V row of ones (E4M3 1.0 = 0x38) and seven of zeros, so
//   column 128 of the accumulator is P's row sum in FP32. Those four accumulator registers are
//   zeroed before every PV, so each tile's row sum r_j is read exactly (for Equation 6).
//
// * V-Smooth's mean term: each tile's (r_j, m_j) goes to shared memory; every 16 tiles one
//   m16n8k16 FP16 mma.sync per 8 output columns adds sum_t f16(r_t 2^(m_t - m)) mu_t^T to the
//   accumulator (the means of 16 tiles come in by one bulk copy, 4 KB). The weights
//   2^(m_t - m) are the products of the alphas the accumulator saw since tile t.
//
// * "simple": each consumer warpgroup runs QK, softmax, PV in order on its tile. The ping-pong
//   variants: a warpgroup issues QK_j and PV_{j-1} together, and a pair of named barriers makes
//   the two warpgroups take turns issuing, so one's softmax overlaps the other's matrix
//   products. -vs3s issues V-Smooth's mean product as a wgmma in that turn instead of mma.sync.
//
// * "simple-3wg", every plan's default: three consumer warpgroups (192 query rows, 160
//   registers a thread) on the simple schedule: each scheduler has three independent chains
//   instead of two that take turns (vc-8bit 9.5% faster than -late, session 19). At 160
//   registers there is none to spare: the masked last tile runs outside the loop, the K scale
//   comes through shared memory, the Q scale and the warpgroup index are warp-uniform, V-Smooth's
//   batch product is an SS wgmma in PV's group of each batch's first tile with its weights in
//   shared memory (mma.sync would wait for the other warpgroups' wgmmas), and the row sums wait
//   in shared memory across the cold tiles. No local memory.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <climits>

#include "vc_attention_sm90.cuh"
#include "wgmma_sm90.cuh"

namespace vc {

constexpr int D = 128;           // head dim
constexpr int BN = 128;          // keys per KV tile = K scale block = V-Smooth block
// NC consumer warpgroups of 64 query rows each (two in every variant but "simple-3wg") and one
// producer warpgroup; setmaxnreg: the producer gives its registers to the consumers.
template <int NC>
struct Warpgroups {
  static constexpr int BM = 64 * NC;  // query rows per CTA
  static constexpr int THREADS = 128 * (NC + 1);
  static constexpr int PRODUCER_REGS = NC == 2 ? 40 : 32;
  static constexpr int CONSUMER_REGS = NC == 2 ? 232 : 160;  // 2: 128 x 40 + 256 x 232 = 64512
  static_assert(NC == 2 || NC == 3, "two or three consumer warpgroups");
  static_assert(128 * PRODUCER_REGS + 128 * NC * CONSUMER_REGS <= 65536, "register file");
};

struct Params {
  const float* q_scale;
  const float* k_scale;
  const float* v_scale;
  const __half* v_mean;
  void* out;
  long long out_sb, out_sh, out_sn;
  int heads, n, n_pad, n_tiles, q_rows, out_bf16;
  float expcast_bias, log2_p_scale;
  uint64_t desc_zero;  // 0 (see the 3-warpgroup loop's descriptors)
};

template <bool EXPCAST, bool VSMOOTH, bool PINGPONG, int STAGES, bool VS3 = false, int NC = 2>
struct Config {
  static constexpr int BM = Warpgroups<NC>::BM;
#ifdef VC_PROBE_NO_ONES  // timing probe (compiled.PROBES): ExpCast's row sums wrong by design
  static constexpr int PV_N = 128;
#else
  static constexpr int PV_N = EXPCAST ? 136 : 128;  // + ones column (ExpCast's row sum)
#endif
  static constexpr int NACC = PV_N / 2;             // accumulator registers per thread
  static constexpr int Q_BYTES = BM * D;
  static constexpr int K_BYTES = BN * D;
  static constexpr int V_BYTES = D * BN + (EXPCAST ? 1024 : 0);  // + 8 rows: ones, zeros
  static constexpr int STAGE_BYTES = K_BYTES + V_BYTES;
  static constexpr int Q_OFF = 0;
  static constexpr int STAGE_OFF = Q_OFF + Q_BYTES;
  static constexpr int MBUF_OFF = STAGE_OFF + STAGES * STAGE_BYTES;
  static constexpr int MBUF_BYTES = VSMOOTH ? 2 * MEAN_BATCH * D * 2 : 0;  // 2 x 16 x 128 fp16
  static constexpr int RBUF_OFF = MBUF_OFF + MBUF_BYTES;
  // (r, m) per row and tile of a batch; 3 warpgroups: a 17th slot (the last tile's, when it
  // opens a batch)
  static constexpr int RM_SLOTS = NC == 3 ? MEAN_BATCH + 1 : MEAN_BATCH;
  static constexpr int RBUF_BYTES = VSMOOTH ? NC * RM_SLOTS * 64 * 8 : 0;
  // VS3 and 3 warpgroups: the mean weights, per warpgroup (A of the mean product's wgmma)
  static constexpr int WBUF_OFF = RBUF_OFF + RBUF_BYTES;
  static constexpr int WBUF_BYTES = VSMOOTH && (VS3 || NC == 3) ? NC * 64 * MEAN_BATCH * 2 : 0;
  static constexpr int BAR_OFF = WBUF_OFF + WBUF_BYTES;
  static constexpr int BAR_BYTES = (2 * STAGES + 1) * 8;
  static constexpr int KS_OFF = BAR_OFF + BAR_BYTES;  // 3 warpgroups: each stage's K scale
  static constexpr int KS_BYTES = NC == 3 ? STAGES * 4 : 0;
  // 3 warpgroups: each consumer thread's row sums, parked across the cold tiles
  static constexpr int PARK_OFF = (KS_OFF + KS_BYTES + 15) / 16 * 16;
  static constexpr int PARK_BYTES = NC == 3 ? 128 * NC * 8 : 0;
  static constexpr int ALLOC = PARK_OFF + PARK_BYTES + 1024;  // + base alignment
  static_assert(STAGE_BYTES % 1024 == 0 && Q_BYTES % 1024 == 0, "128B-swizzle atoms");
  static_assert(STAGES >= 2 && STAGES < MEAN_BATCH, "mean buffers are reused every 2 batches");
};

// ------------------------------------------------------------------------------------------
// PTX wrappers
// ------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}

__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar,
                                            int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void prefetch_tensormap(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

__device__ __forceinline__ void named_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void named_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Pins registers at this point of the program: the compiler may not move their reads or
// writes across it (the wgmma writes them asynchronously until the wait).
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// A read-only global f32 load that stays where it is written (volatile: not moved past the
// barriers and wgmma fences around it), so its latency hides under what follows.
__device__ __forceinline__ float ldg_pinned(const float* p) {
  float v;
  asm volatile("ld.global.nc.f32 %0, [%1];\n" : "=f"(v) : "l"(p));
  return v;
}

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

// Two FP32 values to an f16x2 (lo in the low half), round to nearest even.
__device__ __forceinline__ uint32_t f16x2(float hi, float lo) {
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                                  uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void mma_f16_16816(float& c0, float& c1, float& c2, float& c3,
                                              const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// wgmma shared-memory descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart
// (LBO is unused for this layout). The tile base must be 1024-byte aligned; a k-step of 32
// bytes advances the start address by 2 (16-byte units).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// ------------------------------------------------------------------------------------------
// The consumer's pieces
// ------------------------------------------------------------------------------------------
// Key (0..127 within the tile) held in S column 8c + 2q + b, given the K row permutation.
__device__ __forceinline__ int key_of(int c, int q, int b) {
  return 16 * (c & 7) + 4 * q + 2 * (c >> 3) + b;
}

// S = Q K_j^T for this warpgroup's 64 rows: 4 k-steps of 32 channels.
__device__ __forceinline__ void issue_qk(uint32_t (&s)[64], uint64_t desc_q, uint64_t desc_k) {
  wgmma_s8_ss_n128_first(s, desc_q, desc_k);  // overwrites: the old S is dead by now
#pragma unroll
  for (int kk = 1; kk < 4; ++kk) wgmma_s8_ss_n128(s, desc_q + 2 * kk, desc_k + 2 * kk, 1);
}

// acc += P V_j (FRESH: acc = P V_j, the first k-step overwriting): 4 k-steps of 32 keys, P
// from registers.
template <bool FRESH, int NACC>
__device__ __forceinline__ void issue_pv(float (&acc)[NACC], const uint32_t (&p)[16],
                                         uint64_t desc_v) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if constexpr (NACC == 68) {
      if (FRESH && kk == 0)
        wgmma_e4m3_rs_n136_first(acc, p[0], p[1], p[2], p[3], desc_v);
      else
        wgmma_e4m3_rs_n136(acc, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                           desc_v + 2 * kk);
    } else {
      if (FRESH && kk == 0)
        wgmma_e4m3_rs_n128_first(acc, p[0], p[1], p[2], p[3], desc_v);
      else
        wgmma_e4m3_rs_n128(acc, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                           desc_v + 2 * kk);
    }
  }
}

// The online softmax of one S tile. This thread holds rows r (h = 0) and r + 8 (h = 1), S
// columns 8c + 2q + b (s[4c + 2h + b]). On return m holds the new running max, alpha the
// rescale of the accumulator, rsum (exp2 path) the full row sums of P, and s the P bytes that
// pack_p makes the A fragment of: ExpCast, s[4c + 2h] the two bytes of block c (columns 8c + 2q,
// +1) in its low half; exp2, s[4c + 2h] (c < 8) all four bytes of fragment register 2c + h.
// c_scale: q_scale * k_scale (S = raw * c_scale, log2 units).
// ExpCast's clamp is folded into the FFMA, with bit-identical codes (7 ms faster than FFMA +
// FMNMX + FADD at the Wan2.2 shape, docs/perf.md, session 13). The FFMA computes t/256 =
// fma(S, c8/256, bias/256) with .sat (scaling by 2^-8 commutes with the rounding, and
// t <= 120 + beta < 256 never reaches the upper clamp; t < 0 and NaN give 0), and a second
// FFMA fma(t/256, 256, 1.5 * 2^23) is the magic add of the exact t: FFMA.SAT + FFMA replace
// FFMA + FMNMX + FADD, one ALU-pipe instruction less per score.
// LEAN (the 3-warpgroup kernel; the 2-warpgroup variants keep the form they were measured in,
// where ptxas spilled with these): the ALU pipe (I2FP, the max, PRMT, half rate) is the
// softmax's busiest, so the byte pairs are built by IMAD on the FMA pipe, and a few
// instructions less a tile (the magic add with an immediate, the 2^-8 folds, no select for
// alpha). Session 20: vc-8bit 3.4% faster (docs/perf.md).
template <bool EXPCAST, bool MASK, bool LEAN = false>
__device__ __forceinline__ void softmax_tile(uint32_t (&s)[64], float (&m)[2], float (&alpha)[2],
                                             float (&rsum)[2], float c_scale, float expcast_bias,
                                             float log2_p_scale, int n_valid, int q) {
  int mx[2] = {INT_MIN, INT_MIN};
#pragma unroll
  for (int c = 0; c < 16; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        int v = static_cast<int>(s[4 * c + 2 * h + b]);
        if (MASK && key_of(c, q, b) >= n_valid) v = INT_MIN;
        mx[h] = max(mx[h], v);
      }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mx[h] = max(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
    mx[h] = max(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
  }
  float m_new[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    m_new[h] = fmaxf(m[h], static_cast<float>(mx[h]) * c_scale);  // c_scale >= 0
    // per row: MUFU allowed. LEAN ExpCast: no compare and select for an unchanged max, ex2(0)
    // is exactly 1 and the first tile's ex2(-inf) is 0 (m_new is finite: the scores are). The
    // exp2 path keeps the select: there the MUFU pipe carries P (1% slower without it).
    alpha[h] = (LEAN && EXPCAST) || m_new[h] != m[h] ? ex2(m[h] - m_new[h]) : 1.f;
    m[h] = m_new[h];
  }
  if constexpr (EXPCAST) {
    // t = S*8 + (120 + beta - 8m): one FFMA from the raw score; the code is rne(max(t, 0)).
    // Both operands scaled by 2^-8 as the folded clamp needs. LEAN: each in one instruction,
    // c8/256 = c_scale/32 and bias/256 = fma(m, -1/32, expcast_bias/256), the same floats
    // (powers of two commute with the rounding).
    const float eb_256 = expcast_bias * 0.00390625f;
    const float c8_256 = LEAN ? c_scale * 0.03125f : c_scale * 8.f * 0.00390625f;
    float bias_256[2];
#pragma unroll
    for (int h = 0; h < 2; ++h)
      bias_256[h] = LEAN ? fmaf(m_new[h], -0.03125f, eb_256)
                         : (expcast_bias - m_new[h] * 8.f) * 0.00390625f;
#pragma unroll
    for (int c = 0; c < 16; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t u[2];
#pragma unroll
        for (int b = 0; b < 2; ++b) {
#ifdef VC_PROBE_NO_I2F  // timing probe (compiled.PROBES): the scores' bits as FP32, wrong
          const float x = __uint_as_float(s[4 * c + 2 * h + b]);
#else
          const float x = static_cast<float>(static_cast<int>(s[4 * c + 2 * h + b]));
#endif
          float t = fma_sat(x, c8_256, bias_256[h]);
          if (MASK && key_of(c, q, b) >= n_valid) t = 0.f;
          // low byte: rne(256 t). LEAN: as an add with an immediate, t + 1.5 * 2^15, whose
          // ulp is 2^-8 (no register holding 256)
          u[b] = __float_as_uint(LEAN ? t + 49152.f : fmaf(t, 256.f, 12582912.f));
        }
        // byte 0: column b = 0, byte 1: b = 1. LEAN: by an IMAD, which runs on the FMA pipe
        // (PRMT, like I2FP and the max, on the ALU pipe, the softmax's busiest): u1 * 0x10100
        // puts code 1 in byte 1 and nothing in byte 0, and u0's byte 1 is 0 (the magic's)
        s[4 * c + 2 * h] = LEAN ? u[1] * 0x10100u + u[0] : prmt(u[0], u[1], 0x0040);
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
            float x = fmaf(static_cast<float>(static_cast<int>(s[4 * cb + 2 * h + b])), c_scale,
                           bias[h]);
            if (MASK && key_of(cb, q, b) >= n_valid) x = -INFINITY;
            pf[e][b] = ex2(x);
            part[h][e] += pf[e][b];
          }
        }
        s[4 * c + 2 * h] = e4m3x4(pf[0][0], pf[0][1], pf[1][0], pf[1][1]);
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
template <bool EXPCAST>
__device__ __forceinline__ void pack_p(uint32_t (&p)[16], const uint32_t (&s)[64]) {
#pragma unroll
  for (int c = 0; c < 8; ++c)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      p[2 * c + h] =
          EXPCAST ? prmt(s[4 * c + 2 * h], s[4 * (c + 8) + 2 * h], 0x5410) : s[4 * c + 2 * h];
}

// acc += A B for the 16 mean rows: A (16 rows x 16 tiles, fp16, in mma.sync's A fragment a)
// holds the tiles' weights, B (16 tiles x D, fp16) the means in shared memory at mbuf; one
// m16n8k16 per 8 output columns.
template <int NACC>
__device__ __forceinline__ void mean_mma(float (&acc)[NACC], const uint32_t (&a)[4], uint32_t mbuf,
                                         int lane) {
#ifdef VC_PROBE_NO_MEAN_MMA  // timing probe (compiled.PROBES): wrong outputs by design
  // the weights still computed: a use ptxas cannot drop (an empty asm would not keep them)
  if ((a[0] ^ a[1] ^ a[2] ^ a[3]) == 0x12345678u) acc[0] += 1.f;
  return;
#endif
  const int mi = lane >> 3, rr = lane & 7;
#pragma unroll
  for (int nb2 = 0; nb2 < 8; ++nb2) {
    const uint32_t addr = mbuf + (rr + 8 * (mi & 1)) * (D * 2) + (nb2 * 16 + 8 * (mi >> 1)) * 2;
    uint32_t b0, b1, b2, b3;
    ldmatrix_x4_trans(addr, b0, b1, b2, b3);
    mma_f16_16816(acc[8 * nb2 + 0], acc[8 * nb2 + 1], acc[8 * nb2 + 2], acc[8 * nb2 + 3], a, b0,
                  b1);
    mma_f16_16816(acc[8 * nb2 + 4], acc[8 * nb2 + 5], acc[8 * nb2 + 6], acc[8 * nb2 + 7], a, b2,
                  b3);
  }
}

// The A fragment of a batch's mean product (mma.m16n8k16's A layout per warp, which is also
// wgmma's register A): f16(r_t 2^(m_t - m_ref)) for the rows this thread holds, slots t <
// count, 0 beyond. WARP_SYNC ("-vs" variant): the slots a thread reads (rows 16 warp + g, + 8)
// were written by lane 4g of its own warp, so a __syncwarp orders them; the 128-thread named
// barrier (the default, kept for the measured variants) also waits for the warpgroup's other
// warps. After it returns, every read is done (the next batch may write slot 0).
template <bool WARP_SYNC>
__device__ __forceinline__ void mean_weights_rows(uint32_t (&a)[4], const float* rbuf,
                                                  const float (&m_ref)[2], int count, int cw,
                                                  int warp, int lane) {
  const int q = lane & 3, i = warp * 8 + (lane >> 2);  // store_rm's index of this quad
  if constexpr (WARP_SYNC)
    __syncwarp();
  else
    named_sync(3 + cw, 128);  // the (r, m) slots written by the q == 0 threads are visible
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
  if constexpr (WARP_SYNC)
    __syncwarp();
  else
    named_sync(3 + cw, 128);  // every read done before the next batch writes slot 0
}

// V-Smooth: acc += sum over the batch's tiles t of f16(r_t 2^(m_t - m_ref)) f16(mu_t)^T, one
// m16n8k16 per 8 output columns. rbuf: this warpgroup's (r, m) slots (store_rm's layout).
template <int NACC, bool WARP_SYNC = false>
__device__ __forceinline__ void mean_flush(float (&acc)[NACC], const float* rbuf, uint32_t mbuf,
                                           const float (&m_ref)[2], int count, int cw, int warp,
                                           int lane) {
#ifdef VC_PROBE_NO_MEAN_FLUSH  // timing probe (compiled.PROBES): wrong outputs by design
  return;
#endif
  uint32_t a[4];
  mean_weights_rows<WARP_SYNC>(a, rbuf, m_ref, count, cw, warp, lane);
  mean_mma(acc, a, mbuf, lane);
}

// VS3's bookkeeping: V-Smooth's (r_t, m_t) as one float4 {r (row g), m (row g), r (row g + 8),
// m (row g + 8)} per lane quad and tile slot: rb points at this thread's quad in slot 0 (the
// quads of both consumer warpgroups side by side, slots 64 float4 apart: rbuf's 16 KB).
// exp2: every lane of the quad holds the same (r, m) (quad-reduced) and stores it, so each lane
// reads only what it wrote itself; ExpCast: the q == 0 lane stores (only it holds column 128),
// hence __syncwarp. mean_weights4 builds the A fragment of a batch's mean product (mma.m16n8k16's
// A layout per warp, which is also wgmma's register A): f16(r_t * ex2(m_t - m_ref)), as
// mean_flush, for slots t < count, 0 beyond.
__device__ __forceinline__ void mean_weights4(uint32_t (&a)[4], const float4* rb,
                                              const float (&m_ref)[2], int count, int lane) {
  const int q = lane & 3;
  __syncwarp();
#pragma unroll
  for (int hk = 0; hk < 2; ++hk) {
    float v[2][2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int t = 2 * q + 8 * hk + e;
      const float4 rm = rb[t * 64];
      v[0][e] = (t < count) ? rm.x * ex2(rm.y - m_ref[0]) : 0.f;
      v[1][e] = (t < count) ? rm.z * ex2(rm.w - m_ref[1]) : 0.f;
    }
    a[2 * hk + 0] = f16x2(v[0][1], v[0][0]);
    a[2 * hk + 1] = f16x2(v[1][1], v[1][0]);
  }
  __syncwarp();  // every read done before slot 0 is written again
}

// VS3 ("pingpong-2lvl-vs3s"): the mean product as one wgmma (m64n128k16, f16) issued in the
// warpgroup's turn beside its QK and PV products, instead of mma.sync on the CUDA-core side of
// the turn. Its B operand is the batch's means in the layout of compiled.blocked_means: K-major
// 8 x 8 core matrices, 128 bytes apart along the tiles (LBO) and 256 along the channels (SBO).
__device__ __forceinline__ uint64_t desc_means(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(128 >> 4) << 16) |
         (static_cast<uint64_t>(256 >> 4) << 32);
}

// VS3, in the loop: this thread's mean weights (mean_weights4's fragment) into its
// warpgroup's A tile in shared memory, 64 rows x 16 tiles f16 in the layout desc_means names
// (K-major, no swizzle: core matrices 128 bytes apart along the tiles, 256 along the rows), for
// a wgmma that reads A from shared memory: no weight registers live across the turn. The
// fence makes the stores visible to the wgmma (async proxy); the turn's barrier orders them.
__device__ __forceinline__ void store_weights(uint8_t* wtile, const uint32_t (&a)[4], int warp,
                                              int lane) {
  const int q = lane & 3, g = lane >> 2;
#pragma unroll
  for (int hk = 0; hk < 2; ++hk)
#pragma unroll
    for (int h = 0; h < 2; ++h)  // row 16 warp + g + 8h, tiles 8hk + 2q, + 1
      *reinterpret_cast<uint32_t*>(wtile + (2 * warp + h) * 256 + hk * 128 + g * 16 + 4 * q) =
          a[2 * hk + h];
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// How -vs3s issues V-Smooth's mean product: in the loop, one body with the wgmma under a guard
// predicate and its weights from shared memory; in the final turns, straight paths with the
// weights in registers (a tag type picks the path). A wgmma under its own branch made ptxas
// serialize every wgmma of the loop (C7520); the guarded register form serialized ExpCast's
// (C7511, its 68-register PV block), and two straight copies of the loop body, which avoided
// both, cost ~3 ms (docs/perf.md, session 15).
template <bool B>
struct With {
  static constexpr bool value = B;
};

// What of VS3's flush is compiled in: all of it, except in the timing probes (compiled.PROBES).
#if defined(VC_PROBE_NO_MEAN_FLUSH)
constexpr bool VS3_WEIGHTS = false, VS3_PRODUCT = false;
#elif defined(VC_PROBE_NO_MEAN_MMA)
constexpr bool VS3_WEIGHTS = true, VS3_PRODUCT = false;
#else
constexpr bool VS3_WEIGHTS = true, VS3_PRODUCT = true;
#endif

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

// The shared-memory buffer of batch `batch` (tiles MEAN_BATCH * batch ...): two buffers that
// alternate. Callers pass tile / MEAN_BATCH or, where the tile is known to be >= 0, tile >> 4
// (each as the measured variants compute it).
__device__ __forceinline__ uint32_t mean_buffer(uint32_t mbuf_base, int batch) {
  return mbuf_base + (batch & 1) * (MEAN_BATCH * D * 2);
}

// Tile (r, m) into slot t of this warpgroup's rows. A slot is 128 floats: r of rows 16 warp + g,
// r of rows 16 warp + g + 8, m of the same, m of the same, 32 each at index i = 8 warp + g
// (g = lane / 4), which is the thread's index in its warpgroup over 4. The q == 0 lane of each
// quad holds the rows' r (ExpCast's ones column) and stores; for it, 4 i is its index in the
// warpgroup itself, so the byte offset needs no arithmetic beyond that and the stores take one
// base register with immediate offsets (no pair of registers to fill, as float2 stores need).
// rm_lanes: rm_lanes_of(rbuf, cw), uniform, so that the address is one add to threadIdx.x.
__device__ __forceinline__ uint32_t rm_lanes_of(const float* rbuf, int cw) {
  return smem_u32(rbuf) - 128 * (cw + 1);  // + threadIdx.x: the thread's index in its warpgroup
}
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

// The 3-warpgroup variants' cold tiles (the one that carries a batch's mean product, the masked
// last one) need a few registers more than the loop's, which at 160 a thread has none to spare:
// the row sums wait in shared memory (this thread's 8 bytes) from the tile's start to their
// update, instead of ptxas spilling something to local memory. volatile: the store and the load
// stay where they are written.
__device__ __forceinline__ void park(uint32_t slot, const float (&l)[2]) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(slot), "f"(l[0]), "f"(l[1]) : "memory");
}
__device__ __forceinline__ void unpark(uint32_t slot, float (&l)[2]) {
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(l[0]), "=f"(l[1]) : "r"(slot) : "memory");
}

// V-Smooth's bookkeeping once tile j's product is in the accumulator: (r_j, m_j) into this
// warpgroup's slots (m_j: the max P_j was encoded against, which is also the max the
// accumulator is referenced to right now), and the mean MMA when a batch of 16 is complete.
template <int NACC, bool WARP_SYNC = false>
__device__ __forceinline__ void vsmooth_tile(float (&acc)[NACC], const float (&r)[2],
                                             const float (&m_j)[2], int j, int n_tiles,
                                             float* rbuf, uint32_t mbuf_base, int cw, int warp,
                                             int lane) {
  const int t = j % MEAN_BATCH;
  store_rm(rm_lanes_of(rbuf, cw), t, r, m_j);
  if (t == MEAN_BATCH - 1 || j == n_tiles - 1) {
    mean_flush<NACC, WARP_SYNC>(acc, rbuf, mean_buffer(mbuf_base, j / MEAN_BATCH), m_j, t + 1, cw,
                                warp, lane);
  }
}

// Tile j's product has landed: r_j, the normaliser, V-Smooth's bookkeeping. pv is the tile's own
// product block, merged as acc = acc * a_j + pv.
template <bool EXPCAST, bool VSMOOTH, int NP, bool WARP_SYNC = false>
__device__ __forceinline__ void land_2l(float (&acc)[64], const float (&pv)[NP], float (&l)[2],
                                        const float (&a_j)[2], const float (&r_in)[2],
                                        const float (&m_j)[2], int j, int n_tiles, float* rbuf,
                                        uint32_t mbuf, int cw, int warp, int lane) {
  float r[2];
  tile_rowsum<EXPCAST>(pv, r_in, r);
  merge_tile(acc, pv, l, a_j, r);
  if constexpr (VSMOOTH)
    vsmooth_tile<64, WARP_SYNC>(acc, r, m_j, j, n_tiles, rbuf, mbuf, cw, warp, lane);
}

// ------------------------------------------------------------------------------------------
// The kernel
// ------------------------------------------------------------------------------------------
// Accumulation is two-level in every variant: each tile's PV product comes in its own register
// block and is merged into acc in FP32 (merge_tile says why).
// VSX ("pingpong-2lvl-vs", ping-pong only): tile j's K scale loaded at the top of iteration j
// by a pinned load (not in a conditional block after V-Smooth's flush branch, where ptxas left
// it with its use right behind it: an exposed global-load latency every tile), and the flush's
// two 128-thread barriers replaced by __syncwarp (its data is warp-local).
// VS3 ("pingpong-2lvl-vs3s", with VSX): V-Smooth's bookkeeping per lane quad (mean_weights4) and
// the mean product as a wgmma in the warpgroup's turn, its weights from shared memory (see the
// loop).
template <bool EXPCAST, bool VSMOOTH, bool PINGPONG, int STAGES, bool VSX = false,
          bool VS3 = false, bool LATE = false, int NC = 2>
__global__ void __launch_bounds__(Warpgroups<NC>::THREADS, 1)
    vc_attention_kernel(const __grid_constant__ CUtensorMap tm_q,
                        const __grid_constant__ CUtensorMap tm_k0,
                        const __grid_constant__ CUtensorMap tm_k1,
                        const __grid_constant__ CUtensorMap tm_v, const Params prm) {
  using C = Config<EXPCAST, VSMOOTH, PINGPONG, STAGES, VS3, NC>;
  using W = Warpgroups<NC>;
  constexpr int BM = W::BM, THREADS = W::THREADS;
  static_assert(NC == 2 || !PINGPONG, "ping-pong takes turns between two warpgroups");
  // the means blocked, a batch's product one wgmma: -vs3s / -late, and the 3-warpgroup variants
  constexpr bool BLOCKED = VS3 || NC == 3;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = smem_u32(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  uint8_t* smem = smem_raw + (base - raw);
  const uint32_t s_q = base + C::Q_OFF;
  const uint32_t s_stage = base + C::STAGE_OFF;  // stage st: K at +st*STAGE_BYTES, V after it
  const uint32_t s_mbuf = base + C::MBUF_OFF;
  const uint32_t bar = base + C::BAR_OFF;  // full[STAGES], empty[STAGES], q
  auto full = [&](int st) { return bar + 8 * st; };
  auto empty = [&](int st) { return bar + 8 * (STAGES + st); };
  const uint32_t bar_q = bar + 8 * 2 * STAGES;

  const int m_block = blockIdx.x;
  const int bh = blockIdx.y;
  const int wg = threadIdx.x / 128;
  const int tid = threadIdx.x % 128;
  const int n_tiles = prm.n_tiles;

  if (threadIdx.x == 0) {
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(full(st), 1);
      mbar_init(empty(st), 128 * NC);
    }
    mbar_init(bar_q, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (EXPCAST) {  // the 8 extra V rows: row 128 all E4M3 1.0 (0x38), 129..135 zero
    for (int i = threadIdx.x; i < STAGES * 256; i += THREADS) {
      const int st = i / 256, w = i % 256;
      uint32_t* ones = reinterpret_cast<uint32_t*>(smem + C::STAGE_OFF + st * C::STAGE_BYTES +
                                                   C::K_BYTES + D * BN);
      ones[w] = w < 32 ? 0x38383838u : 0u;
    }
  }
  if constexpr (VSMOOTH) {  // mean rows past the last tile are multiplied by 0: keep them finite
    uint32_t* mb = reinterpret_cast<uint32_t*>(smem + C::MBUF_OFF);
    for (int i = threadIdx.x; i < C::MBUF_BYTES / 4; i += THREADS) mb[i] = 0u;
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // seen by wgmma / TMA
  __syncthreads();

  if (wg == 0) {
    // ---------------- producer: one thread issues every copy ----------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(W::PRODUCER_REGS));
    if (tid == 0) {
      prefetch_tensormap(&tm_q);
      prefetch_tensormap(&tm_k0);
      prefetch_tensormap(&tm_k1);
      prefetch_tensormap(&tm_v);
      mbar_expect_tx(bar_q, C::Q_BYTES);
      tma_load_2d(s_q, &tm_q, bar_q, 0, bh * prm.n_pad + m_block * BM);
      for (int j = 0; j < n_tiles; ++j) {
        const int st = j % STAGES;
        mbar_wait(empty(st), ((j / STAGES) & 1) ^ 1);
        uint32_t bytes = C::K_BYTES + D * BN;
        int mean_tiles = 0;
        if (VSMOOTH && j % MEAN_BATCH == 0) {
          mean_tiles = min(MEAN_BATCH, n_tiles - j);
          bytes += (BLOCKED ? MEAN_BATCH : mean_tiles) * D * 2;
        }
        if constexpr (NC == 3)  // the tile's K scale beside it (released by the arrive below)
          reinterpret_cast<float*>(smem + C::KS_OFF)[st] =
              prm.k_scale[static_cast<size_t>(bh) * n_tiles + j];
        mbar_expect_tx(full(st), bytes);
        const uint32_t s_k = s_stage + st * C::STAGE_BYTES;
        const int g0 = (bh * prm.n_pad + j * BN) / 16;
        tma_load_4d(s_k, &tm_k0, full(st), 0, 0, 0, g0);             // keys 16G + 4q + {0,1}
        tma_load_4d(s_k + C::K_BYTES / 2, &tm_k1, full(st), 0, 0, 0, g0);  // 16G + 4q + {2,3}
        tma_load_2d(s_k + C::K_BYTES, &tm_v, full(st), j * BN, bh * D);
        if (VSMOOTH && mean_tiles > 0) {
          // BLOCKED: the means come blocked (compiled.blocked_means), whole batches, zero-padded
          const int copied = BLOCKED ? MEAN_BATCH : mean_tiles;
          const int rows = BLOCKED ? (n_tiles + MEAN_BATCH - 1) / MEAN_BATCH * MEAN_BATCH : n_tiles;
          const __half* src = prm.v_mean + (static_cast<size_t>(bh) * rows + j) * D;
          bulk_load(mean_buffer(s_mbuf, j / MEAN_BATCH), src, copied * D * 2, full(st));
        }
      }
    }
  } else {
    // ---------------- consumers: 64 query rows each ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(W::CONSUMER_REGS));
    const int cw = wg - 1;
    const int warp = tid / 32, lane = tid % 32, q = lane & 3, g = lane >> 2;
    const int row0 = m_block * BM + cw * 64 + warp * 16 + g;  // rows row0, row0 + 8
    // BM = 192: the last CTA of a head may hold rows past n_pad (computed, never written)
    const int q_row = BM == 128 ? row0 : min(row0, prm.n_pad - 1);
    const float q_scale_row =
        prm.q_scale[static_cast<size_t>(bh) * (prm.n_pad / prm.q_rows) + q_row / prm.q_rows];
    // Three warpgroups: the Q scale is the same across the warp (q_rows is 16 or 128, and a
    // warp's 16 rows start at a multiple of 16); through a shuffle ptxas knows it and keeps it in
    // a uniform register, one vector register fewer at 160.
    const float q_scale = NC == 3 ? __shfl_sync(0xffffffffu, q_scale_row, 0) : q_scale_row;
    const float* k_scale = prm.k_scale + static_cast<size_t>(bh) * n_tiles;
    const int masked = (prm.n % BN) ? n_tiles - 1 : -1;  // the tile holding padded keys
    // Three warpgroups: the warpgroup index through a shuffle, which ptxas knows is warp-uniform,
    // so what is derived from it (Q's descriptor, the (r, m) slots' base) lives in uniform
    // registers instead of being rebuilt from the thread index every tile or held in a
    // register (in the 2-warpgroup ping-pong this serialized vc-8bit's wgmmas: the probe
    // uniform-desc-q).
    const int cw_u = NC == 3 ? __shfl_sync(0xffffffffu, cw, 0) : cw;
    float* rbuf = reinterpret_cast<float*>(smem + C::RBUF_OFF) + cw_u * C::RM_SLOTS * 128;

    // acc: FP32 on the CUDA cores; each tile's product comes in its own block (pv).
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    reg_fence(acc);  // zeros in registers now: left as constants, ptxas places them late and
                     // then serializes the wgmmas that write them (C7511)
    uint32_t s[64];
    uint32_t p[16];
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2], rsum[2] = {0.f, 0.f};

#ifdef VC_PROBE_UNIFORM_DESC_Q  // timing probe (compiled.PROBES): the same outputs, vc-8bit's
    // wgmmas serialized (C7511). Q's descriptor from a warp-uniform value (ptxas keeps it in
    // uniform registers): the turn's descriptor arithmetic ~15 instructions shorter.
    const uint64_t desc_q = desc_sw128(s_q + __shfl_sync(0xffffffffu, cw, 0) * 64 * D);
#else
    const uint64_t desc_q = desc_sw128(s_q + cw_u * 64 * D);
#endif
    auto desc_k = [&](int st) { return desc_sw128(s_stage + st * C::STAGE_BYTES); };
    auto desc_v = [&](int st) { return desc_sw128(s_stage + st * C::STAGE_BYTES + C::K_BYTES); };
    // K scales one tile ahead, so the load is in flight during the QK product.
    float ks_next = __ldg(k_scale);
    // VSX: tile j's softmax with its K scale ks_j given (loaded early by the caller).
    auto softmax_ks = [&](int j, float ks_j) {
      const float c_scale = q_scale * ks_j;
      if (j == masked)
        softmax_tile<EXPCAST, true>(s, m, alpha, rsum, c_scale, prm.expcast_bias,
                                     prm.log2_p_scale, prm.n - j * BN, q);
      else
        softmax_tile<EXPCAST, false>(s, m, alpha, rsum, c_scale, prm.expcast_bias,
                                      prm.log2_p_scale, BN, q);
    };
    auto softmax = [&](int j) {
      const float c_scale = q_scale * ks_next;
      if (j + 1 < n_tiles) ks_next = __ldg(k_scale + j + 1);
      if (j == masked)
        softmax_tile<EXPCAST, true>(s, m, alpha, rsum, c_scale, prm.expcast_bias,
                                     prm.log2_p_scale, prm.n - j * BN, q);
      else
        softmax_tile<EXPCAST, false>(s, m, alpha, rsum, c_scale, prm.expcast_bias,
                                      prm.log2_p_scale, BN, q);
    };
    // How both ping-pong schedules open: warpgroup 1 lets warpgroup 0 go first; tile 0's QK is
    // issued in this warpgroup's turn (QK only), the turn handed over, then its softmax.
    auto pingpong_tile0 = [&](int my_turn, int their_turn) {
      if (cw == 1) named_arrive(1, 256);
      mbar_wait(full(0), 0);
      named_sync(my_turn, 256);
      wgmma_fence();
      issue_qk(s, desc_q, desc_k(0));
      wgmma_commit();
      named_arrive(their_turn, 256);
      wgmma_wait<0>();
      reg_fence(s);
      softmax(0);
    };
    mbar_wait(bar_q, 0);

    if constexpr (!PINGPONG) {
      // One tile. PEEL (the 3-warpgroup variants): the masked softmax only in the last tile,
      // which runs outside the loop, so the loop's registers are the unmasked path's (with the
      // mask's predicates in it, ptxas spilled at 160 registers).
      constexpr bool PEEL = NC == 3;
      // PEEL also counts the stage and its phase instead of dividing j by STAGES every tile.
      int stage = 0, phase = 0;
      // PEEL: the descriptors as opaque 64-bit values (plus desc_zero, which ptxas cannot know
      // is 0): each k-step's is then one 64-bit uniform add, where a known constant high word
      // made ptxas rebuild both words of every descriptor every tile. dk: the stage's K tile.
      const uint64_t dq = desc_q + prm.desc_zero, dk0 = desc_k(0) + prm.desc_zero;
      uint64_t dk = dk0;
      // = rm_lanes_of(rbuf, cw_u), written from base (the form measured: through rbuf, ptxas
      // allocates the V-Smooth instances' registers differently)
      [[maybe_unused]] const uint32_t rm_lanes =
          base + C::RBUF_OFF + cw_u * C::RM_SLOTS * 512 - 128 * (cw_u + 1);
      // PEEL's V-Smooth: each tile's (r, m) stored per row (lane q == 0) after its merge; at
      // tile j = 16k (k >= 1) the batch of tiles j - 16 .. j - 1 is complete: its weights,
      // against m_j (the max P_j is encoded against), go to shared memory after the softmax,
      // and its product is one f16 wgmma (A and B from shared memory) in PV_j's group, into
      // PV_j's block, which the merge rescales and adds like the rest. The last batch (and the
      // one before it, when the last tile opens a batch) goes into acc after the loop.
      // mma.sync (mean_flush) waits for every wgmma in flight on the SM, which with three
      // warpgroups is always another warpgroup's: 10 ms at the Wan2.2 shape (session 18).
      auto simple_tile = [&](int j, auto last, auto with_mean) {
        constexpr bool LAST = decltype(last)::value;
        // MEAN: j = 16k (k >= 1), the tile that adds the batch before it. A straight copy of
        // the tile, not a guard: a wgmma under a branch serializes the loop's (C7520), a guarded
        // one cost its dummy product, 1-1.5 ms (session 18).
        constexpr bool MEAN = decltype(with_mean)::value && VSMOOTH;
        static_assert(!(MEAN && LAST), "the last tile's batch goes into acc after the loop");
        // (r, m)'s slot: j's place in its batch, except a last tile that opens a batch, which
        // takes slot 16 so that the batch before it, still owed, stays whole until after the loop
        [[maybe_unused]] const int rm_slot =
            LAST && (j & (MEAN_BATCH - 1)) == 0 ? MEAN_BATCH : j & (MEAN_BATCH - 1);
        constexpr bool COLD = MEAN || LAST;
        const uint32_t l_slot = base + C::PARK_OFF + (threadIdx.x - 128) * 8;
        if constexpr (PEEL && COLD) park(l_slot, l);
        const int st = PEEL ? stage : j % STAGES;
        mbar_wait(full(st), PEEL ? phase : (j / STAGES) & 1);
        const uint64_t dk_j = PEEL ? dk : desc_k(st);
        const uint64_t dv_j = PEEL ? dk + (C::K_BYTES >> 4) : desc_v(st);
        if constexpr (PEEL) {
          stage = stage == STAGES - 1 ? 0 : stage + 1;
          phase ^= stage == 0;
          dk = stage == 0 ? dk0 : dk + (C::STAGE_BYTES >> 4);
        }
        wgmma_fence();
        issue_qk(s, PEEL ? dq : desc_q, dk_j);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(s);
        if constexpr (PEEL) {
          // the K scale from the stage (the producer wrote it): no register across tiles
          const float c_scale = q_scale * reinterpret_cast<const float*>(smem + C::KS_OFF)[st];
          softmax_tile<EXPCAST, LAST, true>(s, m, alpha, rsum, c_scale, prm.expcast_bias,
                                      prm.log2_p_scale, LAST ? prm.n - j * BN : BN, q);
        } else {
          softmax(j);
        }
        if constexpr (MEAN) {
          // the batch's weights against m_j into this warpgroup's A tile (S's 32 code registers
          // live, not the PV block's 68): nothing more is live while PV runs than in any tile
          uint32_t w[4];
          mean_weights_rows<true>(w, rbuf, m, MEAN_BATCH, cw, warp, lane);
          store_weights(smem + C::WBUF_OFF + cw_u * 64 * MEAN_BATCH * 2, w, warp, lane);
          __syncwarp();  // a warp's weight rows are the A rows its part of the wgmma reads
        }
        pack_p<EXPCAST>(p, s);
        // MEAN: the batch's product in PV_j's group, into PV_j's block (merged with it), the
        // weights from shared memory (-vs3s's guarded wgmma, always on here: ptxas drops the guard)
        [[maybe_unused]] const uint64_t desc_mu = desc_means(mean_buffer(s_mbuf, (j >> 4) - 1));
        [[maybe_unused]] const uint64_t desc_w =
            desc_means(smem_u32(smem + C::WBUF_OFF) + cw_u * 64 * MEAN_BATCH * 2);
        float pv[C::NACC];
        reg_fence(p);
        wgmma_fence();
        issue_pv<true>(pv, p, dv_j);
        if constexpr (MEAN) wgmma_f16_ss_n128_if(pv, desc_w, desc_mu, 1);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(pv);
        reg_fence(p);
        mbar_arrive(empty(st));
        if constexpr (PEEL) {
          float r[2];
          tile_rowsum<EXPCAST>(pv, rsum, r);
          if constexpr (COLD) unpark(l_slot, l);
          merge_tile(acc, pv, l, alpha, r);
          if constexpr (VSMOOTH) store_rm(rm_lanes, rm_slot, r, m);
        } else {  // the 2-warpgroup "simple": V-Smooth's flush by mma.sync
          land_2l<EXPCAST, VSMOOTH>(acc, pv, l, alpha, rsum, m, j, n_tiles, rbuf, s_mbuf, cw, warp,
                                    lane);
        }
      };
      if constexpr (PEEL) {
        // tiles 0 .. last - 1 in batches; a batch's first tile (from the second batch on)
        // carries the previous batch's product: no branch around a wgmma
        const int last = n_tiles - 1;
        if constexpr (VSMOOTH) {
          int j = 0;
          for (const int e = min(MEAN_BATCH, last); j < e; ++j)
            simple_tile(j, With<false>{}, With<false>{});
          while (j < last) {
            simple_tile(j, With<false>{}, With<true>{});
            ++j;
            // the batch's other tiles, counted down (two instructions a tile; the bound
            // min(j + 15, last) was rebuilt every tile, three)
            for (int k = min(MEAN_BATCH - 1, last - j); k > 0; --k, ++j)
              simple_tile(j, With<false>{}, With<false>{});
          }
        } else {
          for (int j = 0; j < last; ++j) simple_tile(j, With<false>{}, With<false>{});
        }
        simple_tile(last, With<true>{}, With<false>{});
        if constexpr (VSMOOTH) {
          // the batches still owed, against the final max: the last tile's and, when the last
          // tile opens a batch (its (r, m) then in slot 16), the batch before it (else a
          // product of zero weights: no branch around a wgmma)
          const bool opens = (last & (MEAN_BATCH - 1)) == 0;
          uint32_t w_prev[4], w[4];
          mean_weights_rows<true>(w_prev, rbuf, m, opens && last > 0 ? MEAN_BATCH : 0, cw, warp,
                                  lane);
          mean_weights_rows<true>(w, opens ? rbuf + MEAN_BATCH * 128 : rbuf, m,
                                  opens ? 1 : (last & (MEAN_BATCH - 1)) + 1, cw, warp, lane);
          reg_fence(acc);
          wgmma_fence();
          wgmma_f16_rs_n128(acc, w_prev, desc_means(mean_buffer(s_mbuf, (last >> 4) - 1)));
          wgmma_f16_rs_n128(acc, w, desc_means(mean_buffer(s_mbuf, last >> 4)));
          wgmma_commit();
          wgmma_wait<0>();
          reg_fence(acc);
        }
      } else {
        for (int j = 0; j < n_tiles; ++j) simple_tile(j, With<false>{}, With<false>{});
      }
    } else {
      // Turn-taking between the two consumer warpgroups: warpgroup cw issues after waiting on
      // barrier 1 + cw and hands over with barrier 2 - cw. Warpgroup 1 lets warpgroup 0 go
      // first and skips its hand-over at the last issue, so every arrive meets one sync.
      // Within a warpgroup, QK_j and PV_{j-1} are issued together in one turn; *_prev hold
      // tile j-1's alpha, sums and max.
      const int my_turn = 1 + cw, their_turn = 2 - cw;
      pingpong_tile0(my_turn, their_turn);
      {
        // Both products of a turn complete, PV_{j-1} is merged into acc, and only then tile j's
        // softmax runs: S, the PV block, acc and P are never all live beside the softmax's
        // temporaries (with them, ptxas spilled). The overlap is the other warpgroup's turn.
        pack_p<EXPCAST>(p, s);
        float a_prev[2] = {alpha[0], alpha[1]}, r_prev[2] = {rsum[0], rsum[1]},
              m_prev[2] = {m[0], m[1]};
        // tile j's softmax is done: its alpha, sums and max become *_prev, its P the operand
        // of the next turn's PV
        auto hand_on = [&] {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            a_prev[h] = alpha[h];
            r_prev[h] = rsum[h];
            m_prev[h] = m[h];
          }
          pack_p<EXPCAST>(p, s);
        };
        // Iteration j's turn (prev: tile j - 1's stage): tile j's K and V landed, the turn taken,
        // QK_j and PV_{j-1} (into
        // the fresh block pv, with whatever `also` adds to PV's group) committed, the turn
        // handed over. pv and the extra wgmmas' operands come in as arguments: an accumulator
        // captured by a lambda that also received it made ptxas serialize the wgmmas (C7511).
        auto take_turn = [&](int j, int prev, float (&pv)[C::NACC], auto&& also) {
          const int st = j % STAGES;
          mbar_wait(full(st), (j / STAGES) & 1);
          named_sync(my_turn, 256);
          reg_fence(p);
          wgmma_fence();
          issue_qk(s, desc_q, desc_k(st));
          wgmma_commit();
          issue_pv<true>(pv, p, desc_v(prev));
          also(pv);
          wgmma_commit();
          named_arrive(their_turn, 256);
        };
        // The last turn: PV of the last tile only; warpgroup 1 does not hand over after it.
        auto take_last_turn = [&](float (&pv)[C::NACC], auto&& also) {
          named_sync(my_turn, 256);
          reg_fence(p);
          wgmma_fence();
          issue_pv<true>(pv, p, desc_v((n_tiles - 1) % STAGES));
          also(pv);
          wgmma_commit();
          if (cw == 0) named_arrive(their_turn, 256);
        };
        auto nothing = [](float (&)[C::NACC]) {};
        if constexpr (VS3) {
          // V-Smooth's bookkeeping per lane quad: tile j-1's (r, m) stored as one float4 at a
          // slot address computed from j alone (no flush branch after the merge). A complete
          // batch (tiles j - 17 .. j - 2 in iteration j) is weighted against tile j - 1's max
          // m_prev before the turn and its product issued in the turn into tile j - 1's PV
          // block, which the merge then rescales and adds like the rest.
          static_assert(!VSMOOTH || MEAN_BATCH == 16, "slot arithmetic below");
          // quad index over both consumer warpgroups, cw * 32 + warp * 8 + g = threadIdx.x / 4
          // - 32: cheap for ptxas to rematerialize at the store (it has no register to keep it)
          float4* rb4 = reinterpret_cast<float4*>(smem + C::RBUF_OFF) + (threadIdx.x >> 2) - 32;
          const bool rb_writer = !EXPCAST || q == 0;
          // in iteration j, the batch of tiles j - 17 .. j - 2 is complete
          auto mean_due = [&](int j) {
            return VSMOOTH && j > MEAN_BATCH && (j & (MEAN_BATCH - 1)) == 1;
          };
          // the mean product of the batch holding tile batch_tile, added into the PV block d: in
          // the loop (mean_guarded) only where `due`, the weights read from this warpgroup's A
          // tile in shared memory; in the final turns (mean_registers) from the registers w
          uint8_t* const wtile = smem + C::WBUF_OFF + cw * 64 * MEAN_BATCH * 2;
          auto mean_guarded = [&](auto& d, int batch_tile, bool due) {
            if constexpr (VSMOOTH && VS3_PRODUCT)
              wgmma_f16_ss_n128_if(d, desc_means(smem_u32(wtile)),
                                   desc_means(mean_buffer(s_mbuf, batch_tile >> 4)), due);
          };
          auto mean_registers = [&](auto& d, const uint32_t (&w)[4], int batch_tile) {
            if constexpr (VSMOOTH && VS3_PRODUCT)
              wgmma_f16_rs_n128(d, w, desc_means(mean_buffer(s_mbuf, batch_tile >> 4)));
          };
          // before iteration j's turn: whether a batch's product is due in it, and if so its
          // weights, against tile j - 1's max, stored for mean_guarded
          auto stage_weights = [&](int j) {
            const bool due = mean_due(j);
            if constexpr (VSMOOTH && VS3_WEIGHTS) {
              if (due) {
                uint32_t mw[4];
                mean_weights4(mw, rb4, m_prev, MEAN_BATCH, lane);
                store_weights(wtile, mw, warp, lane);
              }
            }
            return due;
          };
          // tile t's PV block merged, and its (r, m) stored
          auto land_vs3 = [&](const auto& pvb, int t) {
            float r[2];
            tile_rowsum<EXPCAST>(pvb, r_prev, r);
            merge_tile(acc, pvb, l, a_prev, r);
            if constexpr (VSMOOTH) {
              if (rb_writer)
                rb4[(t & (MEAN_BATCH - 1)) * 64] = make_float4(r[0], m_prev[0], r[1], m_prev[1]);
            }
          };
          // One iteration; its turn also issues a batch's mean product where one is due.
          auto iteration = [&](int j) {
            const int prev = (j - 1) % STAGES;
            const bool due = stage_weights(j);
            float pv[C::NACC];
            take_turn(j, prev, pv, [&](float (&d)[C::NACC]) { mean_guarded(d, j - 2, due); });
            const float ks_j = ldg_pinned(k_scale + j);  // still under the wgmma wait
            wgmma_wait<0>();
            reg_fence(s);
            reg_fence(pv);
            reg_fence(p);
            mbar_arrive(empty(prev));
            land_vs3(pv, j - 1);
            softmax_ks(j, ks_j);
            hand_on();
          };
          // LATE ("pingpong-2lvl-vs3s-late"): QK_j alone in the turn's first wgmma group, PV_{j-1}
          // in the second, so tile j's softmax runs while PV_{j-1} is on the tensor core (S, the
          // PV block, P and acc all live: 212 registers, which ptxas fits); tile j's P is packed
          // once PV_{j-1} is done. The mean product, where one is due, goes in a third group:
          // ptxas gives a guarded wgmma a hardware group of its own (a branch and a dummy
          // HGMMA), so in PV's group it made wait<1> wait for PV_{j-1} too, and issued after the
          // softmax it queued behind the other warpgroup's turn (docs/perf.md, session 17). The
          // same products and merges as -vs3s (outputs bit-equal). On the exp2 path ptxas
          // serializes this form's wgmmas (C7513): its instances run -vs3s's code. The turn is
          // spelled out, not take_turn with a flag for these groups: that flag made ptxas
          // serialize -vs3s's ExpCast wgmmas with V-Smooth (C7511; tried in session 17).
          constexpr bool LATE_USED = LATE && EXPCAST;
          auto iteration_late = [&](int j) {
            const int st = j % STAGES, prev = (j - 1) % STAGES;
            const bool due = stage_weights(j);
            float pv[C::NACC];
            mbar_wait(full(st), (j / STAGES) & 1);
            named_sync(my_turn, 256);
            reg_fence(p);
            wgmma_fence();
            issue_qk(s, desc_q, desc_k(st));
            wgmma_commit();
            issue_pv<true>(pv, p, desc_v(prev));
            wgmma_commit();
            if constexpr (VSMOOTH) {
              mean_guarded(pv, j - 2, due);
              wgmma_commit();
            }
            named_arrive(their_turn, 256);
            const float ks_j = ldg_pinned(k_scale + j);  // still under the wgmma wait
            wgmma_wait<VSMOOTH ? 2 : 1>();
            reg_fence(s);
            softmax_ks(j, ks_j);
            wgmma_wait<0>();
            reg_fence(pv);
            reg_fence(p);
            mbar_arrive(empty(prev));
            land_vs3(pv, j - 1);
            hand_on();
          };
          for (int j = 1; j < n_tiles; ++j) {
            if constexpr (LATE_USED)
              iteration_late(j);
            else
              iteration(j);
          }
          const int last = n_tiles - 1;
          // the final turn, as two straight paths; MEAN: the batch that ended with tile
          // last - 1 is complete and its product joins tile last's
          auto final_turn = [&](auto mean) {
            constexpr bool MEAN = decltype(mean)::value;
            uint32_t mw[4];
            if constexpr (MEAN && VS3_WEIGHTS) mean_weights4(mw, rb4, m_prev, MEAN_BATCH, lane);
            float pv[C::NACC];
            take_last_turn(pv, [&](float (&d)[C::NACC]) {
              if constexpr (MEAN) mean_registers(d, mw, last - 1);
            });
            wgmma_wait<0>();
            reg_fence(pv);
            reg_fence(p);
            mbar_arrive(empty(last % STAGES));
            land_vs3(pv, last);
          };
          if (mean_due(last + 1))
            final_turn(With<true>{});
          else
            final_turn(With<false>{});
          if constexpr (VSMOOTH) {  // the last batch, against the final max, into acc
            uint32_t mw[4] = {0u, 0u, 0u, 0u};
            if constexpr (VS3_WEIGHTS)
              mean_weights4(mw, rb4, m_prev, (last & (MEAN_BATCH - 1)) + 1, lane);
            reg_fence(acc);
            wgmma_fence();
            mean_registers(acc, mw, last);
            wgmma_commit();
            wgmma_wait<0>();
            reg_fence(acc);
          }
        } else {
        for (int j = 1; j < n_tiles; ++j) {
          const int prev = (j - 1) % STAGES;
          float ks_j = 0.f;
          if constexpr (VSX) ks_j = ldg_pinned(k_scale + j);  // used after the products land
          float pv[C::NACC];
          take_turn(j, prev, pv, nothing);
          wgmma_wait<0>();
          reg_fence(s);
          reg_fence(pv);
          reg_fence(p);
          mbar_arrive(empty(prev));
          land_2l<EXPCAST, VSMOOTH, C::NACC, VSX>(acc, pv, l, a_prev, r_prev, m_prev, j - 1,
                                                  n_tiles, rbuf, s_mbuf, cw, warp, lane);
          if constexpr (VSX)
            softmax_ks(j, ks_j);
          else
            softmax(j);
          hand_on();
        }
        const int last = n_tiles - 1;
        float pv[C::NACC];
        take_last_turn(pv, nothing);
        wgmma_wait<0>();
        reg_fence(pv);
        reg_fence(p);
        mbar_arrive(empty(last % STAGES));
        land_2l<EXPCAST, VSMOOTH, C::NACC, VSX>(acc, pv, l, a_prev, r_prev, m_prev, last,
                                                n_tiles, rbuf, s_mbuf, cw, warp, lane);
        }  // VS3
      }
    }

    // ---------------- epilogue: O = acc * v_scale / l ----------------
    if constexpr (EXPCAST) {
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
        const float2 sc = *reinterpret_cast<const float2*>(vs + col);
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
}

// ------------------------------------------------------------------------------------------
// Host side
// ------------------------------------------------------------------------------------------
namespace {

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

thread_local char g_msg[512];

const char* fail(const char* fmt, const char* a = "", long long b = 0) {
  snprintf(g_msg, sizeof(g_msg), fmt, a, b);
  return g_msg;
}

// cuTensorMapEncodeTiled through the runtime's driver entry point: no -lcuda at link time.
EncodeTiled encode_fn() {
  static EncodeTiled fn = nullptr;
  if (fn == nullptr) {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult status;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault,
                                         &status) == cudaSuccess &&
        status == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<EncodeTiled>(ptr);
  }
  return fn;
}

// A u8 tensor map with 128-byte swizzle (every box's inner extent is 128 bytes).
bool make_map(CUtensorMap* map, const void* ptr, int rank, const cuuint64_t* dims,
              const cuuint64_t* strides, const cuuint32_t* box) {
  EncodeTiled enc = encode_fn();
  if (enc == nullptr) return false;
  cuuint32_t elem[5] = {1, 1, 1, 1, 1};
  return enc(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, rank, const_cast<void*>(ptr), dims, strides, box,
             elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <bool EXPCAST, bool VSMOOTH, bool PINGPONG, int STAGES, bool VSX = false,
          bool VS3 = false, bool LATE = false, int NC = 2>
struct Variant {
  using C = Config<EXPCAST, VSMOOTH, PINGPONG, STAGES, VS3, NC>;
  static constexpr int THREADS = Warpgroups<NC>::THREADS;
  static constexpr auto kernel =
      vc_attention_kernel<EXPCAST, VSMOOTH, PINGPONG, STAGES, VSX, VS3, LATE, NC>;

  static const char* launch(const CUtensorMap (&maps)[4], const Params& prm, dim3 grid,
                            cudaStream_t stream) {
    // Per call (cheap): the attribute belongs to the current device.
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::ALLOC);
    if (e != cudaSuccess) return fail("cudaFuncSetAttribute: %s", cudaGetErrorString(e));
    kernel<<<grid, THREADS, C::ALLOC, stream>>>(maps[0], maps[1], maps[2], maps[3], prm);
    e = cudaGetLastError();
    if (e != cudaSuccess) return fail("kernel launch: %s", cudaGetErrorString(e));
    return nullptr;
  }

  static void describe(char* buf, size_t len, const char* name) {
    cudaFuncAttributes at;
    if (cudaFuncGetAttributes(&at, kernel) != cudaSuccess) {
      snprintf(buf, len, "%s: cudaFuncGetAttributes failed\n", name);
      return;
    }
    snprintf(buf, len, "%s expcast=%d vsmooth=%d stages=%d: %d registers/thread at entry, %zu B "
             "local, %d B dynamic shared memory\n",
             name, EXPCAST, VSMOOTH, STAGES, at.numRegs, at.localSizeBytes, C::ALLOC);
  }
};

// The compiled variants, in the order of ForwardArgs::variant (compiled.VARIANTS); every one
// accumulates two-level (merge_tile) and encodes ExpCast with FFMA.SAT:
//   0 simple             warpgroups in turn-free order
//   1 pingpong-2lvl      ping-pong: the warpgroups take turns issuing QK_j and PV_{j-1}
//   2 pingpong-2lvl-vs   as 1, tile j's K scale loaded early (pinned) and V-Smooth's flush
//                        synchronized per warp: same numerics as 1
//   3 pingpong-2lvl-vs3s as 2, V-Smooth's mean product one f16 wgmma in the turn (into the PV
//                        block of the tile after the batch, weighted against that tile's max),
//                        its weights stored to shared memory, the means blocked
//                        (compiled.blocked_means): no mma.sync, one loop body
//   4 pingpong-2lvl-vs3s-late  as 3, tile j's softmax while PV_{j-1} runs (QK_j, PV_{j-1} and
//                        the mean product in three wgmma groups of the turn); exp2: 3's code
//   5 simple-3wg         0 with three consumer warpgroups (192 query rows, 160 registers):
//                        the default of every plan since session 19
// The measured losers are gone (docs/perf.md, sessions 11-16): direct accumulation into the
// wgmma block ("pingpong", "simple-direct": the accumulator's truncation drifts from the
// emulation), ExpCast's FFMA + FMNMX + FADD form (the "-sat" variants won), "-vs2" (the mean
// product by mma.sync beside the turn, 7 ms behind -vs3), "-vs3" (the weights in registers:
// ExpCast's two loop copies 1.7 ms behind -vs3s, exp2 level), and "-vs3-p4"/"-p8" (part of the
// exponentials by a polynomial on the FMA pipe: MUFU does not bind; -p8 8% slower, -p4 0.5%
// faster at 7x the deviation from the emulation), and, in session 17, the other overlaps of tile
// j's softmax with PV_{j-1}: "-split" (PV in two column halves, the softmax beside the second:
// 1-2% behind -late), the mean product after the softmax (it queued behind the other
// warpgroup's turn) and "-late-2b" (two loop bodies, tied with the three groups); in session 19
// "simple-3wg-h" (simple-3wg with PV in two column halves: not faster, and ptxas spilled in it).
constexpr int N_VARIANTS = 6;
static_assert(reads_blocked_means(3) && reads_blocked_means(4) && reads_blocked_means(5) &&
                  !reads_blocked_means(2),
              "the VS3 and 3-warpgroup variants read the means blocked");
constexpr const char* VARIANT_NAMES[N_VARIANTS] = {"simple", "pingpong-2lvl", "pingpong-2lvl-vs",
                                                   "pingpong-2lvl-vs3s",
                                                   "pingpong-2lvl-vs3s-late", "simple-3wg"};
// Consumer warpgroups of each variant: query rows per CTA 64 x that.
constexpr int consumer_warpgroups(int variant) { return variant >= 5 ? 3 : 2; }
constexpr int STAGES_ALL = 3;

template <bool PINGPONG, bool VSX = false, bool VS3 = false, bool LATE = false, int NC = 2>
struct Family {
  template <bool E, bool V>
  using Of = Variant<E, V, PINGPONG, STAGES_ALL, VSX, VS3, LATE, NC>;

  static const char* launch(bool expcast, bool vsmooth, const CUtensorMap (&maps)[4],
                            const Params& prm, dim3 grid, cudaStream_t stream) {
    if (expcast)
      return vsmooth ? Of<true, true>::launch(maps, prm, grid, stream)
                     : Of<true, false>::launch(maps, prm, grid, stream);
    return vsmooth ? Of<false, true>::launch(maps, prm, grid, stream)
                   : Of<false, false>::launch(maps, prm, grid, stream);
  }

  static void describe(char* text, size_t len, const char* name) {
    char line[256];
    Of<true, true>::describe(line, sizeof(line), name);
    strncat(text, line, len - strlen(text) - 1);
    Of<false, true>::describe(line, sizeof(line), name);
    strncat(text, line, len - strlen(text) - 1);
    Of<true, false>::describe(line, sizeof(line), name);
    strncat(text, line, len - strlen(text) - 1);
    Of<false, false>::describe(line, sizeof(line), name);
    strncat(text, line, len - strlen(text) - 1);
  }
};

}  // namespace

const char* forward(const ForwardArgs& a) {
  if (a.n < 1 || a.n_pad % BN != 0 || a.n_pad < a.n || a.n_pad - a.n >= BN)
    return fail("bad sequence lengths%s (n_pad %lld)", "", a.n_pad);
  if (a.q_rows < 16 || 128 % a.q_rows != 0)
    return fail("q_rows must divide 128 and be at least 16%s, got %lld", "", a.q_rows);
  if (a.variant < 0 || a.variant >= N_VARIANTS) return fail("unknown variant%s %lld", "", a.variant);
  const int bm = 64 * consumer_warpgroups(a.variant);
  const long long bh = static_cast<long long>(a.batch) * a.heads;
  if (bh < 1 || bh > 65535) return fail("batch x heads out of range%s: %lld", "", bh);

  CUtensorMap maps[4];
  const cuuint64_t rows = static_cast<cuuint64_t>(bh) * a.n_pad;
  {  // Q: (B*H*n_pad rows, 128 bytes), box of a CTA's rows
    const cuuint64_t dims[2] = {D, rows};
    const cuuint64_t strides[1] = {D};
    const cuuint32_t box[2] = {D, static_cast<cuuint32_t>(bm)};
    if (!make_map(&maps[0], a.q, 2, dims, strides, box)) return fail("tensor map for Q failed%s");
  }
  {  // K, permuted rows: dims (channel, key bit 0, key pair in 4, group of 16 keys); the second
     // map starts two keys further, so it reads keys 16G + 4q + {2, 3}
    const cuuint64_t dims[4] = {D, 2, 4, rows / 16};
    const cuuint64_t strides[3] = {D, 4 * D, 16 * D};
    const cuuint32_t box[4] = {D, 2, 4, 8};
    if (!make_map(&maps[1], a.k, 4, dims, strides, box) ||
        !make_map(&maps[2], static_cast<const uint8_t*>(a.k) + 2 * D, 4, dims, strides, box))
      return fail("tensor map for K failed%s");
  }
  {  // V^T: (B*H*128 channel rows, n_pad keys), box 128 x 128
    const cuuint64_t dims[2] = {static_cast<cuuint64_t>(a.n_pad), static_cast<cuuint64_t>(bh) * D};
    const cuuint64_t strides[1] = {static_cast<cuuint64_t>(a.n_pad)};
    const cuuint32_t box[2] = {BN, D};
    if (!make_map(&maps[3], a.v_t, 2, dims, strides, box)) return fail("tensor map for V failed%s");
  }
  Params prm;
  prm.q_scale = a.q_scale;
  prm.k_scale = a.k_scale;
  prm.v_scale = a.v_scale;
  prm.v_mean = static_cast<const __half*>(a.v_mean);
  prm.out = a.out;
  prm.out_sb = a.out_sb;
  prm.out_sh = a.out_sh;
  prm.out_sn = a.out_sn;
  prm.heads = a.heads;
  prm.n = a.n;
  prm.n_pad = a.n_pad;
  prm.n_tiles = a.n_pad / BN;
  prm.q_rows = a.q_rows;
  prm.out_bf16 = a.out_bf16 ? 1 : 0;
  prm.expcast_bias = a.expcast_bias;
  prm.log2_p_scale = a.log2_p_scale;
  prm.desc_zero = 0;
  const bool vsmooth = a.v_mean != nullptr;
  const dim3 grid((a.n_pad + bm - 1) / bm, static_cast<unsigned>(bh));
  auto stream = static_cast<cudaStream_t>(a.stream);
  switch (a.variant) {
    case 0: return Family<false>::launch(a.expcast, vsmooth, maps, prm, grid, stream);
    case 1: return Family<true>::launch(a.expcast, vsmooth, maps, prm, grid, stream);
    case 2: return Family<true, true>::launch(a.expcast, vsmooth, maps, prm, grid, stream);
    case 3: return Family<true, true, true>::launch(a.expcast, vsmooth, maps, prm, grid, stream);
    case 4:
      return Family<true, true, true, true>::launch(a.expcast, vsmooth, maps, prm, grid, stream);
    default:  // 5 (forward checked the range)
      return Family<false, false, false, false, 3>::launch(a.expcast, vsmooth, maps, prm, grid,
                                                            stream);
  }
}

const char* describe() {
  static char text[8192];
  text[0] = 0;
  Family<false>::describe(text, sizeof(text), VARIANT_NAMES[0]);
  Family<true>::describe(text, sizeof(text), VARIANT_NAMES[1]);
  Family<true, true>::describe(text, sizeof(text), VARIANT_NAMES[2]);
  Family<true, true, true>::describe(text, sizeof(text), VARIANT_NAMES[3]);
  Family<true, true, true, true>::describe(text, sizeof(text), VARIANT_NAMES[4]);
  Family<false, false, false, false, 3>::describe(text, sizeof(text), VARIANT_NAMES[5]);
  return text;
}

}  // namespace vc
