// The compiled VC-Attention forward kernel for Hopper (sm_90a): the host-side interface, plain
// C++ (binding.cpp includes it too; .cuh so the package data carries it). No torch here:
// binding.cpp checks tensors and fills ForwardArgs; launch.cu builds the TMA descriptors and
// launches.
#pragma once
#include <stddef.h>
#include <stdint.h>

namespace vc {

// Operands exactly as backends.triton.operands.prepare_gpu writes them (GpuOperands), all
// contiguous, N padded to a multiple of 128 (n_pad), head dim 128:
//   q        int8 or e4m3 (B, H, n_pad, 128)  Q codes, softmax scale * log2(e) folded in
//   q_scale  fp32  (B, H, n_pad / q_rows)     one scale per q_rows query rows (16 or 128)
//   k        as q  (B, H, n_pad, 128)         K codes (token-mean smoothed, permuted)
//   k_scale  fp32  (B, H, n_pad / 128)        one scale per 128-key tile
//   v_t      e4m3  (B, H, 128, n_pad)         V codes, transposed
//   v_scale  fp32  (B, H, 128)                one scale per channel (epilogue), or
//                  (B, H, n_pad / 128)        one per KV tile (v_per_tile: the merge)
//   v_mean   fp16  (B, H, n_pad / 128, 128)   V-Smooth block means / channel scale, or null
//   out      bf16 or fp16 (B, H, n, 128)      any strides (elements), unit last stride
struct ForwardArgs {
  const void* q;
  const float* q_scale;
  const void* k;
  const float* k_scale;
  const void* v_t;
  const float* v_scale;
  const void* v_mean;
  void* out;
  int64_t out_sb, out_sh, out_sn;
  int batch, heads, n, n_pad, q_rows;
  bool expcast;         // P by ExpCast-FP8 (vc-8bit) or by exp2 then cast (vc-8bit-vsmooth)
  bool qk_fp8;          // Q, K codes in E4M3 (else INT8)
  bool v_per_tile;      // v_scale per KV tile (else per channel)
  bool out_bf16;        // else fp16
  float expcast_bias;   // 120 + beta
  float log2_p_scale;   // exp2 path: log2 of the static P scale (256 for vc, 448 for sage2)
  void* stream;         // cudaStream_t
};

// KV tiles per V-Smooth mean product (one batch of means; compiled.MEAN_BATCH). The kernel
// reads the means blocked (compiled.blocked_means): whole batches of 16 tiles, zero-padded,
// each as wgmma's K-major B operand.
constexpr int MEAN_BATCH = 16;

// nullptr on success, else a message (static storage) saying what was refused or failed.
const char* forward(const ForwardArgs& args);

// The NVFP4 instances' operands, as backends.triton.nvfp4.prepare writes them (Nvfp4Operands,
// key_order "sm90": each 128-key tile's K and V rows in nvfp4::key_of's order), all
// contiguous, head dim 128:
//   q        fp16 (B*H, nq_pad, 128)   dequantized NVFP4 values, softmax scale * log2(e) in
//   k        fp16 (B*H, nk_pad, 128)   nk_pad a multiple of 128
//   v        fp16 (B*H, nk_pad, 128)   V's dequantized values
//   q_outer, k_outer, v_outer  fp32 (B*H,)  the two-level operand scales, or null
//   bias     fp32 (B*H, nq_pad / 128, nk_pad)  Q smoothing's score term, or null
//   mean     fp16 (B*H, nk_pad / 128, 2048)   V-Smooth's mean steps (compiled.mean_steps)
//   out      fp16, bf16 or fp32 (B, H, n, 128), any strides (elements), unit last stride
struct Nvfp4Args {
  const void* q;
  const void* k;
  const void* v;
  const float* q_outer;
  const float* k_outer;
  const float* v_outer;
  const float* bias;
  const void* mean;
  void* out;
  int64_t out_sb, out_sh, out_sn;
  int batch, heads, n, nq_pad, nk_pad;
  bool two_level;  // P under a per-row scale (sage3, vc-4bit), else microscaled directly
  int out_kind;    // 0 fp16, 1 bf16, 2 fp32
  void* stream;
};

const char* forward_nvfp4(const Nvfp4Args& args);

// describe()'s lines for the NVFP4 instances, appended to text (len bytes in all).
void describe_nvfp4(char* text, size_t len);

// One line per compiled instance: registers/thread at entry, local and dynamic shared memory.
const char* describe();

}  // namespace vc
