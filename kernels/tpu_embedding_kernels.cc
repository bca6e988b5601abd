// CPU kernels of tf_tpu_emb, each registered under our prefixed op name and
// under TF's core op name (so unchanged tf.raw_ops graphs run on CPU).
//
// Every kernel validates all of its inputs before it touches engine state:
// a failed op leaves queues and tables exactly as they were.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/engine.h"
#include "kernels/guard.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/refcount.h"

namespace tf_tpu_emb {
namespace {

using ::tensorflow::DT_DOUBLE;
using ::tensorflow::DT_FLOAT;
using ::tensorflow::DT_INT64;
using ::tensorflow::OpInputList;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::OpOutputList;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

constexpr char kPrefix[] = "TfTpuEmb>";

// Registers `Kernel` for `bare_name` under our prefix and, if `core`, under
// TF's own op name; it runs as Guarded<Kernel> (kernels/guard.h).
template <typename Kernel>
void RegisterCpuKernel(const std::string& bare_name, bool core = true) {
  auto create = [](OpKernelConstruction* c) -> OpKernel* { return CreateGuarded<Kernel>(c); };
  std::vector<std::string> names = {kPrefix + bare_name};
  if (core) names.push_back(bare_name);
  for (const std::string& name : names) {
    new ::tensorflow::kernel_factory::OpKernelRegistrar(
        ::tensorflow::KernelDefBuilder(name.c_str())
            .Device(::tensorflow::DEVICE_CPU)
            .Build(),
        name, create);
  }
}

// The op's name without our prefix, for error messages.
std::string BareOpName(OpKernelConstruction* c) {
  std::string name = c->def().op();
  if (name.rfind(kPrefix, 0) == 0) name = name.substr(strlen(kPrefix));
  return name;
}

// Replica served by a kernel placed on this device: its task-local device id
// (CPU:k serves replica k; the default CPU:0 serves replica 0).
int DeviceReplica(OpKernelContext* ctx) {
  const auto& parsed = ctx->device()->parsed_name();
  return parsed.has_id ? parsed.id : 0;
}

absl::Status ReplicaInRange(const std::string& op, int replica, const Engine& e) {
  if (replica < 0 || replica >= e.num_replicas()) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": replica ", replica, " is out of range: the config has ",
        e.num_replicas(), " tensor core(s) (num_tensor_cores)"));
  }
  return absl::OkStatus();
}

class EngineRef {
 public:
  absl::Status Acquire(const std::string& op) {
    Engine* e = nullptr;
    TF_RETURN_IF_ERROR(Engine::Current(op, &e));
    ref_.reset(e);
    return absl::OkStatus();
  }
  Engine* operator->() const { return ref_.get(); }
  Engine& operator*() const { return *ref_; }

 private:
  ::tensorflow::core::RefCountPtr<Engine> ref_;
};

// =================================================================== system

class TPUEmbeddingActivationsOp : public OpKernel {
 public:
  explicit TPUEmbeddingActivationsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  // Identity on sliced_activations (forwarded without a copy): the op exists
  // so that autodiff reaches the embedding gradients.
  void Compute(OpKernelContext* ctx) override { ctx->set_output(0, ctx->input(1)); }
};

class ConfigureOp : public OpKernel {
 public:
  explicit ConfigureOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("config", &config_));
  }
  void Compute(OpKernelContext* ctx) override {
    std::unique_ptr<Engine> engine;
    OP_REQUIRES_OK(ctx, Engine::Create(config_, &engine));
    OP_REQUIRES_OK(ctx, Engine::Install(std::move(engine)));
  }

 private:
  std::string config_;
};

class IsInitializedOp : public OpKernel {
 public:
  explicit IsInitializedOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<bool>()() = Engine::IsConfigured();
  }
};

class ShutdownOp : public OpKernel {
 public:
  explicit ShutdownOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override { Engine::Shutdown(); }
};

// ================================================================== enqueue

// Element access to an int32/int64 (IntView) or float32/float64 (FloatView)
// tensor through a raw pointer: built once per tensor, cheap per element.
class IntView {
 public:
  explicit IntView(const Tensor& t)
      : data_(t.tensor_data().data()), is64_(t.dtype() == DT_INT64),
        cols_(t.dims() == 2 ? t.dim_size(1) : 1) {}
  int64_t operator[](int64_t i) const {
    return is64_ ? static_cast<const int64_t*>(data_)[i]
                 : static_cast<const int32_t*>(data_)[i];
  }
  // Element (row, col) of a rank-2 tensor.
  int64_t operator()(int64_t row, int64_t col) const { return (*this)[row * cols_ + col]; }

 private:
  const void* data_;
  bool is64_;
  int64_t cols_;
};

class FloatView {
 public:
  explicit FloatView(const Tensor& t)
      : data_(t.tensor_data().data()), is64_(t.dtype() == DT_DOUBLE) {}
  float operator[](int64_t i) const {
    return is64_ ? static_cast<float>(static_cast<const double*>(data_)[i])
                 : static_cast<const float*>(data_)[i];
  }

 private:
  const void* data_;
  bool is64_;
};

// One input feature of an enqueue op, mapped onto an engine output: element k
// goes to bag positions[k] of the output, or nowhere when positions[k] < 0
// (truncated sequence positions).
struct FeatureSource {
  int output = 0;
  std::vector<int64_t> positions;
  const Tensor* ids = nullptr;
  const Tensor* weights = nullptr;  // nullptr: all weights are 1
};

enum class SplitsKind { kCoo, kRowSplits, kDense };

// Runs fn(i) for every i in [0, n) on the intra-op pool and returns the
// error of the lowest failing i (so errors do not depend on scheduling).
template <typename Fn>
absl::Status ParallelForStatus(OpKernelContext* ctx, int n, Fn fn) {
  std::vector<absl::Status> status(n);
  ctx->device()->tensorflow_cpu_worker_threads()->workers->ParallelFor(
      n, /*cost_per_unit=*/1 << 20, [&](int64_t begin, int64_t end) {
        // An exception must not leave a pool thread (it would terminate).
        for (int64_t i = begin; i < end; ++i) {
          const absl::Status thrown =
              CatchExceptions("tf_tpu_emb", [&] { status[i] = fn(static_cast<int>(i)); });
          if (!thrown.ok()) status[i] = thrown;
        }
      });
  for (const absl::Status& s : status) TF_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

// Shared by the ops whose first three inputs are (indices-or-splits, ids,
// weights) lists of length N.
struct TripleInputs {
  OpInputList splits, ids, weights;
};
absl::Status GetTriple(OpKernelContext* ctx, const char* first, TripleInputs* in) {
  TF_RETURN_IF_ERROR(ctx->input_list(first, &in->splits));
  TF_RETURN_IF_ERROR(ctx->input_list("embedding_indices", &in->ids));
  return ctx->input_list("aggregation_weights", &in->weights);
}

// Inputs are positional: input i feeds output i (a table in table mode, a
// feature descriptor otherwise).
absl::Status CheckPositionalCount(const std::string& op, int n, const Engine& e) {
  if (n != static_cast<int>(e.outputs().size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": got ", n, " inputs but the config has ", e.outputs().size(),
        e.table_mode() ? " tables" : " feature descriptors"));
  }
  return absl::OkStatus();
}

class EnqueueOpBase : public OpKernel {
 public:
  explicit EnqueueOpBase(OpKernelConstruction* ctx, bool has_combiners,
                         bool has_table_ids, bool dynamic)
      : OpKernel(ctx), op_(BareOpName(ctx)), dynamic_(dynamic) {
    if (!dynamic) OP_REQUIRES_OK(ctx, ctx->GetAttr("device_ordinal", &device_ordinal_));
    if (has_combiners) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("combiners", &combiner_names_));
      for (const std::string& c : combiner_names_) {
        OP_REQUIRES(ctx, c == "sum" || c == "mean" || c == "sqrtn",
                    absl::InvalidArgumentError(absl::StrCat(
                        op_, ": Invalid combiner '", c,
                        "': only \"sum\", \"mean\", and \"sqrtn\" are supported.")));
      }
    }
    if (has_table_ids) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("table_ids", &table_ids_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("max_sequence_lengths", &max_sequence_lengths_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("num_features", &num_features_));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    OP_REQUIRES_OK(ctx, engine.Acquire(op_));
    Batch batch;
    int replica;
    OP_REQUIRES_OK(ctx, Common(ctx, *engine, &replica, &batch.training));
    std::vector<FeatureSource> sources;
    std::vector<std::vector<Combiner>> slot_combiners(engine->outputs().size());
    OP_REQUIRES_OK(ctx, MapFeatures(ctx, *engine, &sources, &slot_combiners));
    OP_REQUIRES_OK(ctx, CheckIds(ctx, *engine, sources));
    Assemble(ctx, *engine, sources, std::move(slot_combiners), &batch);
    engine->Enqueue(replica, std::move(batch));
  }

 protected:
  // Maps each input feature onto the engine's outputs (validating it).
  virtual absl::Status MapFeatures(OpKernelContext* ctx, Engine& engine,
                                   std::vector<FeatureSource>* sources,
                                   std::vector<std::vector<Combiner>>* slot_combiners) = 0;

  // "input 2 (feature 'watched', table 'video')"
  std::string Describe(const Engine& e, int input, int output) const {
    const int table = e.outputs()[output].table;
    std::string s = absl::StrCat(op_, ": input ", input, " (");
    if (!e.table_mode()) {
      absl::StrAppend(&s, "feature '", e.config().feature_descriptor(output).name(), "', ");
    }
    absl::StrAppend(&s, "table '", e.config().table_descriptor(table).name(), "')");
    return s;
  }

  // Combiner of each input: `combiners` is empty (all "sum"), one per input,
  // or one per table.  `inputs_first` decides when N == number of tables.
  absl::Status InputCombiners(const Engine& e, int n, const std::vector<int>& input_tables,
                              bool inputs_first, std::vector<Combiner>* out) const {
    auto parse = [](const std::string& c) {
      return c == "mean" ? Combiner::kMean : c == "sqrtn" ? Combiner::kSqrtn : Combiner::kSum;
    };
    out->assign(n, Combiner::kSum);
    const int k = combiner_names_.size();
    if (k == 0) return absl::OkStatus();
    const bool per_input = k == n && (inputs_first || k != e.num_tables());
    if (!per_input && k != e.num_tables()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": ", k, " combiners given; expected 0, one per input (", n,
          ") or one per table (", e.num_tables(), ")"));
    }
    for (int i = 0; i < n; ++i) {
      (*out)[i] = parse(combiner_names_[per_input ? i : input_tables[i]]);
    }
    return absl::OkStatus();
  }

  // Maps positional inputs (input i feeds output i), each input's element
  // positions given by `positions(who, i, splits_or_indices, ids, &pos)`.
  template <typename PositionsFn>
  absl::Status MapPositional(OpKernelContext* ctx, const Engine& e, const TripleInputs& in,
                             bool inputs_first,
                             PositionsFn positions, std::vector<FeatureSource>* sources,
                             std::vector<std::vector<Combiner>>* slot_combiners) const {
    const int n = in.ids.size();
    TF_RETURN_IF_ERROR(CheckPositionalCount(op_, n, e));
    std::vector<int> tables(n);
    for (int i = 0; i < n; ++i) tables[i] = e.outputs()[i].table;
    std::vector<Combiner> combiners;
    TF_RETURN_IF_ERROR(InputCombiners(e, n, tables, inputs_first, &combiners));
    sources->resize(n);
    return ParallelForStatus(ctx, n, [&](int i) -> absl::Status {
      const std::string who = Describe(e, i, i);
      FeatureSource& s = (*sources)[i];
      s.output = i;
      s.ids = &in.ids[i];
      TF_RETURN_IF_ERROR(CheckWeights(who, in.ids[i], in.weights[i]));
      s.weights = in.weights[i].NumElements() ? &in.weights[i] : nullptr;
      (*slot_combiners)[i] = {combiners[i]};
      return positions(who, i, in.splits[i], in.ids[i], &s.positions);
    });
  }

  static absl::Status CheckWeights(const std::string& who, const Tensor& ids,
                                   const Tensor& weights) {
    if (weights.NumElements() != 0 && weights.NumElements() != ids.NumElements()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": aggregation_weights has ", weights.NumElements(),
          " elements but embedding_indices has ", ids.NumElements(),
          " (weights must be empty or one per id)"));
    }
    return absl::OkStatus();
  }

  // Positions of a feature whose output has `shape` (bags laid out
  // row-major), for COO indices, row splits or dense ids (see README).
  absl::Status ArbitraryPositions(const std::string& who, const std::vector<int64_t>& shape,
                                  const Tensor& splits, const Tensor& ids,
                                  std::vector<int64_t>* pos) const {
    const int64_t n = ids.NumElements();
    const int r = shape.size();
    int64_t positions = 1;
    for (int64_t d : shape) positions *= d;
    pos->resize(n);
    if (splits.dims() == 2 && splits.dim_size(0) > 0) {  // COO indices
      const int64_t cols = splits.dim_size(1);
      if (splits.dim_size(0) != n) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": sample_indices has ", splits.dim_size(0), " rows but there are ",
            n, " embedding ids"));
      }
      if (cols != r && cols != r + 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": sample_indices has ", cols, " columns; the feature's input_shape has rank ",
            r, " so ", r, " or ", r + 1, " columns are expected"));
      }
      const IntView idx(splits);
      for (int64_t k = 0; k < n; ++k) {
        int64_t p = 0;
        for (int j = 0; j < r && p >= 0; ++j) {
          const int64_t v = idx(k, j);
          if (v < 0 || (j == 0 && v >= shape[0])) {
            return absl::InvalidArgumentError(absl::StrCat(
                who, ": sample index ", v, " (row ", k, ", column ", j,
                ") is outside [0, ", shape[j], ")"));
          }
          p = v >= shape[j] ? -1 : p * shape[j] + v;  // past a trailing dim: truncated
        }
        if (cols == r + 1 && idx(k, r) < 0) {  // the position inside the bag
          return absl::InvalidArgumentError(absl::StrCat(
              who, ": sample index ", idx(k, r), " (row ", k, ", column ", r,
              ") is negative"));
        }
        (*pos)[k] = p;
      }
      return absl::OkStatus();
    }
    if (splits.dims() == 1 && splits.NumElements() > 0) {  // row splits
      const int64_t rows = splits.NumElements() - 1;
      const int64_t width = r >= 2 && rows * shape[r - 1] == positions && rows != positions
                                ? shape[r - 1] : 1;
      if (rows * width != positions) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": row_splits describe ", rows, " rows but the feature has ", positions,
            " output positions", r >= 2 ? absl::StrCat(" (or ", positions / shape[r - 1],
                                                       " sequences)") : ""));
      }
      TF_RETURN_IF_ERROR(CheckSplits(who, splits, n));
      const IntView sv(splits);
      for (int64_t b = 0; b < rows; ++b) {
        const int64_t lo = sv[b], hi = sv[b + 1];
        for (int64_t k = lo; k < hi; ++k) {
          const int64_t j = k - lo;
          (*pos)[k] = width == 1 ? b : (j < width ? b * width + j : -1);
        }
      }
      return absl::OkStatus();
    }
    if (splits.dims() < 1 || splits.dims() > 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": sample_indices_or_row_splits must have rank 1 or 2, got rank ", splits.dims()));
    }
    // Empty indices: one id per output position (or no ids at all).
    if (n != 0 && n != positions) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": without sample indices or row splits there must be one id per "
               "output position (", positions, "), got ", n));
    }
    for (int64_t k = 0; k < n; ++k) (*pos)[k] = k;
    return absl::OkStatus();
  }

  // ArbitraryPositions as a MapPositional callback.
  auto ArbitraryFn(const Engine& e) const {
    return [this, &e](const std::string& who, int i, const Tensor& splits, const Tensor& ids,
                      std::vector<int64_t>* pos) {
      return ArbitraryPositions(who, e.outputs()[i].shape, splits, ids, pos);
    };
  }

  static absl::Status CheckSplits(const std::string& who, const Tensor& splits, int64_t n) {
    const int64_t rows = splits.NumElements() - 1;
    const IntView sv(splits);
    if (sv[0] != 0 || sv[rows] != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": row splits must start at 0 and end at the number of ids (", n, "), got ",
          sv[0], " and ", sv[rows]));
    }
    for (int64_t b = 0; b < rows; ++b) {
      if (sv[b + 1] < sv[b]) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": row splits must be non-decreasing; split ", b + 1, " is ",
            sv[b + 1], " after ", sv[b]));
      }
    }
    return absl::OkStatus();
  }

  const std::string op_;
  std::vector<std::string> combiner_names_;
  std::vector<int32_t> table_ids_, max_sequence_lengths_, num_features_;

 private:
  absl::Status Common(OpKernelContext* ctx, const Engine& e, int* replica, bool* training) {
    const Tensor* mode;
    TF_RETURN_IF_ERROR(ctx->input("mode_override", &mode));
    if (mode->NumElements() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": mode_override must be a scalar string, got shape ", mode->shape().DebugString()));
    }
    const std::string m(mode->flat<::tensorflow::tstring>()(0));
    if (m == "train") {
      *training = true;
    } else if (m == "inference") {
      *training = false;
    } else if (m == "unspecified") {
      *training = e.training_by_default();
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": Unsupported value ", m, " specified for mode_override. "
          "Use \"train\", \"inference\" or \"unspecified\"."));
    }
    int64_t ordinal = device_ordinal_;
    if (dynamic_) {
      const Tensor* t;
      TF_RETURN_IF_ERROR(ctx->input("device_ordinal", &t));
      if (t->NumElements() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_, ": device_ordinal must be a scalar, got shape ", t->shape().DebugString()));
      }
      ordinal = t->flat<int32_t>()(0);
    }
    *replica = ordinal < 0 ? DeviceReplica(ctx) : static_cast<int>(ordinal);
    return ReplicaInRange(op_, *replica, e);
  }

  absl::Status CheckIds(OpKernelContext* ctx, const Engine& e,
                        const std::vector<FeatureSource>& sources) const {
    return ParallelForStatus(ctx, sources.size(), [&](int i) -> absl::Status {
      const FeatureSource& s = sources[i];
      const int64_t vocab = e.config().table_descriptor(e.outputs()[s.output].table).vocabulary_size();
      const IntView ids(*s.ids);
      const int64_t n = s.ids->NumElements();
      for (int64_t k = 0; k < n; ++k) {
        const int64_t id = ids[k];
        if (id < 0 || id >= vocab) {
          return absl::InvalidArgumentError(absl::StrCat(
              Describe(e, i, s.output), ": embedding id ", id, " at index ", k,
              " is outside the table's vocabulary [0, ", vocab, ")"));
        }
      }
      if (s.weights != nullptr) {
        const FloatView weights(*s.weights);
        for (int64_t k = 0; k < n; ++k) {
          if (!std::isfinite(weights[k])) {
            return absl::InvalidArgumentError(absl::StrCat(
                Describe(e, i, s.output), ": aggregation weight at index ", k,
                " is not finite"));
          }
        }
      }
      return absl::OkStatus();
    });
  }

  // Groups the sources' elements by output into CSR (stable: input order),
  // one output per task.
  static void Assemble(OpKernelContext* ctx, const Engine& e,
                       const std::vector<FeatureSource>& sources,
                       std::vector<std::vector<Combiner>> slot_combiners, Batch* batch) {
    const int num_outputs = e.outputs().size();
    batch->outputs.resize(num_outputs);
    std::vector<std::vector<const FeatureSource*>> feeding(num_outputs);
    for (const FeatureSource& s : sources) feeding[s.output].push_back(&s);
    ParallelForStatus(ctx, num_outputs, [&](int o) {
      OutputBatch& ob = batch->outputs[o];
      ob.slot_combiners = std::move(slot_combiners[o]);
      if (ob.slot_combiners.empty()) ob.slot_combiners.push_back(Combiner::kSum);
      ob.offsets.assign(e.outputs()[o].positions + 1, 0);
      bool weighted = false;
      for (const FeatureSource* s : feeding[o]) {
        weighted |= s->weights != nullptr;
        for (int64_t p : s->positions) {
          if (p >= 0) ++ob.offsets[p + 1];
        }
      }
      for (size_t p = 1; p < ob.offsets.size(); ++p) ob.offsets[p] += ob.offsets[p - 1];
      ob.ids.resize(ob.offsets.back());
      if (weighted) ob.weights.resize(ob.offsets.back());
      std::vector<int64_t> cursor(ob.offsets.begin(), ob.offsets.end() - 1);
      for (const FeatureSource* s : feeding[o]) {
        const IntView ids(*s->ids);
        const bool has_weights = s->weights != nullptr;
        const FloatView weights(has_weights ? *s->weights : *s->ids);
        for (size_t k = 0; k < s->positions.size(); ++k) {
          const int64_t p = s->positions[k];
          if (p < 0) continue;
          const int64_t at = cursor[p]++;
          ob.ids[at] = ids[k];
          if (weighted) ob.weights[at] = has_weights ? weights[k] : 1.0f;
        }
      }
      return absl::OkStatus();
    }).IgnoreError();
  }

  bool dynamic_;
  int device_ordinal_ = -1;
};

class EnqueueIntegerBatchOp : public EnqueueOpBase {
 public:
  explicit EnqueueIntegerBatchOp(OpKernelConstruction* ctx)
      : EnqueueOpBase(ctx, false, false, false) {}

 protected:
  absl::Status MapFeatures(OpKernelContext* ctx, Engine& e, std::vector<FeatureSource>* sources,
                           std::vector<std::vector<Combiner>>*) override {
    OpInputList batch;
    TF_RETURN_IF_ERROR(ctx->input_list("batch", &batch));
    TF_RETURN_IF_ERROR(CheckPositionalCount(op_, batch.size(), e));
    sources->resize(batch.size());
    for (int i = 0; i < batch.size(); ++i) {
      FeatureSource& s = (*sources)[i];
      s.output = i;
      s.ids = &batch[i];
      const int64_t positions = e.outputs()[i].positions;
      if (batch[i].NumElements() != positions) {
        return absl::InvalidArgumentError(absl::StrCat(
            Describe(e, i, i), ": expected one id per output row (", positions, "), got ",
            batch[i].NumElements()));
      }
      s.positions.resize(positions);
      for (int64_t k = 0; k < positions; ++k) s.positions[k] = k;
    }
    return absl::OkStatus();
  }
};

class EnqueueSparseBatchOp : public EnqueueOpBase {
 public:
  explicit EnqueueSparseBatchOp(OpKernelConstruction* ctx)
      : EnqueueOpBase(ctx, true, false, false) {}

 protected:
  absl::Status MapFeatures(OpKernelContext* ctx, Engine& e, std::vector<FeatureSource>* sources,
                           std::vector<std::vector<Combiner>>* slot_combiners) override {
    TripleInputs in;
    TF_RETURN_IF_ERROR(GetTriple(ctx, "sample_indices", &in));
    auto positions = [&](const std::string& who, int i, const Tensor& idx, const Tensor& ids,
                         std::vector<int64_t>* pos) -> absl::Status {
      const int64_t count = ids.NumElements();
      const int64_t rows = e.outputs()[i].positions;
      if (idx.NumElements() != count) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": sample_indices has ", idx.NumElements(), " elements but there are ",
            count, " embedding ids"));
      }
      pos->resize(count);
      const IntView iv(idx);
      for (int64_t k = 0; k < count; ++k) {
        const int64_t p = iv[k];
        if (p < 0 || p >= rows) {
          return absl::InvalidArgumentError(absl::StrCat(
              who, ": sample index ", p, " at index ", k, " is outside [0, ", rows,
              ") (batch_size * num_features rows)"));
        }
        (*pos)[k] = p;
      }
      return absl::OkStatus();
    };
    return MapPositional(ctx, e, in, /*inputs_first=*/false, positions, sources, slot_combiners);
  }
};

class EnqueueArbitraryTensorBatchOp : public EnqueueOpBase {
 public:
  explicit EnqueueArbitraryTensorBatchOp(OpKernelConstruction* ctx, bool dynamic = false)
      : EnqueueOpBase(ctx, true, false, dynamic) {}

 protected:
  absl::Status MapFeatures(OpKernelContext* ctx, Engine& e, std::vector<FeatureSource>* sources,
                           std::vector<std::vector<Combiner>>* slot_combiners) override {
    TripleInputs in;
    TF_RETURN_IF_ERROR(GetTriple(ctx, "sample_indices_or_row_splits", &in));
    return MapPositional(ctx, e, in, /*inputs_first=*/false, ArbitraryFn(e), sources,
                         slot_combiners);
  }
};

class DynamicEnqueueArbitraryTensorBatchOp : public EnqueueArbitraryTensorBatchOp {
 public:
  explicit DynamicEnqueueArbitraryTensorBatchOp(OpKernelConstruction* ctx)
      : EnqueueArbitraryTensorBatchOp(ctx, /*dynamic=*/true) {}
};

// SparseTensorBatch / RaggedTensorBatch: feature-oriented, table_ids[i] is
// the table of input i.  In a table-mode config the features of table t fill
// its [batch, num_features, dim] rows in input order, a sequence feature of
// length L taking L rows per sample and a feature with num_features k taking
// k; in a feature-descriptor config input i is feature descriptor i.
class EnqueueFeatureBatchOp : public EnqueueOpBase {
 public:
  EnqueueFeatureBatchOp(OpKernelConstruction* ctx, bool ragged, bool dynamic)
      : EnqueueOpBase(ctx, true, true, dynamic), ragged_(ragged) {}

 protected:
  absl::Status MapFeatures(OpKernelContext* ctx, Engine& e, std::vector<FeatureSource>* sources,
                           std::vector<std::vector<Combiner>>* slot_combiners) override {
    TripleInputs in;
    TF_RETURN_IF_ERROR(GetTriple(ctx, ragged_ ? "sample_splits" : "sample_indices", &in));
    const int n = in.ids.size();
    if (static_cast<int>(table_ids_.size()) != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": table_ids has ", table_ids_.size(), " entries but there are ", n, " inputs"));
    }
    for (const auto* list : {&max_sequence_lengths_, &num_features_}) {
      if (!list->empty() && static_cast<int>(list->size()) != n) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_, ": max_sequence_lengths and num_features must be empty or have one "
                 "entry per input (", n, "), got ", list->size()));
      }
    }
    std::vector<int> tables(table_ids_.begin(), table_ids_.end());
    for (int i = 0; i < n; ++i) {
      if (tables[i] < 0 || tables[i] >= e.num_tables()) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_, ": table_ids[", i, "] = ", tables[i], " is not a table id in [0, ",
            e.num_tables(), ")"));
      }
    }
    std::vector<Combiner> combiners;
    TF_RETURN_IF_ERROR(InputCombiners(e, n, tables, /*inputs_first=*/true, &combiners));
    sources->resize(n);
    if (!e.table_mode()) {
      TF_RETURN_IF_ERROR(CheckPositionalCount(op_, n, e));
      for (int i = 0; i < n; ++i) {
        if (tables[i] != e.outputs()[i].table) {
          return absl::InvalidArgumentError(absl::StrCat(
              Describe(e, i, i), ": table_ids[", i, "] = ", tables[i],
              " but the config's feature ", i, " looks up table ", e.outputs()[i].table));
        }
      }
      auto positions = [this, &e](const std::string& who, int i, const Tensor& idx,
                                  const Tensor& ids, std::vector<int64_t>* pos) {
        return FeaturePositions(who, e.outputs()[i].shape, idx, ids, pos);
      };
      return MapPositional(ctx, e, in, /*inputs_first=*/true, positions, sources,
                           slot_combiners);
    }
    // Table mode: lay the features of each table out in its feature rows.
    const int64_t batch = e.config().batch_size_per_tensor_core();
    std::vector<int64_t> used(e.num_tables(), 0), offset(n), width(n);
    for (int i = 0; i < n; ++i) {
      const int seq = max_sequence_lengths_.empty() ? 0 : max_sequence_lengths_[i];
      const int nf = num_features_.empty() ? 1 : num_features_[i];
      if (seq < 0 || nf < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_, ": input ", i, " has max_sequence_length ", seq, " and num_features ", nf,
            "; they must be >= 0 and >= 1"));
      }
      width[i] = seq > 0 ? seq : nf;
      offset[i] = used[tables[i]];
      used[tables[i]] += width[i];
    }
    for (int t = 0; t < e.num_tables(); ++t) {
      (*slot_combiners)[t].assign(e.config().table_descriptor(t).num_features(), Combiner::kSum);
      if (used[t] != 0 && used[t] != e.config().table_descriptor(t).num_features()) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_, ": the inputs of table '", e.config().table_descriptor(t).name(), "' take ",
            used[t], " rows per sample but the table has num_features ",
            e.config().table_descriptor(t).num_features()));
      }
    }
    for (int i = 0; i < n; ++i) {
      const int t = tables[i];
      const std::string who = Describe(e, i, t);
      const bool sequence = !max_sequence_lengths_.empty() && max_sequence_lengths_[i] > 0;
      const int64_t w = width[i], nf_t = e.config().table_descriptor(t).num_features();
      FeatureSource& s = (*sources)[i];
      s.output = t;
      s.ids = &in.ids[i];
      TF_RETURN_IF_ERROR(CheckWeights(who, in.ids[i], in.weights[i]));
      s.weights = in.weights[i].NumElements() ? &in.weights[i] : nullptr;
      for (int64_t j = 0; j < w; ++j) (*slot_combiners)[t][offset[i] + j] = combiners[i];
      // Each element's (sample b, row-in-feature j), or j = -1 to drop it.
      const Tensor& idx = in.splits[i];
      const int64_t count = in.ids[i].NumElements();
      std::vector<int64_t>& pos = s.positions;
      pos.resize(count);
      auto place = [&](int64_t k, int64_t b, int64_t j) {
        pos[k] = j < 0 ? -1 : b * nf_t + offset[i] + j;
      };
      const int64_t rows = sequence ? batch : batch * w;  // sparse rows of the input
      auto from_row = [&](int64_t k, int64_t row, int64_t within) -> absl::Status {
        if (row < 0 || row >= rows) {
          return absl::InvalidArgumentError(absl::StrCat(
              who, ": sample index ", row, " at index ", k, " is outside [0, ", rows, ")"));
        }
        if (sequence) {
          if (within < 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                who, ": negative sequence position ", within, " at index ", k));
          }
          place(k, row, within < w ? within : -1);
        } else {
          place(k, row / w, row % w);
        }
        return absl::OkStatus();
      };
      if (idx.NumElements() == 0) {  // dense: one id per row (per position for sequences)
        if (count != 0 && count != batch * w) {
          return absl::InvalidArgumentError(absl::StrCat(
              who, ": without sample indices there must be ", batch * w, " ids, got ", count));
        }
        for (int64_t k = 0; k < count; ++k) place(k, k / w, k % w);
      } else if (ragged_) {
        if (idx.dims() != 1 || idx.NumElements() - 1 != rows) {
          return absl::InvalidArgumentError(absl::StrCat(
              who, ": sample_splits must be a vector of ", rows + 1, " row splits, got shape ",
              idx.shape().DebugString()));
        }
        TF_RETURN_IF_ERROR(CheckSplits(who, idx, count));
        const IntView sv(idx);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t lo = sv[r], hi = sv[r + 1];
          for (int64_t k = lo; k < hi; ++k) TF_RETURN_IF_ERROR(from_row(k, r, k - lo));
        }
      } else {
        const bool matrix = idx.dims() == 2;
        if (idx.dims() < 1 || idx.dims() > 2 || idx.dim_size(0) != count) {
          return absl::InvalidArgumentError(absl::StrCat(
              who, ": sample_indices must be [", count, "] or [", count,
              ", k] (one row per id), got shape ", idx.shape().DebugString()));
        }
        if (sequence && (!matrix || idx.dim_size(1) < 2)) {
          return absl::InvalidArgumentError(absl::StrCat(
              who, ": a sequence feature needs [n, 2] sample indices (sample, position), "
                   "got shape ", idx.shape().DebugString()));
        }
        const IntView iv(idx);
        for (int64_t k = 0; k < count; ++k) {
          const int64_t row = matrix ? iv(k, 0) : iv[k];
          const int64_t within = sequence ? iv(k, 1) : 0;
          TF_RETURN_IF_ERROR(from_row(k, row, within));
        }
      }
    }
    return absl::OkStatus();
  }

  // Feature-descriptor mode, after TF's op docs: SparseTensorBatch's
  // sample_indices are sp_ids.indices (rank 2, COO as for
  // ArbitraryTensorBatch) or its first column (rank 1: the sample of each
  // id, for a feature of input_shape [batch]); RaggedTensorBatch's
  // sample_splits are row splits (rank 1).  Empty means one id per position.
  absl::Status FeaturePositions(const std::string& who, const std::vector<int64_t>& shape,
                                const Tensor& idx, const Tensor& ids,
                                std::vector<int64_t>* pos) const {
    if (ragged_ ? idx.dims() != 1 : (idx.dims() != 1 && idx.dims() != 2)) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ragged_ ? ": sample_splits must have rank 1 (row splits)"
                       : ": sample_indices must have rank 1 or 2",
          ", got shape ", idx.shape().DebugString()));
    }
    if (ragged_ || idx.dims() == 2 || idx.NumElements() == 0) {
      return ArbitraryPositions(who, shape, idx, ids, pos);
    }
    const int64_t n = ids.NumElements();
    if (shape.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": rank-1 sample_indices (sp_ids.indices[:, 0]) give only the sample of "
               "each id, but the feature's input_shape has rank ", shape.size(),
          "; pass [n, ", shape.size(), "] or [n, ", shape.size() + 1, "] indices"));
    }
    if (idx.NumElements() != n) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, ": sample_indices has ", idx.NumElements(), " elements but there are ", n,
          " embedding ids"));
    }
    const IntView iv(idx);
    pos->resize(n);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t v = iv[k];
      if (v < 0 || v >= shape[0]) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, ": sample index ", v, " at index ", k, " is outside [0, ", shape[0], ")"));
      }
      (*pos)[k] = v;
    }
    return absl::OkStatus();
  }

 private:
  bool ragged_;
};

class EnqueueSparseTensorBatchOp : public EnqueueFeatureBatchOp {
 public:
  explicit EnqueueSparseTensorBatchOp(OpKernelConstruction* c) : EnqueueFeatureBatchOp(c, false, false) {}
};
class EnqueueRaggedTensorBatchOp : public EnqueueFeatureBatchOp {
 public:
  explicit EnqueueRaggedTensorBatchOp(OpKernelConstruction* c) : EnqueueFeatureBatchOp(c, true, false) {}
};
class DynamicEnqueueRaggedTensorBatchOp : public EnqueueFeatureBatchOp {
 public:
  explicit DynamicEnqueueRaggedTensorBatchOp(OpKernelConstruction* c) : EnqueueFeatureBatchOp(c, true, true) {}
};

// ===================================================================== recv

class RecvOp : public OpKernel {
 public:
  explicit RecvOp(OpKernelConstruction* ctx) : OpKernel(ctx), op_(BareOpName(ctx)) {
    std::string bytes;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("config", &bytes));
    TPUEmbeddingConfiguration config;
    OP_REQUIRES_OK(ctx, ParseConfig(bytes, &config));
    OP_REQUIRES_OK(ctx, ComputeOutputShapes(config, &shapes_));
  }

  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    OP_REQUIRES_OK(ctx, engine.Acquire(op_));
    const auto& outs = engine->outputs();
    OP_REQUIRES(ctx, ctx->num_outputs() == static_cast<int>(outs.size()) &&
                         shapes_.size() == outs.size(),
                absl::InvalidArgumentError(absl::StrCat(
                    op_, ": num_outputs is ", ctx->num_outputs(), " and the op's config has ",
                    shapes_.size(), " outputs, but the configured engine has ", outs.size())));
    for (size_t o = 0; o < outs.size(); ++o) {
      TensorShape attr_shape;
      OP_REQUIRES_OK(ctx, TensorShape::BuildTensorShape(shapes_[o], &attr_shape));
      OP_REQUIRES(ctx, attr_shape == outs[o].recv_shape,
                  absl::InvalidArgumentError(absl::StrCat(
                      op_, ": output ", o, " has shape ", attr_shape.DebugString(),
                      " in the op's config but ", outs[o].recv_shape.DebugString(),
                      " in the configured engine's config")));
    }
    const int replica = DeviceReplica(ctx);
    OP_REQUIRES_OK(ctx, ReplicaInRange(op_, replica, *engine));
    OP_REQUIRES_OK(ctx, engine->WaitForStep(replica));
    Batch batch;
    OP_REQUIRES_OK(ctx, engine->Dequeue(replica, &batch));
    std::vector<float*> out(outs.size());
    for (size_t o = 0; o < outs.size(); ++o) {
      Tensor* t;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(o, outs[o].recv_shape, &t));
      out[o] = t->flat<float>().data();
    }
    {
      std::shared_lock<std::shared_mutex> lock(engine->tables_mutex());
      engine->Lookup(batch, out, ctx->device()->tensorflow_cpu_worker_threads()->workers);
    }
    engine->SetInFlight(replica, std::move(batch));
  }

 private:
  const std::string op_;
  std::vector<TensorShapeProto> shapes_;
};

// ===================================================================== send

// SendTPUEmbeddingGradients: gradients for the replica's in-flight training
// batch (one per Recv output, same shapes) and the dynamic learning rates
// (one scalar per tag).  Everything is validated before the engine sees it;
// with several replicas an invalid Send fails the whole step.
class SendOp : public OpKernel {
 public:
  explicit SendOp(OpKernelConstruction* ctx) : OpKernel(ctx), op_(BareOpName(ctx)) {}

  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    OP_REQUIRES_OK(ctx, engine.Acquire(op_));
    const int replica = DeviceReplica(ctx);
    OP_REQUIRES_OK(ctx, ReplicaInRange(op_, replica, *engine));
    std::vector<Tensor> gradients;
    std::vector<float> rates;
    const absl::Status status = Validate(ctx, *engine, &gradients, &rates);
    if (!status.ok()) {
      engine->AbortStep(std::string(status.message()));
      ctx->SetStatus(status);
      return;
    }
    OP_REQUIRES_OK(ctx, engine->Submit(replica, std::move(gradients), rates,
                                       ctx->device()->tensorflow_cpu_worker_threads()->workers));
  }

 private:
  absl::Status Validate(OpKernelContext* ctx, Engine& e, std::vector<Tensor>* gradients,
                        std::vector<float>* rates) const {
    OpInputList inputs, learning_rates;
    TF_RETURN_IF_ERROR(ctx->input_list("inputs", &inputs));
    TF_RETURN_IF_ERROR(ctx->input_list("learning_rates", &learning_rates));
    const auto& outs = e.outputs();
    if (inputs.size() != static_cast<int>(outs.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": got ", inputs.size(), " gradients but Recv produces ", outs.size(),
          " outputs"));
    }
    if (learning_rates.size() != e.num_dynamic_inputs()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": got ", learning_rates.size(), " learning rates but the config has ",
          e.num_dynamic_inputs(), " dynamic learning rate tag(s)"));
    }
    for (int i = 0; i < learning_rates.size(); ++i) {
      if (learning_rates[i].NumElements() != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            op_, ": learning_rates[", i, "] must be a scalar, got shape ",
            learning_rates[i].shape().DebugString()));
      }
      rates->push_back(learning_rates[i].flat<float>()(0));
      if (e.check_numerics() && !std::isfinite(rates->back())) {
        return absl::InvalidArgumentError(
            absl::StrCat(op_, ": learning_rates[", i, "] is not finite"));
      }
    }
    for (int t = 0; t < e.num_tables(); ++t) {
      if (e.table(t).params.learning_rate().learning_rate_case() ==
          ::tensorflow::tpu::LearningRate::LEARNING_RATE_NOT_SET) {
        return absl::FailedPreconditionError(absl::StrCat(
            op_, ": table '", e.table(t).name,
            "' has no learning_rate in its optimization_parameters"));
      }
    }
    for (size_t o = 0; o < outs.size(); ++o) {
      const int t = outs[o].table;
      const TensorShape& expected = outs[o].recv_shape;
      const std::string who = absl::StrCat(
          op_, ": gradient ", o, " (",
          e.table_mode() ? "" : absl::StrCat("feature '", e.config().feature_descriptor(o).name(), "', "),
          "table '", e.table(t).name, "')");
      if (inputs[o].shape() != expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, " has shape ", inputs[o].shape().DebugString(), " but Recv's output is ",
            expected.DebugString()));
      }
      if (e.check_numerics()) {
        const float* g = inputs[o].flat<float>().data();
        for (int64_t k = 0; k < inputs[o].NumElements(); ++k) {
          if (!std::isfinite(g[k])) {
            return absl::InvalidArgumentError(absl::StrCat(
                who, " has a non-finite value at flat index ", k));
          }
        }
      }
      gradients->push_back(inputs[o]);
    }
    return absl::OkStatus();
  }

  const std::string op_;
};

// ========================================================== load / retrieve

// Resolves the table of a per-table op and the rows of its shard.
struct TableShard {
  int table = -1;
  int64_t rows = 0;
};

class TableOpBase : public OpKernel {
 public:
  explicit TableOpBase(OpKernelConstruction* ctx) : OpKernel(ctx), op_(BareOpName(ctx)) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_id", &table_id_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shard_id", &shard_id_));
    OP_REQUIRES(ctx, (table_id_ >= 0) != !table_name_.empty(),
                absl::InvalidArgumentError(absl::StrCat(
                    op_, ": exactly one of table_id or table_name must be non-default")));
    // "LoadTPUEmbedding<infix>Parameters" / "RetrieveTPUEmbedding<infix>Parameters"
    for (const OptimizerSpec& spec : AllOptimizers()) {
      if (op_ == absl::StrCat("LoadTPUEmbedding", spec.op_infix, "Parameters") ||
          op_ == absl::StrCat("RetrieveTPUEmbedding", spec.op_infix, "Parameters")) {
        optimizer_ = &spec;
      }
    }
    OP_REQUIRES(ctx, optimizer_ != nullptr,
                absl::InternalError(absl::StrCat("no optimizer for op ", op_)));
  }

 protected:
  absl::Status Resolve(Engine& e, TableShard* shard) const {
    int t = table_id_;
    if (!table_name_.empty()) {
      t = e.FindTable(table_name_);
      if (t < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(op_, ": no table named '", table_name_, "' is configured"));
      }
    } else if (t >= e.num_tables()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": table_id ", t, " is out of range; ", e.num_tables(), " tables are configured"));
    }
    const Table& table = e.table(t);
    if (table.optimizer != optimizer_) {
      return absl::FailedPreconditionError(absl::StrCat(
          op_, ": table '", table.name, "' (id ", t, ") is configured with the ",
          table.optimizer->proto_field, " optimizer, not ", optimizer_->proto_field));
    }
    absl::StatusOr<int64_t> rows = NumIdsInShard(table.vocabulary_size, shard_id_, num_shards_);
    if (!rows.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(op_, ": table '", table.name, "': ",
                                                     rows.status().message()));
    }
    shard->table = t;
    shard->rows = *rows;
    return absl::OkStatus();
  }

  // Copies rows between a shard tensor and the table's state variable.
 public:
  static void CopyShard(const Engine& e, const Table& table, int num_shards, int shard_id,
                        int64_t rows, float* state, float* shard, bool to_state) {
    const int dim = table.dimension;
    const bool mod = e.config().sharding_strategy() == TPUEmbeddingConfiguration::MOD;
    if (!mod || num_shards == 1) {
      float* base = state + GlobalRowOfShardRow(false, table.vocabulary_size, shard_id,
                                                num_shards, 0) * dim;
      if (to_state) std::memcpy(base, shard, sizeof(float) * rows * dim);
      else std::memcpy(shard, base, sizeof(float) * rows * dim);
      return;
    }
    for (int64_t r = 0; r < rows; ++r) {
      float* row = state + GlobalRowOfShardRow(true, table.vocabulary_size, shard_id,
                                               num_shards, r) * dim;
      if (to_state) std::memcpy(row, shard + r * dim, sizeof(float) * dim);
      else std::memcpy(shard + r * dim, row, sizeof(float) * dim);
    }
  }

 public:
  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    OP_REQUIRES_OK(ctx, engine.Acquire(op_));
    TableShard shard;
    OP_REQUIRES_OK(ctx, Resolve(*engine, &shard));
    Transfer(ctx, *engine, engine->table(shard.table), shard.rows);
  }
 protected:
  // Moves the shard's tensors into (Load) or out of (Retrieve) the table.
  virtual void Transfer(OpKernelContext* ctx, Engine& engine, Table& table, int64_t rows) = 0;

  const std::string op_;
  int table_id_ = -1;
  std::string table_name_;
  int num_shards_ = 0, shard_id_ = 0;
  const OptimizerSpec* optimizer_ = nullptr;
};

class LoadTableOp : public TableOpBase {
 public:
  using TableOpBase::TableOpBase;

 protected:
  void Transfer(OpKernelContext* ctx, Engine& engine, Table& table, int64_t rows) override {
    const TensorShape expected({rows, table.dimension});
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      OP_REQUIRES(ctx, ctx->input(i).shape() == expected,
                  absl::InvalidArgumentError(absl::StrCat(
                      op_, ": table '", table.name, "': ", ctx->op_kernel().def().input(i),
                      " ", ctx->input(i).shape().DebugString(), " should be ",
                      expected.DebugString(), " (shard ", shard_id_, " of ", num_shards_, ")")));
    }
    std::unique_lock<std::shared_mutex> lock(engine.tables_mutex());
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      CopyShard(engine, table, num_shards_, shard_id_, rows, table.state[i]->data(),
                const_cast<float*>(ctx->input(i).flat<float>().data()), /*to_state=*/true);
    }
  }
};

class RetrieveTableOp : public TableOpBase {
 public:
  using TableOpBase::TableOpBase;

 protected:
  void Transfer(OpKernelContext* ctx, Engine& engine, Table& table, int64_t rows) override {
    std::shared_lock<std::shared_mutex> lock(engine.tables_mutex());
    for (int i = 0; i < ctx->num_outputs(); ++i) {
      Tensor* out;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(i, TensorShape({rows, table.dimension}), &out));
      CopyShard(engine, table, num_shards_, shard_id_, rows, table.state[i]->data(),
                out->flat<float>().data(), /*to_state=*/false);
    }
  }
};

// LoadAll / RetrieveAll: group i of table t is the table's i-th state
// variable (parameters, slots..., gradient_accumulators) or empty.  The
// gradient accumulators are per-step scratch on CPU: Retrieve returns their
// TPU fill value and Load checks their shape and ignores them.
class AllTablesOpBase : public OpKernel {
 public:
  explicit AllTablesOpBase(OpKernelConstruction* ctx) : OpKernel(ctx), op_(BareOpName(ctx)) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("NumTables", &num_tables_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shard_id", &shard_id_));
  }

 protected:
  absl::Status Shards(Engine& e, std::vector<int64_t>* rows) const {
    if (num_tables_ != e.num_tables()) {
      return absl::InvalidArgumentError(absl::StrCat(
          op_, ": NumTables is ", num_tables_, " but ", e.num_tables(), " tables are configured"));
    }
    for (int t = 0; t < e.num_tables(); ++t) {
      absl::StatusOr<int64_t> r = NumIdsInShard(e.table(t).vocabulary_size, shard_id_, num_shards_);
      if (!r.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(op_, ": table '", e.table(t).name, "': ",
                                                       r.status().message()));
      }
      rows->push_back(*r);
    }
    return absl::OkStatus();
  }
  static bool IsAccumulator(const Table& t, int i) {
    return t.state_names[i] == "gradient_accumulators";
  }
  static std::string GroupName(int i) {
    return i == 0 ? std::string("parameters") : absl::StrCat("auxiliary", i);
  }

  const std::string op_;
  int num_tables_ = 0, num_shards_ = 0, shard_id_ = 0;

 public:
  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    OP_REQUIRES_OK(ctx, engine.Acquire(op_));
    std::vector<int64_t> rows;
    OP_REQUIRES_OK(ctx, Shards(*engine, &rows));
    Transfer(ctx, *engine, rows);
  }

 protected:
  // Moves every table's state variables in (LoadAll) or out (RetrieveAll);
  // rows[t] is the number of rows of table t in this shard.
  virtual void Transfer(OpKernelContext* ctx, Engine& engine,
                        const std::vector<int64_t>& rows) = 0;
};

class LoadAllOp : public AllTablesOpBase {
 public:
  using AllTablesOpBase::AllTablesOpBase;

 protected:
  void Transfer(OpKernelContext* ctx, Engine& e, const std::vector<int64_t>& rows) override {
    Engine* engine = &e;
    std::vector<OpInputList> groups(kMaxStateVariables);
    for (int i = 0; i < kMaxStateVariables; ++i) {
      OP_REQUIRES_OK(ctx, ctx->input_list(GroupName(i), &groups[i]));
    }
    for (int t = 0; t < engine->num_tables(); ++t) {
      const Table& table = engine->table(t);
      const TensorShape expected({rows[t], table.dimension});
      for (int i = 0; i < kMaxStateVariables; ++i) {
        const Tensor& in = groups[i][t];
        const bool used = i < static_cast<int>(table.state_names.size());
        OP_REQUIRES(ctx, used ? in.shape() == expected : in.NumElements() == 0,
                    absl::InvalidArgumentError(absl::StrCat(
                        op_, ": table '", table.name, "' (id ", t, "): ", GroupName(i),
                        " has shape ", in.shape().DebugString(), " but should be ",
                        used ? absl::StrCat(expected.DebugString(), " (its ",
                                            table.state_names[i], ")")
                             : std::string("empty"))));
      }
    }
    std::unique_lock<std::shared_mutex> lock(engine->tables_mutex());
    for (int t = 0; t < engine->num_tables(); ++t) {
      Table& table = engine->table(t);
      for (int i = 0; i < static_cast<int>(table.state_names.size()); ++i) {
        if (IsAccumulator(table, i)) continue;
        TableOpBase::CopyShard(*engine, table, num_shards_, shard_id_, rows[t],
                               table.state[i]->data(),
                               const_cast<float*>(groups[i][t].flat<float>().data()), true);
      }
    }
  }
};

class RetrieveAllOp : public AllTablesOpBase {
 public:
  using AllTablesOpBase::AllTablesOpBase;

 protected:
  void Transfer(OpKernelContext* ctx, Engine& e, const std::vector<int64_t>& rows) override {
    Engine* engine = &e;
    std::shared_lock<std::shared_mutex> lock(engine->tables_mutex());
    for (int i = 0; i < kMaxStateVariables; ++i) {
      OpOutputList group;
      OP_REQUIRES_OK(ctx, ctx->output_list(GroupName(i), &group));
      for (int t = 0; t < engine->num_tables(); ++t) {
        Table& table = engine->table(t);
        const bool used = i < static_cast<int>(table.state_names.size());
        Tensor* out;
        OP_REQUIRES_OK(ctx, group.allocate(t, used ? TensorShape({rows[t], table.dimension})
                                                   : TensorShape({0, 0}), &out));
        if (!used) continue;
        if (IsAccumulator(table, i)) {
          out->flat<float>().setConstant(GradientAccumulatorInitialValue());
        } else {
          TableOpBase::CopyShard(*engine, table, num_shards_, shard_id_, rows[t],
                                 table.state[i]->data(), out->flat<float>().data(), false);
        }
      }
    }
  }
};

// ============================================================ registration

bool RegisterKernels() {
  RegisterCpuKernel<TPUEmbeddingActivationsOp>("TPUEmbeddingActivations");
  RegisterCpuKernel<ConfigureOp>("ConfigureTPUEmbedding");
  RegisterCpuKernel<IsInitializedOp>("IsTPUEmbeddingInitialized");
  RegisterCpuKernel<ShutdownOp>("ShutdownTPUEmbedding", /*core=*/false);
  RegisterCpuKernel<EnqueueIntegerBatchOp>("EnqueueTPUEmbeddingIntegerBatch");
  RegisterCpuKernel<EnqueueSparseBatchOp>("EnqueueTPUEmbeddingSparseBatch");
  RegisterCpuKernel<EnqueueSparseTensorBatchOp>("EnqueueTPUEmbeddingSparseTensorBatch");
  RegisterCpuKernel<EnqueueRaggedTensorBatchOp>("EnqueueTPUEmbeddingRaggedTensorBatch");
  RegisterCpuKernel<DynamicEnqueueRaggedTensorBatchOp>("DynamicEnqueueTPUEmbeddingRaggedTensorBatch");
  RegisterCpuKernel<EnqueueArbitraryTensorBatchOp>("EnqueueTPUEmbeddingArbitraryTensorBatch");
  RegisterCpuKernel<DynamicEnqueueArbitraryTensorBatchOp>(
      "DynamicEnqueueTPUEmbeddingArbitraryTensorBatch");
  RegisterCpuKernel<RecvOp>("RecvTPUEmbeddingActivations");
  RegisterCpuKernel<SendOp>("SendTPUEmbeddingGradients");
  RegisterCpuKernel<LoadAllOp>("LoadAllTPUEmbeddingParameters");
  RegisterCpuKernel<RetrieveAllOp>("RetrieveAllTPUEmbeddingParameters");
  for (const OptimizerSpec& spec : AllOptimizers()) {
    if (spec.which == OptimizationParameters::kUserDefinedProgram) continue;
    RegisterCpuKernel<LoadTableOp>(absl::StrCat("LoadTPUEmbedding", spec.op_infix, "Parameters"),
                                   spec.core_has_table_ops);
    RegisterCpuKernel<RetrieveTableOp>(
        absl::StrCat("RetrieveTPUEmbedding", spec.op_infix, "Parameters"), spec.core_has_table_ops);
  }
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace tf_tpu_emb
