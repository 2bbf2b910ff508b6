// Paged decode attention on the CPU: one query token per request, read
// straight from the paged KV cache through the block table.
//
// The torch path gathers every request's whole context into a padded dense
// tensor each layer of each step and runs two batched matmuls, a mask and a
// softmax around it: about fifteen ops and as many temporaries per layer.
// At batch 1 that is framework overhead, at batch 16 it is allocation and
// copying. Here one call per layer reads K and V in place.
//
// The query heads that share a KV head (GQA) are computed together, so each
// K/V row is read once.
// Scores and the softmax are float32 whatever the cache dtype, as in the
// torch path. The cache may be in another dtype than the query
// (kv_cache_dtype): each K/V row is widened to float as it is read.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include <algorithm>

#include <cmath>
#include <limits>
#include <vector>

#include "cpu_common.h"
#include "graph.h"

namespace {

using pagoda_cpu::FlushDenormals;
using pagoda_cpu::kMasked;
using pagoda_cpu::softmax_block16;

// sum(a[i] * b[i]) in float. -ffast-math lets the compiler vectorize the
// reduction and finish it with a shuffle tree: a hand-written 16-lane
// accumulator ended in 16 dependent scalar adds, which dominated at D=64.
template <typename scalar_t>
inline float dot(const float* __restrict a, const scalar_t* __restrict b, int64_t d) {
  float s = 0.f;
  for (int64_t i = 0; i < d; ++i) s += a[i] * static_cast<float>(b[i]);
  return s;
}

template <typename scalar_t>
inline void axpy(float* __restrict y, float a, const scalar_t* __restrict x, int64_t d) {
  for (int64_t i = 0; i < d; ++i) y[i] += a * static_cast<float>(x[i]);
}

#if defined(PAGODA_VEC)
// The vector path (vec.h: AVX-512 or AVX2): 16 positions at a time. Each
// position's K row is multiplied with every query head of its group (D /
// kLanes FMAs per head, the products kept as vectors); each kLanes of those
// partial vectors are then summed across their lanes together (lane_sums, a
// shuffle tree); the online softmax is one block per head (softmax_block16,
// shared with prefill_attention.cpp); V rows are converted once and added
// into every head of the group. Measured 389 us per layer for the scalar
// loop at 16 requests x 300 positions in bf16 (AVX-512).
using pagoda_cpu::kLanes;
using pagoda_cpu::vfloat;

// How many 16-position blocks ahead of the one being computed are fetched
// (1 and 4 measured the same as 2).
constexpr int64_t kPrefetchBlocks = 2;

// One request's positions [begin, end), every head: q [heads][D] scaled,
// float. Leaves each head's unnormalized output in acc [heads][D], its score
// maximum and its sum of exp(score - maximum).
template <typename scalar_t, int64_t D>
void decode_request_vec(const float* q, const scalar_t* k_cache, const scalar_t* v_cache,
                        const int32_t* table, int64_t begin, int64_t end, int64_t block_size,
                        int64_t block_stride, int64_t row_stride, int64_t num_kv_heads,
                        int64_t group, float* acc, float* maxes, float* sums) {
  using namespace pagoda_cpu;
  constexpr int64_t V = D / kLanes;
  const int64_t heads = num_kv_heads * group;
  std::fill(acc, acc + heads * D, 0.f);
  std::fill(maxes, maxes + heads, kMasked);
  std::fill(sums, sums + heads, 0.f);
  const scalar_t* krows[16];
  const scalar_t* vrows[16];
  alignas(64) float p[16];
  const int64_t row_bytes = row_stride * static_cast<int64_t>(sizeof(scalar_t));
  for (int64_t start = begin; start < end; start += 16) {
    const int64_t n = std::min<int64_t>(16, end - start);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t pos = start + k;
      const int64_t off = table[pos / block_size] * block_stride + (pos % block_size) * row_stride;
      krows[k] = k_cache + off;
      vrows[k] = v_cache + off;
    }
    // The rows kPrefetchBlocks blocks ahead, fetched while these are
    // computed: a request's blocks lie anywhere in the cache, so each new
    // block starts a stream the hardware prefetchers have not seen, and in a
    // step the cache comes from memory (the layer's weights passed through
    // L3 since). From memory, 16 x 272 positions in bf16: 355 -> 300 us.
    const int64_t ahead_begin = start == begin ? begin : start + 16 * kPrefetchBlocks;
    for (int64_t pos = ahead_begin; pos < std::min(end, start + 16 * (kPrefetchBlocks + 1)); ++pos) {
      const int64_t off = table[pos / block_size] * block_stride + (pos % block_size) * row_stride;
      const char* kp = reinterpret_cast<const char*>(k_cache + off);
      const char* vp = reinterpret_cast<const char*>(v_cache + off);
      for (int64_t b = 0; b < row_bytes; b += 64) {
        _mm_prefetch(kp + b, _MM_HINT_T0);
        _mm_prefetch(vp + b, _MM_HINT_T0);
      }
    }
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      for (int64_t g = 0; g < group; ++g) {
        const int64_t head = h * group + g;
        vfloat qv[V];
        for (int64_t i = 0; i < V; ++i) qv[i] = vload(q + head * D + kLanes * i);
        for (int64_t k0 = 0; k0 < 16; k0 += kLanes) {
          vfloat part[kLanes];
          for (int64_t k = 0; k < kLanes; ++k) {
            if (k0 + k >= n) {
              part[k] = vzero();
              continue;
            }
            const scalar_t* kr = krows[k0 + k] + h * D;
            vfloat a = vmul(qv[0], vload(kr));
            for (int64_t i = 1; i < V; ++i) a = vfma(qv[i], vload(kr + kLanes * i), a);
            part[k] = a;
          }
          vstore(p + k0, lane_sums(part));
        }
        float corr;
        softmax_block16(p, n, maxes[head], sums[head], corr);
        vfloat a[V];
        const vfloat c = vset1(corr);
        for (int64_t i = 0; i < V; ++i) a[i] = vmul(vload(acc + head * D + kLanes * i), c);
        for (int64_t k = 0; k < n; ++k) {
          const scalar_t* vr = vrows[k] + h * D;
          const vfloat pk = vset1(p[k]);
          for (int64_t i = 0; i < V; ++i) a[i] = vfma(pk, vload(vr + kLanes * i), a[i]);
        }
        for (int64_t i = 0; i < V; ++i) vstore(acc + head * D + kLanes * i, a[i]);
      }
    }
  }
}
#endif  // PAGODA_VEC

// out rows [heads][D] = acc / sum, per head.
template <typename scalar_t>
void store_normalized(scalar_t* o_base, int64_t o_head_stride, const float* acc, const float* sums,
                      int64_t heads, int64_t head_size) {
  for (int64_t j = 0; j < heads; ++j) {
    scalar_t* dst = o_base + j * o_head_stride;
    // A request with no positions (a padded row of a decode graph) attends
    // to nothing: its output is zero, not 0/0.
    const float inv = sums[j] > 0.f ? 1.f / sums[j] : 0.f;
    for (int64_t i = 0; i < head_size; ++i) dst[i] = static_cast<scalar_t>(acc[j * head_size + i] * inv);
  }
}

// A piece of one request's positions, [from, to), computed by thread `owner`.
struct Segment {
  int64_t req, from, to, owner;
};

// A request is cut only into pieces of at least this many positions: each
// piece costs a merge of softmax states.
constexpr int64_t kMinSplitPositions = 32;

// The requests' positions, in order, cut into `threads` runs of about equal
// length. The work is per position, and splitting by request count left one
// of two threads with 55% of the positions at 16 requests of 33-576 (the
// other waited at the barrier); with fewer requests than threads a request
// is split (split-KV), or a batch-1 decode ran on one thread of two. A cut
// falls on a 16-position step (the vector loop's) and only where both pieces
// keep kMinSplitPositions; with `cut` false, whole requests are balanced.
std::vector<Segment> balanced_segments(const int32_t* lens, int64_t num_reqs, int64_t threads, bool cut) {
  std::vector<Segment> segs;
  int64_t total = 0;
  for (int64_t r = 0; r < num_reqs; ++r) total += lens[r];
  if (total == 0) return segs;
  int64_t start = 0;  // request r's first position in the concatenation
  for (int64_t r = 0; r < num_reqs; ++r) {
    const int64_t len = lens[r];
    int64_t from = 0;
    auto add = [&](int64_t to) {
      // The thread whose run holds the piece's middle: runs are contiguous.
      const int64_t twice_mid = 2 * (start + from) + (to - from);
      const int64_t owner = std::min(threads - 1, twice_mid * threads / (2 * total));
      segs.push_back({r, from, to, owner});
      from = to;
    };
    for (int64_t t = 1; cut && t < threads; ++t) {
      const int64_t boundary = total * t / threads - start;
      if (boundary <= from || boundary >= len) continue;
      const int64_t at = (boundary + 8) / 16 * 16;
      if (at - from >= kMinSplitPositions && len - at >= kMinSplitPositions) add(at);
    }
    add(len);
    start += len;
  }
  return segs;
}

template <typename scalar_t, typename cache_t>
void decode_attention_impl(
    at::Tensor& out, const at::Tensor& query, const at::Tensor& kv_cache,
    const at::Tensor& block_table, const at::Tensor& seq_lens,
    const at::Tensor& token_index, double scale) {
  const int64_t num_reqs = token_index.size(0);
  const int64_t num_heads = query.size(1);
  const int64_t head_size = query.size(2);
  const int64_t block_size = kv_cache.size(2);
  const int64_t num_kv_heads = kv_cache.size(3);
  const int64_t group = num_heads / num_kv_heads;

  const scalar_t* q_base = query.data_ptr<scalar_t>();
  scalar_t* o_base = out.data_ptr<scalar_t>();
  const cache_t* k_cache = kv_cache[0].data_ptr<cache_t>();
  const cache_t* v_cache = kv_cache[1].data_ptr<cache_t>();
  const int32_t* tables = block_table.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int64_t* tokens = token_index.data_ptr<int64_t>();

  const int64_t q_tok_stride = query.stride(0), q_head_stride = query.stride(1);
  const int64_t o_tok_stride = out.stride(0), o_head_stride = out.stride(1);
  const int64_t table_stride = block_table.stride(0);
  // Cache strides in elements: [num_blocks, block_size, num_kv_heads, head_size].
  const int64_t row_stride = num_kv_heads * head_size;
  const int64_t block_stride = block_size * row_stride;
  const float fscale = static_cast<float>(scale);

  // A work item is one request (or, split-KV, one part of its positions),
  // all its heads: each position's K and V rows (every head, contiguous) are
  // read front to back, block after block, as the prefetchers like.
  // Splitting a request's heads over threads instead measured 4x slower at
  // batch 1 in the engine (94 against 24 us per layer): the strided reads.
  const int64_t rows = num_heads;
  bool vector_path = false;
#if defined(PAGODA_VEC)
  vector_path = head_size == 64 || head_size == 128;
#endif
  const int64_t threads = at::get_num_threads();
  const std::vector<Segment> segs = balanced_segments(lens, num_reqs, threads, vector_path);
  const int64_t num_segs = static_cast<int64_t>(segs.size());
  std::vector<int64_t> first(num_reqs + 1, 0);  // the first segment of each request
  for (const Segment& seg : segs) first[seg.req + 1] += 1;
  for (int64_t r = 0; r < num_reqs; ++r) first[r + 1] += first[r];
  std::vector<int64_t> owned(threads + 1, 0);  // the first segment of each thread
  for (const Segment& seg : segs) owned[seg.owner + 1] += 1;
  for (int64_t t = 0; t < threads; ++t) owned[t + 1] += owned[t];
  // The softmax states of the pieces of split requests, merged below.
  const bool any_split = num_segs > num_reqs;
  std::vector<float> part_acc(any_split ? num_segs * rows * head_size : 0);
  std::vector<float> part_max(any_split ? num_segs * rows : 0), part_sum(part_max.size());

  at::parallel_for(0, threads, 1, [&](int64_t thread_begin, int64_t thread_end) {
    FlushDenormals ftz;
    std::vector<float> q(rows * head_size), acc(rows * head_size), logits;
    std::vector<float> maxes(rows), sums(rows);
    for (int64_t item = owned[thread_begin]; item < owned[thread_end]; ++item) {
      const Segment& seg = segs[item];
      const int64_t r = seg.req;
      const int64_t len = lens[r];
      const int64_t tok = tokens[r];
      const int32_t* table = tables + r * table_stride;
      // The query, scaled, in float.
      for (int64_t j = 0; j < rows; ++j) {
        const scalar_t* src = q_base + tok * q_tok_stride + j * q_head_stride;
        for (int64_t i = 0; i < head_size; ++i) q[j * head_size + i] = static_cast<float>(src[i]) * fscale;
      }
#if defined(PAGODA_VEC)
      {
        if (vector_path) {
          auto run = head_size == 64 ? decode_request_vec<cache_t, 64> : decode_request_vec<cache_t, 128>;
          if (first[r + 1] - first[r] == 1) {
            run(q.data(), k_cache, v_cache, table, 0, len, block_size, block_stride, row_stride,
                num_kv_heads, group, acc.data(), maxes.data(), sums.data());
            store_normalized(o_base + tok * o_tok_stride, o_head_stride, acc.data(), sums.data(), rows,
                             head_size);
          } else {
            run(q.data(), k_cache, v_cache, table, seg.from, seg.to, block_size, block_stride, row_stride,
                num_kv_heads, group, part_acc.data() + item * rows * head_size,
                part_max.data() + item * rows, part_sum.data() + item * rows);
          }
          continue;
        }
      }
#endif
      logits.resize(rows * len);
      std::fill(maxes.begin(), maxes.end(), std::numeric_limits<float>::lowest());
      for (int64_t pos = 0; pos < len; ++pos) {
        const cache_t* k = k_cache + table[pos / block_size] * block_stride +
                            (pos % block_size) * row_stride;
        for (int64_t j = 0; j < rows; ++j) {
          const float s = dot(q.data() + j * head_size, k + (j / group) * head_size, head_size);
          logits[j * len + pos] = s;
          if (s > maxes[j]) maxes[j] = s;
        }
      }
      for (int64_t j = 0; j < rows; ++j) {
        float* lg = logits.data() + j * len;
        float sum = 0.f;
        for (int64_t pos = 0; pos < len; ++pos) {
          lg[pos] = std::exp(lg[pos] - maxes[j]);
          sum += lg[pos];
        }
        sums[j] = sum;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t pos = 0; pos < len; ++pos) {
        const cache_t* v = v_cache + table[pos / block_size] * block_stride +
                            (pos % block_size) * row_stride;
        for (int64_t j = 0; j < rows; ++j) {
          axpy(acc.data() + j * head_size, logits[j * len + pos], v + (j / group) * head_size, head_size);
        }
      }
      store_normalized(o_base + tok * o_tok_stride, o_head_stride, acc.data(), sums.data(), rows,
                       head_size);
    }
  });
  if (!any_split) return;
  // Merge each split request's parts: rescale every part to the largest
  // maximum, add, normalize (an empty part has maximum kMasked, weight 0).
  at::parallel_for(0, num_reqs, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(head_size);
    for (int64_t r = begin; r < end; ++r) {
      if (first[r + 1] - first[r] == 1) continue;
      for (int64_t j = 0; j < rows; ++j) {
        float m = kMasked;
        for (int64_t item = first[r]; item < first[r + 1]; ++item) m = std::max(m, part_max[item * rows + j]);
        float sum = 0.f;
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t item = first[r]; item < first[r + 1]; ++item) {
          const float w = std::exp(part_max[item * rows + j] - m);
          sum += w * part_sum[item * rows + j];
          axpy(acc.data(), w, part_acc.data() + (item * rows + j) * head_size, head_size);
        }
        scalar_t* dst = o_base + tokens[r] * o_tok_stride + j * o_head_stride;
        for (int64_t i = 0; i < head_size; ++i) dst[i] = static_cast<scalar_t>(acc[i] / sum);
      }
    }
  });
}

}  // namespace

// out[token_index[r]] = attention of query[token_index[r]] over the first
// seq_lens[r] positions of request r's blocks.
namespace {

void checked_decode_attention(
    at::Tensor out, at::Tensor query, at::Tensor kv_cache, at::Tensor block_table,
    at::Tensor seq_lens, at::Tensor token_index, double scale) {
  PAGODA_CHECK(query.device().is_cpu() && kv_cache.device().is_cpu(), "CPU tensors only");
  PAGODA_CHECK(query.dim() == 3 && out.sizes() == query.sizes(), "query/out must be [T, H, D]");
  PAGODA_CHECK(query.stride(2) == 1 && out.stride(2) == 1, "head dim must be contiguous");
  PAGODA_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
               "kv_cache must be a contiguous [2, blocks, block_size, kv_heads, head_size]");
  PAGODA_CHECK(kv_cache.size(4) == query.size(2), "head sizes differ");
  PAGODA_CHECK(query.size(1) % kv_cache.size(3) == 0, "heads must be a multiple of KV heads");
  PAGODA_CHECK(out.scalar_type() == query.scalar_type(), "query and out dtypes differ");
  PAGODA_CHECK(block_table.scalar_type() == at::kInt && block_table.stride(1) == 1, "block_table: int32 rows");
  PAGODA_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous(), "seq_lens: int32");
  PAGODA_CHECK(token_index.scalar_type() == at::kLong && token_index.is_contiguous(), "token_index: int64");
  PAGODA_CHECK(seq_lens.size(0) == token_index.size(0) && block_table.size(0) == token_index.size(0),
               "one row per request");
  // Bounds, checked once here rather than per read: a wrong length or block
  // id would read outside the cache instead of failing.
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* table = block_table.data_ptr<int32_t>();
  const int64_t width = block_table.size(1), block_size = kv_cache.size(2);
  const int64_t num_blocks = kv_cache.size(1), num_tokens = query.size(0);
  const int64_t* tokens = token_index.data_ptr<int64_t>();
  for (int64_t r = 0; r < seq_lens.size(0); ++r) {
    // 0: a padded row of a decode graph, which attends to nothing.
    PAGODA_CHECK(lens[r] >= 0 && lens[r] <= width * block_size,
                 "seq_lens[%lld] = %d outside 0..%lld", static_cast<long long>(r), lens[r],
                 static_cast<long long>(width * block_size));
    PAGODA_CHECK(tokens[r] >= 0 && tokens[r] < num_tokens, "token_index out of range");
    const int64_t used = (lens[r] + block_size - 1) / block_size;
    for (int64_t b = 0; b < used; ++b) {
      const int32_t id = table[r * block_table.stride(0) + b];
      PAGODA_CHECK(id >= 0 && id < num_blocks, "block id %d outside the cache", id);
    }
  }
  pagoda_cpu::dispatch_dtype(query.scalar_type(), "query", [&](auto q) {
    pagoda_cpu::dispatch_dtype(kv_cache.scalar_type(), "kv_cache", [&](auto c) {
      decode_attention_impl<decltype(q), decltype(c)>(out, query, kv_cache, block_table, seq_lens,
                                                      token_index, scale);
    });
  });
}

}  // namespace

void decode_attention(
    at::Tensor out, at::Tensor query, at::Tensor kv_cache, at::Tensor block_table,
    at::Tensor seq_lens, at::Tensor token_index, double scale) {
  pagoda_cpu::run_op([=]() mutable {
    checked_decode_attention(out, query, kv_cache, block_table, seq_lens, token_index, scale);
  });
}
