// Load/Retrieve: the per-table ops (bound to their optimizer's table entry
// at registration) and LoadAll/RetrieveAll move a shard of a table's state
// variables in or out (row mapping: engine/table.h CopyShard).
#include <shared_mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "core/optimizers.h"
#include "engine/engine.h"
#include "engine/table.h"
#include "kernels/registration.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace {

using Shard = Engine::LocalShard;

// Resolves the table of a per-table op and the rows of its shard.
struct TableShard {
  int table = -1;
  Shard shard;
};

class TableOpBase : public OpKernel {
 public:
  // `optimizer`: the table entry whose Load/Retrieve op this kernel serves
  // (bound at registration, see RegisterTableKernel).
  TableOpBase(OpKernelConstruction* ctx, const OptimizerSpec* optimizer)
      : OpKernel(ctx), op_(BareOpName(ctx)), optimizer_(optimizer) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_id", &table_id_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("table_name", &table_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_shards", &num_shards_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("shard_id", &shard_id_));
    OP_REQUIRES(ctx, (table_id_ >= 0) != !table_name_.empty(),
                absl::InvalidArgumentError(absl::StrCat(
                    op_, ": exactly one of table_id or table_name must be non-default")));
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
      return absl::InvalidArgumentError(absl::StrCat(op_, ": table_id ", t, " is out of range; ",
                                                     e.num_tables(), " tables are configured"));
    }
    const Table& table = e.table(t);
    if (table.optimizer != optimizer_) {
      return absl::FailedPreconditionError(
          absl::StrCat(op_, ": table '", table.name, "' (id ", t, ") is configured with the ",
                       table.optimizer->proto_field, " optimizer, not ", optimizer_->proto_field));
    }
    shard->table = t;
    return e.ResolveShard(op_, t, num_shards_, shard_id_, &shard->shard);
  }

 public:
  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    OP_REQUIRES_OK(ctx, engine.Acquire(ctx, op_));
    TableShard shard;
    OP_REQUIRES_OK(ctx, Resolve(*engine, &shard));
    Transfer(ctx, *engine, engine->table(shard.table), shard.shard);
  }

 protected:
  // Moves the shard's tensors into (Load) or out of (Retrieve) the table.
  virtual void Transfer(OpKernelContext* ctx, Engine& engine, Table& table, const Shard& shard) = 0;

  const std::string op_;
  int table_id_ = -1;
  std::string table_name_;
  int num_shards_ = 0, shard_id_ = 0;
  const OptimizerSpec* const optimizer_;
};

class LoadTableOp : public TableOpBase {
 public:
  using TableOpBase::TableOpBase;

 protected:
  void Transfer(OpKernelContext* ctx, Engine& engine, Table& table, const Shard& shard) override {
    const TensorShape expected({shard.rows, table.dimension});
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      OP_REQUIRES(ctx, ctx->input(i).shape() == expected,
                  absl::InvalidArgumentError(absl::StrCat(
                      op_, ": table '", table.name, "': ", ctx->op_kernel().def().input(i), " ",
                      ctx->input(i).shape().DebugString(), " should be ", expected.DebugString(),
                      " (shard ", shard_id_, " of ", num_shards_, ")")));
    }
    engine.WaitForApply();  // a routed Send's update may still run
    std::unique_lock<std::shared_mutex> lock(engine.tables_mutex());
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      CopyShard(table, engine.sharding(), shard.local_shards, shard.local_shard_id, shard.rows,
                table.state[i].get(), const_cast<float*>(ctx->input(i).flat<float>().data()),
                /*to_state=*/true);
    }
  }
};

class RetrieveTableOp : public TableOpBase {
 public:
  using TableOpBase::TableOpBase;

 protected:
  void Transfer(OpKernelContext* ctx, Engine& engine, Table& table, const Shard& shard) override {
    engine.WaitForApply();  // a routed Send's update may still run
    std::shared_lock<std::shared_mutex> lock(engine.tables_mutex());
    for (int i = 0; i < ctx->num_outputs(); ++i) {
      Tensor* out;
      OP_REQUIRES_OK(ctx,
                     ctx->allocate_output(i, TensorShape({shard.rows, table.dimension}), &out));
      CopyShard(table, engine.sharding(), shard.local_shards, shard.local_shard_id, shard.rows,
                table.state[i].get(), out->flat<float>().data(),
                /*to_state=*/false);
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
  absl::Status Shards(Engine& e, std::vector<Shard>* shards) const {
    if (num_tables_ != e.num_tables()) {
      return absl::InvalidArgumentError(absl::StrCat(op_, ": NumTables is ", num_tables_, " but ",
                                                     e.num_tables(), " tables are configured"));
    }
    for (int t = 0; t < e.num_tables(); ++t) {
      shards->emplace_back();
      TF_RETURN_IF_ERROR(e.ResolveShard(op_, t, num_shards_, shard_id_, &shards->back()));
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
    OP_REQUIRES_OK(ctx, engine.Acquire(ctx, op_));
    std::vector<Shard> shards;
    OP_REQUIRES_OK(ctx, Shards(*engine, &shards));
    Transfer(ctx, *engine, shards);
  }

 protected:
  // Moves every table's state variables in (LoadAll) or out (RetrieveAll);
  // shards[t]: the rows of table t this op moves.
  virtual void Transfer(OpKernelContext* ctx, Engine& engine, const std::vector<Shard>& shards) = 0;
};

class LoadAllOp : public AllTablesOpBase {
 public:
  using AllTablesOpBase::AllTablesOpBase;

 protected:
  void Transfer(OpKernelContext* ctx, Engine& e, const std::vector<Shard>& shards) override {
    Engine* engine = &e;
    std::vector<OpInputList> groups(kMaxStateVariables);
    for (int i = 0; i < kMaxStateVariables; ++i) {
      OP_REQUIRES_OK(ctx, ctx->input_list(GroupName(i), &groups[i]));
    }
    for (int t = 0; t < engine->num_tables(); ++t) {
      const Table& table = engine->table(t);
      const TensorShape expected({shards[t].rows, table.dimension});
      for (int i = 0; i < kMaxStateVariables; ++i) {
        const Tensor& in = groups[i][t];
        const bool used = i < static_cast<int>(table.state_names.size());
        OP_REQUIRES(ctx, used ? in.shape() == expected : in.NumElements() == 0,
                    absl::InvalidArgumentError(
                        absl::StrCat(op_, ": table '", table.name, "' (id ", t, "): ", GroupName(i),
                                     " has shape ", in.shape().DebugString(), " but should be ",
                                     used ? absl::StrCat(expected.DebugString(), " (its ",
                                                         table.state_names[i], ")")
                                          : std::string("empty"))));
      }
    }
    engine->WaitForApply();  // a routed Send's update may still run
    std::unique_lock<std::shared_mutex> lock(engine->tables_mutex());
    for (int t = 0; t < engine->num_tables(); ++t) {
      Table& table = engine->table(t);
      for (int i = 0; i < static_cast<int>(table.state_names.size()); ++i) {
        if (IsAccumulator(table, i)) continue;
        CopyShard(table, engine->sharding(), shards[t].local_shards, shards[t].local_shard_id,
                  shards[t].rows, table.state[i].get(),
                  const_cast<float*>(groups[i][t].flat<float>().data()), true);
      }
    }
  }
};

class RetrieveAllOp : public AllTablesOpBase {
 public:
  using AllTablesOpBase::AllTablesOpBase;

 protected:
  void Transfer(OpKernelContext* ctx, Engine& e, const std::vector<Shard>& shards) override {
    Engine* engine = &e;
    engine->WaitForApply();  // a routed Send's update may still run
    std::shared_lock<std::shared_mutex> lock(engine->tables_mutex());
    for (int i = 0; i < kMaxStateVariables; ++i) {
      OpOutputList group;
      OP_REQUIRES_OK(ctx, ctx->output_list(GroupName(i), &group));
      for (int t = 0; t < engine->num_tables(); ++t) {
        Table& table = engine->table(t);
        const bool used = i < static_cast<int>(table.state_names.size());
        Tensor* out;
        OP_REQUIRES_OK(ctx, group.allocate(t,
                                           used ? TensorShape({shards[t].rows, table.dimension})
                                                : TensorShape({0, 0}),
                                           &out));
        if (!used) continue;
        if (IsAccumulator(table, i)) {
          out->flat<float>().setConstant(GradientAccumulatorInitialValue());
        } else {
          CopyShard(table, engine->sharding(), shards[t].local_shards, shards[t].local_shard_id,
                    shards[t].rows, table.state[i].get(), out->flat<float>().data(), false);
        }
      }
    }
  }
};

// The step count seeding bfloat16 storage's stochastic rounding (a
// checkpoint's part of the engine that is not a table; Engine::steps_applied).
class RetrieveStepCountOp : public OpKernel {
 public:
  explicit RetrieveStepCountOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    OP_REQUIRES_OK(ctx, engine.Acquire(ctx, "RetrieveTPUEmbeddingStepCount"));
    Tensor *count, *rounding;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &count));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &rounding));
    engine->WaitForApply();  // the count of every step whose Sends returned
    std::shared_lock<std::shared_mutex> lock(engine->tables_mutex());
    count->scalar<int64_t>()() = static_cast<int64_t>(engine->steps_applied());
    rounding->scalar<bool>()() = engine->stochastic_rounding();
  }
};

class LoadStepCountOp : public OpKernel {
 public:
  explicit LoadStepCountOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}
  void Compute(OpKernelContext* ctx) override {
    EngineRef engine;
    OP_REQUIRES_OK(ctx, engine.Acquire(ctx, "LoadTPUEmbeddingStepCount"));
    const int64_t count = ctx->input(0).scalar<int64_t>()();
    OP_REQUIRES(ctx, count >= 0,
                absl::InvalidArgumentError(absl::StrCat(
                    "LoadTPUEmbeddingStepCount: step_count must be >= 0, got ", count)));
    engine->WaitForApply();  // a pending update must not count after the load
    std::unique_lock<std::shared_mutex> lock(engine->tables_mutex());
    engine->set_steps_applied(static_cast<uint64_t>(count));
  }
};

bool RegisterKernels() {
  RegisterCpuKernel<RetrieveStepCountOp>("RetrieveTPUEmbeddingStepCount", /*core=*/false);
  RegisterCpuKernel<LoadStepCountOp>("LoadTPUEmbeddingStepCount", /*core=*/false);
  RegisterCpuKernel<LoadAllOp>("LoadAllTPUEmbeddingParameters");
  RegisterCpuKernel<RetrieveAllOp>("RetrieveAllTPUEmbeddingParameters");
  for (const OptimizerSpec& spec : AllOptimizers()) {
    if (spec.load_op == nullptr) continue;  // no per-table ops
    RegisterTableKernel<LoadTableOp>(spec.load_op, &spec);
    RegisterTableKernel<RetrieveTableOp>(spec.retrieve_op, &spec);
  }
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace kernels
}  // namespace tf_tpu_emb
