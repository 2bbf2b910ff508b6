// The paged KV cache's write on the CPU: this step's K and V rows copied to
// their slots, one call per layer where the torch path takes six ops (two
// index_copy_ and the views around them), the CPU twin of
// pagoda/kernels/cache_write.py.

#include <ATen/ATen.h>

#include <cstring>

#include "graph.h"

namespace {

void write_cache(at::Tensor key, at::Tensor value, at::Tensor kv_cache,
                       at::Tensor slot_mapping) {
  TORCH_CHECK(kv_cache.device().is_cpu() && kv_cache.dim() == 5 && kv_cache.size(0) == 2 &&
                  kv_cache.is_contiguous(),
              "kv_cache must be a contiguous CPU [2, blocks, block_size, kv_heads, head_size]");
  const int64_t heads = kv_cache.size(3), head_size = kv_cache.size(4);
  const int64_t tokens = key.size(0), row = heads * head_size;
  for (const at::Tensor* t : {&key, &value}) {
    TORCH_CHECK(t->dim() == 3 && t->size(0) == tokens && t->size(1) == heads &&
                    t->size(2) == head_size && t->stride(2) == 1 && t->stride(1) == head_size,
                "key/value must be [tokens, kv_heads, head_size] with each token's heads contiguous");
    TORCH_CHECK(t->scalar_type() == kv_cache.scalar_type(), "key/value dtype must be kv_cache's");
  }
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.numel() >= tokens &&
                  slot_mapping.scalar_type() == at::kLong,
              "slot_mapping must be int64 with a slot per token");
  auto slots_t = slot_mapping.contiguous();
  const int64_t* slots = slots_t.data_ptr<int64_t>();
  const int64_t capacity = kv_cache.size(1) * kv_cache.size(2);
  // Every slot checked before the first write: a bad one leaves the cache as it was.
  for (int64_t t = 0; t < tokens; ++t) {
    TORCH_CHECK(slots[t] < capacity, "slot ", slots[t], " outside the cache (", capacity, " slots)");
  }
  const int64_t bytes = row * static_cast<int64_t>(kv_cache.element_size());
  char* k_cache = static_cast<char*>(kv_cache.data_ptr());
  char* v_cache = k_cache + capacity * bytes;
  const char* k = static_cast<const char*>(key.data_ptr());
  const char* v = static_cast<const char*>(value.data_ptr());
  const int64_t k_stride = key.stride(0) * kv_cache.element_size();
  const int64_t v_stride = value.stride(0) * kv_cache.element_size();
  for (int64_t t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;  // padding
    std::memcpy(k_cache + slots[t] * bytes, k + t * k_stride, bytes);
    std::memcpy(v_cache + slots[t] * bytes, v + t * v_stride, bytes);
  }
}

}  // namespace

void reshape_and_cache(at::Tensor key, at::Tensor value, at::Tensor kv_cache,
                       at::Tensor slot_mapping) {
  pagoda_cpu::run_op([=]() mutable { write_cache(key, value, kv_cache, slot_mapping); });
}
