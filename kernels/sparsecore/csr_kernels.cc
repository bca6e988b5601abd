// CPU kernels of the SparseCore CSR preprocessing (TPUEmbeddingV2): the
// padded CSR buffers (ConvertToSparseCoreCsrWrappedCooTensor), the
// minibatching path (GetMinibatchSplitsWithPhysicalReplica,
// GetMinibatchesInCsrWithPhysicalReplica, StoreMinibatchStatisticsInFdo),
// GlobalIterId and the dynamic-shape copies of the CSR buffers.  Registered
// as TfTpuEmb>Name and under TF's name (TF's CPU wheel has no kernel for
// them).  The CSR and minibatching kernels read their attrs and call their
// computations (kernels/sparsecore/preprocess.h,
// kernels/sparsecore/csr_preprocess.cc); what each computes:
// docs/sparsecore_semantics.md §3-§4, §8.  Every input is checked before
// anything is written: a bad one is InvalidArgument naming the op and the
// offending index, never an out-of-bounds access.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/registration.h"
#include "kernels/sparsecore/preprocess.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {
namespace {

// ------------------------------------------------------------ §3-§4

// The attrs both CSR ops share (CsrAttrs::Init).
absl::Status ReadCsrAttrs(OpKernelConstruction* c, const std::string& op, bool per_sc,
                          CsrAttrs* a) {
  std::string table;
  int num_replica, sample_count, max_minibatches, per_sample, num_sc;
  TF_RETURN_IF_ERROR(c->GetAttr("table_name", &table));
  TF_RETURN_IF_ERROR(c->GetAttr("num_replica", &num_replica));
  TF_RETURN_IF_ERROR(c->GetAttr(per_sc ? "sample_count_per_sc" : "sample_count", &sample_count));
  TF_RETURN_IF_ERROR(c->GetAttr("max_minibatches_per_sc", &max_minibatches));
  TF_RETURN_IF_ERROR(c->GetAttr("max_ids_per_chip_per_sample", &per_sample));
  TF_RETURN_IF_ERROR(c->GetAttr("num_sc_per_chip", &num_sc));
  return a->Init(op, per_sc, std::move(table), num_replica, sample_count, max_minibatches,
                 per_sample, num_sc);
}

class ConvertToSparseCoreCsrWrappedCooTensorOp : public OpKernel {
 public:
  explicit ConvertToSparseCoreCsrWrappedCooTensorOp(OpKernelConstruction* c)
      : OpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, ReadCsrAttrs(c, op_, /*per_sc=*/true, &a_));
    OP_REQUIRES_OK(c, c->GetAttr("allow_id_dropping", &allow_dropping_));
  }

  void Compute(OpKernelContext* ctx) override {
    std::vector<std::vector<Tensor>> lists(4);
    const char* names[] = {"sorted_row_ids_list", "sorted_col_ids_list", "sorted_gains_list",
                           "id_counts_list"};
    for (int k = 0; k < 4; ++k) {
      OpInputList list;
      OP_REQUIRES_OK(ctx, ctx->input_list(names[k], &list));
      for (int i = 0; i < list.size(); ++i) lists[k].push_back(list[i]);
    }
    PreprocessContext pc = KernelPreprocessContext(ctx);
    OP_REQUIRES_OK(ctx, ConvertToCsrWrappedCoo(op_, a_, allow_dropping_, lists[0], lists[1],
                                               lists[2], lists[3], ctx->input(4 * a_.num_sc), pc));
  }

 private:
  const std::string op_;
  CsrAttrs a_;
  bool allow_dropping_ = false;
};

// GetMinibatchSplitsWithPhysicalReplica: the whole chip's COO tensors (rows
// ascending) sorted per SparseCore into the 64 id-space divisions of each
// physical replica.  On a TPU the per-partition limits come from the FDO
// store by program_key and decide the splits; a CPU has no such limit
// (semantics §4): no split is needed, nothing is dropped, splits is 0.
class GetMinibatchSplitsWithPhysicalReplicaOp : public OpKernel {
 public:
  explicit GetMinibatchSplitsWithPhysicalReplicaOp(OpKernelConstruction* c)
      : OpKernel(c), op_(BareOpName(c)) {
    int sample_count, num_replica, vocab, num_sc;
    OP_REQUIRES_OK(c, c->GetAttr("sample_count", &sample_count));
    OP_REQUIRES_OK(c, c->GetAttr("num_replica", &num_replica));
    OP_REQUIRES_OK(c, c->GetAttr("table_vocab_size", &vocab));
    OP_REQUIRES_OK(c, c->GetAttr("num_sc_per_chip", &num_sc));
    OP_REQUIRES_OK(c, a_.Init(op_, sample_count, num_replica, vocab, num_sc));
  }

  void Compute(OpKernelContext* ctx) override {
    PreprocessContext pc = KernelPreprocessContext(ctx);
    OP_REQUIRES_OK(ctx,
                   GetMinibatchSplits(op_, a_, ctx->input(1), ctx->input(2), ctx->input(3), pc));
  }

 private:
  const std::string op_;
  MinibatchSplitsAttrs a_;
};

// GetMinibatchesInCsrWithPhysicalReplica: the CSR buffers (semantics §3)
// of GetMinibatchSplitsWithPhysicalReplica's output, its minibatches cut at
// `splits` (0 on CPU, or any caller's).  Ids that do not fit are an error,
// never dropped (TF drops them only under its flag
// tf_xla_sparse_core_allow_id_dropping_for_minibatching).
class GetMinibatchesInCsrWithPhysicalReplicaOp : public OpKernel {
 public:
  explicit GetMinibatchesInCsrWithPhysicalReplicaOp(OpKernelConstruction* c)
      : OpKernel(c), op_(BareOpName(c)) {
    OP_REQUIRES_OK(c, ReadCsrAttrs(c, op_, /*per_sc=*/false, &a_));
  }

  void Compute(OpKernelContext* ctx) override {
    PreprocessContext pc = KernelPreprocessContext(ctx);
    OP_REQUIRES_OK(ctx, GetMinibatchesInCsr(op_, a_, ctx->input(1), ctx->input(2), ctx->input(3),
                                            ctx->input(4), ctx->input(5), pc));
  }

 private:
  const std::string op_;
  CsrAttrs a_;
};

// StoreMinibatchStatisticsInFdo: on a TPU, records max_ids/max_uniques in
// the FDO store of the program; a CPU has none (semantics §4): it checks
// its inputs are scalars and records nothing.
class StoreMinibatchStatisticsInFdoOp : public OpKernel {
 public:
  explicit StoreMinibatchStatisticsInFdoOp(OpKernelConstruction* c)
      : OpKernel(c), op_(BareOpName(c)) {
    int sample_count, num_sc;
    OP_REQUIRES_OK(c, c->GetAttr("sample_count", &sample_count));
    OP_REQUIRES_OK(c, c->GetAttr("num_sc_per_chip", &num_sc));
    OP_REQUIRES_OK(c, CheckSampleCount(op_, sample_count, num_sc));
  }

  void Compute(OpKernelContext* ctx) override {
    for (int i : {1, 2}) {
      TTE_SC_CHECK(ctx, ctx->input(i).NumElements() == 1,
                   Invalid(op_, absl::StrCat(i == 1 ? "max_ids" : "max_uniques",
                                             " must be a scalar, got shape ",
                                             ctx->input(i).shape().DebugString())));
    }
  }

 private:
  const std::string op_;
};

// ------------------------------------------------------------------ §8 other

class GlobalIterIdOp : public OpKernel {
 public:
  explicit GlobalIterIdOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    Tensor* out;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int64_t>()() = ctx->frame_iter().iter_id;
  }
};

// TPUCopyWithDynamicShape / TPUAnnotateTensorsWithDynamicShape: on a TPU
// the device copy of the CSR buffers with their unpadded sizes as dynamic
// first dimensions; on CPU the tensors themselves (their static, padded
// shapes stay what the shape function said; the CSR kernels read only up to
// the row pointers).  Each unpadded size must be a scalar within its
// tensor's first dimension (semantics §8).
class DynamicShapeCopyOp : public OpKernel {
 public:
  explicit DynamicShapeCopyOp(OpKernelConstruction* c) : OpKernel(c), op_(BareOpName(c)) {
    if (c->HasAttr("N")) OP_REQUIRES_OK(c, c->GetAttr("N", &num_sizes_));
  }

  void Compute(OpKernelContext* ctx) override {
    const int num_tensors = ctx->num_inputs() - num_sizes_;
    for (int i = 0; i < num_sizes_; ++i) {
      const Tensor& size = ctx->input(num_tensors + i);
      TTE_SC_CHECK(ctx, size.dims() == 0,
                   Invalid(op_, absl::StrCat("unpadded_sizes[", i, "] must be a scalar, got shape ",
                                             size.shape().DebugString())));
      if (i >= num_tensors) continue;
      const Tensor& t = ctx->input(i);
      const int64_t bound = t.dims() == 0 ? 1 : t.dim_size(0);
      const int32_t n = size.scalar<int32_t>()();
      TTE_SC_CHECK(ctx, n >= 0 && n <= bound,
                   Invalid(op_,
                           absl::StrCat("unpadded_sizes[", i, "] = ", n, " is outside [0, ", bound,
                                        "] (the first dimension of tensors[", i, "])")));
    }
    for (int i = 0; i < num_tensors; ++i) ctx->set_output(i, ctx->input(i));
  }

 private:
  const std::string op_;
  int num_sizes_ = 0;
};

bool RegisterKernels() {
  RegisterBoth<ConvertToSparseCoreCsrWrappedCooTensorOp>("ConvertToSparseCoreCsrWrappedCooTensor");
  RegisterBoth<GetMinibatchSplitsWithPhysicalReplicaOp>("GetMinibatchSplitsWithPhysicalReplica");
  RegisterBoth<GetMinibatchesInCsrWithPhysicalReplicaOp>("GetMinibatchesInCsrWithPhysicalReplica");
  RegisterBoth<StoreMinibatchStatisticsInFdoOp>("StoreMinibatchStatisticsInFdo");
  RegisterBoth<GlobalIterIdOp>("GlobalIterId");
  RegisterBoth<DynamicShapeCopyOp>("TPUCopyWithDynamicShape");
  RegisterBoth<DynamicShapeCopyOp>("TPUAnnotateTensorsWithDynamicShape");
  return true;
}

[[maybe_unused]] const bool kKernelsRegistered = RegisterKernels();

}  // namespace
}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb
