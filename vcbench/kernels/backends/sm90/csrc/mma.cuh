// The tensor-core side: wgmma's shared-memory descriptors, its fence / commit / wait, and the
// two products of a tile, S = Q K^T (INT8 or FP8) and P V (FP8, P from registers).
#pragma once
#include <stdint.h>

#include "wgmma.cuh"

namespace vc {

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

// wgmma shared-memory descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart
// (LBO is unused for this layout). The tile base must be 1024-byte aligned; a k-step of 32
// bytes advances the start address by 2 (16-byte units).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// wgmma shared-memory descriptor: N-major (a B operand whose rows are its k index: V's rows of
// keys for P V), 128-byte swizzle, the canonical layout ((64, m), (8, k)) : ((1, LBO), (64,
// SBO)) in 16-bit elements: each 128-byte row is 64 consecutive n of one k, the m chunks of
// 64 n are `chunk` bytes apart (LBO; a 16-bit tile's halves), groups of 8 k rows 1024 (SBO).
// addr: the k-step's first row, 1024-byte aligned.
__device__ __forceinline__ uint64_t desc_sw128_nmajor(uint32_t addr, uint32_t chunk) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((chunk & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// The mean product's operands: A, the weights (64 rows x 16 tiles), and B, the batch's means
// in the layout of compiled.blocked_means, both K-major 8 x 8 core matrices without swizzle,
// 128 bytes apart along the tiles (LBO) and 256 along the rows or channels (SBO).
__device__ __forceinline__ uint64_t desc_means(uint32_t addr) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(128 >> 4) << 16) |
         (static_cast<uint64_t>(256 >> 4) << 32);
}

// S = Q K_j^T for this warpgroup's 64 rows: 4 k-steps of 32 channels.
__device__ __forceinline__ void issue_qk(uint32_t (&s)[64], uint64_t desc_q, uint64_t desc_k) {
  wgmma_s8_ss_n128_first(s, desc_q, desc_k);  // overwrites: the old S is dead by now
#pragma unroll
  for (int kk = 1; kk < 4; ++kk) wgmma_s8_ss_n128(s, desc_q + 2 * kk, desc_k + 2 * kk, 1);
}

// The same from E4M3 codes: FP32 scores, in the s32 accumulator's layout (the K row
// permutation holds). Hopper's FP8 wgmma adds its products into the accumulator with a
// truncated mantissa, so the scores differ from exact FP32 in their last bits (measured
// against the emulation: docs/perf.md).
__device__ __forceinline__ void issue_qk(float (&s)[64], uint64_t desc_q, uint64_t desc_k) {
  wgmma_e4m3_ss_n128_first(s, desc_q, desc_k);
#pragma unroll
  for (int kk = 1; kk < 4; ++kk) wgmma_e4m3_ss_n128(s, desc_q + 2 * kk, desc_k + 2 * kk, 1);
}

// acc = P V_j, a fresh block (the first k-step overwriting): 4 k-steps of 32 keys, P from
// registers. NACC 68: ExpCast's ones column (N = 136).
template <int NACC>
__device__ __forceinline__ void issue_pv(float (&acc)[NACC], const uint32_t (&p)[16],
                                         uint64_t desc_v) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    if constexpr (NACC == 68) {
      if (kk == 0)
        wgmma_e4m3_rs_n136_first(acc, p[0], p[1], p[2], p[3], desc_v);
      else
        wgmma_e4m3_rs_n136(acc, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                           desc_v + 2 * kk);
    } else {
      if (kk == 0)
        wgmma_e4m3_rs_n128_first(acc, p[0], p[1], p[2], p[3], desc_v);
      else
        wgmma_e4m3_rs_n128(acc, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                           desc_v + 2 * kk);
    }
  }
}

}  // namespace vc
