// The forward pass: the fused multi-output lookup Recv runs (one parallel
// loop over every bag of every output; combiners and the bag arithmetic of
// core/bag.h, simulated quantization).
#include <algorithm>
#include <cmath>

#include "core/cpu_dispatch.h"
#include "engine/engine.h"
#include "tsl/platform/threadpool.h"  // every TF 2.16-2.21 ships this path

namespace tf_tpu_emb {

// ------------------------------------------------------------------ lookup

namespace {

inline float Quantize(const Table& t, float x) {
  const float c = std::min(std::max(x, t.quant_lower), t.quant_upper);
  const float q = std::floor((c - t.quant_lower) / t.quant_step + 0.5f);
  return q * t.quant_step + t.quant_lower;
}

// One bag of `table` whose rows are `base` (float or Bf16 storage).
template <typename T>
TF_TPU_EMB_INLINE_INTO_CLONES void ReduceTableBag(const Table& table, const T* base,
                                                  const int64_t* ids, const float* w, int64_t n,
                                                  Combiner c, float* dst) {
  const int dim = table.dimension;
  if (table.quantize) {
    auto q = [&table](float x) { return Quantize(table, x); };
    if (w) ReduceBag<true>(base, dim, ids, w, n, c, dst, q);
    else ReduceBag<false>(base, dim, ids, w, n, c, dst, q);
  } else {
    auto identity = [](float x) { return x; };
    if (w) ReduceBag<true>(base, dim, ids, w, n, c, dst, identity);
    else ReduceBag<false>(base, dim, ids, w, n, c, dst, identity);
  }
}

// Prefetches the first rows of a bag: ReduceBag prefetches ahead within a
// bag, so without this every bag would start with cold misses.
inline void PrefetchBagHead(const Table& table, const int64_t* ids, int64_t n) {
  const FloatBuffer& params = *table.state[0];
  const int bytes = table.dimension * params.element_bytes();
  const char* base = params.bf16() ? reinterpret_cast<const char*>(params.half())
                                   : reinterpret_cast<const char*>(params.data());
  for (int64_t k = 0; k < std::min<int64_t>(n, 4); ++k) {
    const char* row = base + ids[k] * bytes;
    for (int b = 0; b < bytes; b += 64) __builtin_prefetch(row + b);
  }
}

// Bags [begin, end) of the flattened index space of Engine::Lookup (one
// function, so that it carries the CPU dispatch of core/cpu_dispatch.h; the
// inline helpers above are compiled into each of its clones).
TF_TPU_EMB_CPU_DISPATCH
void LookupRange(const Engine& engine, const Batch& batch, const std::vector<float*>& out,
                 const std::vector<int64_t>& starts, int64_t begin, int64_t end) {
  const std::vector<OutputSpec>& outputs = engine.outputs();
  int o = std::upper_bound(starts.begin(), starts.end(), begin) - starts.begin() - 1;
  for (int64_t i = begin; i < end; ++i) {
    while (i >= starts[o + 1]) ++o;
    const int64_t p = i - starts[o];
    const OutputBatch& ob = batch.outputs[o];
    const Table& table = engine.table(outputs[o].table);
    const int64_t lo = ob.offsets[p], n = ob.offsets[p + 1] - lo;
    const int64_t* ids = ob.ids.data() + lo;
    const float* w = ob.weights.empty() ? nullptr : ob.weights.data() + lo;
    const Combiner c = ob.slot_combiners[p % ob.slot_combiners.size()];
    if (i + 1 < end && i + 1 < starts[o + 1]) {
      const int64_t next = ob.offsets[p + 1];
      PrefetchBagHead(table, ob.ids.data() + next, ob.offsets[p + 2] - next);
    }
    float* dst = out[o] + p * table.dimension;
    if (table.bf16) ReduceTableBag(table, table.state[0]->half(), ids, w, n, c, dst);
    else ReduceTableBag(table, table.state[0]->data(), ids, w, n, c, dst);
  }
}

}  // namespace

void Engine::Lookup(const Batch& batch, const std::vector<float*>& out,
                    ::tsl::thread::ThreadPool* pool) {
  // Flatten every output's bags into one index space so that one ParallelFor
  // covers all tables and features.
  const int num_outputs = outputs_.size();
  std::vector<int64_t> starts(num_outputs + 1, 0);
  int64_t total_ids = 0, total_dims = 0;
  for (int o = 0; o < num_outputs; ++o) {
    starts[o + 1] = starts[o] + outputs_[o].positions;
    total_ids += batch.outputs[o].ids.size();
    total_dims += tables_[outputs_[o].table].dimension;
  }
  const int64_t total = starts[num_outputs];
  if (total == 0) return;
  const int64_t avg_dim = std::max<int64_t>(1, total_dims / std::max(1, num_outputs));
  const int64_t cost = (1 + total_ids / total) * avg_dim * 4 + avg_dim;

  auto work = [&](int64_t begin, int64_t end) {
    LookupRange(*this, batch, out, starts, begin, end);
  };
  if (pool == nullptr) {
    work(0, total);
  } else {
    pool->ParallelFor(total, cost, work);
  }
}

}  // namespace tf_tpu_emb
