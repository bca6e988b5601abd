// CPU kernel of XlaSparseDenseMatmulGradWithCsrInput: the SparseCore gradient
// with the optimizer given as the user's function (`custom_computation`).
// It is called once per touched row with the row's gradient [1, width], each
// table's row ([1, cols], or [1] for a vector slot) and each hyper-parameter
// broadcast to [1, width], and returns the N updated rows
// (docs/sparsecore_semantics.md §6; TF's argument layout in
// sparse_core_xla_ops.cc).  Registered as TfTpuEmb>Name and under TF's name.
//
// On the stand-in SparseCore TPU of several chips the replicas' kernels of a
// step meet (kernels/sparsecore/chips.h, semantics §10 "Multi-chip"): chip
// c's shard is updated with the ids of every replica's buffers that lie on
// chip c -- a touched row's gradient is the sum over the global batch, in
// replica order, each one's buffer order -- by the function of chip c's own
// kernel, on chip c's tables and hyper-parameters; its outputs are replica
// c's.  Every input is checked before an output is written; a function that
// fails, or returns other than one float32 row per table, fails the step of
// every replica, naming the op and table.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/registration.h"
#include "kernels/sparsecore/chips.h"
#include "kernels/sparsecore/kernel_util.h"
#include "kernels/sparsecore/pipeline.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {
namespace {

// One replica's checked inputs.
struct CustomInput {
  std::vector<Tensor> tables;
  std::vector<float> hyper;
  std::vector<CsrId> ids;
};

class CsrGradCustomOp : public AsyncOpKernel {
 public:
  explicit CsrGradCustomOp(OpKernelConstruction* c) : AsyncOpKernel(c), op_(BareOpName(c)) {
    const ::tensorflow::NameAttrList* func;
    OP_REQUIRES_OK(c, c->GetAttr("custom_computation", &func));
    func_ = *func;
    OP_REQUIRES_OK(c, c->GetAttr("table_name", &table_));
    ::tensorflow::DataType t;
    OP_REQUIRES_OK(c, c->GetAttr("T", &t));
    OP_REQUIRES(c, t == ::tensorflow::DT_FLOAT,
                absl::UnimplementedError(
                    absl::StrCat(op_, ": only float32 tables are implemented on CPU")));
    OP_REQUIRES_OK(c, ReadChips(c, op_, &chips_));
    // Ours: no undo log for a user's optimizer (semantics "Pipelining").
    OP_REQUIRES(c, !Pipelined(c),
                absl::UnimplementedError(
                    absl::StrCat(op_,
                                 ": pipeline_execution_with_tensor_core with a custom_computation "
                                 "optimizer is not implemented on the CPU stand-in")));
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto in = std::make_shared<CustomInput>();
    absl::Status status;
    const absl::Status caught = CatchExceptions(op_, [&] { status = Check(ctx, in.get()); });
    if (!caught.ok()) status = caught;
    const std::string op = op_;
    const ::tensorflow::NameAttrList func = func_;
    RunOnChips(ctx, std::move(done), op_, table_, chips_, status, in,
               [op, func](std::vector<ChipArrival>& a) { return Apply(op, func, a); });
  }

 private:
  absl::Status Check(OpKernelContext* ctx, CustomInput* in) const {
    OpInputList tables, hypers;
    TF_RETURN_IF_ERROR(ctx->input_list("tables", &tables));
    TF_RETURN_IF_ERROR(ctx->input_list("hyperparameters", &hypers));
    const Tensor& grads = ctx->input(4);
    const Tensor& table = tables[0];
    TF_RETURN_IF_ERROR(CheckRank(op_, "activation_gradients", grads, 2));
    TF_RETURN_IF_ERROR(CheckRank(op_, "tables[0]", table, 2));
    const int64_t rows = table.dim_size(0), width = table.dim_size(1);
    const int64_t batch = grads.dim_size(0), num_sc = chips_.num_sc;
    if (grads.dim_size(1) != width || batch % num_sc != 0) {
      return Invalid(op_, absl::StrCat("activation_gradients ", grads.shape().DebugString(),
                                       " must be [a multiple of ", num_sc, ", ", width, "]"));
    }
    for (int i = 1; i < tables.size(); ++i) {
      if (!((tables[i].dims() == 1 || tables[i].dims() == 2) && tables[i].dim_size(0) == rows)) {
        return Invalid(op_,
                       absl::StrCat("tables[", i, "] has shape ", tables[i].shape().DebugString(),
                                    "; [", rows, "] or [", rows, ", cols] expected"));
      }
    }
    for (int i = 0; i < tables.size(); ++i) in->tables.push_back(tables[i]);
    in->hyper.resize(hypers.size());
    for (int j = 0; j < hypers.size(); ++j) {
      TF_RETURN_IF_ERROR(ScalarValue(op_, "a hyperparameter", hypers[j], &in->hyper[j]));
    }
    return ReadCsr(op_, ctx, table, ctx->input(ctx->num_inputs() - 1), chips_, batch / num_sc,
                   &in->ids);
  }

  static CustomInput* InputOf(ChipArrival& a) { return static_cast<CustomInput*>(a.data.get()); }

  // Chip c's touched rows in order of first id (replicas in order, each
  // one's buffer order) and each one's summed gradient.
  static void RowSums(std::vector<ChipArrival>& a, size_t c, int64_t rows, int64_t width,
                      std::vector<int64_t>* touched, std::vector<float>* sums) {
    std::vector<int64_t> slot_of(rows, -1);
    for (ChipArrival& from : a) {
      const float* g = from.ctx->input(4).flat<float>().data();
      for (const CsrId& id : InputOf(from)->ids) {
        if (id.chip != static_cast<int64_t>(c)) continue;
        int64_t& slot = slot_of[id.row];
        if (slot < 0) {
          slot = static_cast<int64_t>(touched->size());
          touched->push_back(id.row);
          sums->resize(sums->size() + width, 0.0f);
        }
        float* sum = sums->data() + slot * width;
        for (int64_t d = 0; d < width; ++d) sum[d] += id.gain * g[id.sample * width + d];
      }
    }
  }

  // Replica c's outputs: its tables with chip c's touched rows replaced by
  // the function's results.
  static absl::Status UpdateChip(const std::string& op, const ::tensorflow::NameAttrList& func,
                                 std::vector<ChipArrival>& a, size_t c) {
    OpKernelContext* ctx = a[c].ctx;
    CustomInput* in = InputOf(a[c]);
    const int n_tables = static_cast<int>(in->tables.size());
    const int64_t rows = in->tables[0].dim_size(0), width = in->tables[0].dim_size(1);
    std::vector<float*> out(n_tables);
    std::vector<int64_t> cols(n_tables);
    for (int i = 0; i < n_tables; ++i) {
      TF_RETURN_IF_ERROR(CopyToOutput(ctx, i, in->tables[i], &out[i]));
      cols[i] = in->tables[i].dims() == 2 ? in->tables[i].dim_size(1) : 0;
    }
    std::vector<int64_t> touched;
    std::vector<float> sums;
    RowSums(a, c, rows, width, &touched, &sums);
    if (touched.empty()) return absl::OkStatus();

    ::tensorflow::FunctionLibraryRuntime* flr = ctx->function_library();
    if (flr == nullptr) {
      return absl::InternalError(absl::StrCat(op, ": no function library runtime"));
    }
    ::tensorflow::FunctionLibraryRuntime::Handle handle;
    TF_RETURN_IF_ERROR(
        flr->Instantiate(func.name(), ::tensorflow::AttrSlice(&func.attr()), &handle));
    ::tensorflow::FunctionLibraryRuntime::Options opts;
    opts.runner = ctx->runner();
    opts.cancellation_manager = ctx->cancellation_manager();
    opts.rendezvous = ctx->rendezvous();
    // Arguments: gradient, the tables' rows, the hyper-parameters.
    std::vector<Tensor> args;
    args.emplace_back(::tensorflow::DT_FLOAT, TensorShape({1, width}));
    for (int i = 0; i < n_tables; ++i) {
      args.emplace_back(::tensorflow::DT_FLOAT,
                        cols[i] ? TensorShape({1, cols[i]}) : TensorShape({1}));
    }
    for (float h : in->hyper) {
      args.emplace_back(::tensorflow::DT_FLOAT, TensorShape({1, width}));
      std::fill_n(args.back().flat<float>().data(), width, h);
    }
    for (size_t t = 0; t < touched.size(); ++t) {
      const int64_t row = touched[t];
      std::copy_n(sums.data() + t * width, width, args[0].flat<float>().data());
      for (int i = 0; i < n_tables; ++i) {
        const int64_t n = cols[i] ? cols[i] : 1;
        std::copy_n(out[i] + row * n, n, args[1 + i].flat<float>().data());
      }
      std::vector<Tensor> rets;
      TF_RETURN_IF_ERROR(flr->RunSync(opts, handle, args, &rets));
      if (static_cast<int>(rets.size()) != n_tables) {
        return Invalid(op, absl::StrCat("custom_computation returned ", rets.size(),
                                        " tensors for ", n_tables, " tables"));
      }
      for (int i = 0; i < n_tables; ++i) {
        const int64_t n = cols[i] ? cols[i] : 1;
        if (rets[i].dtype() != ::tensorflow::DT_FLOAT || rets[i].NumElements() != n) {
          return Invalid(
              op, absl::StrCat("custom_computation's output ", i, " is ", rets[i].DebugString(),
                               "; ", n, " float32 elements (one row of tables[", i, "]) expected"));
        }
        std::copy_n(rets[i].flat<float>().data(), n, out[i] + row * n);
      }
    }
    return absl::OkStatus();
  }

  static std::vector<absl::Status> Apply(const std::string& op,
                                         const ::tensorflow::NameAttrList& func,
                                         std::vector<ChipArrival>& a) {
    std::vector<const Tensor*> tables;
    for (ChipArrival& x : a) tables.push_back(&InputOf(x)->tables[0]);
    std::vector<absl::Status> result(a.size(), SameShards(op, tables));
    if (!result[0].ok()) return result;
    for (size_t c = 0; c < a.size(); ++c) {
      const absl::Status s = UpdateChip(op, func, a, c);
      if (!s.ok()) {
        // One chip's failure is every replica's: the step's update is one.
        const std::string who = a.size() == 1 ? "" : absl::StrCat(" (chip ", c, ")");
        std::fill(result.begin(), result.end(),
                  absl::Status(s.code(), absl::StrCat(s.message(), who)));
        return result;
      }
    }
    return result;
  }

  const std::string op_;
  std::string table_;
  ::tensorflow::NameAttrList func_;
  Chips chips_;
};

bool RegisterKernels() {
  const std::string bare = "XlaSparseDenseMatmulGradWithCsrInput";
  RegisterCpuKernel<CsrGradCustomOp>(bare, CoreOpRegistered(bare));
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb
