// VC-Attention forward for Hopper (sm_90a): INT8 QK^T and FP8 PV on wgmma, Q/K/V tiles by TMA
// into a 3-stage shared-memory pipeline on mbarriers, one producer warpgroup and three consumer
// warpgroups (64 query rows each) that each run QK, softmax and PV in order on their tile,
// ExpCast-FP8 or exp2-then-cast for P, V-Smooth's mean restored in the same accumulator (paper
// Equation 6). Semantics: the Triton kernel (vcbench/kernels/triton/attention.py) and its
// oracle, the emulation (online.py). The measurements behind each choice: docs/perf.md.
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
// * V-Smooth's mean term: each tile's (r_j, m_j) goes to shared memory; at the first tile of
//   each batch of 16 after the first, one f16 wgmma adds sum_t f16(r_t 2^(m_t - m)) mu_t^T of
//   the batch before it to that tile's PV block (the means of 16 tiles come in by one bulk
//   copy, 4 KB, laid out as the wgmma's B operand). The weights 2^(m_t - m) are the products of
//   the alphas the accumulator saw since tile t.
//
// * Three consumer warpgroups (192 query rows, 160 registers a thread) give each scheduler three
//   independent chains of QK, softmax and PV. At 160 registers there is none to spare: the
//   masked last tile runs outside the loop, the K scale comes through shared memory, the Q
//   scale and the warpgroup index are warp-uniform, V-Smooth's batch product is an SS wgmma in
//   PV's group of each batch's first tile with its weights in shared memory (mma.sync would
//   wait for the other warpgroups' wgmmas), and the row sums wait in shared memory across the
//   cold tiles. No local memory.
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
// Three consumer warpgroups of 64 query rows each and one producer warpgroup; setmaxnreg: the
// producer gives its registers to the consumers.
constexpr int NC = 3;
constexpr int BM = 64 * NC;  // query rows per CTA
constexpr int THREADS = 128 * (NC + 1);
constexpr int PRODUCER_REGS = 32;
constexpr int CONSUMER_REGS = 160;
constexpr int STAGES = 3;
static_assert(128 * PRODUCER_REGS + 128 * NC * CONSUMER_REGS <= 65536, "register file");

struct Params {
  const float* q_scale;
  const float* k_scale;
  const float* v_scale;
  const __half* v_mean;
  void* out;
  long long out_sb, out_sh, out_sn;
  int heads, n, n_pad, n_tiles, q_rows, out_bf16;
  float expcast_bias, log2_p_scale;
  uint64_t desc_zero;  // 0 (see the consumer's descriptors)
};

template <bool EXPCAST, bool VSMOOTH>
struct Config {
  static constexpr int PV_N = EXPCAST ? 136 : 128;  // + ones column (ExpCast's row sum)
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
  // (r, m) per row and tile of a batch, and a 17th slot (the last tile's, when it opens a batch)
  static constexpr int RM_SLOTS = MEAN_BATCH + 1;
  static constexpr int RBUF_BYTES = VSMOOTH ? NC * RM_SLOTS * 64 * 8 : 0;
  // the mean weights, per warpgroup (A of the mean product's wgmma)
  static constexpr int WBUF_OFF = RBUF_OFF + RBUF_BYTES;
  static constexpr int WBUF_BYTES = VSMOOTH ? NC * 64 * MEAN_BATCH * 2 : 0;
  static constexpr int BAR_OFF = WBUF_OFF + WBUF_BYTES;
  static constexpr int BAR_BYTES = (2 * STAGES + 1) * 8;
  static constexpr int KS_OFF = BAR_OFF + BAR_BYTES;  // each stage's K scale
  static constexpr int KS_BYTES = STAGES * 4;
  // each consumer thread's row sums, parked across the cold tiles
  static constexpr int PARK_OFF = (KS_OFF + KS_BYTES + 15) / 16 * 16;
  static constexpr int PARK_BYTES = 128 * NC * 8;
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
// ExpCast's clamp is folded into the FFMA, with bit-identical codes: the FFMA computes t/256 =
// fma(S, c8/256, bias/256) with .sat (scaling by 2^-8 commutes with the rounding, and
// t <= 120 + beta < 256 never reaches the upper clamp; t < 0 and NaN give 0), and an add of
// 1.5 * 2^15 is the magic add of the exact t: FFMA.SAT + FADD instead of FFMA + FMNMX + FADD.
// The ALU pipe (I2FP, the max, PRMT, half rate) is the softmax's busiest, so the byte pairs are
// built by IMAD on the FMA pipe.
template <bool EXPCAST, bool MASK>
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
    // per row: MUFU allowed. ExpCast: no compare and select for an unchanged max, ex2(0) is
    // exactly 1 and the first tile's ex2(-inf) is 0 (m_new is finite: the scores are). The
    // exp2 path keeps the select: there the MUFU pipe carries P (1% slower without it).
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
          const float x = static_cast<float>(static_cast<int>(s[4 * c + 2 * h + b]));
          float t = fma_sat(x, c8_256, bias_256[h]);
          if (MASK && key_of(c, q, b) >= n_valid) t = 0.f;
          // low byte: rne(256 t), as an add with an immediate, t + 1.5 * 2^15, whose ulp is
          // 2^-8 (no register holding 256)
          u[b] = __float_as_uint(t + 49152.f);
        }
        // byte 0: column b = 0, byte 1: b = 1, by an IMAD, which runs on the FMA pipe (PRMT,
        // like I2FP and the max, on the ALU pipe, the softmax's busiest): u1 * 0x10100 puts
        // code 1 in byte 1 and nothing in byte 0, and u0's byte 1 is 0 (the magic's)
        s[4 * c + 2 * h] = u[1] * 0x10100u + u[0];
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

// The mean product's operands: A, the weights (64 rows x 16 tiles), and B, the batch's means
// in the layout of compiled.blocked_means, both K-major 8 x 8 core matrices without swizzle,
// 128 bytes apart along the tiles (LBO) and 256 along the rows or channels (SBO).
__device__ __forceinline__ uint64_t desc_means(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(128 >> 4) << 16) |
         (static_cast<uint64_t>(256 >> 4) << 32);
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
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A compile-time flag as an argument (which of the tile's straight copies to run).
template <bool B>
struct With {
  static constexpr bool value = B;
};

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

// ------------------------------------------------------------------------------------------
// The kernel
// ------------------------------------------------------------------------------------------
// Accumulation is two-level: each tile's PV product comes in its own register block and is
// merged into acc in FP32 (merge_tile says why).
template <bool EXPCAST, bool VSMOOTH>
__global__ void __launch_bounds__(THREADS, 1)
    vc_attention_kernel(const __grid_constant__ CUtensorMap tm_q,
                        const __grid_constant__ CUtensorMap tm_k0,
                        const __grid_constant__ CUtensorMap tm_k1,
                        const __grid_constant__ CUtensorMap tm_v, const Params prm) {
  using C = Config<EXPCAST, VSMOOTH>;
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
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PRODUCER_REGS));
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
          bytes += MEAN_BATCH * D * 2;
        }
        // the tile's K scale beside it (released by the arrive below)
        reinterpret_cast<float*>(smem + C::KS_OFF)[st] =
            prm.k_scale[static_cast<size_t>(bh) * n_tiles + j];
        mbar_expect_tx(full(st), bytes);
        const uint32_t s_k = s_stage + st * C::STAGE_BYTES;
        const int g0 = (bh * prm.n_pad + j * BN) / 16;
        tma_load_4d(s_k, &tm_k0, full(st), 0, 0, 0, g0);             // keys 16G + 4q + {0,1}
        tma_load_4d(s_k + C::K_BYTES / 2, &tm_k1, full(st), 0, 0, 0, g0);  // 16G + 4q + {2,3}
        tma_load_2d(s_k + C::K_BYTES, &tm_v, full(st), j * BN, bh * D);
        if (VSMOOTH && mean_tiles > 0) {
          // the means come blocked (compiled.blocked_means), whole batches, zero-padded
          const int rows = (n_tiles + MEAN_BATCH - 1) / MEAN_BATCH * MEAN_BATCH;
          const __half* src = prm.v_mean + (static_cast<size_t>(bh) * rows + j) * D;
          bulk_load(mean_buffer(s_mbuf, j / MEAN_BATCH), src, MEAN_BATCH * D * 2, full(st));
        }
      }
    }
  } else {
    // ---------------- consumers: 64 query rows each ----------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(CONSUMER_REGS));
    const int cw = wg - 1;
    const int warp = tid / 32, lane = tid % 32, q = lane & 3, g = lane >> 2;
    const int row0 = m_block * BM + cw * 64 + warp * 16 + g;  // rows row0, row0 + 8
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

    const uint64_t desc_q = desc_sw128(s_q + cw_u * 64 * D);
    auto desc_k = [&](int st) { return desc_sw128(s_stage + st * C::STAGE_BYTES); };
    // A volatile load whose value is never used (each tile's K scale comes through shared
    // memory); ptxas drops it, but it is part of the program ptxas allocates registers for:
    // without it, the exp2 + V-Smooth instance's allocation moves (the measured build has it).
    [[maybe_unused]] const float k_scale_0 = __ldg(k_scale);
    mbar_wait(bar_q, 0);

    // One tile. The masked softmax only in the last tile, which runs outside the loop, so the
    // loop's registers are the unmasked path's (with the mask's predicates in it, ptxas spilled
    // at 160 registers). The stage and its phase are counted, not j divided by STAGES.
    int stage = 0, phase = 0;
    // The descriptors as opaque 64-bit values (plus desc_zero, which ptxas cannot know is 0):
    // each k-step's is then one 64-bit uniform add, where a known constant high word made
    // ptxas rebuild both words of every descriptor every tile. dk: the stage's K tile.
    const uint64_t dq = desc_q + prm.desc_zero, dk0 = desc_k(0) + prm.desc_zero;
    uint64_t dk = dk0;
    // store_rm's base, written from base (through rbuf, ptxas allocates the V-Smooth
    // instances' registers differently)
    [[maybe_unused]] const uint32_t rm_lanes =
        base + C::RBUF_OFF + cw_u * C::RM_SLOTS * 512 - 128 * (cw_u + 1);
    // V-Smooth: each tile's (r, m) stored per row (lane q == 0) after its merge; at tile
    // j = 16k (k >= 1) the batch of tiles j - 16 .. j - 1 is complete: its weights, against m_j
    // (the max P_j is encoded against), go to shared memory after the softmax, and its product
    // is one f16 wgmma (A and B from shared memory) in PV_j's group, into PV_j's block, which
    // the merge rescales and adds like the rest. The last batch (and the one before it, when
    // the last tile opens a batch) goes into acc after the loop. mma.sync waits for every wgmma
    // in flight on the SM, which with three warpgroups is always another warpgroup's.
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
      const uint32_t l_slot = base + C::PARK_OFF + (threadIdx.x - 128) * 8;
      if constexpr (COLD) park(l_slot, l);
      const int st = stage;
      mbar_wait(full(st), phase);
      const uint64_t dk_j = dk;
      const uint64_t dv_j = dk + (C::K_BYTES >> 4);
      stage = stage == STAGES - 1 ? 0 : stage + 1;
      phase ^= stage == 0;
      dk = stage == 0 ? dk0 : dk + (C::STAGE_BYTES >> 4);
      wgmma_fence();
      issue_qk(s, dq, dk_j);
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(s);
      // the K scale from the stage (the producer wrote it): no register across tiles
      const float c_scale = q_scale * reinterpret_cast<const float*>(smem + C::KS_OFF)[st];
      softmax_tile<EXPCAST, LAST>(s, m, alpha, rsum, c_scale, prm.expcast_bias, prm.log2_p_scale,
                                  LAST ? prm.n - j * BN : BN, q);
      if constexpr (MEAN) {
        // the batch's weights against m_j into this warpgroup's A tile (S's 32 code registers
        // live, not the PV block's 68): nothing more is live while PV runs than in any tile
        uint32_t w[4];
        mean_weights_rows(w, rbuf, m, MEAN_BATCH, warp, lane);
        store_weights(smem + C::WBUF_OFF + cw_u * 64 * MEAN_BATCH * 2, w, warp, lane);
        __syncwarp();  // a warp's weight rows are the A rows its part of the wgmma reads
      }
      pack_p<EXPCAST>(p, s);
      // MEAN: the batch's product in PV_j's group, into PV_j's block (merged with it), the
      // weights from shared memory
      [[maybe_unused]] const uint64_t desc_mu = desc_means(mean_buffer(s_mbuf, (j >> 4) - 1));
      [[maybe_unused]] const uint64_t desc_w =
          desc_means(smem_u32(smem + C::WBUF_OFF) + cw_u * 64 * MEAN_BATCH * 2);
      float pv[C::NACC];
      reg_fence(p);
      wgmma_fence();
      issue_pv<true>(pv, p, dv_j);
      if constexpr (MEAN) wgmma_f16_ss_n128(pv, desc_w, desc_mu);
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(pv);
      reg_fence(p);
      mbar_arrive(empty(st));
      float r[2];
      tile_rowsum<EXPCAST>(pv, rsum, r);
      if constexpr (COLD) unpark(l_slot, l);
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
    if constexpr (VSMOOTH) {
      // the batches still owed, against the final max: the last tile's and, when the last tile
      // opens a batch (its (r, m) then in slot 16), the batch before it (else a product of
      // zero weights: no branch around a wgmma)
      const bool opens = (last & (MEAN_BATCH - 1)) == 0;
      uint32_t w_prev[4], w[4];
      mean_weights_rows(w_prev, rbuf, m, opens && last > 0 ? MEAN_BATCH : 0, warp, lane);
      mean_weights_rows(w, opens ? rbuf + MEAN_BATCH * 128 : rbuf, m,
                        opens ? 1 : (last & (MEAN_BATCH - 1)) + 1, warp, lane);
      reg_fence(acc);
      wgmma_fence();
      wgmma_f16_rs_n128(acc, w_prev, desc_means(mean_buffer(s_mbuf, (last >> 4) - 1)));
      wgmma_f16_rs_n128(acc, w, desc_means(mean_buffer(s_mbuf, last >> 4)));
      wgmma_commit();
      wgmma_wait<0>();
      reg_fence(acc);
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

template <bool EXPCAST, bool VSMOOTH>
struct Instance {
  using C = Config<EXPCAST, VSMOOTH>;
  static constexpr auto kernel = vc_attention_kernel<EXPCAST, VSMOOTH>;

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

  static void describe(char* text, size_t len) {
    char line[256];
    cudaFuncAttributes at;
    if (cudaFuncGetAttributes(&at, kernel) != cudaSuccess)
      snprintf(line, sizeof(line), "expcast=%d vsmooth=%d: cudaFuncGetAttributes failed\n",
               EXPCAST, VSMOOTH);
    else
      snprintf(line, sizeof(line), "expcast=%d vsmooth=%d stages=%d: %d registers/thread at "
               "entry, %zu B local, %d B dynamic shared memory\n",
               EXPCAST, VSMOOTH, STAGES, at.numRegs, at.localSizeBytes, C::ALLOC);
    strncat(text, line, len - strlen(text) - 1);
  }
};

}  // namespace

const char* forward(const ForwardArgs& a) {
  if (a.n < 1 || a.n_pad % BN != 0 || a.n_pad < a.n || a.n_pad - a.n >= BN)
    return fail("bad sequence lengths%s (n_pad %lld)", "", a.n_pad);
  if (a.q_rows < 16 || 128 % a.q_rows != 0)
    return fail("q_rows must divide 128 and be at least 16%s, got %lld", "", a.q_rows);
  const long long bh = static_cast<long long>(a.batch) * a.heads;
  if (bh < 1 || bh > 65535) return fail("batch x heads out of range%s: %lld", "", bh);

  CUtensorMap maps[4];
  const cuuint64_t rows = static_cast<cuuint64_t>(bh) * a.n_pad;
  {  // Q: (B*H*n_pad rows, 128 bytes), box of a CTA's rows
    const cuuint64_t dims[2] = {D, rows};
    const cuuint64_t strides[1] = {D};
    const cuuint32_t box[2] = {D, static_cast<cuuint32_t>(BM)};
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
  const dim3 grid((a.n_pad + BM - 1) / BM, static_cast<unsigned>(bh));
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (a.expcast)
    return vsmooth ? Instance<true, true>::launch(maps, prm, grid, stream)
                   : Instance<true, false>::launch(maps, prm, grid, stream);
  return vsmooth ? Instance<false, true>::launch(maps, prm, grid, stream)
                 : Instance<false, false>::launch(maps, prm, grid, stream);
}

const char* describe() {
  static char text[2048];
  text[0] = 0;
  Instance<true, true>::describe(text, sizeof(text));
  Instance<false, true>::describe(text, sizeof(text));
  Instance<true, false>::describe(text, sizeof(text));
  Instance<false, false>::describe(text, sizeof(text));
  return text;
}

}  // namespace vc
