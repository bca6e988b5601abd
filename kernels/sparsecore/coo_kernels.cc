// CPU kernels of the SparseCore COO preprocessing (TPUEmbeddingV2): the
// COO conversion of a feature's batch (ConvertToCooTensor,
// ConvertToListOfSparseCoreCooTensors) and the per-SparseCore sort and its
// statistics (SortListOfSparseCoreCooTensors,
// GetStatsFromListOfSparseCoreCooTensors).  Registered as TfTpuEmb>Name and
// under TF's name (TF's CPU wheel has no kernel for them).  Each reads its
// attrs and calls its computation (kernels/sparsecore/preprocess.h,
// kernels/sparsecore/coo_preprocess.cc; docs/sparsecore_semantics.md
// §1-§2) on its inputs, its intra-op threads and its outputs.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/sparsecore.h"
#include "kernels/registration.h"
#include "kernels/sparsecore/preprocess.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {
namespace {

namespace sc = ::tf_tpu_emb::sparsecore;

absl::Status ReadCombiner(OpKernelConstruction* c, const std::string& op, sc::Combiner* out) {
  std::string name;
  TF_RETURN_IF_ERROR(c->GetAttr("combiner", &name));
  return ParseCombinerAttr(op, name, out);
}

// An input list as the computations take it.
std::vector<Tensor> InputList(OpKernelContext* ctx, const char* name, absl::Status* status) {
  OpInputList list;
  std::vector<Tensor> out;
  *status = ctx->input_list(name, &list);
  if (!status->ok()) return out;
  for (int i = 0; i < list.size(); ++i) out.push_back(list[i]);
  return out;
}

class ConvertToCooTensorOp : public OpKernel {
 public:
  explicit ConvertToCooTensorOp(OpKernelConstruction* c) : OpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, c->GetAttr("sample_count", &a_.sample_count));
    OP_REQUIRES_OK(c, ReadCombiner(c, op_, &a_.combiner));
  }

  void Compute(OpKernelContext* ctx) override {
    PreprocessContext pc = KernelPreprocessContext(ctx);
    OP_REQUIRES_OK(ctx, ConvertToCoo(op_, a_, ctx->input(0), ctx->input(1), ctx->input(2), pc));
  }

 private:
  const std::string op_;
  CooAttrs a_;
};

class ConvertToListOfSparseCoreCooTensorsOp : public OpKernel {
 public:
  explicit ConvertToListOfSparseCoreCooTensorsOp(OpKernelConstruction* c)
      : OpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, c->GetAttr("sample_count", &a_.sample_count));
    OP_REQUIRES_OK(c, c->GetAttr("num_sc_per_chip", &a_.num_sc));
    OP_REQUIRES_OK(c, c->GetAttr("row_offset", &a_.row_offset));
    OP_REQUIRES_OK(c, c->GetAttr("col_offset", &a_.col_offset));
    OP_REQUIRES_OK(c, c->GetAttr("col_shift", &a_.col_shift));
    OP_REQUIRES_OK(c, c->GetAttr("num_sc_shards", &a_.num_sc_shards));
    OP_REQUIRES_OK(c, c->GetAttr("stacked_table_sample_count", &a_.stacked_sample_count));
    OP_REQUIRES_OK(c, ReadCombiner(c, op_, &a_.combiner));
    OP_REQUIRES_OK(c, a_.CheckList(op_));
  }

  void Compute(OpKernelContext* ctx) override {
    PreprocessContext pc = KernelPreprocessContext(ctx);
    OP_REQUIRES_OK(ctx, ConvertToCooList(op_, a_, ctx->input(0), ctx->input(1), ctx->input(2), pc));
  }

 private:
  const std::string op_;
  CooAttrs a_;
};

// §2's attrs, shared by the sort and the statistics.
absl::Status InitSortedList(OpKernelConstruction* c, SortedList* list) {
  int n, num_replica, num_sc;
  std::vector<int32_t> sample_counts, col_offsets;
  TF_RETURN_IF_ERROR(c->GetAttr("N", &n));
  TF_RETURN_IF_ERROR(c->GetAttr("sample_count_list", &sample_counts));
  TF_RETURN_IF_ERROR(c->GetAttr("col_offset_list", &col_offsets));
  TF_RETURN_IF_ERROR(c->GetAttr("num_replica", &num_replica));
  TF_RETURN_IF_ERROR(c->GetAttr("num_sc_per_chip", &num_sc));
  return list->Init(BareOpName(c), n, std::move(sample_counts), std::move(col_offsets), num_replica,
                    num_sc);
}

// The N features' lists, inputs row_ids_list, col_ids_list, gains_list.
absl::Status FeatureLists(OpKernelContext* ctx, std::vector<Tensor>* rows,
                          std::vector<Tensor>* cols, std::vector<Tensor>* gains) {
  absl::Status status;
  *rows = InputList(ctx, "row_ids_list", &status);
  TF_RETURN_IF_ERROR(status);
  *cols = InputList(ctx, "col_ids_list", &status);
  TF_RETURN_IF_ERROR(status);
  *gains = InputList(ctx, "gains_list", &status);
  return status;
}

class GetStatsFromListOfSparseCoreCooTensorsOp : public OpKernel {
 public:
  explicit GetStatsFromListOfSparseCoreCooTensorsOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, InitSortedList(c, &list_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<Tensor> rows, cols, gains;
    OP_REQUIRES_OK(ctx, FeatureLists(ctx, &rows, &cols, &gains));
    PreprocessContext pc = KernelPreprocessContext(ctx);
    OP_REQUIRES_OK(ctx, GetStatsFromCooList(list_, rows, cols, gains, pc));
  }

 private:
  SortedList list_;
};

class SortListOfSparseCoreCooTensorsOp : public OpKernel {
 public:
  explicit SortListOfSparseCoreCooTensorsOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, InitSortedList(c, &list_));
    OP_REQUIRES_OK(c, c->GetAttr("table_name", &table_));
    OP_REQUIRES_OK(c, c->GetAttr("max_ids_per_sparse_core", &max_ids_));
    OP_REQUIRES_OK(c, c->GetAttr("max_unique_ids_per_sparse_core", &max_uniques_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<Tensor> rows, cols, gains;
    OP_REQUIRES_OK(ctx, FeatureLists(ctx, &rows, &cols, &gains));
    PreprocessContext pc = KernelPreprocessContext(ctx);
    OP_REQUIRES_OK(ctx, SortCooList(list_, table_, max_ids_, max_uniques_, rows, cols, gains, pc));
  }

 private:
  SortedList list_;
  std::string table_;
  int max_ids_ = 1, max_uniques_ = 1;
};

bool RegisterKernels() {
  RegisterBoth<ConvertToCooTensorOp>("ConvertToCooTensor");
  RegisterBoth<ConvertToListOfSparseCoreCooTensorsOp>("ConvertToListOfSparseCoreCooTensors");
  RegisterBoth<SortListOfSparseCoreCooTensorsOp>("SortListOfSparseCoreCooTensors");
  RegisterBoth<GetStatsFromListOfSparseCoreCooTensorsOp>("GetStatsFromListOfSparseCoreCooTensors");
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb
