// Helpers of the SparseCore kernels (the lookup and gradient kernels,
// kernels/sparsecore/matmul_kernels.cc and kernels/sparsecore/chips.h; the
// standalone optimizers, kernels/sparsecore/standalone_kernels.cc; the
// custom-combiner ops,
// kernels/sparsecore/custom_combiner_kernels.cc; the COO lookup,
// kernels/sparsecore/coo_matmul_kernel.cc; the preprocessing through
// kernels/sparsecore/preprocess.h): input checks naming the op, registration
// under both names, the SparseCore count, the gradient ops' optimizer attrs
// and row update (docs/sparsecore_semantics.md §6), and calling a `func`
// attr through the function library runtime with its outputs checked.
#ifndef TF_TPU_EMB_KERNELS_SPARSECORE_KERNEL_UTIL_H_
#define TF_TPU_EMB_KERNELS_SPARSECORE_KERNEL_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/cpu_dispatch.h"
#include "core/optimizers.h"
#include "core/sparsecore_optimizers.gen.h"
#include "kernels/registration.h"
#include "tensorflow/core/framework/function.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {

inline absl::Status Invalid(const std::string& op, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

inline absl::Status CheckRank(const std::string& op, const std::string& name, const Tensor& t,
                              int rank) {
  if (t.dims() != rank) {
    return Invalid(op, absl::StrCat(name, " must have rank ", rank, ", got shape ",
                                    t.shape().DebugString()));
  }
  return absl::OkStatus();
}

inline absl::Status CheckShape(const std::string& op, const std::string& name, const Tensor& t,
                               const TensorShape& want) {
  if (t.shape() != want) {
    return Invalid(op, absl::StrCat(name, " has shape ", t.shape().DebugString(), ", ",
                                    want.DebugString(), " expected"));
  }
  return absl::OkStatus();
}

inline absl::Status ScalarValue(const std::string& op, const std::string& name, const Tensor& t,
                                float* out) {
  if (t.NumElements() != 1 || t.dims() > 1) {
    return Invalid(op,
                   absl::StrCat(name, " must be a scalar, got shape ", t.shape().DebugString()));
  }
  *out = t.flat<float>()(0);
  return absl::OkStatus();
}

// A slot (or other same-shaped input) against the embedding table.
inline absl::Status CheckSameShape(const std::string& op, const char* name, const Tensor& t,
                                   const Tensor& table) {
  if (t.shape() != table.shape()) {
    return Invalid(op, absl::StrCat(name, " has shape ", t.shape().DebugString(),
                                    ", the embedding table ", table.shape().DebugString()));
  }
  return absl::OkStatus();
}

// TF takes the SparseCore count from the TPU topology, else from the attr,
// and requires a power of two: without a TPU, -1 is TF's error too (§5).
inline absl::Status ReadNumSparseCores(OpKernelConstruction* c, const std::string& op,
                                       int64_t* out) {
  int64_t n;
  TF_RETURN_IF_ERROR(c->GetAttr("num_sparsecores_per_device", &n));
  if (n <= 0 || n > (int64_t{1} << 20) || (n & (n - 1)) != 0) {
    return Invalid(op, absl::StrCat("num_sparsecores_per_device must be a power of two, but got: ",
                                    n, " (a CPU device has no TPU topology to read it from)"));
  }
  *out = n;
  return absl::OkStatus();
}

// Lookup quantization (a SparseCore feature whose arithmetic TF does not
// publish) is refused rather than guessed (§5).
inline absl::Status RefuseQuantization(OpKernelConstruction* c, const std::string& op) {
  int buckets;
  TF_RETURN_IF_ERROR(c->GetAttr("quantization_config_num_buckets", &buckets));
  if (buckets != 0) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": lookup quantization (quantization_config_num_buckets = ", buckets,
                     ") is not implemented on CPU"));
  }
  return absl::OkStatus();
}

// Copies `in` into a new output `index` of its shape.
inline absl::Status CopyToOutput(OpKernelContext* ctx, int index, const Tensor& in, float** data) {
  Tensor* out;
  TF_RETURN_IF_ERROR(ctx->allocate_output(index, in.shape(), &out));
  if (in.NumElements() > 0) {  // an empty tensor's data may be null
    std::memcpy(out->flat<float>().data(), in.flat<float>().data(),
                sizeof(float) * in.NumElements());
  }
  *data = out->flat<float>().data();
  return absl::OkStatus();
}

// Registers `Kernel` under our prefix and, where this TensorFlow has the
// op, under TF's name (the SparseCore family grew over TF versions).
template <typename Kernel>
void RegisterBoth(const std::string& bare) {
  RegisterCpuKernel<Kernel>(bare, CoreOpRegistered(bare));
}

// ------------------------------------------------ §6 the optimizers

// The SparseCore optimizers: data generated from tf_tpu_emb/optimizer_specs.py
// (core/sparsecore_optimizers.gen.h).
using sc_opt::NumSlotsOf;
using sc_opt::Opt;

// One SparseCore optimizer's hyper-parameters and its row update:
// core/optimizer_formulas.h's formula, then the weight clipping.
struct SparseCoreOptimizer {
  Opt opt = Opt::kSgd;
  sc_opt::Hyper hyper{};
  float clip_min = -std::numeric_limits<float>::infinity();
  float clip_max = std::numeric_limits<float>::infinity();

  // Inlined into a CPU-dispatched caller's clones (core/cpu_dispatch.h).
  // `clip`: false for the standalone optimizers (§7: no clip attrs).
  TF_TPU_EMB_INLINE_INTO_CLONES void Update(const RowArgs& a, bool clip = true) const {
    sc_opt::Update(opt, a, hyper);
    if (!clip) return;
    for (int d = 0; d < a.dim; ++d) a.w[d] = std::min(std::max(a.w[d], clip_min), clip_max);
  }
};

// A hyper-parameter the optimizer refuses at 0 (ours: TF's kernels divide by it).
inline absl::Status CheckNonzeroHypers(const std::string& op, const SparseCoreOptimizer& o) {
  if (const char* zero = sc_opt::ZeroHyper(o.opt, o.hyper)) {
    return Invalid(op, absl::StrCat(zero, " must not be 0"));
  }
  return absl::OkStatus();
}

// Reads each attr a visitor of core/sparsecore_optimizers.gen.h names.
template <typename VisitAttrs>
absl::Status ReadAttrs(OpKernelConstruction* c, const VisitAttrs& visit_attrs) {
  absl::Status status;
  visit_attrs([&](const char* name, auto* value) {
    status = c->GetAttr(name, value);
    return status.ok();
  });
  return status;
}

// The gradient ops' optimizer attrs (TF's names; beta1 is AdagradMomentum's
// momentum), with TF's clip check and ours on the nonzero ones (§6).
inline absl::Status ReadGradAttrs(OpKernelConstruction* c, const std::string& op, Opt o,
                                  SparseCoreOptimizer* out) {
  out->opt = o;
  TF_RETURN_IF_ERROR(c->GetAttr("clip_weight_min", &out->clip_min));
  TF_RETURN_IF_ERROR(c->GetAttr("clip_weight_max", &out->clip_max));
  if (out->clip_min > out->clip_max) {
    return Invalid(op, absl::StrCat("clip_weight_min must be smaller or equal to clip_weight_max "
                                    "but got clip_weight_min as ",
                                    out->clip_min, " and clip_weight_max as ", out->clip_max, "."));
  }
  TF_RETURN_IF_ERROR(
      ReadAttrs(c, [&](auto&& visit) { return sc_opt::VisitGradAttrs(o, &out->hyper, visit); }));
  return CheckNonzeroHypers(op, *out);
}

// ------------------------------------------------ user functions

// A `func` attr of the op, called through the kernel's function library
// runtime (as XlaSparseDenseMatmulGradWithCsrInput's kernel calls its
// custom_computation).  Every output is checked against the expected shapes:
// a wrong count, dtype or shape is InvalidArgument naming the op, the attr
// and the output's index.  Const after Init: a kernel's Computes may run
// concurrently, so each one Prepares its own Call.
class UserFunction {
 public:
  absl::Status Init(OpKernelConstruction* c, const std::string& op, const char* attr) {
    op_ = op;
    attr_ = attr;
    const ::tensorflow::NameAttrList* f;
    TF_RETURN_IF_ERROR(c->GetAttr(attr, &f));
    func_ = *f;
    return absl::OkStatus();
  }

  // The function instantiated for one Compute (the runtime caches it).
  class Call {
   public:
    // Runs it on `args`; its outputs must be float32 of the `want` shapes.
    absl::Status Run(const std::vector<Tensor>& args, const std::vector<TensorShape>& want,
                     std::vector<Tensor>* rets) {
      rets->clear();
      TF_RETURN_IF_ERROR(flr_->RunSync(opts_, handle_, args, rets));
      const std::string& op = fn_->op_;
      if (rets->size() != want.size()) {
        return Invalid(op, absl::StrCat(fn_->attr_, " returned ", rets->size(), " tensors, ",
                                        want.size(), " expected"));
      }
      for (size_t i = 0; i < want.size(); ++i) {
        const Tensor& r = (*rets)[i];
        if (r.dtype() != ::tensorflow::DT_FLOAT || r.shape() != want[i]) {
          return Invalid(op, absl::StrCat(fn_->attr_, "'s output ", i, " is ",
                                          ::tensorflow::DataTypeString(r.dtype()), " ",
                                          r.shape().DebugString(), "; float ",
                                          want[i].DebugString(), " expected"));
        }
      }
      return absl::OkStatus();
    }

   private:
    friend class UserFunction;
    const UserFunction* fn_ = nullptr;
    ::tensorflow::FunctionLibraryRuntime* flr_ = nullptr;
    ::tensorflow::FunctionLibraryRuntime::Handle handle_{};
    ::tensorflow::FunctionLibraryRuntime::Options opts_;
  };

  absl::Status Prepare(OpKernelContext* ctx, Call* call) const {
    call->fn_ = this;
    call->flr_ = ctx->function_library();
    if (call->flr_ == nullptr) {
      return absl::InternalError(absl::StrCat(op_, ": no function library runtime"));
    }
    TF_RETURN_IF_ERROR(call->flr_->Instantiate(func_.name(), ::tensorflow::AttrSlice(&func_.attr()),
                                               &call->handle_));
    call->opts_.runner = ctx->runner();
    call->opts_.cancellation_manager = ctx->cancellation_manager();
    call->opts_.rendezvous = ctx->rendezvous();
    return absl::OkStatus();
  }

 private:
  std::string op_;
  const char* attr_ = "";
  ::tensorflow::NameAttrList func_;
};

}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_SPARSECORE_KERNEL_UTIL_H_
