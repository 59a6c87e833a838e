// Host side of the NVFP4 instances: the TMA maps of Q, K and V (16-bit tiles as two halves of
// 128 bytes a row, addressed in bytes), the parameters, and the instance table
// (nvfp4_instances.cuh, from compiled.NVFP4_INSTANCES) that forward_nvfp4 launches from.
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "forward.cuh"
#include "nvfp4_mainloop.cuh"
#include "nvfp4_traits.cuh"
#include "tensor_maps.cuh"

namespace vc {

namespace {

using nvfp4::BN;
using nvfp4::D;

template <class T>
const char* launch(const CUtensorMap (&maps)[3], const nvfp4::Params& prm, dim3 grid,
                   cudaStream_t stream) {
  constexpr auto kernel = nvfp4::nvfp4_attention_kernel<T>;
  cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, T::ALLOC);
  if (e != cudaSuccess) return fail("cudaFuncSetAttribute: %s", cudaGetErrorString(e));
  kernel<<<grid, T::THREADS, T::ALLOC, stream>>>(maps[0], maps[1], maps[2], prm);
  e = cudaGetLastError();
  if (e != cudaSuccess) return fail("kernel launch: %s", cudaGetErrorString(e));
  return nullptr;
}

template <class T>
void describe_into(char* text, size_t len) {
  char line[256];
  cudaFuncAttributes at;
  if (cudaFuncGetAttributes(&at, nvfp4::nvfp4_attention_kernel<T>) != cudaSuccess)
    snprintf(line, sizeof(line), "nvfp4 two_level=%d vsmooth=%d bias=%d: "
             "cudaFuncGetAttributes failed\n", T::TWO_LEVEL, T::VSMOOTH, T::BIAS);
  else
    snprintf(line, sizeof(line), "nvfp4 two_level=%d vsmooth=%d bias=%d stages=%d: %d "
             "registers/thread at entry, %zu B local, %d B dynamic shared memory\n",
             T::TWO_LEVEL, T::VSMOOTH, T::BIAS, T::STAGES, at.numRegs, at.localSizeBytes,
             T::ALLOC);
  strncat(text, line, len - strlen(text) - 1);
}

struct Instance {
  bool two_level, vsmooth, bias;
  const char* (*launch)(const CUtensorMap (&)[3], const nvfp4::Params&, dim3, cudaStream_t);
  void (*describe)(char*, size_t);
};
template <bool TWO_LEVEL, bool VSMOOTH, bool BIAS>
constexpr Instance instance() {
  using T = nvfp4::Traits<TWO_LEVEL, VSMOOTH, BIAS>;
  return {TWO_LEVEL, VSMOOTH, BIAS, launch<T>, describe_into<T>};
}
constexpr Instance INSTANCES[] = {
#include "nvfp4_instances.cuh"
};
constexpr int BM = nvfp4::Traits<true, false, false>::BM;

}  // namespace

const char* forward_nvfp4(const Nvfp4Args& a) {
  if (a.n < 1 || a.nk_pad % BN != 0 || a.nk_pad < a.n || a.nk_pad - a.n >= BN)
    return fail("bad key padding%s (nk_pad %lld)", "", a.nk_pad);
  if (a.nq_pad < a.n || a.nq_pad % 16 != 0)
    return fail("bad query padding%s (nq_pad %lld)", "", a.nq_pad);
  const long long bh = static_cast<long long>(a.batch) * a.heads;
  if (bh < 1 || bh > 65535) return fail("batch x heads out of range%s: %lld", "", bh);
  if ((a.q_outer == nullptr) != (a.k_outer == nullptr))
    return fail("Q and K take outer scales together%s");
  if (a.bias != nullptr && a.q_outer != nullptr)  // the bias starts the QK accumulator, unscaled
    return fail("Q smoothing's score term with outer scales of Q and K%s");

  // Rows of 256 bytes (128 fp16 channels), boxes of 128 bytes x 128 rows: a half of a K or V
  // tile (its rows in key_of's order already); Q's of 64 rows (a CTA's 192 rows are three).
  CUtensorMap maps[3];
  const cuuint32_t box[2] = {128, 128};
  {
    const cuuint32_t q_box[2] = {128, 64};
    const cuuint64_t dims[2] = {2 * D, static_cast<cuuint64_t>(bh) * a.nq_pad};
    const cuuint64_t strides[1] = {2 * D};
    if (!make_map(&maps[0], a.q, 2, dims, strides, q_box))
      return fail("tensor map for Q failed%s");
  }
  {
    const cuuint64_t dims[2] = {2 * D, static_cast<cuuint64_t>(bh) * a.nk_pad};
    const cuuint64_t strides[1] = {2 * D};
    if (!make_map(&maps[1], a.k, 2, dims, strides, box) ||
        !make_map(&maps[2], a.v, 2, dims, strides, box))
      return fail("tensor map for K or V failed%s");
  }
  nvfp4::Params prm;
  prm.q_outer = a.q_outer;
  prm.k_outer = a.k_outer;
  prm.v_outer = a.v_outer;
  prm.bias = a.bias;
  prm.mean = static_cast<const __half*>(a.mean);
  prm.out = a.out;
  prm.out_sb = a.out_sb;
  prm.out_sh = a.out_sh;
  prm.out_sn = a.out_sn;
  prm.heads = a.heads;
  prm.n = a.n;
  prm.nq_pad = a.nq_pad;
  prm.nk_pad = a.nk_pad;
  prm.n_tiles = a.nk_pad / BN;
  prm.q_blocks = (a.nq_pad + nvfp4::QBLOCK - 1) / nvfp4::QBLOCK;
  prm.out_kind = a.out_kind;
  const bool vsmooth = a.mean != nullptr, bias = a.bias != nullptr;
  const dim3 grid((a.n + BM - 1) / BM, static_cast<unsigned>(bh));
  for (const Instance& k : INSTANCES)
    if (k.two_level == a.two_level && k.vsmooth == vsmooth && k.bias == bias)
      return k.launch(maps, prm, grid, static_cast<cudaStream_t>(a.stream));
  return fail("no NVFP4 instance for this combination of P scaling, V-Smooth and Q smoothing%s");
}

void describe_nvfp4(char* text, size_t len) {
  for (const Instance& k : INSTANCES) k.describe(text, len);
}

}  // namespace vc
