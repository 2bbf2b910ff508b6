// Linear layers on the CPU: y = x W^T (+ bias) on a weight packed once at
// load time, for every number of rows a step brings.
//
// Why not oneDNN's prepacked linear, which this replaces where the CPU has
// AVX-512 or AVX2: at the few rows of a decode step the layer is a read of
// the whole weight, and oneDNN's call read SmolLM2's projections at 25-35
// GB/s against this kernel's 45-65 GB/s (1.4-2.3x at 1 row, 1.2-1.5x at 16,
// measured in docs/benchmarks.md); at 256-512 rows the two are within 5% of
// each other, so one layout and one kernel serve decode and prefill. And a
// model whose every op is a kernel of this extension can be replayed as a
// CPU graph (graph.h); oneDNN's call is a torch op the graph cannot see.
//
// The packed layout puts a panel of kPanel outputs side by side (four
// vectors: 64 on AVX-512, two: 16 on AVX2): [ceil(N/kPanel)][K][kPanel],
// and for bf16 on AVX512-BF16 pairs of K, [ceil(N/kPanel)][ceil(K/2)]
// [kPanel][2], which is what its pair dot product (vdpbf16ps) reads; bf16
// elsewhere is widened to float as it is read. A panel is then one
// contiguous run of memory, read in order: one vector per accumulator per K
// step. Rows go in tiles of up to 6 (6 x 4 accumulators of AVX-512's 32
// registers, 6 x 2 of AVX2's 16); a panel is walked in K blocks of 256 KiB
// so that it stays in L2 while every row tile reads it. Outputs past N and K
// past the weight's are zero padding.
//
// Sums are float32 and rounded once to the output dtype (bias added first),
// as oneDNN's bf16 linear does; the order of the sum differs, so results
// differ from F.linear's at rounding level.
//
// Where a tile widens bf16 weights as it reads them, its rows are float32:
// a call converts its bf16 rows once (M x K, against its M x N x K
// products), so that each row value is one broadcast operand of its FMAs
// rather than a scalar conversion per use.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu_common.h"
#include "graph.h"

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

#if defined(PAGODA_VEC)
using pagoda_cpu::kLanes;
using pagoda_cpu::vfloat;

constexpr int64_t kPanelVecs = kLanes == 16 ? 4 : 2;  // accumulators per row
constexpr int64_t kPanel = kPanelVecs * kLanes;      // outputs per panel
constexpr int kTileRows = 6;       // rows per register tile
constexpr int64_t kChunkRows = 96;  // rows per task (a multiple of kTileRows)
// A panel's K block: kept in L2 on AVX-512 (64-wide panels, 256 bytes a K
// step); on AVX2 (16-wide, one 64-byte line a step) in L1, so that a decode
// step's few row tiles read each block from memory once, the later tiles
// from L1.
constexpr int64_t kBlockBytes = kLanes == 16 ? 256 * 1024 : 16 * 1024;

// Whether a call's row tiles fetch the next K block of the weight (in a
// decode step: the next panel's) into L2 while they compute on this one.
// Without it a block's first tile waits on memory for every line, and its
// later tiles compute while memory idles: a 16-row bf16 decode step of
// SmolLM2 on an Intel Xeon (AVX-512) took 32.0-32.5 ms in the model
// forward without, 29.0-29.4 with, and its LM head 5.1-5.2 ms against
// 4.1-4.2; float32 41.4-42.4 against 36.5-37.7. The exception is one row
// of float32 on AVX-512, a plain read the hardware prefetcher already
// keeps busy: 15.7 against 16.4 ms when every tile prefetched it. AVX2
// (16 KB blocks, kept in L1) prefetches in every call, as it did (16 KB
// ahead) when its kernel was measured.
template <typename T>
bool prefetch_next_block(int64_t rows) {
  if constexpr (kLanes == 8) return true;
  return rows > 1 || !std::is_same_v<T, float>;
}

// One K step of one row tile: the panel's vectors (WVec, as `load` gives
// them) times each row's value(s) (XVec, as `broadcast` gives them). T is
// the layer's dtype (weight, bias, output), X the type the tile reads the
// rows in.
//
// float32, and bf16 where the CPU has no bf16 dot product: one K element
// per step, the weight widened to float as it is loaded, the rows float32.
template <typename T_>
struct WideningStep {
  using T = T_;
  using X = float;
  using WVec = vfloat;
  using XVec = vfloat;
  static constexpr int64_t kPerStep = 1;  // K elements per step
  static vfloat broadcast(const float* x, int64_t k) { return pagoda_cpu::vset1(x[k]); }
  static vfloat broadcast_last(const float* x, int64_t k) { return broadcast(x, k); }
  static vfloat load(const T* w) { return pagoda_cpu::vload(w); }
  static vfloat fma(vfloat acc, vfloat xv, vfloat wv) { return pagoda_cpu::vfma(xv, wv, acc); }
  static constexpr int64_t kVectorElems = kLanes;  // panel elements per vector
};

#if defined(__AVX512BF16__)
struct BFloat16PairStep {
  using T = at::BFloat16;
  using X = at::BFloat16;
  using WVec = __m512;
  using XVec = __m512;
  static constexpr int64_t kPerStep = 2;
  // The pair (x[k], x[k+1]) as one 32-bit lane, low half first.
  static __m512 broadcast(const at::BFloat16* x, int64_t k) {
    int32_t pair;
    std::memcpy(&pair, x + k, 4);
    return _mm512_castsi512_ps(_mm512_set1_epi32(pair));
  }
  // The last step of an odd K: (x[k], 0), as the weight's padding is zero;
  // x[k + 1] is past the row.
  static __m512 broadcast_last(const at::BFloat16* x, int64_t k) {
    uint16_t half;
    std::memcpy(&half, x + k, 2);
    return _mm512_castsi512_ps(_mm512_set1_epi32(half));
  }
  static __m512 load(const at::BFloat16* w) { return _mm512_castsi512_ps(_mm512_loadu_si512(w)); }
  static __m512 fma(__m512 acc, __m512 xv, __m512 wv) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_castps_si512(xv), (__m512bh)_mm512_castps_si512(wv));
  }
  static constexpr int64_t kVectorElems = 32;  // 16 outputs x 2 K
};

// The pair layout read as float32 FMAs: a pair vector's low halves are
// step k's 16 weights, its high halves step k + 1's (a bf16 is a float's
// upper half, so widening is exact: a shift, a mask), against float32 rows.
// Some CPUs with AVX512-BF16 run the pair dot product at no more FLOPs than
// float32 FMAs: on an Intel Xeon with AVX512-BF16 and no AMX, vdpbf16ps gave
// 120-180 GFLOP/s at 16-256 rows where this step gave 165-290 (SmolLM2's
// shapes, docs/benchmarks.md); there a call of `widen_from_rows` rows or
// more runs this step, the caller having measured where it pays.
struct BFloat16WidenedPairStep {
  using T = at::BFloat16;
  using X = float;
  struct WVec {
    __m512 low, high;
  };
  struct XVec {
    __m512 low, high;
  };
  static constexpr int64_t kPerStep = 2;
  static XVec broadcast(const float* x, int64_t k) { return {_mm512_set1_ps(x[k]), _mm512_set1_ps(x[k + 1])}; }
  // The last step of an odd K: x[k + 1] is past the row (the weight's
  // padding there is zero).
  static XVec broadcast_last(const float* x, int64_t k) { return {_mm512_set1_ps(x[k]), _mm512_setzero_ps()}; }
  static WVec load(const at::BFloat16* w) {
    const __m512i v = _mm512_loadu_si512(w);
    return {_mm512_castsi512_ps(_mm512_slli_epi32(v, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))))};
  }
  static __m512 fma(__m512 acc, XVec xv, WVec wv) {
    return _mm512_fmadd_ps(xv.high, wv.high, _mm512_fmadd_ps(xv.low, wv.low, acc));
  }
  static constexpr int64_t kVectorElems = 32;  // 16 outputs x 2 K
};
using BFloat16Step = BFloat16PairStep;
#else
using BFloat16Step = WideningStep<at::BFloat16>;
#endif
using Float32Step = WideningStep<float>;

// acc[r][0..kPanel) (+)= x[r][k0..k1) . panel; `panel` points at step k0.
// `prefetch` (or null): the next block, fetched into L2 alongside this one,
// a step's bytes per step.
template <typename Step, int R>
void tile(const typename Step::X* x, int64_t x_stride, int64_t K, const typename Step::T* panel,
          int64_t k0, int64_t k1, float* acc, bool accumulate, const char* prefetch) {
  constexpr int64_t kStepBytes = kPanelVecs * Step::kVectorElems * sizeof(typename Step::T);
  using T = typename Step::T;
  vfloat c[R][kPanelVecs];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kPanelVecs; ++j)
      c[r][j] = accumulate ? pagoda_cpu::vload(acc + r * kPanel + j * kLanes) : pagoda_cpu::vzero();
  const T* w = panel;
  // Whole steps; then, for bf16 pairs and an odd K, the last element alone.
  const int64_t whole_end = k1 - (k1 == K ? K % Step::kPerStep : 0);
  int64_t k = k0;
  // The panel's vectors are loaded (and widened) once per step, for every row.
  for (; k < whole_end; k += Step::kPerStep, w += kPanelVecs * Step::kVectorElems) {
    if (prefetch != nullptr) {
      for (int64_t b = 0; b < kStepBytes; b += 64) _mm_prefetch(prefetch + b, _MM_HINT_T1);
      prefetch += kStepBytes;
    }
    typename Step::WVec wv[kPanelVecs];
    for (int j = 0; j < kPanelVecs; ++j) wv[j] = Step::load(w + j * Step::kVectorElems);
    for (int r = 0; r < R; ++r) {
      const typename Step::XVec xv = Step::broadcast(x + r * x_stride, k);
      for (int j = 0; j < kPanelVecs; ++j) c[r][j] = Step::fma(c[r][j], xv, wv[j]);
    }
  }
  if (k < k1) {
    typename Step::WVec wv[kPanelVecs];
    for (int j = 0; j < kPanelVecs; ++j) wv[j] = Step::load(w + j * Step::kVectorElems);
    for (int r = 0; r < R; ++r) {
      const typename Step::XVec xv = Step::broadcast_last(x + r * x_stride, k);
      for (int j = 0; j < kPanelVecs; ++j) c[r][j] = Step::fma(c[r][j], xv, wv[j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < kPanelVecs; ++j) pagoda_cpu::vstore(acc + r * kPanel + j * kLanes, c[r][j]);
}

template <typename Step>
void tile_rows(int rows, const typename Step::X* x, int64_t x_stride, int64_t K,
               const typename Step::T* panel, int64_t k0, int64_t k1, float* acc, bool accumulate,
               const char* prefetch) {
  switch (rows) {
    case 6: return tile<Step, 6>(x, x_stride, K, panel, k0, k1, acc, accumulate, prefetch);
    case 5: return tile<Step, 5>(x, x_stride, K, panel, k0, k1, acc, accumulate, prefetch);
    case 4: return tile<Step, 4>(x, x_stride, K, panel, k0, k1, acc, accumulate, prefetch);
    case 3: return tile<Step, 3>(x, x_stride, K, panel, k0, k1, acc, accumulate, prefetch);
    case 2: return tile<Step, 2>(x, x_stride, K, panel, k0, k1, acc, accumulate, prefetch);
    default: return tile<Step, 1>(x, x_stride, K, panel, k0, k1, acc, accumulate, prefetch);
  }
}

// out[r][n0 + j] = acc[r][j] + bias[n0 + j], rounded once, for j < valid.
template <typename T>
void store_rows(const float* acc, int64_t rows, const T* bias, int64_t n0, int64_t valid, T* out,
                int64_t out_stride) {
  using namespace pagoda_cpu;
  int64_t j = 0;
  for (; j + kLanes <= valid; j += kLanes) {
    const vfloat b = bias != nullptr ? vload(bias + n0 + j) : vzero();
    for (int64_t r = 0; r < rows; ++r) vstore(out + r * out_stride + n0 + j, vadd(vload(acc + r * kPanel + j), b));
  }
  if (j < valid) {  // the last outputs of a layer whose width is no multiple of a vector
    const int64_t n = valid - j;
    const vfloat b = bias != nullptr ? vload_first(bias + n0 + j, n) : vzero();
    for (int64_t r = 0; r < rows; ++r)
      vstore_first(out + r * out_stride + n0 + j, vadd(vload(acc + r * kPanel + j), b), n);
  }
}

// How a call of one row chunk (M <= kChunkRows: a decode step, a short
// prefill) is shared by `threads` threads when its panels do not divide
// evenly. One task per panel left one thread idle for the last panel: 9
// panels (576 outputs) on 2 threads ran as 5 and 4, an eleventh of the
// call. Instead each thread takes panels / threads whole panels and a slice
// of this many rows of each remaining panel, which every thread reads (a
// few panels' weights twice, while the rows are enough to keep the call's
// time in its FMAs). 0: one task per panel, as before (the panels divide
// evenly, or the rows are too few to slice).
inline int64_t single_chunk_slice_rows(int64_t M, int64_t panels, int64_t chunks, int64_t threads) {
  if (chunks != 1 || threads < 2 || panels % threads == 0) return 0;
  // Even slices (16 rows on 2 threads: 8 and 8, tiles of 6 and 2, rather
  // than whole tiles, 12 and 4); under 4 rows a slice is mostly the read of
  // its panel, which every thread would repeat.
  const int64_t slice_rows = ceil_div(M, threads);
  return slice_rows < 4 ? 0 : slice_rows;
}

template <typename Step>
void linear_rows(const at::Tensor& x_in, const at::Tensor& packed, const at::Tensor* bias,
                 at::Tensor& out) {
  using T = typename Step::T;
  using X = typename Step::X;
  const at::Tensor x = x_in.to(c10::CppTypeToScalarType<X>::value);  // none where x is X already
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  const int64_t panels = packed.size(0);
  const int64_t k_padded = ceil_div(K, Step::kPerStep) * Step::kPerStep;
  const int64_t panel_elems = k_padded * kPanel;
  // K per block: a multiple of the step, a panel's block within kBlockBytes.
  const int64_t block_k = std::max<int64_t>(
      Step::kPerStep, kBlockBytes / (kPanel * static_cast<int64_t>(sizeof(T))) / Step::kPerStep *
                          Step::kPerStep);
  const X* xs = x.data_ptr<X>();
  const T* ws = packed.data_ptr<T>();
  const T* bs = bias != nullptr ? bias->data_ptr<T>() : nullptr;
  T* os = out.data_ptr<T>();
  const int64_t x_stride = x.stride(0), out_stride = out.stride(0);
  const int64_t chunks = ceil_div(M, kChunkRows);
  // The task order decides which operand stays in cache while the other
  // streams past it. Panel-major (a thread's run of tasks walks its panels
  // once, each against every row chunk) while the weight is the larger, as
  // in a decode step; chunk-major (each row chunk against every panel) once
  // the rows are: panel-major, a 4096-row prefill step read its 9 MB of
  // activations again for every panel (192 times for SmolLM2's gate_up on
  // AVX2) and ran at 70-100 GFLOP/s against 130-150 at 512 rows.
  const bool chunk_major = M > N;
  // What a thread reads after block [k0, k1) of panel p: the rest of the
  // panel, or the next panel, which follows it in memory (the next task's
  // in either order, but at a row chunk's end in chunk-major; none past the
  // weight's end). The first two row
  // tiles fetch it: by the third it has arrived, and in a prefill step's 16
  // tiles a block the prefetches of every tile cost float32 1-3% at 256
  // rows.
  const bool prefetch = prefetch_next_block<T>(M);
  const T* weight_end = ws + panels * panel_elems;
  auto next_block = [&](int64_t p, int64_t k1) -> const char* {
    const T* next = ws + p * panel_elems + k1 * kPanel;
    return prefetch && next < weight_end ? reinterpret_cast<const char*>(next) : nullptr;
  };
  // One task: panel p against rows [m0, m1), m1 - m0 <= kChunkRows.
  auto run_task = [&](float* acc, int64_t p, int64_t m0, int64_t m1) {
    const T* panel = ws + p * panel_elems;
    for (int64_t k0 = 0; k0 < K; k0 += block_k) {
      const int64_t k1 = std::min(K, k0 + block_k);
      for (int64_t m = m0; m < m1; m += kTileRows) {
        const int rows = static_cast<int>(std::min<int64_t>(kTileRows, m1 - m));
        tile_rows<Step>(rows, xs + m * x_stride, x_stride, K, panel + k0 * kPanel, k0, k1,
                        acc + (m - m0) * kPanel, k0 > 0,
                        m < m0 + 2 * kTileRows ? next_block(p, k1) : nullptr);
      }
    }
    const int64_t n0 = p * kPanel;
    store_rows<T>(acc, m1 - m0, bs, n0, std::min(kPanel, N - n0), os + m0 * out_stride, out_stride);
  };
  const int64_t threads = at::get_num_threads();
  const int64_t slice_rows = single_chunk_slice_rows(M, panels, chunks, threads);
  if (slice_rows > 0) {
    const int64_t whole = panels / threads;  // whole panels per thread
    at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
      alignas(64) float acc[kChunkRows * kPanel];
      for (int64_t tid = begin; tid < end; ++tid) {
        for (int64_t p = tid * whole; p < (tid + 1) * whole; ++p) run_task(acc, p, 0, M);
        const int64_t m0 = std::min(M, tid * slice_rows), m1 = std::min(M, m0 + slice_rows);
        for (int64_t p = threads * whole; p < panels && m0 < m1; ++p) run_task(acc, p, m0, m1);
      }
    });
    return;
  }
  at::parallel_for(0, panels * chunks, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float acc[kChunkRows * kPanel];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t p = chunk_major ? t % panels : t / chunks;
      const int64_t m0 = (chunk_major ? t / panels : t % chunks) * kChunkRows;
      run_task(acc, p, m0, std::min(M, m0 + kChunkRows));
    }
  });
}


#else
constexpr int64_t kPanel = 1;  // unused: no kernel without a vector type
#endif  // PAGODA_VEC

bool supported(at::ScalarType dtype) {
#if defined(PAGODA_VEC)
  return dtype == at::kFloat || dtype == at::kBFloat16;
#else
  (void)dtype;
  return false;
#endif
}

// K elements per step of the packed layout.
int64_t per_step(at::ScalarType dtype) {
#if defined(__AVX512BF16__)
  if (dtype == at::kBFloat16) return 2;
#endif
  (void)dtype;
  return 1;
}

}  // namespace

bool linear_supported(at::ScalarType dtype) { return supported(dtype); }

bool linear_bf16_pairs() { return per_step(at::kBFloat16) == 2; }

at::Tensor pack_linear_weight(at::Tensor weight) {
  PAGODA_CHECK(weight.device().is_cpu() && weight.dim() == 2, "weight must be a CPU [out, in] tensor");
  PAGODA_CHECK(supported(weight.scalar_type()), "no packed linear for %s on this CPU",
               c10::toString(weight.scalar_type()));
  const int64_t N = weight.size(0), K = weight.size(1), step = per_step(weight.scalar_type());
  const int64_t panels = ceil_div(N, kPanel), k_steps = ceil_div(K, step);
  // [panel, k step, output in panel, element of the step]
  auto padded = at::zeros({panels * kPanel, k_steps * step}, weight.options());
  padded.narrow(0, 0, N).narrow(1, 0, K).copy_(weight);
  return padded.view({panels, kPanel, k_steps, step}).permute({0, 2, 1, 3}).contiguous();
}

at::Tensor packed_linear(at::Tensor x, at::Tensor packed, int64_t out_features,
                         c10::optional<at::Tensor> bias, int64_t widen_from_rows) {
  PAGODA_CHECK(x.device().is_cpu() && x.dim() == 2 && x.stride(1) == 1,
               "x must be a CPU [rows, in] tensor with contiguous rows");
  PAGODA_CHECK(packed.dim() == 4 && packed.is_contiguous() && packed.size(2) == kPanel &&
                  packed.scalar_type() == x.scalar_type(),
               "packed must come from pack_linear_weight, in x's dtype");
  const int64_t step = per_step(x.scalar_type());
  PAGODA_CHECK(packed.size(3) == step && packed.size(1) == ceil_div(x.size(1), step),
               "x has %lld features; the packed weight takes %lld",
               static_cast<long long>(x.size(1)), static_cast<long long>(packed.size(1) * step));
  PAGODA_CHECK(out_features > 0 && ceil_div(out_features, kPanel) == packed.size(0),
               "out_features %lld does not match the packed weight",
               static_cast<long long>(out_features));
  if (bias.has_value()) {
    PAGODA_CHECK(bias->is_contiguous() && bias->numel() == out_features &&
                    bias->scalar_type() == x.scalar_type(),
                 "bias must be [out_features] in x's dtype");
  }
  PAGODA_CHECK(supported(x.scalar_type()), "no packed linear for %s on this CPU",
               c10::toString(x.scalar_type()));
  auto out = at::empty({x.size(0), out_features}, x.options());
  if (x.size(0) == 0) return out;
  pagoda_cpu::run_op([=]() mutable {
    const at::Tensor* b = bias.has_value() ? &*bias : nullptr;
#if defined(PAGODA_VEC)
    if (x.scalar_type() == at::kFloat) linear_rows<Float32Step>(x, packed, b, out);
    if (x.scalar_type() == at::kBFloat16) {
#if defined(__AVX512BF16__)
      if (widen_from_rows > 0 && x.size(0) >= widen_from_rows)
        return linear_rows<BFloat16WidenedPairStep>(x, packed, b, out);
#endif
      linear_rows<BFloat16Step>(x, packed, b, out);
    }
#endif
    (void)b;
    (void)widen_from_rows;
  });
  return out;
}
