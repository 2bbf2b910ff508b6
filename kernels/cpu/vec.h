// The CPU kernels' float vector: as wide as the instruction set the build
// targets (-march=native, so the CPU it runs on). 16 lanes on AVX-512, 8 on
// AVX2 with FMA (AMD Zen 2/3 and Intel before Skylake-SP have no AVX-512).
// The kernels are written once over these functions; where neither exists
// (PAGODA_VEC undefined) they keep their scalar loops.
//
// The functions are thin: each is one or a few intrinsics, so a kernel's
// AVX-512 build compiles to the instructions it would with the intrinsics
// written out, and its AVX2 build to the same algorithm at half the width.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
#define PAGODA_VEC 16
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define PAGODA_VEC 8
#endif

#if defined(PAGODA_VEC)
namespace pagoda_cpu {

constexpr int kLanes = PAGODA_VEC;

#if PAGODA_VEC == 16
using vfloat = __m512;

inline vfloat vzero() { return _mm512_setzero_ps(); }
inline vfloat vset1(float x) { return _mm512_set1_ps(x); }
inline vfloat vload(const float* p) { return _mm512_loadu_ps(p); }
// A bf16 is a float's upper 16 bits: widening is exact.
inline vfloat vload(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline vfloat vload(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void vstore(float* p, vfloat v) { _mm512_storeu_ps(p, v); }
inline vfloat vadd(vfloat a, vfloat b) { return _mm512_add_ps(a, b); }
inline vfloat vsub(vfloat a, vfloat b) { return _mm512_sub_ps(a, b); }
inline vfloat vmul(vfloat a, vfloat b) { return _mm512_mul_ps(a, b); }
inline vfloat vdiv(vfloat a, vfloat b) { return _mm512_div_ps(a, b); }
inline vfloat vmax(vfloat a, vfloat b) { return _mm512_max_ps(a, b); }
// a * b + c
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm512_fmadd_ps(a, b, c); }
inline vfloat vabs(vfloat a) { return _mm512_abs_ps(a); }
// Lanes where `a < 0` take `neg`, the others `pos`.
inline vfloat vselect_negative(vfloat a, vfloat neg, vfloat pos) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_LT_OQ), pos, neg);
}
// The first `n` lanes of `v`, the others `fill` (0 <= n <= kLanes).
inline vfloat vfirst(vfloat v, int64_t n, vfloat fill) {
  return _mm512_mask_mov_ps(fill, static_cast<__mmask16>((1u << n) - 1u), v);
}
inline float vreduce_add(vfloat v) { return _mm512_reduce_add_ps(v); }
inline float vlane0(vfloat v) { return _mm512_cvtss_f32(v); }
inline float vreduce_max(vfloat v) { return _mm512_reduce_max_ps(v); }
inline vfloat vfloor(vfloat v) {
  return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
}
// v * 2^n for whole-numbered n; 0 far below the float range.
inline vfloat vscale2(vfloat v, vfloat n) { return _mm512_scalef_ps(v, n); }

// out[k] = the sum of v[k]'s lanes, for k < 16: a shuffle tree (45
// instructions for 16 sums, where 16 separate horizontal sums take ~160).
inline vfloat lane_sums(const vfloat* v) {
  __m512 w[8];
  for (int j = 0; j < 8; ++j)
    w[j] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * j], v[2 * j + 1]),
                         _mm512_unpackhi_ps(v[2 * j], v[2 * j + 1]));
  __m512 u[4];
  for (int j = 0; j < 4; ++j)
    u[j] = _mm512_add_ps(_mm512_shuffle_ps(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(w[2 * j], w[2 * j + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 s01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 s23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(s01, s23, _MM_SHUFFLE(3, 1, 3, 1)));
}

#else  // PAGODA_VEC == 8
using vfloat = __m256;

inline vfloat vzero() { return _mm256_setzero_ps(); }
inline vfloat vset1(float x) { return _mm256_set1_ps(x); }
inline vfloat vload(const float* p) { return _mm256_loadu_ps(p); }
inline vfloat vload(const c10::BFloat16* p) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
}
inline vfloat vload(const c10::Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void vstore(float* p, vfloat v) { _mm256_storeu_ps(p, v); }
inline vfloat vadd(vfloat a, vfloat b) { return _mm256_add_ps(a, b); }
inline vfloat vsub(vfloat a, vfloat b) { return _mm256_sub_ps(a, b); }
inline vfloat vmul(vfloat a, vfloat b) { return _mm256_mul_ps(a, b); }
inline vfloat vdiv(vfloat a, vfloat b) { return _mm256_div_ps(a, b); }
inline vfloat vmax(vfloat a, vfloat b) { return _mm256_max_ps(a, b); }
inline vfloat vfma(vfloat a, vfloat b, vfloat c) { return _mm256_fmadd_ps(a, b, c); }
inline vfloat vabs(vfloat a) {
  return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
}
inline vfloat vselect_negative(vfloat a, vfloat neg, vfloat pos) {
  return _mm256_blendv_ps(pos, neg, _mm256_cmp_ps(a, _mm256_setzero_ps(), _CMP_LT_OQ));
}
inline vfloat vfirst(vfloat v, int64_t n, vfloat fill) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lane);
  return _mm256_blendv_ps(fill, v, _mm256_castsi256_ps(keep));
}
inline float vlane0(vfloat v) { return _mm256_cvtss_f32(v); }
inline float vreduce_add(vfloat v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float vreduce_max(vfloat v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline vfloat vfloor(vfloat v) { return _mm256_round_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
// v * 2^n, with 2^n built in the exponent bits; n clamped to [-127, 127]
// first, and 2^-127 has exponent bits 0 (with a zero mantissa, +0): far
// below the float range the product is 0, as AVX-512's vscalefps gives.
inline vfloat vscale2(vfloat v, vfloat n) {
  n = _mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-127.f)), _mm256_set1_ps(127.f));
  const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_mul_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(biased, 23)));
}

// out[k] = the sum of v[k]'s lanes, for k < 8 (two horizontal-add levels,
// then the 128-bit halves).
inline vfloat lane_sums(const vfloat* v) {
  const __m256 h01 = _mm256_hadd_ps(v[0], v[1]), h23 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 h45 = _mm256_hadd_ps(v[4], v[5]), h67 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}
#endif

// The first `n` floats at p (n < kLanes), the other lanes zero; reads
// nothing past p + n.
template <typename T>
inline vfloat vload_first(const T* p, int64_t n) {
  T buf[kLanes] = {};
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(T));
  return vload(buf);
}

// Stores: float as is; bf16 and half rounded to nearest even, as c10's
// conversions round (a NaN stays a quiet NaN).
inline void vstore(c10::BFloat16* p, vfloat v) {
#if PAGODA_VEC == 16 && defined(__AVX512BF16__)
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
#elif PAGODA_VEC == 16
  __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  bits = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  bits = _mm512_mask_mov_epi32(bits, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc00000));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(bits, 16)));
#else
  __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  bits = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  bits = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(bits),
                                              _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000)),
                                              _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  bits = _mm256_srli_epi32(bits, 16);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(bits), _mm256_extracti128_si256(bits, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
#endif
}
inline void vstore(c10::Half* p, vfloat v) {
#if PAGODA_VEC == 16
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
#else
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
#endif
}
// The first `n` lanes of v to p (n < kLanes); writes nothing past p + n.
template <typename T>
inline void vstore_first(T* p, vfloat v, int64_t n) {
  T buf[kLanes];
  vstore(buf, v);
  std::memcpy(p, buf, static_cast<size_t>(n) * sizeof(T));
}

// e^x for x <= 0 (a softmax's shifted scores): 2^(x log2 e) split into 2^n
// (0 far below the float range) times 2^f, f in [0, 1), by a degree-7
// polynomial (relative error below 2e-7, far under the bf16 rounding of the
// probabilities that follows).
inline vfloat vexp(vfloat x) {
  const vfloat t = vmul(x, vset1(1.44269504088896341f));
  const vfloat n = vfloor(t);
  const vfloat f = vmul(vsub(t, n), vset1(0.69314718055994531f));
  // e^(f ln 2) = sum (f ln2)^k / k!, k <= 7, by Horner.
  vfloat p = vset1(1.f / 5040.f);
  p = vfma(p, f, vset1(1.f / 720.f));
  p = vfma(p, f, vset1(1.f / 120.f));
  p = vfma(p, f, vset1(1.f / 24.f));
  p = vfma(p, f, vset1(1.f / 6.f));
  p = vfma(p, f, vset1(0.5f));
  p = vfma(p, f, vset1(1.f));
  p = vfma(p, f, vset1(1.f));
  return vscale2(p, n);
}

}  // namespace pagoda_cpu
#endif  // PAGODA_VEC
