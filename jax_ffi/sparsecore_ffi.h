// The implementations behind jax_ffi/sparsecore_ffi.cc's XLA FFI handlers
// (TfTpuEmbScLookup, TfTpuEmbScGrad, TfTpuEmbScRowGrads), declared for the
// fuzz target that calls them as XLA's decoding does (fuzz/targets/): the
// buffers are ffi::Buffer views of XLA_FFI_Buffer structs, the thread pool
// comes from ffi::CtxDecoding<ffi::ThreadPool>::Decode.  Each checks every
// argument before it reads it and answers bad input with InvalidArgument
// naming the argument (docs/sparsecore_semantics.md §11).
#ifndef TF_TPU_EMB_JAX_FFI_SPARSECORE_FFI_H_
#define TF_TPU_EMB_JAX_FFI_SPARSECORE_FFI_H_

#include <cstdint>
#include <string_view>

#include "xla/ffi/api/ffi.h"

namespace tf_tpu_emb {
namespace jax_sc {

// The lookup (sparse_dense_matmul_csr).
::xla::ffi::Error LookupImpl(
    ::xla::ffi::Buffer<::xla::ffi::S32> rp, ::xla::ffi::Buffer<::xla::ffi::S32> ids,
    ::xla::ffi::Buffer<::xla::ffi::S32> samples, ::xla::ffi::Buffer<::xla::ffi::F32> gains,
    ::xla::ffi::Buffer<::xla::ffi::S32> num_minibatches, ::xla::ffi::Buffer<::xla::ffi::F32> table,
    ::xla::ffi::ResultBuffer<::xla::ffi::F32> out, int64_t num_sc, int64_t num_devices,
    bool minibatching, ::xla::ffi::ThreadPool thread_pool);

// The gradient and update of a built-in optimizer
// (sparse_dense_matmul_grad_with_<optimizer>): args are the table, its
// slots and the hyper-parameters; rets the table and its slots.
::xla::ffi::Error GradImpl(
    ::xla::ffi::Buffer<::xla::ffi::S32> rp, ::xla::ffi::Buffer<::xla::ffi::S32> ids,
    ::xla::ffi::Buffer<::xla::ffi::S32> samples, ::xla::ffi::Buffer<::xla::ffi::F32> gains,
    ::xla::ffi::Buffer<::xla::ffi::S32> num_minibatches,
    ::xla::ffi::Buffer<::xla::ffi::F32> act_grad, ::xla::ffi::Buffer<::xla::ffi::S32> shard_offset,
    ::xla::ffi::RemainingArgs args, ::xla::ffi::RemainingRets rets, std::string_view optimizer,
    int64_t num_sc, int64_t num_devices, int64_t sources, bool clip_min, float min_value,
    bool clip_max, float max_value, bool multiply_linear_by_lr, bool minibatching,
    ::xla::ffi::ThreadPool thread_pool);

// The touched rows and their gradients, for the custom optimizer's update
// (evaluated by the lowering rule through JAX).
::xla::ffi::Error RowGradsImpl(
    ::xla::ffi::Buffer<::xla::ffi::S32> rp, ::xla::ffi::Buffer<::xla::ffi::S32> ids,
    ::xla::ffi::Buffer<::xla::ffi::S32> samples, ::xla::ffi::Buffer<::xla::ffi::F32> gains,
    ::xla::ffi::Buffer<::xla::ffi::S32> num_minibatches,
    ::xla::ffi::Buffer<::xla::ffi::F32> act_grad, ::xla::ffi::Buffer<::xla::ffi::S32> shard_offset,
    ::xla::ffi::Buffer<::xla::ffi::F32> table, ::xla::ffi::ResultBuffer<::xla::ffi::S32> rows,
    ::xla::ffi::ResultBuffer<::xla::ffi::S32> count,
    ::xla::ffi::ResultBuffer<::xla::ffi::F32> grads, int64_t num_sc, int64_t num_devices,
    int64_t sources, bool minibatching, ::xla::ffi::ThreadPool thread_pool);

}  // namespace jax_sc
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_JAX_FFI_SPARSECORE_FFI_H_
