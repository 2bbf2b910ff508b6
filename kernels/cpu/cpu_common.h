// What the CPU kernels share: denormal flushing, the masked-score value,
// bf16 widening, a vectorized exp, and one 16-score block of an online
// softmax (vectorized where the CPU has AVX-512).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace pagoda_cpu {

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

#if defined(__AVX512F__)
// 16 bf16 values as floats: exact, a bf16 is a float's upper 16 bits.
inline __m512 widen_bf16(__m256i raw) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

// e^x for x <= 0 (a softmax's shifted scores): 2^(x log2 e) split into
// 2^n (vscalefps, which flushes to 0 far below the float range) times 2^f,
// f in [0, 1), by a degree-7 polynomial (relative error below 2e-7, far
// under the bf16 rounding of the probabilities that follows).
inline __m512 exp512(__m512 x) {
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, n), _mm512_set1_ps(0.69314718055994531f));
  // e^(f ln 2) = sum (f ln2)^k / k!, k <= 7, by Horner.
  __m512 p = _mm512_set1_ps(1.f / 5040.f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 720.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

#endif

// One block of a row's online softmax. `s` holds the row's 16 scores, of
// which the first `valid` count (the others are masked: causal, or past the
// context); they become the unnormalized probabilities exp(s - max), zero
// where masked. `max` and `sum` are the row's running maximum and sum;
// `corr` is what the row's accumulator must be multiplied by.
inline void softmax_block16(float* __restrict s, int64_t valid, float& max, float& sum, float& corr) {
  valid = std::max<int64_t>(0, std::min<int64_t>(16, valid));
#if defined(__AVX512F__)
  const __mmask16 keep = static_cast<__mmask16>((1u << valid) - 1u);
  const __m512 sr = _mm512_mask_loadu_ps(_mm512_set1_ps(kMasked), keep, s);
  const float m = std::max(max, _mm512_reduce_max_ps(sr));
  const __m512 pr = _mm512_maskz_mov_ps(keep, exp512(_mm512_sub_ps(sr, _mm512_set1_ps(m))));
  _mm512_storeu_ps(s, pr);
  corr = std::exp(max - m);
  sum = sum * corr + _mm512_reduce_add_ps(pr);
  max = m;
#else
  float m = max;
  for (int64_t k = 0; k < valid; ++k) m = std::max(m, s[k]);
  float total = 0.f;
  for (int64_t k = 0; k < 16; ++k) {
    s[k] = k < valid ? std::exp(s[k] - m) : 0.f;
    total += s[k];
  }
  corr = std::exp(max - m);
  sum = sum * corr + total;
  max = m;
#endif
}


}  // namespace pagoda_cpu
