// Torch binding of the compiled VC-Attention kernel: checks the prepared operands
// (backends.triton.operands.GpuOperands) and calls vc::forward on the current stream.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/extension.h>

#include "forward.cuh"

#ifndef VC_SOURCE_HASH_ID
#define VC_SOURCE_HASH_ID unknown
#endif
#define VC_STR2(x) #x
#define VC_STR(x) VC_STR2(x)

namespace {

void check(const torch::Tensor& t, const char* name, at::ScalarType dtype,
           std::initializer_list<int64_t> shape) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.sizes().vec() == std::vector<int64_t>(shape), name, " must have shape ",
              c10::IntArrayRef(shape), ", got ", t.sizes());
}

// out = attention of the prepared operands; returns out.
torch::Tensor forward(torch::Tensor q, torch::Tensor q_scale, torch::Tensor k,
                      torch::Tensor k_scale, torch::Tensor v_t, torch::Tensor v_scale,
                      c10::optional<torch::Tensor> v_mean, torch::Tensor out, int64_t n,
                      int64_t q_rows, bool expcast, double expcast_bias, double log2_p_scale,
                      bool v_per_tile) {
  TORCH_CHECK(q.dim() == 4, "q must be (B, H, N_pad, D)");
  const int64_t b = q.size(0), h = q.size(1), n_pad = q.size(2), d = q.size(3);
  TORCH_CHECK(d == 128, "the compiled kernel takes head dim 128, got ", d);
  TORCH_CHECK(q_rows > 0 && n_pad % q_rows == 0, "q_rows must divide N_pad");
  // the score format is the codes' dtype: INT8 or E4M3, the same for Q and K
  const bool qk_fp8 = q.scalar_type() == at::kFloat8_e4m3fn;
  const at::ScalarType qk_dtype = qk_fp8 ? at::kFloat8_e4m3fn : at::kChar;
  check(q, "q", qk_dtype, {b, h, n_pad, d});
  check(q_scale, "q_scale", at::kFloat, {b, h, n_pad / q_rows});
  check(k, "k", qk_dtype, {b, h, n_pad, d});
  check(k_scale, "k_scale", at::kFloat, {b, h, n_pad / 128});
  check(v_t, "v_t", at::kFloat8_e4m3fn, {b, h, d, n_pad});
  if (v_per_tile)
    check(v_scale, "v_scale", at::kFloat, {b, h, n_pad / 128});
  else
    check(v_scale, "v_scale", at::kFloat, {b, h, d});
  // the means blocked (compiled.blocked_means): whole batches of MEAN_BATCH tiles, zero-padded
  const int64_t tiles = n_pad / 128;
  const int64_t mean_rows = (tiles + vc::MEAN_BATCH - 1) / vc::MEAN_BATCH * vc::MEAN_BATCH;
  if (v_mean.has_value()) check(*v_mean, "v_mean", at::kHalf, {b, h, mean_rows, d});
  TORCH_CHECK(out.is_cuda() && (out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kHalf),
              "out must be a bf16 or fp16 CUDA tensor");
  TORCH_CHECK(out.dim() == 4 && out.size(0) == b && out.size(1) == h && out.size(2) == n &&
                  out.size(3) == d,
              "out must be (B, H, n, D) = (", b, ", ", h, ", ", n, ", ", d, "), got ", out.sizes());
  TORCH_CHECK(out.stride(3) == 1 && out.stride(0) % 2 == 0 && out.stride(1) % 2 == 0 &&
                  out.stride(2) % 2 == 0,
              "out needs a unit last stride and even other strides");
  TORCH_CHECK(q.device() == out.device() && k.device() == out.device() && v_t.device() == out.device(),
              "all tensors on one device");

  const c10::cuda::CUDAGuard guard(q.device());
  vc::ForwardArgs a{};
  a.q = q.data_ptr();
  a.q_scale = q_scale.data_ptr<float>();
  a.k = k.data_ptr();
  a.k_scale = k_scale.data_ptr<float>();
  a.v_t = v_t.data_ptr();
  a.v_scale = v_scale.data_ptr<float>();
  a.v_mean = v_mean.has_value() ? v_mean->data_ptr() : nullptr;
  a.out = out.data_ptr();
  a.out_sb = out.stride(0);
  a.out_sh = out.stride(1);
  a.out_sn = out.stride(2);
  a.batch = static_cast<int>(b);
  a.heads = static_cast<int>(h);
  a.n = static_cast<int>(n);
  a.n_pad = static_cast<int>(n_pad);
  a.q_rows = static_cast<int>(q_rows);
  a.expcast = expcast;
  a.qk_fp8 = qk_fp8;
  a.v_per_tile = v_per_tile;
  a.out_bf16 = out.scalar_type() == at::kBFloat16;
  a.expcast_bias = static_cast<float>(expcast_bias);
  a.log2_p_scale = static_cast<float>(log2_p_scale);
  a.stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  const char* err = vc::forward(a);
  TORCH_CHECK(err == nullptr, "vc_sm90: ", err ? err : "");
  return out;
}

// out = NVFP4 attention of nvfp4.prepare's operands (key_order "sm90"); returns out.
torch::Tensor forward_nvfp4(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                            c10::optional<torch::Tensor> q_outer,
                            c10::optional<torch::Tensor> k_outer,
                            c10::optional<torch::Tensor> v_outer, c10::optional<torch::Tensor> bias,
                            c10::optional<torch::Tensor> mean, torch::Tensor out, int64_t n,
                            bool two_level) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, "q, k, v must be (B*H, rows, cols)");
  TORCH_CHECK(out.dim() == 4, "out must be (B, H, n, D)");
  const int64_t b = out.size(0), h = out.size(1), bh = q.size(0), nq_pad = q.size(1),
                nk_pad = k.size(1), d = q.size(2);
  TORCH_CHECK(d == 128, "the compiled kernel takes head dim 128, got ", d);
  TORCH_CHECK(bh == b * h, "q holds ", bh, " (batch, head)s, out ", b * h);
  check(q, "q", at::kHalf, {bh, nq_pad, d});
  check(k, "k", at::kHalf, {bh, nk_pad, d});
  check(v, "v", at::kHalf, {bh, nk_pad, d});
  for (const auto* o : {&q_outer, &k_outer, &v_outer})
    if (o->has_value()) check(**o, "outer scale", at::kFloat, {bh});
  if (bias.has_value()) check(*bias, "bias", at::kFloat, {bh, (nq_pad + 127) / 128, nk_pad});
  if (mean.has_value()) check(*mean, "mean", at::kHalf, {bh, nk_pad / 128, 2048});
  TORCH_CHECK(out.is_cuda() && (out.scalar_type() == at::kBFloat16 || out.scalar_type() == at::kHalf ||
                                 out.scalar_type() == at::kFloat),
              "out must be a bf16, fp16 or fp32 CUDA tensor");
  TORCH_CHECK(out.size(2) == n && out.size(3) == d, "out must be (B, H, n, 128), got ", out.sizes());
  TORCH_CHECK(out.stride(3) == 1 && out.stride(0) % 2 == 0 && out.stride(1) % 2 == 0 &&
                  out.stride(2) % 2 == 0,
              "out needs a unit last stride and even other strides");
  TORCH_CHECK(q.device() == out.device() && k.device() == out.device() && v.device() == out.device(),
              "all tensors on one device");

  const c10::cuda::CUDAGuard guard(q.device());
  auto ptr = [](const c10::optional<torch::Tensor>& t) -> const float* {
    return t.has_value() ? t->data_ptr<float>() : nullptr;
  };
  vc::Nvfp4Args a{};
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.q_outer = ptr(q_outer);
  a.k_outer = ptr(k_outer);
  a.v_outer = ptr(v_outer);
  a.bias = ptr(bias);
  a.mean = mean.has_value() ? mean->data_ptr() : nullptr;
  a.out = out.data_ptr();
  a.out_sb = out.stride(0);
  a.out_sh = out.stride(1);
  a.out_sn = out.stride(2);
  a.batch = static_cast<int>(b);
  a.heads = static_cast<int>(h);
  a.n = static_cast<int>(n);
  a.nq_pad = static_cast<int>(nq_pad);
  a.nk_pad = static_cast<int>(nk_pad);
  a.two_level = two_level;
  a.out_kind = out.scalar_type() == at::kHalf ? 0 : out.scalar_type() == at::kBFloat16 ? 1 : 2;
  a.stream = c10::cuda::getCurrentCUDAStream(q.device().index()).stream();
  const char* err = vc::forward_nvfp4(a);
  TORCH_CHECK(err == nullptr, "vc_sm90: ", err ? err : "");
  return out;
}

std::string describe() { return vc::describe(); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "VC-Attention forward for Hopper (sm_90a), vcbench";
  m.def("forward", &forward, "attention of prepared operands (see forward.cuh)",
        py::arg("q"), py::arg("q_scale"), py::arg("k"), py::arg("k_scale"), py::arg("v_t"),
        py::arg("v_scale"), py::arg("v_mean"), py::arg("out"), py::arg("n"), py::arg("q_rows"),
        py::arg("expcast"), py::arg("expcast_bias"), py::arg("log2_p_scale"),
        py::arg("v_per_tile"));
  m.def("forward_nvfp4", &forward_nvfp4, "NVFP4 attention of prepared operands (forward.cuh)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("q_outer"), py::arg("k_outer"),
        py::arg("v_outer"), py::arg("bias"), py::arg("mean"), py::arg("out"), py::arg("n"),
        py::arg("two_level"));
  m.def("describe", &describe, "registers and shared memory of each compiled instance");
  m.attr("SOURCE_HASH") = VC_STR(VC_SOURCE_HASH_ID);  // "h" + compiled.source_hash()
}
