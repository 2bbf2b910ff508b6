// RMSNorm (with the residual add fused), RoPE and SiLU-and-mul on the CPU:
// one call each where the torch twins in pagoda/kernels/reference.py take 5,
// 20 and 4 ops a layer, which at batch 1 is framework overhead, not arithmetic.
//
// They round where the twins round: scalar_t arithmetic (c10::BFloat16,
// c10::Half) computes in float and rounds each result to scalar_t, as an
// eager torch op on bf16 tensors does, so RoPE and the residual sum give the
// twins' bits. The sum of squares is accumulated in another order than
// torch's, which moves a few normalized values by one unit in the last place.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>

#include "cpu_common.h"
#include "graph.h"

namespace {

// Rows are spread over threads only when there are enough of them to pay
// for waking the pool (a decode step has one row per request).
constexpr int64_t kRowsPerTask = 16;

template <typename scalar_t>
void rms_norm_rows(scalar_t* out, scalar_t* sum_out, const scalar_t* x, const scalar_t* residual,
                   const scalar_t* weight, int64_t rows, int64_t hidden, int64_t x_stride,
                   int64_t res_stride, float eps) {
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* xr = x + r * x_stride;
      scalar_t* o = out + r * hidden;
      // With a residual, the sum is rounded to scalar_t (the residual stream's
      // dtype) before the statistics, and returned.
      const scalar_t* src = xr;
      if (residual != nullptr) {
        const scalar_t* rr = residual + r * res_stride;
        scalar_t* s = sum_out + r * hidden;
        for (int64_t i = 0; i < hidden; ++i) s[i] = static_cast<scalar_t>(static_cast<float>(xr[i]) + static_cast<float>(rr[i]));
        src = s;
      }
      float sq = 0.f;
      for (int64_t i = 0; i < hidden; ++i) {
        const float v = static_cast<float>(src[i]);
        sq += v * v;
      }
      const float inv = 1.f / std::sqrt(sq / static_cast<float>(hidden) + eps);
      for (int64_t i = 0; i < hidden; ++i) {
        const scalar_t normed = static_cast<scalar_t>(static_cast<float>(src[i]) * inv);
        o[i] = static_cast<scalar_t>(static_cast<float>(weight[i]) * static_cast<float>(normed));
      }
    }
  });
}

void check_rows(const at::Tensor& t, const char* name) {
  PAGODA_CHECK(t.device().is_cpu() && t.dim() == 2 && t.stride(1) == 1,
               "%s must be a CPU [rows, hidden] tensor with contiguous rows", name);
}

}  // namespace

at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
  check_rows(x, "x");
  PAGODA_CHECK(weight.is_contiguous() && weight.numel() == x.size(1) && weight.scalar_type() == x.scalar_type(),
               "weight must be [hidden] in x's dtype");
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  pagoda_cpu::run_op([=]() mutable {
    pagoda_cpu::dispatch_dtype(x.scalar_type(), "x", [&](auto type_tag) {
      using scalar_t = decltype(type_tag);
      rms_norm_rows<scalar_t>(out.data_ptr<scalar_t>(), nullptr, x.data_ptr<scalar_t>(), nullptr,
                              weight.data_ptr<scalar_t>(), x.size(0), x.size(1), x.stride(0), 0,
                              static_cast<float>(eps));
    });
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> fused_add_rms_norm(at::Tensor x, at::Tensor residual,
                                                            at::Tensor weight, double eps) {
  check_rows(x, "x");
  check_rows(residual, "residual");
  PAGODA_CHECK(residual.sizes() == x.sizes() && residual.scalar_type() == x.scalar_type(),
               "residual must match x");
  PAGODA_CHECK(weight.is_contiguous() && weight.numel() == x.size(1) && weight.scalar_type() == x.scalar_type(),
               "weight must be [hidden] in x's dtype");
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  auto sum = at::empty({x.size(0), x.size(1)}, x.options());
  pagoda_cpu::run_op([=]() mutable {
    pagoda_cpu::dispatch_dtype(x.scalar_type(), "x", [&](auto type_tag) {
      using scalar_t = decltype(type_tag);
      rms_norm_rows<scalar_t>(out.data_ptr<scalar_t>(), sum.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(),
                              residual.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(), x.size(0),
                              x.size(1), x.stride(0), residual.stride(0), static_cast<float>(eps));
    });
  });
  return {out, sum};
}

namespace {

template <typename scalar_t>
void rotate_heads(scalar_t* base, int64_t tok_stride, int64_t head_stride, int64_t heads, int64_t t,
                  const float* cos_f, const float* sin_f, int64_t half) {
  for (int64_t h = 0; h < heads; ++h) {
    scalar_t* x = base + t * tok_stride + h * head_stride;
    for (int64_t i = 0; i < half; ++i) {
      // cos and sin rounded to the activations' dtype, as the twin does.
      const scalar_t c = static_cast<scalar_t>(cos_f[i]), s = static_cast<scalar_t>(sin_f[i]);
      const scalar_t x1 = x[i], x2 = x[half + i];
      // (x1 cos - x2 sin, x2 cos + x1 sin), each product and sum rounded.
      x[i] = static_cast<scalar_t>(x1 * c) - static_cast<scalar_t>(x2 * s);
      x[half + i] = static_cast<scalar_t>(x2 * c) + static_cast<scalar_t>(x1 * s);
    }
  }
}

// The positions are checked at every call (a replay reads new ones).
void rotate(const at::Tensor& positions, at::Tensor& query, at::Tensor& key,
            const at::Tensor& cos_sin_cache) {
  auto pos = positions.to(at::kLong).contiguous();
  const int64_t* p = pos.data_ptr<int64_t>();
  const int64_t tokens = query.size(0), max_pos = cos_sin_cache.size(0);
  for (int64_t t = 0; t < tokens; ++t) {
    PAGODA_CHECK(p[t] >= 0 && p[t] < max_pos, "position %lld outside the cache (%lld)",
                 static_cast<long long>(p[t]), static_cast<long long>(max_pos));
  }
  pagoda_cpu::dispatch_dtype(query.scalar_type(), "query/key", [&](auto type_tag) {
    using scalar_t = decltype(type_tag);
    const float* table = cos_sin_cache.data_ptr<float>();
    const int64_t rot = cos_sin_cache.size(1), half = rot / 2;
    scalar_t* q = query.data_ptr<scalar_t>();
    scalar_t* k = key.data_ptr<scalar_t>();
    at::parallel_for(0, tokens, kRowsPerTask, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* cos = table + p[t] * rot;
        rotate_heads<scalar_t>(q, query.stride(0), query.stride(1), query.size(1), t, cos, cos + half, half);
        rotate_heads<scalar_t>(k, key.stride(0), key.stride(1), key.size(1), t, cos, cos + half, half);
      }
    });
  });
}

}  // namespace

void rotary_embedding(at::Tensor positions, at::Tensor query, at::Tensor key,
                      at::Tensor cos_sin_cache) {
  PAGODA_CHECK(query.dim() == 3 && key.dim() == 3 && query.stride(2) == 1 && key.stride(2) == 1,
               "query/key must be [tokens, heads, head_size] with contiguous heads");
  PAGODA_CHECK(query.size(0) == key.size(0) && positions.numel() == query.size(0),
               "one position per token");
  PAGODA_CHECK(query.scalar_type() == key.scalar_type(), "query and key dtypes differ");
  PAGODA_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.is_contiguous() &&
                  cos_sin_cache.size(1) <= query.size(2) && cos_sin_cache.size(1) % 2 == 0,
               "cos_sin_cache must be [max_position, rot_dim], rot_dim even and <= head_size");
  PAGODA_CHECK(key.size(2) == query.size(2), "head sizes differ");
  PAGODA_CHECK(cos_sin_cache.scalar_type() == at::kFloat, "cos_sin_cache must be float32");
  pagoda_cpu::run_op([=]() mutable { rotate(positions, query, key, cos_sin_cache); });
}

namespace {

// silu(g) = g sigmoid(g), with the sigmoid from e^-|g| (at most 1: no
// overflow for any g), then rounded to scalar_t as the twin's F.silu does.
inline float silu(float g) {
  const float e = std::exp(-std::fabs(g));
  return g * ((g < 0.f ? e : 1.f) / (1.f + e));
}

#if defined(PAGODA_VEC)
inline pagoda_cpu::vfloat vsilu(pagoda_cpu::vfloat g) {
  using namespace pagoda_cpu;
  const vfloat one = vset1(1.f);
  const vfloat e = vexp(vsub(vzero(), vabs(g)));
  return vmul(g, vdiv(vselect_negative(g, e, one), vadd(one, e)));
}
#endif

// out[i] = round(round(silu(gate[i])) * up[i]): the twin's two roundings.
template <typename scalar_t>
void silu_and_mul_row(const scalar_t* gate, const scalar_t* up, scalar_t* out, int64_t d) {
  int64_t i = 0;
#if defined(PAGODA_VEC)
  if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, at::BFloat16>) {
    using namespace pagoda_cpu;
    for (; i + kLanes <= d; i += kLanes) {
      vfloat s = vsilu(vload(gate + i));
      if constexpr (!std::is_same_v<scalar_t, float>) {
        // Rounded to bf16 and back, as the twin's F.silu output is.
        alignas(64) scalar_t rounded[kLanes];
        vstore(rounded, s);
        s = vload(rounded);
      }
      vstore(out + i, vmul(s, vload(up + i)));
    }
  }
#endif
  for (; i < d; ++i) {
    const scalar_t s = static_cast<scalar_t>(silu(static_cast<float>(gate[i])));
    out[i] = static_cast<scalar_t>(static_cast<float>(s) * static_cast<float>(up[i]));
  }
}

}  // namespace

at::Tensor silu_and_mul(at::Tensor x) {
  check_rows(x, "x");
  PAGODA_CHECK(x.size(1) % 2 == 0, "x must be [rows, 2 * d]");
  const int64_t rows = x.size(0), d = x.size(1) / 2;
  auto out = at::empty({rows, d}, x.options());
  pagoda_cpu::run_op([=]() mutable {
    pagoda_cpu::dispatch_dtype(x.scalar_type(), "x", [&](auto type_tag) {
      using scalar_t = decltype(type_tag);
      const scalar_t* src = x.data_ptr<scalar_t>();
      scalar_t* dst = out.data_ptr<scalar_t>();
      const int64_t stride = x.stride(0);
      at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) {
          silu_and_mul_row<scalar_t>(src + r * stride, src + r * stride + d, dst + r * d, d);
        }
      });
    });
  });
  return out;
}

// The token embedding: out[t] = weight[ids[t]]. One call where F.embedding
// is an aten op a CPU graph cannot record.
at::Tensor embedding(at::Tensor ids, at::Tensor weight) {
  PAGODA_CHECK(ids.device().is_cpu() && ids.dim() == 1 && ids.scalar_type() == at::kLong,
               "ids must be a CPU int64 [tokens] tensor");
  check_rows(weight, "weight");
  auto out = at::empty({ids.size(0), weight.size(1)}, weight.options());
  pagoda_cpu::run_op([=]() mutable {
    auto idx = ids.contiguous();
    const int64_t* id = idx.data_ptr<int64_t>();
    const int64_t tokens = idx.size(0), vocab = weight.size(0);
    for (int64_t t = 0; t < tokens; ++t) {
      PAGODA_CHECK(id[t] >= 0 && id[t] < vocab, "token id %lld outside the vocabulary (%lld)",
                   static_cast<long long>(id[t]), static_cast<long long>(vocab));
    }
    const int64_t bytes = weight.size(1) * static_cast<int64_t>(weight.element_size());
    const char* src = static_cast<const char*>(weight.data_ptr());
    char* dst = static_cast<char*>(out.data_ptr());
    const int64_t src_stride = weight.stride(0) * weight.element_size();
    for (int64_t t = 0; t < tokens; ++t) std::memcpy(dst + t * bytes, src + id[t] * src_stride, bytes);
  });
  return out;
}
