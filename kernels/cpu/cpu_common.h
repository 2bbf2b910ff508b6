// What the CPU kernels share: denormal flushing, the masked-score value and
// one 16-score block of an online softmax (vectorized where the build has a
// vector type, vec.h).
#pragma once

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "check.h"
#include "vec.h"

namespace pagoda_cpu {

// Calls f(T{}) with T the C++ type of `dtype`, one of the dtypes the
// kernels read and write (a KV cache may differ from the model's:
// kv_cache_dtype); anything else fails naming `what`. Used instead of
// AT_DISPATCH_*, whose refusal builds its message with c10::str (check.h).
template <typename F>
void dispatch_dtype(c10::ScalarType dtype, const char* what, F&& f) {
  switch (dtype) {
    case c10::ScalarType::Float:
      f(float{});
      return;
    case c10::ScalarType::BFloat16:
      f(c10::BFloat16{});
      return;
    case c10::ScalarType::Half:
      f(c10::Half{});
      return;
    default:
      fail("%s dtype must be float32, bfloat16 or float16, got %s", what, c10::toString(dtype));
  }
}

// Flush denormals to zero while the kernel runs on this thread: a peaked
// softmax underflows exp() into denormals, and arithmetic on them is many
// times slower (measured 1.7x for the whole kernel); they are below 1e-38 of
// the largest probability, so zero is as good an answer.
class FlushDenormals {
 public:
#if defined(__SSE__)
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved_); }

 private:
  unsigned int saved_;
#endif
};

// Masked scores: finite (-ffast-math assumes no infinities), and exp() of
// it minus any real maximum is exactly 0.
constexpr float kMasked = -1e30f;


#if defined(PAGODA_VEC)
constexpr int64_t kSumLanes = kLanes;
#else
constexpr int64_t kSumLanes = 1;
#endif

// One span of a row's online softmax: N (16 or 32) keys. `s` holds the
// row's N scores, of which the first `valid` count (the others are masked:
// causal, or past the context); they become the unnormalized probabilities
// exp(s - max), zero where masked. `max` is the row's running maximum;
// `sum_lanes` (kSumLanes floats) its running sum, kept per vector lane so
// that a span pays no horizontal sum (the caller adds the lanes once, at the
// end: lanes_total); `corr` is what the row's accumulator must be
// multiplied by. A span of 32 pays one horizontal maximum and one rescale
// for twice the keys.
template <int64_t N>
inline void softmax_span_lanes(float* __restrict s, int64_t valid, float& max,
                               float* __restrict sum_lanes, float& corr) {
  valid = std::max<int64_t>(0, std::min<int64_t>(N, valid));
#if defined(PAGODA_VEC)
  constexpr int kVecs = N / kLanes;
  vfloat sr[kVecs];
  vfloat top = vset1(kMasked);
#pragma GCC unroll 4
  for (int j = 0; j < kVecs; ++j) {
    const int64_t n = std::max<int64_t>(0, std::min<int64_t>(kLanes, valid - j * kLanes));
    sr[j] = vfirst(vload(s + j * kLanes), n, vset1(kMasked));
    top = vmax(top, sr[j]);
  }
  const float m = std::max(max, vreduce_max(top));
  // exp(max - m) in a vector: a scalar std::exp is a libm call, with the
  // vzeroupper and spills around it, once per row and span.
  const vfloat c = vexp(vset1(max - m));
  vfloat total = vmul(vload(sum_lanes), c);
#pragma GCC unroll 4
  for (int j = 0; j < kVecs; ++j) {
    const int64_t n = std::max<int64_t>(0, std::min<int64_t>(kLanes, valid - j * kLanes));
    const vfloat pr = vfirst(vexp(vsub(sr[j], vset1(m))), n, vzero());
    vstore(s + j * kLanes, pr);
    total = vadd(total, pr);
  }
  vstore(sum_lanes, total);
  corr = vlane0(c);
  max = m;
#else
  float m = max;
  for (int64_t k = 0; k < valid; ++k) m = std::max(m, s[k]);
  float total = 0.f;
  for (int64_t k = 0; k < N; ++k) {
    s[k] = k < valid ? std::exp(s[k] - m) : 0.f;
    total += s[k];
  }
  corr = std::exp(max - m);
  sum_lanes[0] = sum_lanes[0] * corr + total;
  max = m;
#endif
}

// The row's sum from its kSumLanes partial sums.
inline float lanes_total(const float* sum_lanes) {
#if defined(PAGODA_VEC)
  return vreduce_add(vload(sum_lanes));
#else
  return sum_lanes[0];
#endif
}

// The same with the sum a scalar (one horizontal sum per span).
template <int64_t N>
inline void softmax_span(float* __restrict s, int64_t valid, float& max, float& sum, float& corr) {
  float lanes[kSumLanes] = {};
  softmax_span_lanes<N>(s, valid, max, lanes, corr);
  sum = sum * corr + lanes_total(lanes);
}

// One block of 16 keys (the decode kernel's unit).
inline void softmax_block16(float* __restrict s, int64_t valid, float& max, float& sum, float& corr) {
  softmax_span<16>(s, valid, max, sum, corr);
}

}  // namespace pagoda_cpu
