// CPU kernels of the SparseCore lookup and gradient+optimizer ops
// (TPUEmbeddingV2): XlaSparseDenseMatmulWith{CsrInput, StaticBufferSize} and
// XlaSparseDenseMatmulGradWith<Opt>And{CsrInput, StaticBufferSize} (the
// standalone XlaSparseCore<Opt>: kernels/sparsecore/standalone_kernels.cc; the
// user's-function optimizer XlaSparseDenseMatmulGradWithCsrInput:
// kernels/sparsecore/custom_optimizer_kernel.cc).
// Registered as TfTpuEmb>Name and under TF's name.  What they compute -- the
// one-chip CPU model of the CSR buffers, the row gradient, the optimizers --
// is docs/sparsecore_semantics.md §5-§6; the row updates are
// core/optimizer_formulas.h's (one optimizer source).  Ops TF marks pipelined
// (pipeline_execution_with_tensor_core) look up one step old tables
// (kernels/sparsecore/pipeline.h, semantics "Pipelining").
// Every input is checked before an output is written: a bad one is
// InvalidArgument naming the op and the offending index (and, for the
// lookup and gradient ops, the table).  On the stand-in SparseCore TPU
// (several chips, core/sparsecore.h ChipSystem) the lookup and gradient
// kernels are asynchronous: the replicas' kernels of one call meet
// (kernels/sparsecore/chips.h, kernels/sparsecore/rendezvous.h) and exchange
// rows and gradients as the TPU's SparseCores do (semantics "Multi-chip");
// on one chip they run at once.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cpu_dispatch.h"
#include "core/csr_gather.h"
#include "core/optimizers.h"
#include "core/sparsecore.h"
#include "kernels/registration.h"
#include "kernels/sparsecore/chips.h"
#include "kernels/sparsecore/huge_page_allocator.h"
#include "kernels/sparsecore/pipeline.h"
#include "kernels/sparsecore/row_runs.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {
namespace {

namespace sc = ::tf_tpu_emb::sparsecore;

// ------------------------------------------------------------ §5 the lookup

struct LookupInput {
  std::vector<CsrId> ids;
};

// A CsrId's table row (on its chip's shard), activation row and gain, for
// core/csr_gather.h.
struct ChipRows {
  const float* const* shards;
  int64_t width;
  const float* Row(const CsrId& id) const { return shards[id.chip] + id.row * width; }
  static int64_t Sample(const CsrId& id) { return id.sample; }
  static float Gain(const CsrId& id) { return id.gain; }
};

// Activations of samples [first, last): core/csr_gather.h's gather, with
// the CPU dispatch of core/cpu_dispatch.h.
TF_TPU_EMB_CPU_DISPATCH
void GatherIds(const CsrId* ids, int64_t n, const float* const* shards, int64_t width, float* act,
               int64_t first, int64_t last) {
  csr_gather::GatherPart(ChipRows{shards, width}, ids, n, width, act, first, last);
}

class CsrLookupOp : public AsyncOpKernel {
 public:
  explicit CsrLookupOp(OpKernelConstruction* c) : AsyncOpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, c->GetAttr("input_size", &input_size_));
    OP_REQUIRES_OK(c, c->GetAttr("table_name", &table_));
    OP_REQUIRES_OK(c, RefuseQuantization(c, op_));
    if (c->HasAttr("T")) {
      ::tensorflow::DataType t;
      OP_REQUIRES_OK(c, c->GetAttr("T", &t));
      OP_REQUIRES(c, t == ::tensorflow::DT_FLOAT,
                  absl::UnimplementedError(
                      absl::StrCat(op_, ": only float32 tables are implemented on CPU")));
    }
    OP_REQUIRES_OK(c, ReadChips(c, op_, &chips_));
    pipelined_ = Pipelined(c);
    OP_REQUIRES(c, input_size_ % chips_.num_sc == 0,
                Invalid(op_, absl::StrCat("input_size ", input_size_, " is not divisible by ",
                                          chips_.num_sc, " sparse cores")));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto in = std::make_shared<LookupInput>();
    absl::Status status;
    const absl::Status caught = CatchExceptions(op_, [&] {
      status = ReadCsr(op_, ctx, ctx->input(4), ctx->input(5), chips_, input_size_ / chips_.num_sc,
                       &in->ids);
    });
    if (!caught.ok()) status = caught;
    const int64_t input_size = input_size_;
    const std::string op = op_;
    // Pipelined: the table's undo log (kernels/sparsecore/pipeline.h), taken by this lookup.
    const std::string log = pipelined_ ? UndoLogs::Key(table_, chips_.generation) : std::string();
    RunOnChips(ctx, std::move(done), op_, table_, chips_, status, in,
               [input_size, op, log](std::vector<ChipArrival>& a) {
                 std::vector<const Tensor*> tables;
                 for (ChipArrival& x : a) tables.push_back(&x.ctx->input(4));
                 std::vector<absl::Status> result(a.size(), SameShards(op, tables));
                 if (!result[0].ok()) return result;
                 const int64_t width = tables[0]->dim_size(1);
                 std::vector<const float*> shards;
                 for (const Tensor* t : tables) shards.push_back(t->flat<float>().data());
                 std::unique_ptr<LookupView> old;
                 if (!log.empty()) {
                   old = std::make_unique<LookupView>(log, tables);
                   if (old->empty()) old.reset();
                 }
                 if (old != nullptr) shards = old->Shards(std::move(shards));
                 for (size_t k = 0; k < a.size(); ++k) {
                   Tensor* out;
                   result[k] = a[k].ctx->allocate_output(0, TensorShape({input_size, width}), &out);
                   if (!result[k].ok()) continue;
                   float* act = out->flat<float>().data();
                   const std::vector<CsrId>& read = static_cast<LookupInput*>(a[k].data.get())->ids;
                   std::vector<CsrId> redirected;
                   if (old != nullptr) redirected = old->Redirect(read);
                   const std::vector<CsrId>& ids = old != nullptr ? redirected : read;
                   // One part of the samples per intra-op thread; each part
                   // adds its samples' ids in buffer order (the result does
                   // not depend on the thread count).
                   ::tsl::thread::ThreadPool* pool = CpuPool(a[k].ctx);
                   const int64_t parts =
                       std::max<int64_t>(1, std::min<int64_t>(pool->NumThreads(), input_size));
                   const int64_t cost = static_cast<int64_t>(ids.size()) * width * 4;
                   pool->ParallelFor(parts, cost, [&](int64_t begin, int64_t end) {
                     for (int64_t p = begin; p < end; ++p) {
                       GatherIds(ids.data(), static_cast<int64_t>(ids.size()), shards.data(), width,
                                 act, input_size * p / parts, input_size * (p + 1) / parts);
                     }
                   });
                 }
                 return result;
               });
  }

 private:
  const std::string op_;
  std::string table_;
  int64_t input_size_ = 0;
  Chips chips_;
  bool pipelined_ = false;
};
// ------------------------------------------------- §6 gradient and optimizer

// Inputs: row_pointers, sorted_sample_ids, sorted_token_ids, sorted_gains,
// activation_gradients, learning_rate, embedding_table, slots...,
// num_minibatches_per_physical_sparse_core; outputs: table, slots...
// Across chips ("Multi-chip"): chip c's shard is updated with the ids of
// every replica's buffers that address it, replicas in order, each buffer
// in its order, so a touched row gets the summed gradient of the global
// batch once.
//
// kInPlace (ours, "...InPlace", ops/sparsecore_optimizer_ops.cc): the table
// and slots are resource variables, updated where they are instead of
// copied into outputs (semantics §10, "In place").  A variable whose buffer
// is shared with a tensor still alive (an earlier read: a pipelined
// lookup's) is first copied, TF's copy-on-write rule for resource updates
// (tensorflow/core/kernels/training_op_helpers.h PrepareToUpdateVariable),
// so no earlier read sees the update; like TF's sparse apply ops without
// use_locking, the rows are then written without holding the variable's
// lock (the program orders the update's readers after it).
struct GradInput {
  std::vector<CsrId> ids;
  float lr = 0;
  Tensor state[1 + kMaxSlots];  // the table and slots (buffers shared)
};

// The resource variable of input `index` as a float32 tensor sharing the
// variable's buffer, made unique first (copy-on-write, above).
absl::Status InPlaceState(OpKernelContext* ctx, const std::string& op, int index, Tensor* out) {
  ::tensorflow::core::RefCountPtr<::tensorflow::Var> var;
  TF_RETURN_IF_ERROR(
      ::tensorflow::LookupResource(ctx, ::tensorflow::HandleFromInput(ctx, index), &var));
  ::tensorflow::mutex_lock lock(*var->mu());
  if (!var->is_initialized || var->tensor()->dtype() != ::tensorflow::DT_FLOAT) {
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": input ", index, " is not an initialized float32 variable"));
  }
  // A large variable not yet in huge pages moves there once (its rows are
  // random reads and writes: kernels/sparsecore/huge_page_allocator.h).
  HugePageAllocator* huge = HugePageAllocator::Get();
  const Tensor& now = *var->tensor();
  const bool move = now.TotalBytes() >= HugePageAllocator::kMinBytes &&
                    HugePageAllocator::Worthwhile() && !huge->Owns(now.tensor_data().data());
  if (move || !now.RefCountIsOne()) {
    Tensor copy;
    if (move) {
      copy = Tensor(huge, ::tensorflow::DT_FLOAT, now.shape());
      if (!copy.IsInitialized()) {
        return absl::ResourceExhaustedError(
            absl::StrCat(op, ": cannot allocate ", now.TotalBytes(), " bytes for input ", index));
      }
    } else {
      TF_RETURN_IF_ERROR(ctx->allocate_temp(::tensorflow::DT_FLOAT, now.shape(), &copy));
    }
    if (copy.NumElements() > 0) {
      std::memcpy(copy.flat<float>().data(), var->tensor()->flat<float>().data(),
                  sizeof(float) * copy.NumElements());
    }
    *var->tensor() = copy;
  }
  *out = *var->tensor();
  return absl::OkStatus();
}

template <Opt kOpt, bool kInPlace>
class CsrGradOp : public AsyncOpKernel {
 public:
  explicit CsrGradOp(OpKernelConstruction* c) : AsyncOpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, ReadGradAttrs(c, op_, kOpt, &optimizer_));
    OP_REQUIRES_OK(c, c->GetAttr("table_name", &table_));
    OP_REQUIRES_OK(c, ReadChips(c, op_, &chips_));
    pipelined_ = Pipelined(c);
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto in = std::make_shared<GradInput>();
    absl::Status status;
    const absl::Status caught = CatchExceptions(op_, [&] { status = Check(ctx, in.get()); });
    if (!caught.ok()) status = caught;
    const std::string op = op_;
    const SparseCoreOptimizer optimizer = optimizer_;
    const std::string log = UndoLogs::Key(table_, chips_.generation);
    const bool pipelined = pipelined_;
    RunOnChips(ctx, std::move(done), op_, table_, chips_, status, in,
               [op, optimizer, log, pipelined](std::vector<ChipArrival>& a) {
                 return Apply(op, optimizer, log, pipelined, a);
               });
  }

 private:
  static constexpr int kSlots = NumSlotsOf(kOpt);

  absl::Status Check(OpKernelContext* ctx, GradInput* in) const {
    for (int k = 0; k <= kSlots; ++k) {
      if (kInPlace) {
        TF_RETURN_IF_ERROR(InPlaceState(ctx, op_, 6 + k, &in->state[k]));
      } else {
        in->state[k] = ctx->input(6 + k);
      }
    }
    const Tensor& grads = ctx->input(4);
    const Tensor& table = in->state[0];
    TF_RETURN_IF_ERROR(CheckRank(op_, "activation_gradients", grads, 2));
    TF_RETURN_IF_ERROR(CheckRank(op_, "embedding_table", table, 2));
    const int64_t width = table.dim_size(1), batch = grads.dim_size(0);
    const int64_t num_sc = chips_.num_sc;
    if (grads.dim_size(1) != width) {
      return Invalid(op_, absl::StrCat("activation_gradients have ", grads.dim_size(1),
                                       " columns, the embedding table ", width));
    }
    if (batch % num_sc != 0) {
      return Invalid(op_, absl::StrCat("activation_gradients' ", batch,
                                       " rows are not divisible by ", num_sc, " sparse cores"));
    }
    for (int s = 0; s < kSlots; ++s) {
      TF_RETURN_IF_ERROR(CheckSameShape(op_, "a slot variable", in->state[1 + s], table));
    }
    TF_RETURN_IF_ERROR(ScalarValue(op_, "learning_rate", ctx->input(5), &in->lr));
    return ReadCsr(op_, ctx, table, ctx->input(7 + kSlots), chips_, batch / num_sc, &in->ids);
  }

  static GradInput* InputOf(ChipArrival& a) { return static_cast<GradInput*>(a.data.get()); }

  // The rows of part `part` of `parts` of chip c's shard (rows split by a
  // hash) that the update touches, in order of first id (replicas in order,
  // each one's buffer order), and each one's gradient sum.  Row -> slot is an
  // open-addressing table of the thread's, kept between calls (as the
  // engine's ApplyPartition), so a step allocates nothing once its sizes
  // were seen.
  static void RowSums(std::vector<ChipArrival>& a, size_t c, int64_t width, int64_t part,
                      int64_t parts, std::vector<int64_t>* touched, std::vector<float>* sums) {
    int64_t n = 0;
    for (ChipArrival& from : a) n += static_cast<int64_t>(InputOf(from)->ids.size());
    int64_t cap = 16;
    while (cap < 2 * (n / parts + 1)) cap <<= 1;
    thread_local std::vector<int64_t> keys;
    thread_local std::vector<int64_t> slot_of;
    keys.assign(cap, -1);
    slot_of.resize(cap);
    sums->reserve(static_cast<size_t>(std::min<int64_t>(n, cap)) * width);
    for (ChipArrival& from : a) {
      const float* g = from.ctx->input(4).flat<float>().data();
      for (const CsrId& id : InputOf(from)->ids) {
        if (id.chip != static_cast<int64_t>(c) || PartOf(id.row, parts) != part) continue;
        uint64_t h = (static_cast<uint64_t>(id.row) * 0xC2B2AE3D27D4EB4Full) & (cap - 1);
        while (keys[h] != -1 && keys[h] != id.row) h = (h + 1) & (cap - 1);
        if (keys[h] == -1) {
          if (static_cast<int64_t>(touched->size()) * 2 >= cap) {  // more rows than foreseen
            cap <<= 1;
            keys.assign(cap, -1);
            slot_of.resize(cap);
            for (size_t t = 0; t < touched->size(); ++t) {
              uint64_t r =
                  (static_cast<uint64_t>((*touched)[t]) * 0xC2B2AE3D27D4EB4Full) & (cap - 1);
              while (keys[r] != -1) r = (r + 1) & (cap - 1);
              keys[r] = (*touched)[t];
              slot_of[r] = static_cast<int64_t>(t);
            }
            h = (static_cast<uint64_t>(id.row) * 0xC2B2AE3D27D4EB4Full) & (cap - 1);
            while (keys[h] != -1) h = (h + 1) & (cap - 1);
          }
          keys[h] = id.row;
          slot_of[h] = static_cast<int64_t>(touched->size());
          touched->push_back(id.row);
          sums->resize(sums->size() + width, 0.0f);
        }
        float* sum = sums->data() + slot_of[h] * width;
        const float* grad = g + id.sample * width;
        for (int64_t d = 0; d < width; ++d) sum[d] += id.gain * grad[d];
      }
    }
  }

  static int64_t PartOf(int64_t row, int64_t parts) {
    return parts == 1 ? 0
                      : static_cast<int64_t>((static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull) %
                                             static_cast<uint64_t>(parts));
  }

  // Pipelined, the update records each chip's undo log under `log` (the
  // rows it changes, before and after: kernels/sparsecore/pipeline.h); else it drops
  // the table's log.
  static std::vector<absl::Status> Apply(const std::string& op, const SparseCoreOptimizer& opt,
                                         const std::string& log, bool pipelined,
                                         std::vector<ChipArrival>& a) {
    std::vector<const Tensor*> tables;
    for (ChipArrival& x : a) tables.push_back(&InputOf(x)->state[0]);
    std::vector<absl::Status> result(a.size(), SameShards(op, tables));
    if (!result[0].ok()) return result;
    const int64_t width = tables[0]->dim_size(1);
    std::vector<ShardLog> logs(pipelined ? a.size() : 0);
    // The ids as runs of non-decreasing (chip, row), when there are few
    // (the preprocessing's sorted buffers; kernels/sparsecore/row_runs.h).
    // A pipelined update takes the general path, which records the undo log.
    std::vector<IdRun> runs;
    bool sorted = !pipelined;
    for (ChipArrival& x : a) {
      const std::vector<CsrId>& ids = InputOf(x)->ids;
      sorted = sorted && AppendRuns(ids.data(), static_cast<int64_t>(ids.size()),
                                    x.ctx->input(4).flat<float>().data(), &runs);
    }
    for (size_t c = 0; c < a.size(); ++c) {
      GradInput* in = InputOf(a[c]);
      float* w[1 + kMaxSlots] = {};
      for (int k = 0; k <= kSlots && result[c].ok(); ++k) {
        if (kInPlace) {
          w[k] = in->state[k].flat<float>().data();
        } else {
          result[c] = CopyToOutput(a[c].ctx, k, in->state[k], &w[k]);
        }
      }
      if (!result[c].ok()) continue;
      // One part of the rows per intra-op thread: parts update disjoint rows,
      // and a row's gradient is summed in id order whatever the parts.
      ::tsl::thread::ThreadPool* pool = CpuPool(a[c].ctx);
      const int64_t parts = std::max(1, pool->NumThreads());
      int64_t ids = 0;
      for (ChipArrival& x : a) ids += static_cast<int64_t>(InputOf(x)->ids.size());
      const float lr = in->lr;
      std::vector<ShardLog> part_logs(pipelined ? parts : 0);
      if (sorted) {
        // One pass a row range (kernels/sparsecore/row_runs.h); a few more
        // ranges than threads, balanced by ids, so a hot range does not
        // leave a thread idle.
        const int64_t ranges = parts == 1 ? 1 : 4 * parts;
        const std::vector<int64_t> cuts =
            BalancedCuts(runs, static_cast<int64_t>(c), tables[0]->dim_size(0), ranges);
        pool->ParallelFor(ranges, ids * width * 8 / ranges, [&](int64_t begin, int64_t end) {
          thread_local std::vector<float> sum;
          sum.resize(width);
          for (int64_t p = begin; p < end; ++p) {
            SumAndUpdateRows(opt, w, kSlots, runs.data(), static_cast<int>(runs.size()),
                             static_cast<int64_t>(c), cuts[p], cuts[p + 1], width, lr, sum.data());
          }
        });
        continue;
      }
      pool->ParallelFor(parts, ids * width * 4, [&](int64_t begin, int64_t end) {
        thread_local std::vector<int64_t> touched;  // the thread's, as RowSums' map
        thread_local std::vector<float> sums;
        for (int64_t part = begin; part < end; ++part) {
          touched.clear();
          sums.clear();
          RowSums(a, c, width, part, parts, &touched, &sums);
          const int64_t n = static_cast<int64_t>(touched.size());
          if (pipelined) part_logs[part].Copy(w[0], touched.data(), n, width, /*post=*/false);
          UpdateRows(opt, w, kSlots, touched.data(), sums.data(), width, lr, 0, n);
          if (pipelined) part_logs[part].Copy(w[0], touched.data(), n, width, /*post=*/true);
        }
      });
      if (pipelined) {
        logs[c].buffer = w[0];
        logs[c].shape = in->state[0].shape();
        logs[c].width = width;
        for (const ShardLog& p : part_logs) logs[c].Append(p);
      }
    }
    bool all_ok = true;
    for (const absl::Status& s : result) all_ok = all_ok && s.ok();
    // A failed update leaves no log (its lookup reads the tables as they are).
    UndoLogs::Get().Put(log, pipelined && all_ok, std::move(logs));
    if (kInPlace) {
      // Let go of the variables' buffers before any replica's `done`: the
      // next step's update must find them unshared (no copy-on-write).
      for (ChipArrival& x : a) {
        for (Tensor& t : InputOf(x)->state) t = Tensor();
      }
    }
    return result;
  }

  const std::string op_;
  std::string table_;
  SparseCoreOptimizer optimizer_;
  Chips chips_;
  bool pipelined_ = false;
};

template <Opt kOpt>
void RegisterOptimizer() {
  for (const char* form : {"CsrInput", "StaticBufferSize"}) {
    const std::string bare =
        absl::StrCat("XlaSparseDenseMatmulGradWith", sc_opt::NameOf(kOpt), "And", form);
    RegisterBoth<CsrGradOp<kOpt, false>>(bare);
    // Ours only (no TF op of that name).
    RegisterCpuKernel<CsrGradOp<kOpt, true>>(bare + "InPlace", /*core=*/false);
  }
}

bool RegisterKernels() {
  RegisterBoth<CsrLookupOp>("XlaSparseDenseMatmulWithCsrInput");
  RegisterBoth<CsrLookupOp>("XlaSparseDenseMatmulWithStaticBufferSize");
  sc_opt::ForEachOptimizer([](auto opt) { RegisterOptimizer<decltype(opt)::value>(); });
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb
