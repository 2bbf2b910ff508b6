// The Python module of the CPU kernels (pagoda.kernels.cpu).

#include <torch/extension.h>

#include <tuple>

#include "graph.h"

void decode_attention(at::Tensor out, at::Tensor query, at::Tensor kv_cache,
                      at::Tensor block_table, at::Tensor seq_lens, at::Tensor token_index,
                      double scale);
void prefill_attention(at::Tensor out, at::Tensor query, at::Tensor kv_cache,
                       at::Tensor block_table, at::Tensor seq_lens, at::Tensor query_start_loc,
                       at::Tensor rows, double scale);
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps);
std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(at::Tensor x, at::Tensor residual,
                                                            at::Tensor weight, double eps);
void rotary_embedding(at::Tensor positions, at::Tensor query, at::Tensor key,
                      at::Tensor cos_sin_cache);
at::Tensor silu_and_mul(at::Tensor x);
at::Tensor embedding(at::Tensor ids, at::Tensor weight);
void reshape_and_cache(at::Tensor key, at::Tensor value, at::Tensor kv_cache,
                       at::Tensor slot_mapping);
bool linear_supported(at::ScalarType dtype);
bool linear_bf16_pairs();
at::Tensor pack_linear_weight(at::Tensor weight);
at::Tensor packed_linear(at::Tensor x, at::Tensor packed, int64_t out_features,
                         c10::optional<at::Tensor> bias, int64_t widen_from_rows);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "Paged decode attention");
  m.def("prefill_attention", &prefill_attention, "Paged causal attention of prefill chunks");
  m.def("rms_norm", &rms_norm, "RMSNorm over the last dim");
  m.def("fused_add_rms_norm", &fused_add_rms_norm, "(norm(x + residual), x + residual)");
  m.def("rotary_embedding", &rotary_embedding, "Neox-style RoPE in place on query and key");
  m.def("reshape_and_cache", &reshape_and_cache, "Write K/V rows to their paged cache slots");
  m.def("silu_and_mul", &silu_and_mul, "silu(x[:, :d]) * x[:, d:]");
  m.def("embedding", &embedding, "weight[ids]: the token embedding's rows");
  m.def("linear_supported", &linear_supported, "Whether this CPU runs packed_linear in a dtype");
  m.def("linear_bf16_pairs", &linear_bf16_pairs,
        "Whether bf16 runs as AVX512-BF16 pair dot products (and can run widened instead)");
  m.def("pack_linear_weight", &pack_linear_weight, "[out, in] -> the layout packed_linear reads");
  m.def("packed_linear", &packed_linear,
        "x W^T (+ bias) on a packed weight; where the CPU has AVX512-BF16, bf16 calls of at "
        "least widen_from_rows rows (> 0) run as float32 FMAs on the pair layout widened in "
        "registers, the others as pair dot products",
        py::arg("x"), py::arg("packed"), py::arg("out_features"), py::arg("bias"),
        py::arg("widen_from_rows") = 0);
  using pagoda_cpu::CpuGraph;
  py::class_<CpuGraph>(m, "CpuGraph", "The kernel calls of a forward pass, recorded and replayed")
      .def(py::init<>())
      .def("begin_capture", &CpuGraph::begin_capture, "Record this thread's kernel calls here")
      .def("end_capture", &CpuGraph::end_capture)
      // The kernels touch no Python object: other Python threads (the
      // engine core's IO threads) run while a replay computes.
      .def("replay", &CpuGraph::replay, py::call_guard<py::gil_scoped_release>(),
           "Run the recorded calls again")
      .def_property_readonly("num_nodes", &CpuGraph::num_nodes);
}
