// The chips of the stand-in SparseCore TPU as the lookup and gradient
// kernels (kernels/sparsecore/matmul_kernels.cc) see them
// (docs/sparsecore_semantics.md §5-§6 and "Multi-chip"): how many chips and
// SparseCores per chip a kernel's CSR buffers address, the ids the buffers
// hold (which chip's shard, which row, which sample), and running a kernel's
// work on one chip at once or at the chips' meeting
// (kernels/sparsecore/rendezvous.h).
#ifndef TF_TPU_EMB_KERNELS_SPARSECORE_CHIPS_H_
#define TF_TPU_EMB_KERNELS_SPARSECORE_CHIPS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/sparsecore.h"
#include "engine/exceptions.h"
#include "kernels/registration.h"
#include "kernels/sparsecore/kernel_util.h"
#include "kernels/sparsecore/rendezvous.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {

namespace sc = ::tf_tpu_emb::sparsecore;

// InvalidArgument naming the op.

// The chips and SparseCores a kernel's CSR buffers address (semantics §5
// and "Multi-chip"): on the stand-in SparseCore TPU (core/sparsecore.h
// ChipSystem) `chips` replicas of the system's SparseCores per chip -- TF
// takes the count from the TPU topology before the attr, and so do ours --
// else one chip of `num_sparsecores_per_device` (the attr; TF requires a
// power of two: without a TPU, its default -1 is TF's error too).
struct Chips {
  int64_t chips = 1;       // replicas of the system (1: the one-chip model)
  int64_t num_sc = 1;      // SparseCores per chip
  int64_t generation = 0;  // the system's (ChipRendezvous counts per generation)
  int64_t shards() const { return chips * num_sc; }
};

inline absl::Status ReadChips(OpKernelConstruction* c, const std::string& op, Chips* out) {
  const sc::ChipSystem system = sc::CurrentChipSystem();
  if (system.replicas > 0) {
    *out = {system.replicas, system.sparsecores_per_chip, system.generation};
    return absl::OkStatus();
  }
  int64_t n;
  TF_RETURN_IF_ERROR(ReadNumSparseCores(c, op, &n));
  *out = {1, n, 0};
  return absl::OkStatus();
}

// One id of the CSR buffers (semantics §5, "Multi-chip"): it adds gain *
// (row `row` of the table shard of chip `chip`) to activations[sample] of the
// replica whose buffers hold it.
struct CsrId {
  CsrId() {}  // left unset: ReadCsr sizes its list first, then writes every field
  int64_t sample, chip, row;
  float gain;
};

// Validates the CSR buffers (inputs 0-3), the minibatch count and the
// replica's local table shard against the model of `chips` and lists the
// ids in buffer order.
inline absl::Status ReadCsr(const std::string& op, OpKernelContext* ctx, const Tensor& table,
                            const Tensor& minibatches_t, const Chips& chips, int64_t batch,
                            std::vector<CsrId>* ids) {
  const int64_t num_sc = chips.num_sc, shards = chips.shards();
  const Tensor& pointers_t = ctx->input(0);
  const Tensor& samples_t = ctx->input(1);
  const Tensor& tokens_t = ctx->input(2);
  const Tensor& gains_t = ctx->input(3);
  TF_RETURN_IF_ERROR(CheckRank(op, "row_pointers", pointers_t, 1));
  TF_RETURN_IF_ERROR(CheckRank(op, "sorted_sample_ids", samples_t, 1));
  TF_RETURN_IF_ERROR(CheckRank(op, "sorted_token_ids", tokens_t, 1));
  TF_RETURN_IF_ERROR(CheckRank(op, "sorted_gains", gains_t, 1));
  TF_RETURN_IF_ERROR(CheckRank(op, "embedding_table", table, 2));
  const int64_t n = samples_t.NumElements();
  if (tokens_t.NumElements() != n || gains_t.NumElements() != n) {
    return Invalid(op, absl::StrCat("sorted_sample_ids (", n, "), sorted_token_ids (",
                                    tokens_t.NumElements(), ") and sorted_gains (",
                                    gains_t.NumElements(), ") must have the same length"));
  }
  if (minibatches_t.dims() != 0) {
    return Invalid(op, absl::StrCat("num_minibatches_per_physical_sparse_core must be scalar, got "
                                    "shape ",
                                    minibatches_t.shape().DebugString()));
  }
  const int64_t m = minibatches_t.scalar<int32_t>()();
  const int64_t group = sc::RoundUp(shards, sc::kXlaPadSize);
  const int64_t num_pointers = pointers_t.NumElements();
  if (m < 1 || m * num_sc * group > num_pointers) {
    return Invalid(op, absl::StrCat("num_minibatches_per_physical_sparse_core = ", m, " needs ",
                                    m * num_sc * group, " row pointers (", num_sc,
                                    " sparse cores, groups of ", group, "), got ", num_pointers));
  }
  if (table.dim_size(0) % num_sc != 0) {
    return Invalid(op, absl::StrCat("the embedding table's ", table.dim_size(0),
                                    " rows do not split into ", num_sc,
                                    " sparse core shards (num_sparsecores_per_device)"));
  }
  const int64_t shard_rows = table.dim_size(0) / num_sc;
  const auto pointers = pointers_t.vec<int32_t>();
  const auto samples = samples_t.vec<int32_t>();
  const auto tokens = tokens_t.vec<int32_t>();
  const auto gains = gains_t.vec<float>();
  // Written through a pointer, field by field (push_back of a struct built
  // on the stack reloaded it through a stalled store forward, and re-read
  // the vector's end every id: most of this function's time).
  ids->resize(n);
  CsrId* out = ids->data();
  for (int64_t k = 0; k < m * num_sc * group; ++k) {
    const int64_t begin = k == 0 ? 0 : sc::RoundUp(pointers(k - 1), sc::kXlaPadSize);
    const int64_t end = pointers(k);
    const std::string segment = sc::CheckCsrSegment(k, begin, end, n);
    if (!segment.empty()) return Invalid(op, segment);
    const int64_t shard = k % group;
    const int64_t sample_sc = k / group / m;
    if (shard >= shards && end > begin) {
      return Invalid(op, absl::StrCat("row_pointers[", k, "]: segment ", shard,
                                      " of its group holds ids, but the system has only ", shards,
                                      " sparse core shards (", chips.chips, " chip(s) of ", num_sc,
                                      ")"));
    }
    const sc::ShardHome home = sc::HomeOfShard(shard, num_sc);
    for (int64_t i = begin; i < end; ++i) {
      const std::string bad = sc::CheckCsrId(i, samples(i), batch, tokens(i), shard_rows);
      if (!bad.empty()) return Invalid(op, bad);
      out->sample = sample_sc * batch + samples(i);
      out->chip = home.chip;
      out->row = home.local_shard * shard_rows + tokens(i);
      out->gain = gains(i);
      ++out;
    }
  }
  ids->resize(out - ids->data());
  return absl::OkStatus();
}

// The table named in a lookup's or gradient's error (TF's `table_name`).
inline absl::Status NameTable(const absl::Status& s, const std::string& table) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(s.message(), " (table '", table, "')"));
}

// Every chip's local table shard has one shape (TF's stacked variable has
// equal shards), checked where the chips meet.
inline absl::Status SameShards(const std::string& op, const std::vector<const Tensor*>& tables) {
  for (size_t k = 1; k < tables.size(); ++k) {
    if (tables[k]->shape() != tables[0]->shape()) {
      return absl::FailedPreconditionError(
          absl::StrCat(op, ": replica ", k, "'s table shard is ", tables[k]->shape().DebugString(),
                       ", replica 0's ", tables[0]->shape().DebugString(),
                       " (every chip holds an equal shard of the stacked table)"));
    }
  }
  return absl::OkStatus();
}

// Runs `work` over the replicas' arrivals: at once for one chip, else at
// the chips' meeting (kernels/sparsecore/rendezvous.h).  `work` gets each
// replica's arrival and returns each one's status.
inline void RunOnChips(OpKernelContext* ctx, AsyncOpKernel::DoneCallback done,
                       const std::string& op, const std::string& table, const Chips& chips,
                       absl::Status status, std::shared_ptr<void> data, ChipRendezvous::Work work) {
  ChipArrival arrival{ctx, std::move(done), NameTable(status, table), std::move(data)};
  if (chips.chips == 1) {
    std::vector<ChipArrival> one{std::move(arrival)};
    absl::Status s = one[0].status;
    if (s.ok()) {
      // The work's own status, unless it threw.
      absl::Status worked;
      const absl::Status caught = CatchExceptions(op, [&] { worked = work(one)[0]; });
      s = caught.ok() ? worked : caught;
    }
    if (!s.ok()) ctx->SetStatus(NameTable(s, table));
    one[0].done();
    return;
  }
  const int replica = DeviceReplica(ctx);
  if (replica < 0 || replica >= chips.chips) {
    ctx->SetStatus(absl::InvalidArgumentError(
        absl::StrCat(op, ": runs on ", ctx->device()->name(),
                     ", which is no replica of the SparseCore TPU "
                     "system's ",
                     chips.chips, " (/device:CPU:0 .. /device:CPU:", chips.chips - 1, ") (table '",
                     table, "')")));
    arrival.done();
    return;
  }
  ChipRendezvous::Get().Arrive(op, table, chips.generation, replica, chips.chips,
                               std::move(arrival), [work, table](std::vector<ChipArrival>& a) {
                                 std::vector<absl::Status> r = work(a);
                                 for (absl::Status& s : r) s = NameTable(s, table);
                                 return r;
                               });
}

}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_SPARSECORE_CHIPS_H_
