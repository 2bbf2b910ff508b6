// The paged KV cache's write on the CPU: this step's K and V rows copied to
// their slots, one call per layer where the torch path takes six ops (two
// index_copy_ and the views around them), the CPU twin of
// pagoda/kernels/cache_write.py. A cache in another dtype than the model's
// (kv_cache_dtype) gets each row converted, rounded to nearest even.

#include <ATen/ATen.h>

#include <cstring>
#include <type_traits>

#include "cpu_common.h"
#include "graph.h"

namespace {

template <typename src_t, typename dst_t>
void copy_rows(const char* k, const char* v, int64_t k_stride, int64_t v_stride, char* k_cache,
               char* v_cache, const int64_t* slots, int64_t tokens, int64_t row) {
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;  // padding
    const src_t* ks = reinterpret_cast<const src_t*>(k + t * k_stride);
    const src_t* vs = reinterpret_cast<const src_t*>(v + t * v_stride);
    dst_t* kd = reinterpret_cast<dst_t*>(k_cache) + slots[t] * row;
    dst_t* vd = reinterpret_cast<dst_t*>(v_cache) + slots[t] * row;
    if constexpr (std::is_same_v<src_t, dst_t>) {
      std::memcpy(kd, ks, row * sizeof(dst_t));
      std::memcpy(vd, vs, row * sizeof(dst_t));
    } else {
      int64_t i = 0;
#if defined(PAGODA_VEC)
      // Vector conversions (vec.h: exact widening, round-to-nearest-even
      // narrowing): the scalar loop made the write 1.6x slower than the
      // copy it replaces in a float32 model over a float16 cache.
      for (; i + pagoda_cpu::kLanes <= row; i += pagoda_cpu::kLanes) {
        pagoda_cpu::vstore(kd + i, pagoda_cpu::vload(ks + i));
        pagoda_cpu::vstore(vd + i, pagoda_cpu::vload(vs + i));
      }
#endif
      for (; i < row; ++i) {
        kd[i] = static_cast<dst_t>(static_cast<float>(ks[i]));
        vd[i] = static_cast<dst_t>(static_cast<float>(vs[i]));
      }
    }
  }
}

void write_cache(at::Tensor key, at::Tensor value, at::Tensor kv_cache,
                       at::Tensor slot_mapping) {
  PAGODA_CHECK(kv_cache.device().is_cpu() && kv_cache.dim() == 5 && kv_cache.size(0) == 2 &&
                  kv_cache.is_contiguous(),
               "kv_cache must be a contiguous CPU [2, blocks, block_size, kv_heads, head_size]");
  const int64_t heads = kv_cache.size(3), head_size = kv_cache.size(4);
  const int64_t tokens = key.size(0), row = heads * head_size;
  for (const at::Tensor* t : {&key, &value}) {
    PAGODA_CHECK(t->dim() == 3 && t->size(0) == tokens && t->size(1) == heads &&
                    t->size(2) == head_size && t->stride(2) == 1 && t->stride(1) == head_size,
                 "key/value must be [tokens, kv_heads, head_size] with each token's heads contiguous");
  }
  PAGODA_CHECK(key.scalar_type() == value.scalar_type(), "key and value dtypes differ");
  PAGODA_CHECK(slot_mapping.dim() == 1 && slot_mapping.numel() >= tokens &&
                  slot_mapping.scalar_type() == at::kLong,
               "slot_mapping must be int64 with a slot per token");
  auto slots_t = slot_mapping.contiguous();
  const int64_t* slots = slots_t.data_ptr<int64_t>();
  const int64_t capacity = kv_cache.size(1) * kv_cache.size(2);
  // Every slot checked before the first write: a bad one leaves the cache as it was.
  for (int64_t t = 0; t < tokens; ++t) {
    PAGODA_CHECK(slots[t] < capacity, "slot %lld outside the cache (%lld slots)",
                 static_cast<long long>(slots[t]), static_cast<long long>(capacity));
  }
  char* k_cache = static_cast<char*>(kv_cache.data_ptr());
  char* v_cache = k_cache + capacity * row * static_cast<int64_t>(kv_cache.element_size());
  const char* k = static_cast<const char*>(key.data_ptr());
  const char* v = static_cast<const char*>(value.data_ptr());
  const int64_t k_stride = key.stride(0) * key.element_size();
  const int64_t v_stride = value.stride(0) * value.element_size();
  pagoda_cpu::dispatch_dtype(key.scalar_type(), "key/value", [&](auto src) {
    pagoda_cpu::dispatch_dtype(kv_cache.scalar_type(), "kv_cache", [&](auto dst) {
      copy_rows<decltype(src), decltype(dst)>(k, v, k_stride, v_stride, k_cache, v_cache, slots,
                                              tokens, row);
    });
  });
}

}  // namespace

void reshape_and_cache(at::Tensor key, at::Tensor value, at::Tensor kv_cache,
                       at::Tensor slot_mapping) {
  pagoda_cpu::run_op([=]() mutable { write_cache(key, value, kv_cache, slot_mapping); });
}
