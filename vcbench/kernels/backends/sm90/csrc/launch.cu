// Host side of the compiled kernel: the TMA tensor maps of Q, K (rows permuted) and V^T, the
// kernel's parameters, and the instance table (the plans' combinations of P encoding, V-Smooth,
// score format and V scale) that forward() launches from.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "forward.cuh"
#include "mainloop.cuh"
#include "tensor_maps.cuh"
#include "traits.cuh"

namespace vc {

namespace {

// Launch one instance with the shared memory its traits lay out.
template <class T>
const char* launch(const CUtensorMap (&maps)[4], const Params& prm, dim3 grid,
                   cudaStream_t stream) {
  constexpr auto kernel = vc_attention_kernel<T>;
  // Per call (cheap): the attribute belongs to the current device.
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::ALLOC);
  if (e != cudaSuccess) return fail("cudaFuncSetAttribute: %s", cudaGetErrorString(e));
  kernel<<<grid, T::THREADS, T::ALLOC, stream>>>(maps[0], maps[1], maps[2], maps[3], prm);
  e = cudaGetLastError();
  if (e != cudaSuccess) return fail("kernel launch: %s", cudaGetErrorString(e));
  return nullptr;
}

// One line of describe(): the instance's registers at entry, local and shared memory.
template <class T>
void describe_into(char* text, size_t len) {
  char line[256];
  cudaFuncAttributes at;
  if (cudaFuncGetAttributes(&at, vc_attention_kernel<T>) != cudaSuccess)
    snprintf(line, sizeof(line), "expcast=%d vsmooth=%d qk_fp8=%d v_per_tile=%d: "
             "cudaFuncGetAttributes failed\n", T::EXPCAST, T::VSMOOTH, T::QK_FP8, T::V_PER_TILE);
  else
    snprintf(line, sizeof(line), "expcast=%d vsmooth=%d qk_fp8=%d v_per_tile=%d stages=%d: %d "
             "registers/thread at entry, %zu B local, %d B dynamic shared memory\n",
             T::EXPCAST, T::VSMOOTH, T::QK_FP8, T::V_PER_TILE, T::STAGES, at.numRegs,
             at.localSizeBytes, T::ALLOC);
  strncat(text, line, len - strlen(text) - 1);
}

// The compiled instances: INT8 scores with each (P encoding, V-Smooth) (vc-8bit with and
// without V-Smooth, vc-8bit-vsmooth, sage2-8bit), and FP8 scores for vc-8bit-fp8qk (ExpCast,
// with V-Smooth and without: a schedule's plain steps) and fp8-fa4 (exp2, a V scale per
// tile). The list is compiled.INSTANCES, written out by gen_instances.py as instances.cuh.
struct Instance {
  bool expcast, vsmooth, qk_fp8, v_per_tile;
  const char* (*launch)(const CUtensorMap (&)[4], const Params&, dim3, cudaStream_t);
  void (*describe)(char*, size_t);
};
template <bool EXPCAST, bool VSMOOTH, bool QK_FP8, bool V_PER_TILE>
constexpr Instance instance() {
  using T = Traits<EXPCAST, VSMOOTH, QK_FP8, V_PER_TILE>;
  return {EXPCAST, VSMOOTH, QK_FP8, V_PER_TILE, launch<T>, describe_into<T>};
}
constexpr Instance INSTANCES[] = {
#include "instances.cuh"
};
// The CTA shape is the same in every instance (forward's grid and Q's box).
constexpr int BM = Traits<true, true>::BM;
static_assert(BM == Traits<false, false>::BM, "one CTA shape");

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
  for (const Instance& k : INSTANCES)
    if (k.expcast == a.expcast && k.vsmooth == vsmooth && k.qk_fp8 == a.qk_fp8 &&
        k.v_per_tile == a.v_per_tile)
      return k.launch(maps, prm, grid, static_cast<cudaStream_t>(a.stream));
  return fail("no instance for this combination of P encoding, V-Smooth, score format and V "
              "scale%s");
}

const char* describe() {
  static char text[4096];
  text[0] = 0;
  for (const Instance& k : INSTANCES) k.describe(text, sizeof(text));
  describe_nvfp4(text, sizeof(text));
  return text;
}

}  // namespace vc
