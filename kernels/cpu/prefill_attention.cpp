// Paged prefill attention on the CPU: a step's prefill chunks (a request's
// queries are the last q_len of its seq_len positions; they see every
// position up to their own), read straight from the paged KV cache.
//
// torch's SDPA (the torch path) runs at about 65 GFLOP/s on this workload
// whatever the dtype, after the path gathers each request's whole context
// out of the cache; it was a quarter of a c=16 serving run's time (issue
// 13). This is a flash-attention loop shaped for the CPU: one task is one
// request, one KV head and a tile of queries, i.e. every query head of the
// group for those positions (GQA reads each K/V block once per tile); the
// block's keys are transposed to [head_size][block_size] in float, so the
// scores of 16 keys are one vector FMA per dimension, computed for several
// query rows at once to keep independent FMA chains in flight; the running
// softmax is float32 and online (no [q_len, seq_len] matrix).
//
// Every dtype computes in float32: a bf16 or float16 cache is widened once
// per call, when its blocks are packed. A bf16 path on AVX512-BF16's pair
// dot product (vdpbf16ps) ran at 103-108 GFLOP/s where this one runs bf16 at
// 146-151: that instruction issues at half the float32 FMA rate on the
// Xeons measured (the linear kernel found the same), and the widening is
// paid per block, not per FMA.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <vector>

#include "cpu_common.h"
#include "graph.h"

namespace {

using pagoda_cpu::FlushDenormals;
using pagoda_cpu::kMasked;
using pagoda_cpu::kSumLanes;
using pagoda_cpu::lanes_total;
using pagoda_cpu::softmax_span_lanes;

// Positions per block the kernel is written for (the engine's block size);
// other sizes go to the torch path.
constexpr int64_t kBlock = 16;
// Query positions per task: enough rows (x the group) to amortize each K/V
// block's conversion, few enough that a 2-thread pod gets several tasks per
// prefill chunk of a few hundred tokens.
constexpr int64_t kTileQ = 32;
// Rows whose scores are computed together: independent FMA chains.
constexpr int64_t kRowBlock = 8;
// Keys per softmax update: two blocks. Each update costs a row a horizontal
// maximum, a vector exp for the rescale and a rescale of its accumulator; a
// span of two blocks pays them once for 32 keys.
constexpr int64_t kSpan = 2 * kBlock;

template <int64_t D, int64_t R>
inline void scores_rows(const float* __restrict q, const float* __restrict kt,
                        float* __restrict s, int64_t s_stride) {
  float acc[R][kBlock] = {};
  for (int64_t d = 0; d < D; ++d) {
    const float* krow = kt + d * kBlock;
    for (int64_t r = 0; r < R; ++r) {
      const float qv = q[r * D + d];
      for (int64_t k = 0; k < kBlock; ++k) acc[r][k] += qv * krow[k];
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < kBlock; ++k) s[r * s_stride + k] = acc[r][k];
}

#if defined(PAGODA_VEC)
// The same loops in vectors (vec.h), every accumulator a register: the
// unroll pragmas make GCC fully unroll the row and vector loops before it
// decides where the accumulator arrays live; without them it kept them on
// the stack, a store and a store-forwarded reload per FMA chain and step,
// and the scores ran at half the FMA rate (99 against 140 GFLOP/s for
// bench_cpu_attention.py's float32 chunks).
using pagoda_cpu::kLanes;
using pagoda_cpu::vfloat;
using pagoda_cpu::vfma;
using pagoda_cpu::vload;
using pagoda_cpu::vset1;
using pagoda_cpu::vstore;

// Vectors per row of a block's 16 scores.
constexpr int64_t kScoreVecs = kBlock / kLanes;
// Rows whose scores are computed together over a span of NB blocks: R x NB x
// kScoreVecs accumulators, 8 or 16 of AVX-512's 32 registers, 12 of AVX2's
// 16 (with the key vectors and a broadcast). Two FMA units of 4-cycle
// latency need 8 independent chains in flight; a span of two blocks also
// halves the query broadcasts per FMA (each feeds both blocks' keys).
template <int64_t NB>
constexpr int64_t kScoreRows = kLanes == 16 ? 8 : 6 / NB;

// s[r][0 : NB * 16] = q_r . keys of the span's NB blocks, R rows at once:
// q rows of D floats, each block's K as [D][kBlock].
template <int64_t D, int64_t R, int64_t NB>
inline void scores_rows_vec(const float* __restrict q, const float* __restrict kt0,
                            const float* __restrict kt1, float* __restrict s, int64_t s_stride) {
  constexpr int64_t V = NB * kScoreVecs;
  vfloat acc[R][V];
#pragma GCC unroll 16
  for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int64_t v = 0; v < V; ++v) acc[r][v] = pagoda_cpu::vzero();
  for (int64_t d = 0; d < D; ++d) {
    vfloat kv[V];
#pragma GCC unroll 8
    for (int64_t v = 0; v < V; ++v)
      kv[v] = vload((v < kScoreVecs ? kt0 : kt1) + d * kBlock + (v % kScoreVecs) * kLanes);
#pragma GCC unroll 16
    for (int64_t r = 0; r < R; ++r) {
      const vfloat qb = vset1(q[r * D + d]);
#pragma GCC unroll 8
      for (int64_t v = 0; v < V; ++v) acc[r][v] = vfma(qb, kv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int64_t v = 0; v < V; ++v) vstore(s + r * s_stride + v * kLanes, acc[r][v]);
}

// acc[r][d0:d0 + DV kLanes] = (the same) * corr[r] + sum_k p[r][k] v[k][...],
// R rows at once, over a span's two blocks: p rows of kSpan floats (the
// first block's, then the second's), each block's V as [kBlock][D] (keys1
// is 0 for a span of one block).
template <int64_t D, int64_t R, int64_t DV>
inline void accumulate_rows_vec(float* __restrict acc, const float* __restrict p,
                                const float* __restrict corr, const float* __restrict v0,
                                int64_t keys0, const float* __restrict v1, int64_t keys1, int64_t d0) {
  vfloat a[R][DV];
#pragma GCC unroll 16
  for (int64_t r = 0; r < R; ++r) {
    const vfloat c = vset1(corr[r]);
#pragma GCC unroll 16
    for (int64_t i = 0; i < DV; ++i) a[r][i] = pagoda_cpu::vmul(vload(acc + r * D + d0 + kLanes * i), c);
  }
  for (int64_t b = 0; b < 2; ++b) {
    const float* v = b == 0 ? v0 : v1;
    const float* pb = p + b * kBlock;
    const int64_t keys = b == 0 ? keys0 : keys1;
    for (int64_t k = 0; k < keys; ++k) {
      vfloat vv[DV];
#pragma GCC unroll 16
      for (int64_t i = 0; i < DV; ++i) vv[i] = vload(v + k * D + d0 + kLanes * i);
#pragma GCC unroll 16
      for (int64_t r = 0; r < R; ++r) {
        const vfloat pk = vset1(pb[r * kSpan + k]);
#pragma GCC unroll 16
        for (int64_t i = 0; i < DV; ++i) a[r][i] = vfma(pk, vv[i], a[r][i]);
      }
    }
  }
#pragma GCC unroll 16
  for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int64_t i = 0; i < DV; ++i) vstore(acc + r * D + d0 + kLanes * i, a[r][i]);
}

// Scores of a span's NB blocks' keys for every row, into s rows of kSpan.
template <int64_t D, int64_t NB>
inline void scores_vec(const float* q, const float* kt0, const float* kt1, float* s, int64_t rows) {
  constexpr int64_t RB = kScoreRows<NB>;
  int64_t r = 0;
  for (; r + RB <= rows; r += RB) scores_rows_vec<D, RB, NB>(q + r * D, kt0, kt1, s + r * kSpan, kSpan);
  for (; r < rows; ++r) scores_rows_vec<D, 1, NB>(q + r * D, kt0, kt1, s + r * kSpan, kSpan);
}

template <int64_t D>
inline void accumulate_vec(float* acc, const float* p, const float* corr, const float* v0, int64_t keys0,
                           const float* v1, int64_t keys1, int64_t rows) {
  // Rows x DV accumulators in registers: AVX-512 (32 registers) takes a
  // whole row of D in 16; AVX2 (16 registers) two vectors of 6 rows in 12,
  // 2 V loads and 6 broadcasts per 12 FMAs, the linear kernel's tile (the
  // previous 2 rows x 4 vectors, 8 accumulators, with 6 rows x 2 for the
  // scores: 59-76 against 90-94 GFLOP/s in bench_cpu_attention.py).
  constexpr int64_t V = D / kLanes;
  constexpr int64_t DV = kLanes == 16 ? V : 2;
  constexpr int64_t RA = (kLanes == 16 ? 16 : 12) / DV;
  for (int64_t d0 = 0; d0 < D; d0 += DV * kLanes) {
    int64_t r = 0;
    for (; r + RA <= rows; r += RA)
      accumulate_rows_vec<D, RA, DV>(acc + r * D, p + r * kSpan, corr + r, v0, keys0, v1, keys1, d0);
    for (; r < rows; ++r)
      accumulate_rows_vec<D, 1, DV>(acc + r * D, p + r * kSpan, corr + r, v0, keys0, v1, keys1, d0);
  }
}
#endif

// The scores of a span: one block (kt1 null) or two, the second's into
// columns kBlock.. of s's rows.
template <int64_t D>
inline void scores(const float* q, const float* kt0, const float* kt1, float* s, int64_t rows) {
#if defined(PAGODA_VEC)
  if (kt1 != nullptr)
    scores_vec<D, 2>(q, kt0, kt1, s, rows);
  else
    scores_vec<D, 1>(q, kt0, kt0, s, rows);
  return;
#endif
  for (int64_t b = 0; b < (kt1 != nullptr ? 2 : 1); ++b) {
    const float* kt = b == 0 ? kt0 : kt1;
    int64_t r = 0;
    for (; r + kRowBlock <= rows; r += kRowBlock)
      scores_rows<D, kRowBlock>(q + r * D, kt, s + r * kSpan + b * kBlock, kSpan);
    for (; r < rows; ++r) scores_rows<D, 1>(q + r * D, kt, s + r * kSpan + b * kBlock, kSpan);
  }
}

// acc[r] = acc[r] * corr[r] + sum_k p[r][k] * v[k] over a span's two
// blocks (p rows of kSpan), four rows at a time.
template <int64_t D, int64_t R>
inline void accumulate_rows(float* __restrict acc, const float* __restrict p,
                            const float* __restrict corr, const float* __restrict v0, int64_t keys0,
                            const float* __restrict v1, int64_t keys1) {
  float a[R][D];
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d) a[r][d] = acc[r * D + d] * corr[r];
  for (int64_t k = 0; k < keys0 + keys1; ++k) {
    const float* vrow = k < keys0 ? v0 + k * D : v1 + (k - keys0) * D;
    const int64_t col = k < keys0 ? k : kBlock + k - keys0;
    for (int64_t r = 0; r < R; ++r) {
      const float pk = p[r * kSpan + col];
      for (int64_t d = 0; d < D; ++d) a[r][d] += pk * vrow[d];
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t d = 0; d < D; ++d) acc[r * D + d] = a[r][d];
}

template <int64_t D>
inline void accumulate(float* acc, const float* p, const float* corr, const float* v0, int64_t keys0,
                       const float* v1, int64_t keys1, int64_t rows) {
#if defined(PAGODA_VEC)
  accumulate_vec<D>(acc, p, corr, v0, keys0, v1, keys1, rows);
  return;
#endif
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4)
    accumulate_rows<D, 4>(acc + r * D, p + r * kSpan, corr + r, v0, keys0, v1, keys1);
  for (; r < rows; ++r)
    accumulate_rows<D, 1>(acc + r * D, p + r * kSpan, corr + r, v0, keys0, v1, keys1);
}

struct Task {
  int64_t req;      // row of the step's batch
  int64_t kv_head;
  int64_t q_begin;  // query index within the request's chunk
  int64_t q_end;
  int64_t cost;     // query positions x the keys the last of them sees
};

// Tasks differ in cost by the keys they read (a tile at a chunk's end reads
// the whole context, the first tile of a 16-token chunk one block), and a
// step has few of them (9 for an 80-token chunk of SmolLM2's 3 KV heads).
// Static chunks of the list split those 9 5:4 over two threads, 144:96
// units of work for one cached-prefix request; so the threads take tasks,
// costliest first, from a shared counter as they finish the last.
template <typename F>
void run_tasks_costliest_first(std::vector<Task>& tasks, const F& run_range) {
  std::stable_sort(tasks.begin(), tasks.end(),
                   [](const Task& a, const Task& b) { return a.cost > b.cost; });
  const int64_t n = static_cast<int64_t>(tasks.size());
  const int64_t threads = std::min<int64_t>(at::get_num_threads(), n);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    run_range([&]() { return next.fetch_add(1, std::memory_order_relaxed); }, n);
  });
}

// The K/V blocks of the listed requests, packed once per call for each KV
// head into the layout the tile loops read (`words` floats per block and
// head): a request's chunk has several tiles, and each tile reads every
// block before it (converting per tile was a quarter of float32's time:
// 2.25-2.30 -> 1.69-1.80 ms for bench_cpu_attention.py's four chunks).
struct PackedBlocks {
  std::vector<int64_t> base;  // base[i]: the first packed block of reqs[i]
  std::vector<int64_t> slot;  // slot[row]: the index in reqs of a batch row
  // Not a std::vector: resizing one zeroes it, a serial memset of the whole
  // buffer (0.7 MB a layer for one 464-position request of SmolLM2) that the
  // packing then overwrites in full.
  std::unique_ptr<float[]> data;
  int64_t num_kv_heads = 0, words = 0;
  const float* at(int64_t row, int64_t block, int64_t head) const {
    return data.get() + ((base[slot[row]] + block) * num_kv_heads + head) * words;
  }
};

// pack(block_id, head, keys, dst) writes one block of one head (its first
// `keys` positions are the request's) into all of dst[0, words): the buffer
// starts uninitialised.
template <typename Pack>
PackedBlocks pack_blocks(const std::vector<int64_t>& reqs, const int32_t* lens,
                         const int32_t* tables, int64_t table_stride, int64_t num_rows,
                         int64_t num_kv_heads, int64_t words, const Pack& pack) {
  PackedBlocks packed;
  packed.num_kv_heads = num_kv_heads;
  packed.words = words;
  packed.base.assign(reqs.size() + 1, 0);
  packed.slot.assign(num_rows, -1);
  for (size_t i = 0; i < reqs.size(); ++i) {
    packed.slot[reqs[i]] = static_cast<int64_t>(i);
    packed.base[i + 1] = packed.base[i] + (lens[reqs[i]] + kBlock - 1) / kBlock;
  }
  const int64_t total_blocks = packed.base.back();
  packed.data.reset(new float[static_cast<size_t>(total_blocks * num_kv_heads * words)]);
  at::parallel_for(0, total_blocks * num_kv_heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t flat_block = item / num_kv_heads, head = item % num_kv_heads;
      const int64_t i = std::upper_bound(packed.base.begin(), packed.base.end(), flat_block) -
                        packed.base.begin() - 1;
      const int64_t req = reqs[i], block = flat_block - packed.base[i];
      const int64_t keys = std::min(kBlock, lens[req] - block * kBlock);
      pack(tables[req * table_stride + block], head, keys,
           packed.data.get() + (flat_block * num_kv_heads + head) * words);
    }
  });
  return packed;
}

template <typename scalar_t, typename cache_t, int64_t D>
void prefill_attention_impl(at::Tensor& out, const at::Tensor& query,
                            const at::Tensor& kv_cache, const at::Tensor& block_table,
                            const at::Tensor& seq_lens, const at::Tensor& query_start_loc,
                            const std::vector<int64_t>& reqs, std::vector<Task>& tasks,
                            double scale) {
  const int64_t num_heads = query.size(1);
  const int64_t num_kv_heads = kv_cache.size(3);
  const int64_t group = num_heads / num_kv_heads;

  const scalar_t* q_base = query.data_ptr<scalar_t>();
  scalar_t* o_base = out.data_ptr<scalar_t>();
  const cache_t* k_cache = kv_cache[0].data_ptr<cache_t>();
  const cache_t* v_cache = kv_cache[1].data_ptr<cache_t>();
  const int32_t* tables = block_table.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* qsl = query_start_loc.data_ptr<int32_t>();

  const int64_t q_tok_stride = query.stride(0), q_head_stride = query.stride(1);
  const int64_t o_tok_stride = out.stride(0), o_head_stride = out.stride(1);
  const int64_t table_stride = block_table.stride(0);
  const int64_t row_stride = num_kv_heads * D;  // one position, every KV head
  const int64_t block_stride = kBlock * row_stride;
  const float fscale = static_cast<float>(scale);

  // A block, in float: K transposed to [D][kBlock] (the scores of 16 keys
  // are one vector FMA per dimension), then V as [kBlock][D]; positions past
  // the request's context are zero. The cache's dtype (kv_cache_dtype) may
  // differ from the query's: this is where it is widened.
  constexpr int64_t W = kBlock * D;
  const auto packed = pack_blocks(
      reqs, lens, tables, table_stride, seq_lens.size(0), num_kv_heads, 2 * W,
      [&](int64_t id, int64_t head, int64_t keys, float* dst) {
        const cache_t* kb = k_cache + id * block_stride + head * D;
        const cache_t* vb = v_cache + id * block_stride + head * D;
        for (int64_t k = 0; k < kBlock; ++k) {
          const cache_t* krow = kb + k * row_stride;
          const cache_t* vrow = vb + k * row_stride;
          for (int64_t d = 0; d < D; ++d) {
            dst[d * kBlock + k] = k < keys ? static_cast<float>(krow[d]) : 0.f;
            dst[W + k * D + d] = k < keys ? static_cast<float>(vrow[d]) : 0.f;
          }
        }
      });

  run_tasks_costliest_first(tasks, [&](const auto& next_task, int64_t num_tasks) {
    FlushDenormals ftz;
    const int64_t max_rows = kTileQ * group;
    // Rows are (query position, head of the group), position-major.
    std::vector<float> q(max_rows * D), acc(max_rows * D), s(max_rows * kSpan);
    std::vector<float> maxes(max_rows), sums(max_rows * kSumLanes), corr(max_rows);
    for (int64_t t = next_task(); t < num_tasks; t = next_task()) {
      const Task& task = tasks[t];
      const int64_t seq_len = lens[task.req];
      const int64_t q_len = qsl[task.req + 1] - qsl[task.req];
      const int64_t first_tok = qsl[task.req];
      const int64_t offset = seq_len - q_len;  // positions cached before the chunk
      const int64_t n_pos = task.q_end - task.q_begin;
      const int64_t rows = n_pos * group;
      for (int64_t i = 0; i < n_pos; ++i) {
        const int64_t tok = first_tok + task.q_begin + i;
        for (int64_t g = 0; g < group; ++g) {
          const scalar_t* src = q_base + tok * q_tok_stride + (task.kv_head * group + g) * q_head_stride;
          float* dst = q.data() + (i * group + g) * D;
          for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<float>(src[d]) * fscale;
        }
      }
      std::fill(acc.begin(), acc.begin() + rows * D, 0.f);
      std::fill(maxes.begin(), maxes.begin() + rows, kMasked);
      std::fill(sums.begin(), sums.begin() + rows * kSumLanes, 0.f);
      // The last query of the tile sees positions [0, last_pos].
      const int64_t first_pos = offset + task.q_begin;
      const int64_t last_pos = offset + task.q_end - 1;
      const int64_t n_blocks = last_pos / kBlock + 1;
      for (int64_t b = 0; b < n_blocks; b += 2) {
        // A span of two blocks (one at the end of an odd count).
        const int64_t base = b * kBlock;
        const bool pair = b + 1 < n_blocks;
        const int64_t keys0 = std::min(kBlock, last_pos + 1 - base);
        const int64_t keys1 = pair ? std::min(kBlock, last_pos + 1 - base - kBlock) : 0;
        const float* kt0 = packed.at(task.req, b, task.kv_head);
        const float* kt1 = pair ? packed.at(task.req, b + 1, task.kv_head) : kt0;
        scores<D>(q.data(), kt0, pair ? kt1 : nullptr, s.data(), rows);
        // Row r (position first_pos + r / group) sees keys up to its position;
        // the softmax zeroes the probabilities of the later keys.
        for (int64_t r = 0; r < rows; ++r) {
          float* sr = s.data() + r * kSpan;
          const int64_t valid = first_pos + r / group - base + 1;
          if (pair)
            softmax_span_lanes<kSpan>(sr, valid, maxes[r], sums.data() + r * kSumLanes, corr[r]);
          else
            softmax_span_lanes<kBlock>(sr, valid, maxes[r], sums.data() + r * kSumLanes, corr[r]);
        }
        accumulate<D>(acc.data(), s.data(), corr.data(), kt0 + W, keys0, kt1 + W, keys1, rows);
      }
      for (int64_t i = 0; i < n_pos; ++i) {
        const int64_t tok = first_tok + task.q_begin + i;
        for (int64_t g = 0; g < group; ++g) {
          const int64_t r = i * group + g;
          scalar_t* dst = o_base + tok * o_tok_stride + (task.kv_head * group + g) * o_head_stride;
          const float inv = 1.f / lanes_total(sums.data() + r * kSumLanes);
          for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<scalar_t>(acc[r * D + d] * inv);
        }
      }
    }
  });
}


}  // namespace

// For each request r in `rows`: out[qsl[r]:qsl[r+1]] = causal attention of
// those queries (the last q_len of seq_lens[r] positions) over the request's
// paged context.
namespace {

void checked_prefill_attention(at::Tensor out, at::Tensor query, at::Tensor kv_cache,
                                   at::Tensor block_table, at::Tensor seq_lens, at::Tensor query_start_loc,
                                   at::Tensor rows, double scale) {
  PAGODA_CHECK(query.device().is_cpu() && kv_cache.device().is_cpu(), "CPU tensors only");
  PAGODA_CHECK(query.dim() == 3 && out.sizes() == query.sizes(), "query/out must be [T, H, D]");
  PAGODA_CHECK(query.stride(2) == 1 && out.stride(2) == 1, "head dim must be contiguous");
  PAGODA_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && kv_cache.is_contiguous(),
               "kv_cache must be a contiguous [2, blocks, block_size, kv_heads, head_size]");
  PAGODA_CHECK(kv_cache.size(2) == kBlock, "block size must be %d", static_cast<int>(kBlock));
  const int64_t head_size = query.size(2);
  PAGODA_CHECK(head_size == 64 || head_size == 128, "head size must be 64 or 128");
  PAGODA_CHECK(kv_cache.size(4) == head_size, "head sizes differ");
  PAGODA_CHECK(query.size(1) % kv_cache.size(3) == 0, "heads must be a multiple of KV heads");
  PAGODA_CHECK(out.scalar_type() == query.scalar_type(), "query and out dtypes differ");
  PAGODA_CHECK(block_table.scalar_type() == at::kInt && block_table.stride(1) == 1, "block_table: int32 rows");
  PAGODA_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.is_contiguous(), "seq_lens: int32");
  PAGODA_CHECK(query_start_loc.scalar_type() == at::kInt && query_start_loc.is_contiguous(),
               "query_start_loc: int32");
  PAGODA_CHECK(rows.scalar_type() == at::kLong && rows.is_contiguous(), "rows: int64");
  PAGODA_CHECK(query_start_loc.size(0) == seq_lens.size(0) + 1 && block_table.size(0) >= seq_lens.size(0),
               "one row per request");
  // Bounds, checked once here rather than per read.
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* qsl = query_start_loc.data_ptr<int32_t>();
  const int32_t* table = block_table.data_ptr<int32_t>();
  const int64_t* reqs = rows.data_ptr<int64_t>();
  const int64_t width = block_table.size(1), num_blocks = kv_cache.size(1);
  const int64_t num_tokens = query.size(0), num_kv_heads = kv_cache.size(3);
  std::vector<Task> tasks;
  for (int64_t i = 0; i < rows.size(0); ++i) {
    const int64_t r = reqs[i];
    PAGODA_CHECK(r >= 0 && r < seq_lens.size(0), "rows[%lld] = %lld is not a request",
                 static_cast<long long>(i), static_cast<long long>(r));
    const int64_t q_len = qsl[r + 1] - qsl[r];
    PAGODA_CHECK(qsl[r] >= 0 && qsl[r + 1] <= num_tokens && q_len >= 1, "query_start_loc out of range");
    PAGODA_CHECK(lens[r] >= q_len && lens[r] <= width * kBlock,
                 "seq_lens[%lld] = %d outside %lld..%lld", static_cast<long long>(r), lens[r],
                 static_cast<long long>(q_len), static_cast<long long>(width * kBlock));
    for (int64_t b = 0; b < (lens[r] + kBlock - 1) / kBlock; ++b) {
      const int32_t id = table[r * block_table.stride(0) + b];
      PAGODA_CHECK(id >= 0 && id < num_blocks, "block id %d outside the cache", id);
    }
    // Tiles cut from the chunk's end: a short one holds its first queries,
    // which see the fewest keys.
    const int64_t offset = lens[r] - q_len;
    for (int64_t h = 0; h < num_kv_heads; ++h) {
      for (int64_t e = q_len; e > 0; e -= kTileQ) {
        const int64_t b = std::max<int64_t>(0, e - kTileQ);
        tasks.push_back({r, h, b, e, (e - b) * (offset + e)});
      }
    }
  }
  if (tasks.empty()) return;
  const std::vector<int64_t> req_list(reqs, reqs + rows.size(0));
  pagoda_cpu::dispatch_dtype(query.scalar_type(), "query", [&](auto q) {
    pagoda_cpu::dispatch_dtype(kv_cache.scalar_type(), "kv_cache", [&](auto c) {
      using query_t = decltype(q);
      using cache_t = decltype(c);
      auto run = head_size == 64 ? prefill_attention_impl<query_t, cache_t, 64>
                                 : prefill_attention_impl<query_t, cache_t, 128>;
      run(out, query, kv_cache, block_table, seq_lens, query_start_loc, req_list, tasks, scale);
    });
  });
}

}  // namespace

void prefill_attention(at::Tensor out, at::Tensor query, at::Tensor kv_cache,
                       at::Tensor block_table, at::Tensor seq_lens, at::Tensor query_start_loc,
                       at::Tensor rows, double scale) {
  pagoda_cpu::run_op([=]() mutable {
    checked_prefill_attention(out, query, kv_cache, block_table, seq_lens, query_start_loc, rows, scale);
  });
}
