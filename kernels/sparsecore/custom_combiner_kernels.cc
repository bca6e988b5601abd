// CPU kernels of the SparseCore custom-combiner ops (TPUEmbeddingV2's
// CustomCombiner, the combiner run on the TensorCore):
// XlaSparseDenseMatmulCustomCombinerOnTcWithCsrInput (the lookup),
// XlaSparseDenseMatmulCustomCombinerOnTcGradWith<Opt>AndCsrInput and
// XlaSparseDenseMatmulCustomCombinerOnTcGradWithCsrInput (a user optimizer).
// Registered as TfTpuEmb>Name and under TF's name.  The combiner, its two
// VJPs and the custom optimizer are the ops' `func` attrs, called through the
// function library runtime (sc_kernels::UserFunction).  What they compute --
// the preserved vectors, the argument lists, the gradient -- is
// docs/sparsecore_semantics.md §8; the optimizers are §6's.  Every input is
// checked before an output is written; a bad one, or a function returning
// the wrong number, type or shape of outputs, is InvalidArgument naming the
// op and the offending index.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/sparsecore.h"
#include "kernels/registration.h"
#include "kernels/sparsecore/kernel_util.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {
namespace {

namespace sc = ::tf_tpu_emb::sparsecore;

// Inputs 0-4 of every custom-combiner op.
enum : int { kRowPointers = 0, kSampleIds, kTokenIds, kPosIds, kGains };

// One id of the buffers: it puts gain * table[row] at preserved_vectors[sample, pos].
struct PosId {
  int64_t sample, pos, row;
  float gain;
};

// The CSR buffers of the custom-combiner ops (§8): §5's one-chip layout
// with one minibatch per SparseCore (these ops take no minibatch count):
// the first num_sc groups of G = RoundUp(num_sc, 8) row pointers; any later
// row pointer must add no ids.  Lists the ids in buffer order and each
// sample's valency (1 + its largest position; 0 without ids).
absl::Status ReadPosCsr(const std::string& op, OpKernelContext* ctx, const Tensor& table,
                        int64_t num_sc, int64_t input_size, int64_t max_valency,
                        std::vector<PosId>* ids, std::vector<int32_t>* valencies) {
  const Tensor& pointers_t = ctx->input(kRowPointers);
  static const char* const kNames[] = {"row_pointers", "sorted_sample_ids", "sorted_token_ids",
                                       "sorted_pos_ids", "sorted_gains"};
  for (int i = kRowPointers; i <= kGains; ++i) {
    TF_RETURN_IF_ERROR(CheckRank(op, kNames[i], ctx->input(i), 1));
  }
  TF_RETURN_IF_ERROR(CheckRank(op, "embedding_table", table, 2));
  const int64_t n = ctx->input(kSampleIds).NumElements();
  for (int i = kTokenIds; i <= kGains; ++i) {
    if (ctx->input(i).NumElements() != n) {
      return Invalid(op, absl::StrCat(kNames[i], " has ", ctx->input(i).NumElements(),
                                      " elements, sorted_sample_ids ", n, ": they must match"));
    }
  }
  const int64_t group = sc::RoundUp(num_sc, sc::kXlaPadSize);
  const int64_t num_pointers = pointers_t.NumElements();
  if (num_pointers < num_sc * group) {
    return Invalid(op,
                   absl::StrCat("row_pointers has ", num_pointers, " entries; ", num_sc,
                                " sparse cores need ", num_sc * group, " (groups of ", group, ")"));
  }
  if (table.dim_size(0) % num_sc != 0) {
    return Invalid(op, absl::StrCat("the embedding table's ", table.dim_size(0),
                                    " rows do not split into ", num_sc,
                                    " sparse core shards (num_sparsecores_per_device)"));
  }
  const int64_t shard_rows = table.dim_size(0) / num_sc, batch = input_size / num_sc;
  const auto pointers = pointers_t.vec<int32_t>();
  const auto samples = ctx->input(kSampleIds).vec<int32_t>();
  const auto tokens = ctx->input(kTokenIds).vec<int32_t>();
  const auto positions = ctx->input(kPosIds).vec<int32_t>();
  const auto gains = ctx->input(kGains).vec<float>();
  valencies->assign(input_size, 0);
  std::vector<bool> used(input_size * max_valency, false);
  ids->clear();
  for (int64_t k = 0; k < num_pointers; ++k) {
    const int64_t begin = k == 0 ? 0 : sc::RoundUp(pointers(k - 1), sc::kXlaPadSize);
    const int64_t end = pointers(k);
    const std::string segment = sc::CheckCsrSegment(k, begin, end, n);
    if (!segment.empty()) return Invalid(op, segment);
    const int64_t shard = k % group, sample_sc = k / group;
    if (end > begin && (sample_sc >= num_sc || shard >= num_sc)) {
      return Invalid(op,
                     absl::StrCat("row_pointers[", k, "]: segment ", shard, " of group ", sample_sc,
                                  " holds ids, but the custom-combiner ops read one minibatch of ",
                                  num_sc, " sparse cores with ", num_sc, " shards each"));
    }
    for (int64_t i = begin; i < end; ++i) {
      const std::string bad = sc::CheckCsrId(i, samples(i), batch, tokens(i), shard_rows);
      if (!bad.empty()) return Invalid(op, bad);
      if (positions(i) < 0 || positions(i) >= max_valency) {
        return Invalid(op, absl::StrCat("sorted_pos_ids[", i, "] = ", positions(i),
                                        " is outside [0, max_valency = ", max_valency, ")"));
      }
      const int64_t sample = sample_sc * batch + samples(i);
      const int64_t slot = sample * max_valency + positions(i);
      if (used[slot]) {
        return Invalid(op, absl::StrCat("sorted_pos_ids[", i, "] = ", positions(i), ": sample ",
                                        sample, " already has an id at position ", positions(i)));
      }
      used[slot] = true;
      (*valencies)[sample] = std::max<int32_t>((*valencies)[sample], positions(i) + 1);
      ids->push_back({sample, positions(i), shard * shard_rows + tokens(i), gains(i)});
    }
  }
  return absl::OkStatus();
}

// The combiner's (and its VJPs') leading arguments: valencies [B] int32,
// vectors [B, max_valency, width], and weights [num_weights] only when
// num_weights > 0 (TF's CustomCombiner: "only present if num_weights ...
// is greater than 0").
std::vector<Tensor> CombinerArgs(const Tensor& valencies, const Tensor& vectors,
                                 const Tensor& weights, int64_t num_weights) {
  std::vector<Tensor> args = {valencies, vectors};
  if (num_weights > 0) args.push_back(weights);
  return args;
}

absl::Status CheckWeights(const std::string& op, const char* name, const Tensor& w,
                          int64_t num_weights) {
  if (num_weights == 0) return absl::OkStatus();  // unread, as in TF's shape function
  return CheckShape(op, name, w, TensorShape({num_weights}));
}

// ------------------------------------------------------------ the lookup

// Inputs: the five buffers, embedding_table, weights; outputs: activations
// [input_size, width], preserved_valencies [input_size], preserved_vectors
// [input_size, max_valency, width].
class CustomCombinerLookupOp : public OpKernel {
 public:
  explicit CustomCombinerLookupOp(OpKernelConstruction* c) : OpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, c->GetAttr("input_size", &input_size_));
    OP_REQUIRES_OK(c, c->GetAttr("max_valency", &max_valency_));
    OP_REQUIRES_OK(c, c->GetAttr("num_weights", &num_weights_));
    OP_REQUIRES_OK(c, RefuseQuantization(c, op_));
    OP_REQUIRES_OK(c, ReadNumSparseCores(c, op_, &num_sc_));
    OP_REQUIRES(c, input_size_ % num_sc_ == 0,
                Invalid(op_, absl::StrCat("input_size ", input_size_, " is not divisible by ",
                                          num_sc_, " sparse cores")));
    OP_REQUIRES_OK(c, combiner_.Init(c, op_, "combiner_computation"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& table = ctx->input(5);
    const Tensor& weights = ctx->input(6);
    std::vector<PosId> ids;
    std::vector<int32_t> valency;
    OP_REQUIRES_OK(ctx,
                   ReadPosCsr(op_, ctx, table, num_sc_, input_size_, max_valency_, &ids, &valency));
    OP_REQUIRES_OK(ctx, CheckWeights(op_, "weights", weights, num_weights_));
    const int64_t width = table.dim_size(1);
    Tensor* valencies;
    Tensor* vectors;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({input_size_}), &valencies));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({input_size_, max_valency_, width}),
                                             &vectors));
    std::copy(valency.begin(), valency.end(), valencies->flat<int32_t>().data());
    float* v = vectors->flat<float>().data();
    std::fill_n(v, vectors->NumElements(), 0.0f);
    const float* w = table.flat<float>().data();
    for (const PosId& id : ids) {
      float* out = v + (id.sample * max_valency_ + id.pos) * width;
      const float* row = w + id.row * width;
      for (int64_t d = 0; d < width; ++d) out[d] = id.gain * row[d];
    }
    std::vector<Tensor> rets;
    UserFunction::Call combiner;
    OP_REQUIRES_OK(ctx, combiner_.Prepare(ctx, &combiner));
    OP_REQUIRES_OK(ctx, combiner.Run(CombinerArgs(*valencies, *vectors, weights, num_weights_),
                                     {TensorShape({input_size_, width})}, &rets));
    ctx->set_output(0, rets[0]);
  }

 private:
  const std::string op_;
  int64_t input_size_ = 0, max_valency_ = 0, num_weights_ = 0, num_sc_ = 1;
  UserFunction combiner_;
};

// ------------------------------------------------------------ the gradients

// Inputs 5-11 of every gradient op (after the buffers); the tables follow.
enum : int {
  kWeights = 5,
  kPreservedValencies,
  kPreservedVectors,
  kPreservedWeights,
  kActivationGradients
};

// Per touched table row (in the order of its first id), its gradient.
struct RowGradients {
  std::vector<int64_t> rows;
  std::vector<float> sums;  // rows.size() x width
  const float* of(size_t t, int64_t width) const { return sums.data() + t * width; }
};

// The backward pass shared by the gradient ops (§8.1): the table VJP's
// vector gradients summed per touched table row, and the combiner weights
// after their SGD step (output `weights_output`).  Const after Init (a
// kernel's Computes may run concurrently).
class CombinerBackward {
 public:
  absl::Status Init(OpKernelConstruction* c, const std::string& op) {
    op_ = op;
    TF_RETURN_IF_ERROR(c->GetAttr("max_valency", &max_valency_));
    TF_RETURN_IF_ERROR(c->GetAttr("num_weights", &num_weights_));
    TF_RETURN_IF_ERROR(ReadNumSparseCores(c, op, &num_sc_));
    TF_RETURN_IF_ERROR(table_vjp_.Init(c, op, "combiner_table_vjp_computation"));
    return weights_vjp_.Init(c, op, "combiner_weights_vjp_computation");
  }

  // `table`: the embedding table (the row layout); `weights_lr`: the
  // combiner_weights_learning_rate input.
  absl::Status Run(OpKernelContext* ctx, const Tensor& table, const Tensor& weights_lr,
                   int weights_output, RowGradients* out) const {
    const Tensor& grads = ctx->input(kActivationGradients);
    TF_RETURN_IF_ERROR(CheckRank(op_, "activation_gradients", grads, 2));
    TF_RETURN_IF_ERROR(CheckRank(op_, "embedding_table", table, 2));
    const int64_t batch = grads.dim_size(0), width = table.dim_size(1);
    if (grads.dim_size(1) != width || batch % num_sc_ != 0) {
      return Invalid(op_, absl::StrCat("activation_gradients ", grads.shape().DebugString(),
                                       " must be [a multiple of ", num_sc_, ", ", width, "]"));
    }
    const Tensor& valencies = ctx->input(kPreservedValencies);
    const Tensor& vectors = ctx->input(kPreservedVectors);
    TF_RETURN_IF_ERROR(CheckShape(op_, "preserved_valencies", valencies, TensorShape({batch})));
    TF_RETURN_IF_ERROR(
        CheckShape(op_, "preserved_vectors", vectors, TensorShape({batch, max_valency_, width})));
    TF_RETURN_IF_ERROR(CheckWeights(op_, "weights", ctx->input(kWeights), num_weights_));
    TF_RETURN_IF_ERROR(
        CheckWeights(op_, "preserved_weights", ctx->input(kPreservedWeights), num_weights_));
    float lr_w = 0;
    TF_RETURN_IF_ERROR(ScalarValue(op_, "combiner_weights_learning_rate", weights_lr, &lr_w));
    std::vector<PosId> ids;
    std::vector<int32_t> unused;
    TF_RETURN_IF_ERROR(ReadPosCsr(op_, ctx, table, num_sc_, batch, max_valency_, &ids, &unused));
    const auto val = valencies.vec<int32_t>();
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i].pos >= val(ids[i].sample)) {
        return Invalid(op_,
                       absl::StrCat("the id at sorted_pos_ids[", i, "] (sample ", ids[i].sample,
                                    ", position ", ids[i].pos, ") lies beyond preserved_valencies[",
                                    ids[i].sample, "] = ", val(ids[i].sample)));
      }
    }
    std::vector<Tensor> args =
        CombinerArgs(valencies, vectors, ctx->input(kPreservedWeights), num_weights_);
    args.push_back(grads);
    std::vector<Tensor> d_vectors, d_weights;
    UserFunction::Call table_vjp, weights_vjp;
    TF_RETURN_IF_ERROR(table_vjp_.Prepare(ctx, &table_vjp));
    TF_RETURN_IF_ERROR(table_vjp.Run(args, {vectors.shape()}, &d_vectors));
    Tensor* new_weights;
    TF_RETURN_IF_ERROR(
        ctx->allocate_output(weights_output, TensorShape({num_weights_}), &new_weights));
    if (num_weights_ > 0) {
      TF_RETURN_IF_ERROR(weights_vjp_.Prepare(ctx, &weights_vjp));
      TF_RETURN_IF_ERROR(weights_vjp.Run(args, {TensorShape({num_weights_})}, &d_weights));
      const auto w = ctx->input(kWeights).vec<float>();
      const auto dw = d_weights[0].vec<float>();
      auto updated = new_weights->vec<float>();
      for (int64_t k = 0; k < num_weights_; ++k) updated(k) = w(k) - lr_w * dw(k);
    }
    // Per touched row, the sum of gain * d_vectors[sample, pos] (buffer order).
    std::vector<int64_t> slot_of(table.dim_size(0), -1);
    out->rows.clear();
    out->sums.clear();
    const float* dv = d_vectors[0].flat<float>().data();
    for (const PosId& id : ids) {
      int64_t& slot = slot_of[id.row];
      if (slot < 0) {
        slot = static_cast<int64_t>(out->rows.size());
        out->rows.push_back(id.row);
        out->sums.resize(out->sums.size() + width, 0.0f);
      }
      float* sum = out->sums.data() + slot * width;
      const float* g = dv + (id.sample * max_valency_ + id.pos) * width;
      for (int64_t d = 0; d < width; ++d) sum[d] += id.gain * g[d];
    }
    return absl::OkStatus();
  }

 private:
  std::string op_;
  int64_t max_valency_ = 0, num_weights_ = 0, num_sc_ = 1;
  UserFunction table_vjp_, weights_vjp_;
};

// XlaSparseDenseMatmulCustomCombinerOnTcGradWith<Opt>AndCsrInput: inputs
// ..., learning_rate (10), combiner_weights_learning_rate (11),
// embedding_table (12), slots...; outputs table, slots..., updated_weights.
template <Opt kOpt>
class CustomCombinerGradOp : public OpKernel {
 public:
  explicit CustomCombinerGradOp(OpKernelConstruction* c) : OpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, ReadGradAttrs(c, op_, kOpt, &optimizer_));
    OP_REQUIRES_OK(c, backward_.Init(c, op_));
  }

  void Compute(OpKernelContext* ctx) override {
    constexpr int kSlots = NumSlotsOf(kOpt);
    const Tensor& table = ctx->input(12);
    OP_REQUIRES_OK(ctx, CheckRank(op_, "embedding_table", table, 2));
    for (int k = 0; k < kSlots; ++k) {
      OP_REQUIRES_OK(ctx, CheckShape(op_, absl::StrCat("slot variable (input ", 13 + k, ")"),
                                     ctx->input(13 + k), table.shape()));
    }
    float lr = 0;
    OP_REQUIRES_OK(ctx, ScalarValue(op_, "learning_rate", ctx->input(10), &lr));
    RowGradients grads;
    OP_REQUIRES_OK(ctx, backward_.Run(ctx, table, ctx->input(11), 1 + kSlots, &grads));
    const int64_t width = table.dim_size(1);
    float* w;
    float* s[kMaxSlots] = {};
    OP_REQUIRES_OK(ctx, CopyToOutput(ctx, 0, table, &w));
    for (int k = 0; k < kSlots; ++k) {
      OP_REQUIRES_OK(ctx, CopyToOutput(ctx, 1 + k, ctx->input(13 + k), &s[k]));
    }
    for (size_t t = 0; t < grads.rows.size(); ++t) {
      const int64_t off = grads.rows[t] * width;
      RowArgs a{};
      a.w = w + off;
      for (int k = 0; k < kSlots; ++k) a.s[k] = s[k] + off;
      a.g = grads.of(t, width);
      a.dim = static_cast<int>(width);
      a.lr = lr;
      optimizer_.Update(a);
    }
  }

 private:
  const std::string op_;
  SparseCoreOptimizer optimizer_;
  CombinerBackward backward_;
};

// XlaSparseDenseMatmulCustomCombinerOnTcGradWithCsrInput: the optimizer is
// the user's optimizer_custom_computation, called per touched row as
// XlaSparseDenseMatmulGradWithCsrInput's (§6): the row's gradient [1, width],
// each table's row ([1, cols], or [1] for a vector slot), each
// hyper-parameter broadcast to [1, width]; it returns the N updated rows.
class CustomCombinerGradCustomOp : public OpKernel {
 public:
  explicit CustomCombinerGradCustomOp(OpKernelConstruction* c) : OpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, backward_.Init(c, op_));
    OP_REQUIRES_OK(c, optimizer_.Init(c, op_, "optimizer_custom_computation"));
  }

  void Compute(OpKernelContext* ctx) override {
    OpInputList tables, hypers;
    OP_REQUIRES_OK(ctx, ctx->input_list("tables", &tables));
    OP_REQUIRES_OK(ctx, ctx->input_list("hyperparameters", &hypers));
    const Tensor& table = tables[0];
    OP_REQUIRES_OK(ctx, CheckRank(op_, "tables[0]", table, 2));
    const int64_t rows = table.dim_size(0), width = table.dim_size(1);
    const int n = tables.size();
    for (int i = 1; i < n; ++i) {
      OP_REQUIRES(
          ctx, (tables[i].dims() == 1 || tables[i].dims() == 2) && tables[i].dim_size(0) == rows,
          Invalid(op_, absl::StrCat("tables[", i, "] has shape ", tables[i].shape().DebugString(),
                                    "; [", rows, "] or [", rows, ", cols] expected")));
    }
    std::vector<float> hyper(hypers.size());
    for (int j = 0; j < hypers.size(); ++j) {
      OP_REQUIRES_OK(ctx, ScalarValue(op_, absl::StrCat("hyperparameters[", j, "]"), hypers[j],
                                      &hyper[j]));
    }
    RowGradients grads;
    OP_REQUIRES_OK(ctx, backward_.Run(ctx, table, ctx->input(ctx->num_inputs() - 1), n, &grads));
    std::vector<float*> out(n);
    std::vector<int64_t> cols(n);
    for (int i = 0; i < n; ++i) {
      OP_REQUIRES_OK(ctx, CopyToOutput(ctx, i, tables[i], &out[i]));
      cols[i] = tables[i].dims() == 2 ? tables[i].dim_size(1) : 0;
    }
    if (grads.rows.empty()) return;
    UserFunction::Call optimizer;
    OP_REQUIRES_OK(ctx, optimizer_.Prepare(ctx, &optimizer));
    std::vector<Tensor> args;
    std::vector<TensorShape> want;
    args.emplace_back(::tensorflow::DT_FLOAT, TensorShape({1, width}));
    for (int i = 0; i < n; ++i) {
      want.push_back(cols[i] ? TensorShape({1, cols[i]}) : TensorShape({1}));
      args.emplace_back(::tensorflow::DT_FLOAT, want.back());
    }
    for (float h : hyper) {
      args.emplace_back(::tensorflow::DT_FLOAT, TensorShape({1, width}));
      std::fill_n(args.back().flat<float>().data(), width, h);
    }
    std::vector<Tensor> rets;
    for (size_t t = 0; t < grads.rows.size(); ++t) {
      const int64_t row = grads.rows[t];
      std::copy_n(grads.of(t, width), width, args[0].flat<float>().data());
      for (int i = 0; i < n; ++i) {
        const int64_t k = cols[i] ? cols[i] : 1;
        std::copy_n(out[i] + row * k, k, args[1 + i].flat<float>().data());
      }
      OP_REQUIRES_OK(ctx, optimizer.Run(args, want, &rets));
      for (int i = 0; i < n; ++i) {
        const int64_t k = cols[i] ? cols[i] : 1;
        std::copy_n(rets[i].flat<float>().data(), k, out[i] + row * k);
      }
    }
  }

 private:
  const std::string op_;
  CombinerBackward backward_;
  UserFunction optimizer_;
};

bool RegisterKernels() {
  const std::string base = "XlaSparseDenseMatmulCustomCombinerOnTc";
  RegisterBoth<CustomCombinerLookupOp>(base + "WithCsrInput");
  RegisterBoth<CustomCombinerGradCustomOp>(base + "GradWithCsrInput");
  sc_opt::ForEachOptimizer([&base](auto opt) {
    RegisterBoth<CustomCombinerGradOp<decltype(opt)::value>>(
        absl::StrCat(base, "GradWith", sc_opt::NameOf(opt), "AndCsrInput"));
  });
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb
