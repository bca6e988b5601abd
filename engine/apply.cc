// The backward step: the global batch's gradient per row (summed over
// replicas and bags), gradient clipping, the table's optimizer, weight decay
// and weight clipping (docs/tpu_embedding_semantics.md §5.0), in parallel
// over (table, partition of rows).
#include <algorithm>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <mutex>

#include "core/cpu_dispatch.h"
#include "engine/engine.h"
#include "tsl/platform/denormal.h"
#include "tsl/platform/threadpool.h"  // every TF 2.16-2.21 ships this path

namespace tf_tpu_emb {

namespace {

// One occurrence of an id in the global batch: it contributes coef * grad
// to the id's row gradient.
struct Contribution {
  int64_t id;
  float coef;
  const float* grad;
};

// One table's share of a step.  Its settings (clipping, weight decay,
// accumulation, laziness, hyper-parameters) were read at configure
// (Table::update); the step adds its dynamic inputs.
struct TableStep {
  Table* table = nullptr;
  RowArgs args{};     // lr; row pointers filled per row
  HyperParams hp{};   // hyper-parameters and this step's dynamic inputs
  float decay = 0;    // effective weight decay factor
  uint64_t seed = 0;  // bfloat16 storage: this step's stochastic-rounding seed
  std::vector<Contribution> contributions;  // grouped by partition
  std::vector<int64_t> partition_starts;
};

// Rounds the float32 row `wide` (parameters, then every slot) stochastically
// into the bfloat16 state of row `id`; the random bits depend on the step's
// seed, the row and the element only (core/bf16.h).  The rounding loop is
// branch-free and vectorises (with a 64-bit hash per 4 elements and a branch
// per element it was 60% of a bfloat16 Adagrad update, which then ran slower
// than float32: benchmarks/RESULTS.md "bfloat16 storage: speed").
TF_TPU_EMB_INLINE_INTO_CLONES void StoreRounded(const TableStep& ts, int64_t id,
                                                const float* wide) {
  const Table& t = *ts.table;
  const int dim = t.dimension;
  const uint64_t key = MixBits(ts.seed ^ (static_cast<uint64_t>(id) * 0xD6E8FEB86659FD93ull));
  const uint32_t key32 = static_cast<uint32_t>(key ^ (key >> 32));
  for (size_t i = 0; i < t.state.size(); ++i) {
    RoundStochasticRow(wide + i * dim, dim, key32, static_cast<uint32_t>(i * dim),
                       t.state[i]->half() + id * dim);
  }
}

// Gradient clipping, the optimizer, weight decay (from the pre-update
// weight), weight clipping: one row of one table.  `wide` is scratch for
// (1 + slots) x dim floats: a bfloat16 row is widened into it, updated there
// in float32 and rounded back.  Inlined into ApplyPartition's clones (an
// out-of-line copy is compiled for the portable baseline only).
TF_TPU_EMB_INLINE_INTO_CLONES void UpdateRow(const TableStep& ts, int64_t id, float* g,
                                             float* w_old, float* wide) {
  Table& t = *ts.table;
  const UpdateSettings& s = t.update;
  const int dim = t.dimension;
  RowArgs a = ts.args;
  if (t.bf16) {
    for (size_t i = 0; i < t.state.size(); ++i) {
      const Bf16* row = t.state[i]->half() + id * dim;
      for (int d = 0; d < dim; ++d) wide[i * dim + d] = ToFloat(row[d]);
    }
    a.w = wide;
    for (size_t i = 1; i < t.state.size(); ++i) a.s[i - 1] = wide + i * dim;
  } else {
    a.w = t.state[0]->data() + id * dim;
    for (size_t i = 1; i < t.state.size(); ++i) a.s[i - 1] = t.state[i]->data() + id * dim;
  }
  a.g = g;
  a.dim = dim;
  a.hp = &ts.hp;
  if (s.clip_g_lo || s.clip_g_hi) {
    const float lo = s.clip_g_lo ? s.g_lo : -std::numeric_limits<float>::infinity();
    const float hi = s.clip_g_hi ? s.g_hi : std::numeric_limits<float>::infinity();
    for (int d = 0; d < dim; ++d) g[d] = std::min(std::max(g[d], lo), hi);
  }
  if (ts.decay != 0) std::memcpy(w_old, a.w, sizeof(float) * dim);
  t.optimizer->update(a);
  if (ts.decay != 0) {
    for (int d = 0; d < dim; ++d) a.w[d] -= ts.decay * w_old[d];
  }
  if (s.clip_w_lo || s.clip_w_hi) {
    const float lo = s.clip_w_lo ? s.w_lo : -std::numeric_limits<float>::infinity();
    const float hi = s.clip_w_hi ? s.w_hi : std::numeric_limits<float>::infinity();
    for (int d = 0; d < dim; ++d) a.w[d] = std::min(std::max(a.w[d], lo), hi);
  }
  if (t.bf16) StoreRounded(ts, id, wide);
}

// Prefetches every state row (parameters and slots) of row `id`.  Always
// inlined: a function whose only effect is prefetching is "const" to GCC's
// IPA pure-const analysis, and a call to it is deleted as dead code (it was,
// silently, until session 10: benchmarks/RESULTS.md "The training profile").
TF_TPU_EMB_INLINE_INTO_CLONES void PrefetchStateRows(const Table& t, int64_t id) {
  for (const auto& buffer : t.state) {
    const int bytes = t.dimension * buffer->element_bytes();
    const char* row =
        static_cast<const char*>(buffer->bf16() ? static_cast<const void*>(buffer->half())
                                                : static_cast<const void*>(buffer->data())) +
        id * bytes;
    for (int b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 1);
  }
}

inline int PartitionOf(int64_t id, int bits) {
  return bits == 0
             ? 0
             : static_cast<int>((static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

// ApplyPartition's per-thread scratch, kept across steps (no allocation per
// step).  A type of its own at namespace scope: a local one's destructor
// would be a function named after ApplyPartition, without its prefetches
// (tests/packaging/test_package.py reads every such function).
struct PartitionScratch {
  std::vector<int64_t> keys, uniques;
  std::vector<int32_t> slot_of, slot;
  std::vector<float> acc;
};

// Accumulates (or, without gradient accumulation, applies one by one) the
// contributions [begin, end) of one partition: ids of a partition belong to
// no other, so partitions update disjoint rows.  Order is the contribution
// order, so results do not depend on the number of threads.  Carries the
// CPU dispatch of core/cpu_dispatch.h (UpdateRow is inlined into it).
TF_TPU_EMB_CPU_DISPATCH
void ApplyPartition(TableStep& ts, int64_t begin, int64_t end) {
  const int dim = ts.table->dimension;
  std::vector<float> g(dim), w_old(dim), wide(ts.table->state.size() * dim);
  const Contribution* c = ts.contributions.data();
  if (!ts.table->update.accumulate) {
    for (int64_t i = begin; i < end; ++i) {
      for (int d = 0; d < dim; ++d) g[d] = c[i].coef * c[i].grad[d];
      UpdateRow(ts, c[i].id, g.data(), w_old.data(), wide.data());
      if (ts.table->update.non_lazy) ts.table->touched[c[i].id] = 1;
    }
    return;
  }
  // Open-addressing map id -> slot, then one accumulator row per unique id.
  // The scratch is kept per thread across steps (no allocation per step).
  const int64_t n = end - begin;
  int64_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  // One TLS lookup (__tls_get_addr in a shared library: perf showed it at
  // 2.5% of a host's CPU when each vector was a thread_local of its own).
  thread_local PartitionScratch scratch;
  PartitionScratch& sc = scratch;
  auto& keys = sc.keys;
  auto& uniques = sc.uniques;
  auto& slot_of = sc.slot_of;
  auto& slot = sc.slot;
  auto& acc = sc.acc;
  keys.assign(cap, -1);
  slot_of.resize(cap);
  slot.resize(n);
  uniques.clear();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = c[begin + i].id;
    uint64_t h = (static_cast<uint64_t>(id) * 0xC2B2AE3D27D4EB4Full) & (cap - 1);
    while (keys[h] != -1 && keys[h] != id) h = (h + 1) & (cap - 1);
    if (keys[h] == -1) {
      keys[h] = id;
      slot_of[h] = uniques.size();
      uniques.push_back(id);
    }
    slot[i] = slot_of[h];
  }
  acc.assign(uniques.size() * dim, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    float* dst = acc.data() + static_cast<int64_t>(slot[i]) * dim;
    const float coef = c[begin + i].coef;
    const float* src = c[begin + i].grad;
    for (int d = 0; d < dim; ++d) dst[d] += coef * src[d];
  }
  constexpr size_t kAhead =
      4;  // rows are random: fetch them ahead of use (4, 8 and 16 measured alike)
  for (size_t u = 0; u < std::min(kAhead, uniques.size()); ++u)
    PrefetchStateRows(*ts.table, uniques[u]);
  for (size_t u = 0; u < uniques.size(); ++u) {
    if (u + kAhead < uniques.size()) PrefetchStateRows(*ts.table, uniques[u + kAhead]);
    UpdateRow(ts, uniques[u], acc.data() + u * dim, w_old.data(), wide.data());
    if (ts.table->update.non_lazy) ts.table->touched[uniques[u]] = 1;
  }
}

}  // namespace

void Engine::ApplyStep(const std::vector<std::unique_ptr<StepPart>>& parts,
                       const std::vector<float>& dynamic_inputs, ::tsl::thread::ThreadPool* pool,
                       const std::vector<std::vector<uint8_t>>* first,
                       const std::function<void()>& after_first) {
  const int num_tables = tables_.size();
  std::vector<TableStep> steps(num_tables);
  const uint64_t step = steps_applied_++;
  // An exception must not leave a pool thread (it would terminate the
  // process): the first one is rethrown here, to the kernel's guard.
  std::exception_ptr thrown;
  std::mutex thrown_mu;
  auto run = [&](int64_t n, int64_t cost, const std::function<void(int64_t, int64_t)>& fn) {
    auto guarded = [&](int64_t begin, int64_t end) {
      // Subnormals flush to zero in row updates as in lookups (semantics §4.2).
      ::tsl::port::ScopedFlushDenormal flush;
      try {
        fn(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(thrown_mu);
        if (!thrown) thrown = std::current_exception();
      }
    };
    if (pool != nullptr) pool->ParallelFor(n, cost, guarded);
    else guarded(0, n);
    if (thrown) std::rethrow_exception(thrown);
  };
  // Per table: its hyper-parameters and every contribution of the global
  // batch (outputs in order, then replicas, then bags), grouped by partition.
  run(num_tables, 1 << 20, [&](int64_t t_begin, int64_t t_end) {
    for (int64_t t = t_begin; t < t_end; ++t) {
      TableStep& ts = steps[t];
      Table& table = tables_[t];
      const UpdateSettings& s = table.update;
      ts.table = &table;
      ts.hp = s.hp;
      table.optimizer->bind_dynamic(table.params, dynamic_inputs, &ts.hp);
      const float lr = s.lr_tag >= 0 ? dynamic_inputs[s.lr_tag] : s.lr_constant;
      ts.args.lr = lr;
      ts.decay = s.weight_decay * (s.decay_times_lr ? lr : 1.0f);
      ts.seed = MixBits((static_cast<uint64_t>(t) << 48) ^ step);
      if (s.non_lazy) std::fill(table.touched.begin(), table.touched.end(), 0);

      int64_t total = 0;
      for (size_t o = 0; o < outputs_.size(); ++o) {
        if (outputs_[o].table != t) continue;
        for (const auto& part : parts) total += part->batch.outputs[o].ids.size();
      }
      int bits = 0;
      while (bits < 6 && (int64_t{4096} << bits) < total) ++bits;
      const int num_partitions = 1 << bits;
      std::vector<int64_t> count(num_partitions + 1, 0);
      for (size_t o = 0; o < outputs_.size(); ++o) {
        if (outputs_[o].table != t) continue;
        for (const auto& part : parts) {
          for (int64_t id : part->batch.outputs[o].ids) ++count[PartitionOf(id, bits) + 1];
        }
      }
      for (int i = 0; i < num_partitions; ++i) count[i + 1] += count[i];
      ts.partition_starts = count;
      ts.contributions.resize(total);
      std::vector<int64_t> cursor(count.begin(), count.end() - 1);
      const int dim = table.dimension;
      for (size_t o = 0; o < outputs_.size(); ++o) {
        if (outputs_[o].table != t) continue;
        for (const auto& part : parts) {
          const OutputBatch& ob = part->batch.outputs[o];
          const float* grads = part->grads[o];
          const int64_t bags = ob.offsets.size() - 1;
          for (int64_t b = 0; b < bags; ++b) {
            const int64_t lo = ob.offsets[b], hi = ob.offsets[b + 1];
            if (lo == hi) continue;
            const float scale =
                ob.bag_scales.empty()
                    ? BagScale(ob.slot_combiners[b % ob.slot_combiners.size()],
                               ob.weights.empty() ? nullptr : ob.weights.data() + lo, hi - lo)
                    : ob.bag_scales[b];
            for (int64_t k = lo; k < hi; ++k) {
              const float w = ob.weights.empty() ? 1.0f : ob.weights[k];
              const int64_t id = ob.ids[k];
              ts.contributions[cursor[PartitionOf(id, bits)]++] = {id, w * scale, grads + b * dim};
            }
          }
        }
      }
    }
  });
  // With `first`: each partition's contributions to the marked rows move
  // ahead of the others (stable: a row's contributions keep their order, and
  // all of a row's are on one side), so the marked rows can be updated first.
  std::vector<std::vector<int64_t>> mids(num_tables);
  if (first != nullptr) {
    run(num_tables, 1 << 20, [&](int64_t t_begin, int64_t t_end) {
      for (int64_t t = t_begin; t < t_end; ++t) {
        TableStep& ts = steps[t];
        const std::vector<uint8_t>& marked = (*first)[t];
        for (size_t i = 0; i + 1 < ts.partition_starts.size(); ++i) {
          auto begin = ts.contributions.begin() + ts.partition_starts[i];
          auto end = ts.contributions.begin() + ts.partition_starts[i + 1];
          auto mid = std::stable_partition(begin, end, [&](const Contribution& c) {
            return marked[c.id] != 0;
          });
          mids[t].push_back(mid - ts.contributions.begin());
        }
      }
    });
  }
  // Every (table, partition) is an independent task over disjoint rows.
  std::vector<std::pair<int, int>> tasks;
  for (int t = 0; t < num_tables; ++t) {
    for (size_t i = 0; i + 1 < steps[t].partition_starts.size(); ++i) {
      if (steps[t].partition_starts[i + 1] > steps[t].partition_starts[i]) tasks.push_back({t, i});
    }
  }
  // phase 0: every contribution (no `first`); 1: the marked rows; 2: the rest.
  auto apply = [&](int phase) {
    run(tasks.size(), 1 << 20, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        TableStep& ts = steps[tasks[i].first];
        const int p = tasks[i].second;
        int64_t lo = ts.partition_starts[p], hi = ts.partition_starts[p + 1];
        if (phase == 1) hi = mids[tasks[i].first][p];
        if (phase == 2) lo = mids[tasks[i].first][p];
        if (lo < hi) ApplyPartition(ts, lo, hi);
      }
    });
  };
  if (first == nullptr) {
    apply(0);
  } else {
    apply(1);
    if (after_first) after_first();
    apply(2);
  }
  // Non-lazy optimizers: every row the step did not touch sees g = 0.
  for (int t = 0; t < num_tables; ++t) {
    TableStep& ts = steps[t];
    if (!ts.table->update.non_lazy) continue;
    const int dim = ts.table->dimension;
    run(ts.table->vocabulary_size, 50 * dim, [&](int64_t begin, int64_t end) {
      std::vector<float> g(dim), w_old(dim), wide(ts.table->state.size() * dim);
      for (int64_t id = begin; id < end; ++id) {
        if (ts.table->touched[id]) continue;
        std::fill(g.begin(), g.end(), 0.0f);
        UpdateRow(ts, id, g.data(), w_old.data(), wide.data());
      }
    });
  }
}

}  // namespace tf_tpu_emb
