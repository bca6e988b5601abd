// The forward pass: the fused multi-output lookup Recv runs (one parallel
// loop over every bag of every output; combiners and the bag arithmetic of
// core/bag.h, simulated quantization).
#include <algorithm>
#include <cmath>

#include "core/cpu_dispatch.h"
#include "engine/engine.h"
#include "tsl/platform/denormal.h"
#include "tsl/platform/threadpool.h"  // every TF 2.16-2.21 ships this path

namespace tf_tpu_emb {

// ------------------------------------------------------------------ lookup

namespace {

inline float Quantize(const Table& t, float x) {
  const float c = std::min(std::max(x, t.quant_lower), t.quant_upper);
  const float q = std::floor((c - t.quant_lower) / t.quant_step + 0.5f);
  return q * t.quant_step + t.quant_lower;
}

// Prefetches the rows of one output's ids[next, limit) a fixed number of
// cache lines ahead of the row being summed, across bag boundaries: a bag has
// only a few ids, so prefetching within the bag alone starts each bag with
// cold misses and keeps too few loads in flight (a lookup waits on memory
// latency; benchmarks/RESULTS.md, "the forward profile").
template <typename T>
struct RowStream {
  const T* base = nullptr;
  int dim = 0;
  const int64_t* ids = nullptr;
  int64_t next = 0, limit = 0, distance = 0;

  void Reset(const T* b, int d, const int64_t* i, int64_t from, int64_t to) {
    base = b, dim = d, ids = i, next = from, limit = to;
    const int64_t lines = std::max<int64_t>(1, (d * int64_t{sizeof(T)} + 63) / 64);
    distance = std::max<int64_t>(2, kLinesInFlight / lines);
  }
  // Every row before position pos + distance has been prefetched.
  TF_TPU_EMB_INLINE_INTO_CLONES void Until(int64_t pos) {
    const int64_t stop = std::min(limit, pos + distance);
    for (; next < stop; ++next) {
      PrefetchRow(base + ids[next] * dim, dim * static_cast<int>(sizeof(T)));
    }
  }
  // Measured on the peer workload (8 x 1M x 64, Zipf, 2 threads): CPU time
  // per forward 13.7 ms at 8 lines ahead, 9.9 ms at 48, 8.4-9.0 ms from 128
  // on (flat beyond); the hardware drops prefetches it has no room for.
  static constexpr int64_t kLinesInFlight = 128;
};

// Bags [lo_bag, hi_bag) of output o, rows of type T.
template <typename T>
TF_TPU_EMB_INLINE_INTO_CLONES void LookupBags(const Table& table, const T* base,
                                              const OutputBatch& ob, int64_t lo_bag, int64_t hi_bag,
                                              float* out) {
  const int dim = table.dimension;
  RowStream<T> stream;
  stream.Reset(base, dim, ob.ids.data(), ob.offsets[lo_bag], ob.offsets[hi_bag]);
  const auto identity = [](float x) { return x; };
  const auto quantize = [&table](float x) { return Quantize(table, x); };
  for (int64_t p = lo_bag; p < hi_bag; ++p) {
    const int64_t lo = ob.offsets[p], n = ob.offsets[p + 1] - lo;
    const int64_t* ids = ob.ids.data() + lo;
    const float* w = ob.weights.empty() ? nullptr : ob.weights.data() + lo;
    const Combiner c = ob.slot_combiners[p % ob.slot_combiners.size()];
    float* dst = out + p * dim;
    const auto ahead = [&stream, lo](int64_t k) { stream.Until(lo + k + 1); };
    if (table.quantize) {
      if (w) ReduceBagWith<true>(base, dim, ids, w, n, c, dst, quantize, ahead);
      else ReduceBagWith<false>(base, dim, ids, w, n, c, dst, quantize, ahead);
    } else {
      if (w) ReduceBagWith<true>(base, dim, ids, w, n, c, dst, identity, ahead);
      else ReduceBagWith<false>(base, dim, ids, w, n, c, dst, identity, ahead);
    }
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
  for (int64_t i = begin; i < end; ++o) {
    const int64_t stop = std::min(end, starts[o + 1]);
    if (stop > i) {
      const Table& table = engine.table(outputs[o].table);
      const OutputBatch& ob = batch.outputs[o];
      const int64_t lo_bag = i - starts[o], hi_bag = stop - starts[o];
      if (table.bf16) LookupBags(table, table.state[0]->half(), ob, lo_bag, hi_bag, out[o]);
      else LookupBags(table, table.state[0]->data(), ob, lo_bag, hi_bag, out[o]);
    }
    i = std::max(i, stop);
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
    starts[o + 1] = starts[o] + (batch.outputs[o].offsets.size() - 1);  // Batch's bags
    total_ids += batch.outputs[o].ids.size();
    total_dims += tables_[outputs_[o].table].dimension;
  }
  const int64_t total = starts[num_outputs];
  if (total == 0) return;
  const int64_t avg_dim = std::max<int64_t>(1, total_dims / std::max(1, num_outputs));
  const int64_t cost = (1 + total_ids / total) * avg_dim * 4 + avg_dim;

  auto work = [&](int64_t begin, int64_t end) {
    // float32 subnormals flush to zero, as on a TPU and in TF's CPU kernels
    // (semantics §4.2), whichever thread runs this part.
    ::tsl::port::ScopedFlushDenormal flush;
    LookupRange(*this, batch, out, starts, begin, end);
  };
  if (pool == nullptr) {
    work(0, total);
  } else {
    pool->ParallelFor(total, cost, work);
  }
}

}  // namespace tf_tpu_emb
