// The CSR buffers of jax-tpu-embedding's SparseCore primitives, checked and
// walked id by id (docs/sparsecore_semantics.md §11.1): shared by the FFI
// handlers of jax_ffi/sparsecore_ffi.cc and the fuzz target that drives
// them (fuzz/targets/).  No TensorFlow; XLA's FFI error type.
#ifndef TF_TPU_EMB_JAX_FFI_CSR_WALK_H_
#define TF_TPU_EMB_JAX_FFI_CSR_WALK_H_

#include <cmath>
#include <cstdint>
#include <string>

#include "core/sparsecore.h"
#include "xla/ffi/api/ffi.h"

namespace tf_tpu_emb {
namespace jax_sc {

namespace ffi = ::xla::ffi;

using sparsecore::RoundUp;
inline constexpr int64_t kAlign = sparsecore::kXlaPadSize;  // segments start 8-aligned
inline constexpr int64_t kMaxCount = 1 << 16;               // devices, SparseCores a device

inline ffi::Error Invalid(const std::string& msg) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, msg);
}

inline std::string Str(int64_t v) { return std::to_string(v); }

// One id of the CSR buffers, resolved: the table row (in the table operand,
// or -1 where its shard is not in that operand), the activation row, its gain.
struct Id {
  int64_t row;
  int64_t act_row;
  float gain;
};

// The CSR buffers of `sources` devices concatenated (the lookup reads its
// own device's, sources = 1; the gradient reads every device's, gathered by
// the lowering rule), as jax-tpu-embedding's preprocessing writes them
// (docs/sparsecore_semantics.md §11.1).  Without minibatching: per source
// device, `num_sc` equal slices of the id buffers, one a local SparseCore,
// and `num_sc` equal groups of row pointers; group entry j < global_sc is the
// end (relative to the slice) of the segment of global SparseCore j's shard,
// which starts at the previous end rounded up to 8 (0 for the first);
// entries past global_sc are padding and hold no ids.  With minibatching:
// per source device one id buffer and, for each local SparseCore and each of
// its M = num_minibatches[source] minibatches (SparseCore major), a group of
// RoundUp(global_sc, 8) row pointers counted from the buffer's start, each
// segment starting at the previous pointer rounded up to 8; the groups past
// the M-th are not read.  Embedding ids are local to the shard (row id /
// global_sc), sample ids local to the SparseCore (activation row sc * B +
// sample).
struct CsrWalk {
  const int32_t* row_pointers;
  int64_t row_pointers_size;
  const int32_t* embedding_ids;
  const int32_t* sample_ids;
  const float* gains;
  int64_t ids_size;
  int64_t sources;                           // devices whose buffers are concatenated
  int64_t num_sc;                            // SparseCores per device
  int64_t global_sc;                         // SparseCores in all: shards of a table
  int64_t batch_per_sc;                      // B: samples per SparseCore
  int64_t shard_rows;                        // R: rows of one shard
  int64_t first_shard;                       // global SparseCore of the table operand's first shard
  int64_t table_shards;                      // shards in the table operand
  const int32_t* num_minibatches = nullptr;  // per source; null: no minibatching

  // Calls visit(const Id&) for each id in buffer order (source, local
  // SparseCore, segment, position).  Returns an error, naming the argument,
  // at the first malformed entry; visit is called only for ids checked.
  template <typename Visit>
  ffi::Error Walk(Visit visit) const {
    if (row_pointers_size % (sources * num_sc) != 0) {
      return Invalid("lhs_row_pointers: " + Str(row_pointers_size) +
                     " entries is not a multiple of devices * SparseCores per device (" +
                     Str(sources) + " * " + Str(num_sc) + ")");
    }
    const int64_t id_parts = num_minibatches != nullptr ? sources : sources * num_sc;
    if (ids_size % id_parts != 0) {
      return Invalid("lhs_local_embedding_ids: " + Str(ids_size) +
                     " entries is not a multiple of " + Str(id_parts) +
                     " (devices, times SparseCores per device without minibatching)");
    }
    const bool minibatching = num_minibatches != nullptr;
    const int64_t rp_per_src = row_pointers_size / sources;
    const int64_t group =
        minibatching ? RoundUp(global_sc, kAlign) : row_pointers_size / (sources * num_sc);
    if (group < global_sc) {
      return Invalid("lhs_row_pointers: " + Str(group) +
                     " entries per SparseCore, fewer than the " + Str(global_sc) +
                     " SparseCores that shard the table");
    }
    const int64_t ids_per_src = ids_size / sources;
    const int64_t slice = minibatching ? ids_per_src : ids_size / (sources * num_sc);
    for (int64_t src = 0; src < sources; ++src) {
      int64_t groups_per_sc = 1;
      if (minibatching) {
        groups_per_sc = num_minibatches[src];
        if (groups_per_sc < 1 || num_sc * groups_per_sc * group > rp_per_src) {
          return Invalid("num_minibatches_per_physical_sparse_core: " + Str(groups_per_sc) +
                         " (device " + Str(src) + ") is not in [1, " +
                         Str(rp_per_src / (num_sc * group)) + "], the minibatches that " +
                         Str(rp_per_src) + " row pointers hold");
        }
      }
      int64_t prev = 0;  // with minibatching, pointers run on over the device's groups
      for (int64_t sc = 0; sc < num_sc; ++sc) {
        const int64_t base = minibatching ? src * ids_per_src : (src * num_sc + sc) * slice;
        if (!minibatching) prev = 0;
        for (int64_t k = 0; k < groups_per_sc * group; ++k) {
          const int64_t j = k % group;
          const int64_t rp0 = src * rp_per_src + sc * groups_per_sc * group + (k - j);
          const int64_t end = row_pointers[rp0 + j];
          if (end < prev) {
            return Invalid("lhs_row_pointers[" + Str(rp0 + j) + "] = " + Str(end) +
                           " goes backwards (previous end " + Str(prev) + ")");
          }
          if (end > slice) {
            return Invalid("lhs_row_pointers[" + Str(rp0 + j) + "] = " + Str(end) +
                           " is past the SparseCore's slice of " + Str(slice) + " ids");
          }
          const int64_t start = RoundUp(prev, kAlign);
          if (end > prev && end < start) {
            return Invalid("lhs_row_pointers[" + Str(rp0 + j) + "] = " + Str(end) +
                           " ends inside the alignment after the previous end " + Str(prev) +
                           " (a segment starts at a multiple of 8)");
          }
          prev = end;
          if (end <= start) continue;  // empty segment
          if (j >= global_sc) {
            return Invalid("lhs_row_pointers[" + Str(rp0 + j) + "]: padding entry " + Str(j) +
                           " holds ids (only " + Str(global_sc) + " shards)");
          }
          const int64_t shard = j - first_shard;
          const bool here = shard >= 0 && shard < table_shards;
          for (int64_t p = base + start; p < base + end; ++p) {
            const int64_t id = embedding_ids[p];
            const int64_t sample = sample_ids[p];
            const float gain = gains[p];
            if (id < 0 || id >= shard_rows) {
              return Invalid("lhs_local_embedding_ids[" + Str(p) + "] = " + Str(id) +
                             " is outside the shard's " + Str(shard_rows) + " rows");
            }
            if (sample < 0 || sample >= batch_per_sc) {
              return Invalid("lhs_local_sample_ids[" + Str(p) + "] = " + Str(sample) +
                             " is outside the SparseCore's " + Str(batch_per_sc) + " samples");
            }
            if (!std::isfinite(gain)) {
              return Invalid("lhs_gains[" + Str(p) + "] is " + std::to_string(gain) +
                             " inside a segment (NaN only pads)");
            }
            visit(Id{here ? shard * shard_rows + id : -1,
                     (src * num_sc + sc) * batch_per_sc + sample, gain});
          }
        }
      }
    }
    return ffi::Error::Success();
  }
};

}  // namespace jax_sc
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_JAX_FFI_CSR_WALK_H_
