// Typed XLA FFI handlers that run jax-tpu-embedding's SparseCore primitives
// on a CPU (docs/sparsecore_semantics.md, "The JAX (jax-tpu-embedding)
// layout"); tf_tpu_emb/jax/ registers them and the CPU lowering rules that
// call them.  Built against jaxlib's xla/ffi/api/ffi.h by jax_ffi/build.py;
// no TensorFlow here: the optimizer arithmetic is core/optimizer_formulas.h, the one
// implementation TF's SparseCore kernels use too, and the CSR constants are
// core/sparsecore.h's.
//
// Every handler checks its buffers before it reads them and answers bad
// input with InvalidArgument naming the argument and index; none reads or
// writes out of bounds.
#include "jax_ffi/sparsecore_ffi.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/cpu_dispatch.h"
#include "core/csr_gather.h"
#include "core/huge_pages.h"
#include "core/row_runs.h"
#include "core/sparsecore.h"
#include "core/sparsecore_optimizers.gen.h"
#include "jax_ffi/csr_walk.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace tf_tpu_emb {
namespace jax_sc {
namespace {

template <typename B>
int64_t Count(const B& b) {
  return static_cast<int64_t>(b.element_count());
}

int64_t Width(ffi::Span<const int64_t> dims) { return dims.size() == 2 ? dims[1] : 1; }

// Runs work(p) for each part p of [0, parts) on XLA's intra-op threads
// (ffi::ThreadPool) and on the calling thread, and returns when all are
// done.  The caller claims parts too and waits only for parts another
// thread has claimed, so it never waits on a task still queued: no
// deadlock when every pool thread is itself inside such a call (XLA may run
// independent custom calls at once).  A helper that starts late finds no
// part left and touches nothing of the caller's.
template <typename Work>
void ParallelParts(ffi::ThreadPool* pool, int64_t parts, const Work& work) {
  struct State {
    std::atomic<int64_t> next{0};
    std::mutex mu;
    std::condition_variable cv;
    int64_t done = 0;
  };
  auto state = std::make_shared<State>();
  const Work* w = &work;
  auto run = [state, w, parts] {
    for (int64_t p; (p = state->next.fetch_add(1)) < parts;) {
      (*w)(p);
      std::lock_guard<std::mutex> lock(state->mu);
      if (++state->done == parts) state->cv.notify_all();
    }
  };
  const int64_t helpers = pool == nullptr ? 0 : std::min<int64_t>(parts, pool->num_threads()) - 1;
  for (int64_t h = 0; h < helpers; ++h) {
    auto task = run;  // Schedule keeps its own copy
    pool->Schedule(std::move(task));
  }
  run();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done == parts; });
}

// Parts for `items` units of work: one a thread (XLA's pool and the
// caller), none below a size that pays for the scheduling.
int64_t PartsFor(ffi::ThreadPool* pool, int64_t items) {
  constexpr int64_t kMinItems = 1 << 12;
  const int64_t threads = pool == nullptr ? 1 : std::max<int64_t>(1, pool->num_threads());
  return std::max<int64_t>(1, std::min(threads, items / kMinItems));
}

// The hot loops, each carrying the CPU dispatch of core/cpu_dispatch.h (the
// TF kernels' rule: a portable baseline build, AVX2 and AVX-512 clones
// picked at run time); the ids were checked by CsrWalk::Walk before.  The
// table rows are random reads: the rows a few ids ahead are prefetched.
constexpr int64_t kAhead = 16;

// An Id's table row, activation row and gain, for core/csr_gather.h.
struct TableRows {
  const float* table;
  int64_t width;
  const float* Row(const Id& id) const { return table + id.row * width; }
  static int64_t Sample(const Id& id) { return id.act_row; }
  static float Gain(const Id& id) { return id.gain; }
};

// Activations of rows [first, last): core/csr_gather.h's gather (zeroed,
// then each id of such a row adds gain * its table row, ids in order).
TF_TPU_EMB_CPU_DISPATCH
void GatherRows(const Id* ids, int64_t n, const float* table, int64_t width, float* act,
                int64_t first, int64_t last) {
  csr_gather::GatherPart(TableRows{table, width}, ids, n, width, act, first, last);
}

// grad[slot[i]] += ids[i].gain * act_grad[ids[i].act_row] for the ids whose
// slot is in [first, last), ids in order.
TF_TPU_EMB_CPU_DISPATCH
void SumGradients(const Id* ids, const int64_t* slot, int64_t n, const float* act_grad,
                  int64_t width, float* grad, int64_t first, int64_t last) {
  for (int64_t i = 0; i < n; ++i) {
    if (slot[i] < first || slot[i] >= last) continue;
    if (i + kAhead < n) {
      const float* ahead = act_grad + ids[i + kAhead].act_row * width;
      for (int64_t b = 0; b < width; b += 16) __builtin_prefetch(ahead + b);
    }
    float* acc = grad + slot[i] * width;
    const float* src = act_grad + ids[i].act_row * width;
    const float gain = ids[i].gain;
    for (int64_t d = 0; d < width; ++d) acc[d] += gain * src[d];
  }
}

// One row's update by the optimizer (core/sparsecore_optimizers.gen.h's
// JaxUpdate: core/optimizer_formulas.h), then the clipping to
// [min_value, max_value] where given; inlined into each clone.
struct ClippedUpdate {
  sc_opt::Opt opt;
  const sc_opt::Hyper& hyper;
  float lr;
  bool clip_min;
  float min_value;
  bool clip_max;
  float max_value;
  TF_TPU_EMB_INLINE_INTO_CLONES void operator()(RowArgs& a) const {
    a.lr = lr;
    sc_opt::JaxUpdate(opt, a, hyper);
    float* row = a.w;
    for (int d = 0; d < a.dim; ++d) {
      if (clip_min && row[d] < min_value) row[d] = min_value;
      if (clip_max && row[d] > max_value) row[d] = max_value;
    }
  }
};

// The optimizer on rows touched[0, n) of the table w[0] and its slots
// w[1..nvars), row k's gradient at grad + k * width.
TF_TPU_EMB_CPU_DISPATCH
void UpdateTouched(const ClippedUpdate& update, float* const* w, int64_t nvars,
                   const int64_t* touched, int64_t n, const float* grad, int64_t width) {
  for (int64_t k = 0; k < n; ++k) {
    if (k + kAhead / 4 < n) {
      const int64_t ahead = touched[k + kAhead / 4] * width;
      for (int64_t v = 0; v < nvars; ++v) {
        for (int64_t b = 0; b < width; b += 16) __builtin_prefetch(w[v] + ahead + b, 1);
      }
    }
    const int64_t off = touched[k] * width;
    RowArgs a{};
    a.w = w[0] + off;
    for (int64_t v = 1; v < nvars; ++v) a.s[v - 1] = w[v] + off;
    a.g = grad + k * width;
    a.dim = static_cast<int>(width);
    update(a);
  }
}

// core/row_runs.h's view of an Id: keyed by its row of the table operand
// (the preprocessing sorts a segment's ids by row and a group's segments go
// in ascending shard: one run a group); the gradient row is its
// activation row.
struct OwnIds {
  static int64_t Key(const Id& a) { return a.row; }
  static int64_t Row(const Id& a) { return a.row; }
  static int64_t GradRow(const Id& a) { return a.act_row; }
  static float Gain(const Id& a) { return a.gain; }
};
using IdRun = row_runs::Run<Id>;

// Rows [lo, hi) of the table operand: each row's gradient summed in buffer
// order over the runs and updated in the same pass (core/row_runs.h).
TF_TPU_EMB_CPU_DISPATCH
void SumAndUpdateRows(const ClippedUpdate& update, float* const* w, int64_t nvars,
                      const IdRun* runs, int num_runs, int64_t lo, int64_t hi, int64_t width,
                      float* sum) {
  row_runs::SumAndUpdateRuns<OwnIds>(runs, num_runs, lo, hi, w, static_cast<int>(nvars - 1), width,
                                     sum, update);
}

ffi::Error CheckCommon(const ffi::Buffer<ffi::S32>& rp, const ffi::Buffer<ffi::S32>& ids,
                       const ffi::Buffer<ffi::S32>& samples, const ffi::Buffer<ffi::F32>& gains,
                       int64_t num_sc, int64_t num_devices) {
  // Bounded so that no product of the counts overflows.
  if (num_sc <= 0 || num_sc > kMaxCount) {
    return Invalid("num_sc_per_device: " + Str(num_sc) + " is not in [1, " + Str(kMaxCount) + "]");
  }
  if (num_devices <= 0 || num_devices > kMaxCount) {
    return Invalid("num_devices: " + Str(num_devices) + " is not in [1, " + Str(kMaxCount) + "]");
  }
  if (rp.dimensions().size() != 1) return Invalid("lhs_row_pointers: not rank 1");
  if (ids.dimensions().size() != 1 || samples.dimensions().size() != 1 ||
      gains.dimensions().size() != 1) {
    return Invalid("lhs_local_embedding_ids, lhs_local_sample_ids, lhs_gains: not rank 1");
  }
  if (samples.element_count() != ids.element_count() ||
      gains.element_count() != ids.element_count()) {
    return Invalid("lhs_local_sample_ids (" + Str(samples.element_count()) + "), lhs_gains (" +
                   Str(gains.element_count()) + ") and lhs_local_embedding_ids (" +
                   Str(ids.element_count()) + ") differ in length");
  }
  return ffi::Error::Success();
}

}  // namespace

// The lookup (sparse_dense_matmul_csr): activations[sc*B + sample] +=
// gain * table[shard j's row id], ids in buffer order.  `table` is every
// shard of the table (the lowering rule gathers the devices' shards), in
// global SparseCore order.
ffi::Error LookupImpl(ffi::Buffer<ffi::S32> rp, ffi::Buffer<ffi::S32> ids,
                      ffi::Buffer<ffi::S32> samples, ffi::Buffer<ffi::F32> gains,
                      ffi::Buffer<ffi::S32> num_minibatches, ffi::Buffer<ffi::F32> table,
                      ffi::ResultBuffer<ffi::F32> out, int64_t num_sc, int64_t num_devices,
                      bool minibatching, ffi::ThreadPool thread_pool) {
  ffi::ThreadPool* pool = &thread_pool;
  if (ffi::Error e = CheckCommon(rp, ids, samples, gains, num_sc, num_devices); e.failure()) {
    return e;
  }
  const auto tdims = table.dimensions();
  const auto odims = out->dimensions();
  if (tdims.size() != 1 && tdims.size() != 2) return Invalid("embedding_table: not rank 1 or 2");
  const int64_t width = Width(tdims);
  if (odims.size() != tdims.size() || Width(odims) != width) {
    return Invalid("embedding_table: width " + Str(width) + " differs from the activations'");
  }
  const int64_t global_sc = num_sc * num_devices;
  if (tdims[0] % global_sc != 0) {
    return Invalid("embedding_table: " + Str(tdims[0]) + " rows is not a multiple of the " +
                   Str(global_sc) + " SparseCores that shard it");
  }
  const int64_t batch = odims[0];
  if (batch % num_sc != 0) {
    return Invalid("device_batch_size: " + Str(batch) + " is not a multiple of " + Str(num_sc) +
                   " SparseCores per device");
  }
  if (minibatching && Count(num_minibatches) != 1) {
    return Invalid("num_minibatches_per_physical_sparse_core: not a scalar");
  }
  CsrWalk walk{rp.typed_data(),
               Count(rp),
               ids.typed_data(),
               samples.typed_data(),
               gains.typed_data(),
               Count(ids),
               1,
               num_sc,
               global_sc,
               batch / num_sc,
               tdims[0] / global_sc,
               0,
               global_sc,
               minibatching ? num_minibatches.typed_data() : nullptr};
  thread_local std::vector<Id> found;  // kept between calls: no allocation once sized
  found.clear();
  ffi::Error walked = walk.Walk([&](const Id& id) { found.push_back(id); });
  if (walked.failure()) return walked;
  float* act = out->typed_data();
  // The lambda runs on other threads too: it must not name the thread_local.
  const Id* id_list = found.data();
  const int64_t n = static_cast<int64_t>(found.size());
  const int64_t parts = PartsFor(pool, n * width / 16);
  const float* rows = table.typed_data();
  ParallelParts(pool, parts, [&](int64_t p) {
    GatherRows(id_list, n, rows, width, act, batch * p / parts, batch * (p + 1) / parts);
  });
  return walked;
}

namespace {

// The gradient handlers' ids: every id of every device's buffers checked,
// and those of this device's table operand listed in buffer order (`found`,
// `row` in the operand).  The operand (shape `tdims`) holds the shards of
// global SparseCores [shard_offset, shard_offset + num_sc); ids of other
// shards are checked and skipped.  Shared by the built-in optimizers'
// handler and the custom optimizer's.
ffi::Error ListOwnIds(const ffi::Buffer<ffi::S32>& rp, const ffi::Buffer<ffi::S32>& ids,
                      const ffi::Buffer<ffi::S32>& samples, const ffi::Buffer<ffi::F32>& gains,
                      const ffi::Buffer<ffi::S32>& num_minibatches,
                      const ffi::Buffer<ffi::F32>& act_grad,
                      const ffi::Buffer<ffi::S32>& shard_offset, ffi::Span<const int64_t> tdims,
                      int64_t num_sc, int64_t num_devices, int64_t sources, bool minibatching,
                      std::vector<Id>* found) {
  if (sources <= 0 || sources > kMaxCount) {
    return Invalid("sources: " + Str(sources) + " is not in [1, " + Str(kMaxCount) + "]");
  }
  const int64_t width = Width(tdims);
  const auto gdims = act_grad.dimensions();
  if ((gdims.size() != 1 && gdims.size() != 2) || Width(gdims) != width) {
    return Invalid("activations_grad: width " + Str(Width(gdims)) + " differs from the table's " +
                   Str(width));
  }
  if (gdims[0] % (sources * num_sc) != 0) {
    return Invalid("activations_grad: " + Str(gdims[0]) +
                   " rows is not a multiple of devices * SparseCores per device");
  }
  if (tdims[0] % num_sc != 0) {
    return Invalid("embedding_table: " + Str(tdims[0]) + " rows is not a multiple of " +
                   Str(num_sc) + " SparseCores per device");
  }
  if (shard_offset.element_count() != 1) return Invalid("shard_offset: not a scalar");
  const int64_t global_sc = num_sc * num_devices;
  const int64_t first = shard_offset.typed_data()[0];
  if (first < 0 || first + num_sc > global_sc) {
    return Invalid("shard_offset: " + Str(first) + " is outside the " + Str(global_sc) +
                   " SparseCores");
  }
  const int64_t shard_rows = tdims[0] / num_sc;
  if (minibatching && Count(num_minibatches) != sources) {
    return Invalid("num_minibatches_per_physical_sparse_core: " + Str(Count(num_minibatches)) +
                   " entries, not one per device (" + Str(sources) + ")");
  }
  CsrWalk walk{rp.typed_data(),
               Count(rp),
               ids.typed_data(),
               samples.typed_data(),
               gains.typed_data(),
               Count(ids),
               sources,
               num_sc,
               global_sc,
               gdims[0] / (sources * num_sc),
               shard_rows,
               first,
               num_sc,
               minibatching ? num_minibatches.typed_data() : nullptr};
  found->clear();
  return walk.Walk([&](const Id& id) {
    if (id.row >= 0) found->push_back(id);
  });
}

// The gradient of each row of this device's table operand that has an id
// (`found`, from ListOwnIds): the sum of gain * activations_grad[sample]
// over its ids from every device and SparseCore, in buffer order
// (`touched`: the rows in order of their first id; `grad`: their gradients,
// `width` floats each).  The custom optimizer's handler, and the built-in
// optimizers' where the ids are not in a few sorted runs.
void RowGradients(const std::vector<Id>& found, int64_t rows, int64_t width, const float* act_grad,
                  ffi::ThreadPool* pool, std::vector<int64_t>* touched, std::vector<float>* grad) {
  // Row -> slot: a table of the thread's, kept between calls and reset only
  // where this call wrote.
  thread_local std::vector<int64_t> slot_of;
  thread_local std::vector<int64_t> slot;
  if (static_cast<int64_t>(slot_of.size()) < rows) slot_of.assign(rows, -1);
  slot.clear();
  touched->clear();
  for (const Id& id : found) {
    int64_t& k = slot_of[id.row];
    if (k < 0) {
      k = static_cast<int64_t>(touched->size());
      touched->push_back(id.row);
    }
    slot.push_back(k);
  }
  for (int64_t row : *touched) slot_of[row] = -1;
  grad->assign(touched->size() * width, 0.0f);
  // The lambda runs on other threads too: it must not name the thread_locals.
  const Id* id_list = found.data();
  const int64_t* slot_list = slot.data();
  const int64_t n = static_cast<int64_t>(found.size());
  const int64_t slots = static_cast<int64_t>(touched->size());
  const int64_t parts = PartsFor(pool, n * width / 16);
  float* sums = grad->data();
  ParallelParts(pool, parts, [&](int64_t p) {
    SumGradients(id_list, slot_list, n, act_grad, width, sums, slots * p / parts,
                 slots * (p + 1) / parts);
  });
}

}  // namespace

// The gradient and update (sparse_dense_matmul_grad_with_<optimizer>): the
// gradient of a row is the sum of gain * activations_grad[sample] over its
// ids from every device and SparseCore, in buffer order; each row with an id
// is updated once by the optimizer (core/sparsecore_optimizers.gen.h's JaxUpdate:
// core/optimizer_formulas.h), then clipped to
// [min_value, max_value] where given; other rows are unchanged.  This
// device's table operand holds the shards of global SparseCores
// [shard_offset, shard_offset + num_sc); ids of other shards are checked and
// skipped.  The remaining arguments are the table, its slots and the
// hyper-parameters; the results the updated table and slots.
ffi::Error GradImpl(ffi::Buffer<ffi::S32> rp, ffi::Buffer<ffi::S32> ids,
                    ffi::Buffer<ffi::S32> samples, ffi::Buffer<ffi::F32> gains,
                    ffi::Buffer<ffi::S32> num_minibatches, ffi::Buffer<ffi::F32> act_grad,
                    ffi::Buffer<ffi::S32> shard_offset, ffi::RemainingArgs args,
                    ffi::RemainingRets rets, std::string_view optimizer, int64_t num_sc,
                    int64_t num_devices, int64_t sources, bool clip_min, float min_value,
                    bool clip_max, float max_value, bool multiply_linear_by_lr, bool minibatching,
                    ffi::ThreadPool thread_pool) {
  ffi::ThreadPool* pool = &thread_pool;
  if (ffi::Error e = CheckCommon(rp, ids, samples, gains, num_sc, num_devices); e.failure()) {
    return e;
  }
  sc_opt::Opt opt;
  if (!sc_opt::FindJaxOptimizer(optimizer, &opt)) {
    return Invalid("optimizer: '" + std::string(optimizer) + "' is unknown");
  }
  const int num_hypers = sc_opt::NumJaxScalars(opt);
  const int64_t nvars = 1 + sc_opt::NumSlotsOf(opt);
  if (static_cast<int64_t>(args.size()) != nvars + num_hypers ||
      static_cast<int64_t>(rets.size()) != nvars) {
    return Invalid("optimizer " + std::string(optimizer) + ": " + Str(args.size()) +
                   " table/slot/hyper-parameter operands and " + Str(rets.size()) +
                   " results; expected " + Str(nvars + num_hypers) + " and " + Str(nvars));
  }
  std::vector<const float*> in(nvars);
  std::vector<float*> out(nvars);
  ffi::Span<const int64_t> tdims;
  int64_t table_elems = 0;
  for (int64_t v = 0; v < nvars; ++v) {
    const char* what = v == 0 ? "embedding_table" : "slot variable";
    auto a = args.get<ffi::Buffer<ffi::F32>>(v);
    auto r = rets.get<ffi::Buffer<ffi::F32>>(v);
    if (a.has_error() || r.has_error()) return Invalid(std::string(what) + ": not float32");
    const auto dims = a.value().dimensions();
    if (v == 0) {
      tdims = dims;
      table_elems = Count(a.value());
      if (dims.size() != 1 && dims.size() != 2) {
        return Invalid("embedding_table: not rank 1 or 2");
      }
    } else if (Count(a.value()) != table_elems || dims.size() != tdims.size() ||
               dims[0] != tdims[0]) {
      return Invalid("slot variable " + Str(v - 1) + ": its shape differs from the table's");
    }
    if (Count(*r.value()) != table_elems) {
      return Invalid(std::string(what) + ": result shape differs from the operand's");
    }
    in[v] = a.value().typed_data();
    out[v] = (*r.value()).typed_data();
  }
  // The scalar operands: the learning rate, then the optimizer's own
  // (named by the optimizer source), and the handler's attrs it reads.
  std::vector<std::string> names(num_hypers, "learning_rate");
  sc_opt::Hyper hyper{};
  sc_opt::VisitJaxScalars(opt, &hyper, [&](int index, const char* name, auto*) {
    names[index] = name;
    return true;
  });
  std::vector<float> scalar(num_hypers);
  for (int h = 0; h < num_hypers; ++h) {
    auto a = args.get<ffi::Buffer<ffi::F32>>(nvars + h);
    if (a.has_error() || a.value().element_count() != 1) {
      return Invalid("hyper-parameter " + Str(h) + " (" + names[h] + "): not a float32 scalar");
    }
    scalar[h] = a.value().typed_data()[0];
  }
  sc_opt::VisitJaxScalars(opt, &hyper, [&](int index, const char*, auto* value) {
    using T = std::remove_pointer_t<decltype(value)>;
    if constexpr (std::is_same_v<T, bool>) {
      *value = scalar[index] != 0.0f;
    } else {
      *value = scalar[index];
    }
    return true;
  });
  sc_opt::VisitJaxAttrs(opt, &hyper, [&](const char* name, auto* value) {
    if (std::string_view(name) == "multiply_linear_by_lr") *value = multiply_linear_by_lr;
    return true;
  });
  const int64_t width = Width(tdims);
  // Scratch of the calling thread, kept between calls: a step allocates (and
  // page-faults) nothing once its sizes were seen.
  thread_local std::vector<Id> found;
  thread_local std::vector<IdRun> runs;
  thread_local std::vector<int64_t> touched;
  thread_local std::vector<float> grad;
  if (ffi::Error e = ListOwnIds(rp, ids, samples, gains, num_minibatches, act_grad, shard_offset,
                                tdims, num_sc, num_devices, sources, minibatching, &found);
      e.failure()) {
    return e;
  }
  // The table and slots' rows are read and written at random: with 4 KiB
  // pages nearly every row is a TLB miss, and XLA's buffers are not advised
  // for huge pages (the TF kernels move theirs into huge pages instead,
  // kernels/sparsecore/huge_page_allocator.h; benchmarks/RESULTS.md,
  // issue 38).  A donated variable, updated where it lies, is collapsed
  // into huge pages once; a new result is advised before it is written.
  for (int64_t v = 0; v < nvars; ++v) {
    const size_t bytes = sizeof(float) * table_elems;
    if (out[v] == in[v]) {
      huge_pages::AdvisePersistent(out[v], bytes);
    } else {
      huge_pages::AdviseRange(out[v], bytes, /*collapse=*/false);
      std::memcpy(out[v], in[v], bytes);
    }
  }
  const ClippedUpdate update{opt, hyper, scalar[0], clip_min, min_value, clip_max, max_value};
  // The lambdas run on other threads too: they must not name the thread_locals.
  const int64_t n_ids = static_cast<int64_t>(found.size());
  runs.clear();
  if (row_runs::AppendRuns<OwnIds>(found.data(), n_ids, act_grad.typed_data(), &runs)) {
    // The preprocessing's sorted buffers: one pass a row range, a few more
    // ranges than threads, balanced by ids (core/row_runs.h).
    const int64_t threads = PartsFor(pool, n_ids * width / 16);
    const int64_t ranges = threads == 1 ? 1 : 4 * threads;
    const std::vector<int64_t> cuts = row_runs::BalancedCuts<OwnIds>(runs, 0, tdims[0], ranges);
    const IdRun* run_list = runs.data();
    const int num_runs = static_cast<int>(runs.size());
    ParallelParts(pool, threads, [&](int64_t p) {
      std::vector<float> sum(width);
      for (int64_t r = ranges * p / threads; r < ranges * (p + 1) / threads; ++r) {
        SumAndUpdateRows(update, out.data(), nvars, run_list, num_runs, cuts[r], cuts[r + 1], width,
                         sum.data());
      }
    });
    return ffi::Error::Success();
  }
  RowGradients(found, tdims[0], width, act_grad.typed_data(), pool, &touched, &grad);
  const int64_t* touched_rows = touched.data();
  const float* row_grads = grad.data();
  const int64_t n = static_cast<int64_t>(touched.size());
  const int64_t parts = PartsFor(pool, n * width * nvars / 16);
  ParallelParts(pool, parts, [&](int64_t p) {
    const int64_t lo = n * p / parts;
    UpdateTouched(update, out.data(), nvars, touched_rows + lo, n * (p + 1) / parts - lo,
                  row_grads + lo * width, width);
  });
  return ffi::Error::Success();
}

// The custom optimizer's first half (sparse_dense_matmul_optimizer_grad,
// whose update is a called StableHLO computation the lowering rule applies):
// the rows of this device's table operand that have an id and their
// gradients, as RowGradients computes them.  Results: `rows` (int32
// [capacity], the touched rows in first-touch order, -1 after them),
// `count` (int32 [1]) and `grads` (float32 [capacity, width], zero after
// `count`).  `table` is read for its shape only.
ffi::Error RowGradsImpl(ffi::Buffer<ffi::S32> rp, ffi::Buffer<ffi::S32> ids,
                        ffi::Buffer<ffi::S32> samples, ffi::Buffer<ffi::F32> gains,
                        ffi::Buffer<ffi::S32> num_minibatches, ffi::Buffer<ffi::F32> act_grad,
                        ffi::Buffer<ffi::S32> shard_offset, ffi::Buffer<ffi::F32> table,
                        ffi::ResultBuffer<ffi::S32> rows, ffi::ResultBuffer<ffi::S32> count,
                        ffi::ResultBuffer<ffi::F32> grads, int64_t num_sc, int64_t num_devices,
                        int64_t sources, bool minibatching, ffi::ThreadPool thread_pool) {
  ffi::ThreadPool* pool = &thread_pool;
  if (ffi::Error e = CheckCommon(rp, ids, samples, gains, num_sc, num_devices); e.failure()) {
    return e;
  }
  const auto tdims = table.dimensions();
  if (tdims.size() != 1 && tdims.size() != 2) return Invalid("embedding_table: not rank 1 or 2");
  const int64_t width = Width(tdims);
  const int64_t capacity = Count(*rows);
  if (Count(*count) != 1 || Count(*grads) != capacity * width) {
    return Invalid("results: count is not a scalar or grads is not [" + Str(capacity) + ", " +
                   Str(width) + "]");
  }
  // Scratch of the calling thread, kept between calls: a step allocates (and
  // page-faults) nothing once its sizes were seen.
  thread_local std::vector<Id> found;
  thread_local std::vector<int64_t> touched;
  thread_local std::vector<float> grad;
  if (ffi::Error e = ListOwnIds(rp, ids, samples, gains, num_minibatches, act_grad, shard_offset,
                                tdims, num_sc, num_devices, sources, minibatching, &found);
      e.failure()) {
    return e;
  }
  RowGradients(found, tdims[0], width, act_grad.typed_data(), pool, &touched, &grad);
  const int64_t n = static_cast<int64_t>(touched.size());
  if (n > capacity) {
    return Invalid("results: " + Str(n) + " touched rows do not fit the capacity of " +
                   Str(capacity));
  }
  int32_t* r = rows->typed_data();
  for (int64_t k = 0; k < capacity; ++k) r[k] = k < n ? static_cast<int32_t>(touched[k]) : -1;
  count->typed_data()[0] = static_cast<int32_t>(n);
  float* out = grads->typed_data();
  // An empty result may have no storage (a null pointer is no memset's).
  if (capacity * width > 0) std::memset(out, 0, sizeof(float) * capacity * width);
  if (n > 0) std::memcpy(out, grad.data(), sizeof(float) * n * width);
  return ffi::Error::Success();
}

}  // namespace jax_sc
}  // namespace tf_tpu_emb

XLA_FFI_DEFINE_HANDLER_SYMBOL(TfTpuEmbScLookup, tf_tpu_emb::jax_sc::LookupImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lhs_row_pointers
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lhs_local_embedding_ids
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lhs_local_sample_ids
                                  .Arg<ffi::Buffer<ffi::F32>>()  // lhs_gains
                                  .Arg<ffi::Buffer<ffi::S32>>()  // num_minibatches
                                  .Arg<ffi::Buffer<ffi::F32>>()  // embedding_table (all shards)
                                  .Ret<ffi::Buffer<ffi::F32>>()  // activations
                                  .Attr<int64_t>("num_sc_per_device")
                                  .Attr<int64_t>("num_devices")
                                  .Attr<bool>("minibatching")
                                  .Ctx<ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(TfTpuEmbScGrad, tf_tpu_emb::jax_sc::GradImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lhs_row_pointers
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lhs_local_embedding_ids
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lhs_local_sample_ids
                                  .Arg<ffi::Buffer<ffi::F32>>()  // lhs_gains
                                  .Arg<ffi::Buffer<ffi::S32>>()  // num_minibatches (a device)
                                  .Arg<ffi::Buffer<ffi::F32>>()  // activations_grad
                                  .Arg<ffi::Buffer<ffi::S32>>()  // shard_offset
                                  .RemainingArgs()               // table, slots, hypers
                                  .RemainingRets()               // table, slots
                                  .Attr<std::string_view>("optimizer")
                                  .Attr<int64_t>("num_sc_per_device")
                                  .Attr<int64_t>("num_devices")
                                  .Attr<int64_t>("sources")
                                  .Attr<bool>("clip_min")
                                  .Attr<float>("min_value")
                                  .Attr<bool>("clip_max")
                                  .Attr<float>("max_value")
                                  .Attr<bool>("multiply_linear_by_lr")
                                  .Attr<bool>("minibatching")
                                  .Ctx<ffi::ThreadPool>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(TfTpuEmbScRowGrads, tf_tpu_emb::jax_sc::RowGradsImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lhs_row_pointers
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lhs_local_embedding_ids
                                  .Arg<ffi::Buffer<ffi::S32>>()  // lhs_local_sample_ids
                                  .Arg<ffi::Buffer<ffi::F32>>()  // lhs_gains
                                  .Arg<ffi::Buffer<ffi::S32>>()  // num_minibatches (a device)
                                  .Arg<ffi::Buffer<ffi::F32>>()  // activations_grad
                                  .Arg<ffi::Buffer<ffi::S32>>()  // shard_offset
                                  .Arg<ffi::Buffer<ffi::F32>>()  // embedding_table (its shape)
                                  .Ret<ffi::Buffer<ffi::S32>>()  // rows
                                  .Ret<ffi::Buffer<ffi::S32>>()  // count
                                  .Ret<ffi::Buffer<ffi::F32>>()  // grads
                                  .Attr<int64_t>("num_sc_per_device")
                                  .Attr<int64_t>("num_devices")
                                  .Attr<int64_t>("sources")
                                  .Attr<bool>("minibatching")
                                  .Ctx<ffi::ThreadPool>());
