// One-step-old lookups of `pipeline_execution_with_tensor_core=True` on the
// stand-in SparseCore TPU (docs/sparsecore_semantics.md "Pipelining"):
// the lookup of step N+1 does not see the update of step N, the lookup of
// step N+2 does -- the V1 engine's rule (docs/engine.md "Training steps":
// the update waits for every replica's next lookup).
//
// TF marks the lookup and gradient ops that TPUEmbeddingV2 makes with the
// flag set with the node attr `_embedding_pipelining` ("forward" in the
// lookup, "backward" in apply_gradients; "forward_sequential" /
// "backward_sequential" where TF turns pipelining off: summary recording,
// SequentialEmbeddingContext); without the flag there is no attr.  Our
// kernels read it (Pipelined below), so the flag reaches them per op.
//
// The tables stay up to date (checkpoints, `embedding_tables` and the
// update itself read them as they are).  A pipelined update records, per
// chip's shard of the stacked table, the rows it changed with their values
// before and after (an undo log); the next lookup of that table reads those
// rows from the log's "before" values, so it sees the tables as they were
// before that update, and drops the log (the lookup after it sees the update,
// with or without a new update between).  A row whose value is no longer the
// log's "after" (assigned or restored since), or a shard whose buffer or
// shape changed (another variable: a fresh object with the same stacked
// table names), is read as it is.  An update that is not pipelined drops the
// table's log.
#ifndef TF_TPU_EMB_KERNELS_SPARSECORE_PIPELINE_H_
#define TF_TPU_EMB_KERNELS_SPARSECORE_PIPELINE_H_

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/sparsecore/chips.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {

using ::tensorflow::OpKernelConstruction;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

// TF's node attr (tensorflow/python/tpu/tpu_embedding_v3.py
// EmbeddingPipeliningContext): "forward" / "backward" when the op is
// pipelined.
inline bool Pipelined(OpKernelConstruction* c) {
  if (!c->HasAttr("_embedding_pipelining")) return false;
  std::string mode;
  if (!c->GetAttr("_embedding_pipelining", &mode).ok()) return false;
  return mode == "forward" || mode == "backward";
}

// One chip's shard of the undo log: the rows an update changed, each with
// its `width` values before and after it.
struct ShardLog {
  const void* buffer = nullptr;  // the shard's buffer after the update
  TensorShape shape;
  int64_t width = 0;
  std::vector<int64_t> rows;
  std::vector<float> before, after;

  // Appends rows touched[0..n) of `table` (before the update: their rows and
  // values; `after` false) or their values after it (`after` true).
  void Copy(const float* table, const int64_t* touched, int64_t n, int64_t w, bool post) {
    width = w;
    std::vector<float>& to = post ? after : before;
    if (!post) rows.insert(rows.end(), touched, touched + n);
    const size_t at = to.size();
    to.resize(at + static_cast<size_t>(n * w));
    for (int64_t t = 0; t < n; ++t) {
      std::memcpy(to.data() + at + t * w, table + touched[t] * w, sizeof(float) * w);
    }
  }

  // Appends `part` (another part of the same shard's rows).
  void Append(const ShardLog& part) {
    width = part.width;
    rows.insert(rows.end(), part.rows.begin(), part.rows.end());
    before.insert(before.end(), part.before.begin(), part.before.end());
    after.insert(after.end(), part.after.begin(), part.after.end());
  }
};

// The undo logs, per stacked table (and system generation): each chip's.
class UndoLogs {
 public:
  static UndoLogs& Get() {
    static UndoLogs* logs = new UndoLogs();  // lives as long as the process
    return *logs;
  }

  static std::string Key(const std::string& table, int64_t generation) {
    return absl::StrCat(table, "\n", generation);
  }

  // An update: its logs replace the table's (pipelined), or the table has
  // none (not pipelined).
  void Put(const std::string& key, bool pipelined, std::vector<ShardLog> logs) {
    std::lock_guard<std::mutex> lock(mu_);
    if (pipelined) {
      logs_[key] = std::move(logs);
    } else {
      logs_.erase(key);
    }
  }

  // A lookup: the table's logs, taken (the next lookup sees the update).
  std::vector<ShardLog> Take(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = logs_.find(key);
    if (it == logs_.end()) return {};
    std::vector<ShardLog> out = std::move(it->second);
    logs_.erase(it);
    return out;
  }

 private:
  UndoLogs() = default;
  std::mutex mu_;
  std::map<std::string, std::vector<ShardLog>> logs_;
};

// What a pipelined lookup reads: the chips' shards and, as chips
// [chips, 2 * chips), the logs' "before" rows; ids of logged rows are
// redirected there.
class LookupView {
 public:
  // Takes the table's log; `tables[c]` is chip c's shard as the lookup reads it.
  LookupView(const std::string& key, const std::vector<const Tensor*>& tables)
      : logs_(UndoLogs::Get().Take(key)), slot_of_(tables.size()) {
    if (logs_.size() != tables.size()) return;  // none (or another system's)
    for (size_t c = 0; c < tables.size(); ++c) {
      const ShardLog& log = logs_[c];
      const Tensor& t = *tables[c];
      if (log.rows.empty() || t.shape() != log.shape || t.dims() != 2 ||
          t.dim_size(1) != log.width || t.tensor_data().data() != log.buffer ||
          log.before.size() != log.rows.size() * log.width ||
          log.after.size() != log.before.size()) {
        continue;
      }
      const float* now = t.flat<float>().data();
      for (size_t s = 0; s < log.rows.size(); ++s) {
        const int64_t row = log.rows[s];
        if (row < 0 || row >= t.dim_size(0)) continue;
        if (std::memcmp(now + row * log.width, log.after.data() + s * log.width,
                        sizeof(float) * log.width) == 0) {
          slot_of_[c][row] = static_cast<int64_t>(s);
          any_ = true;
        }
      }
    }
  }

  bool empty() const { return !any_; }

  // The shards to gather from: the chips', then the logs' "before" rows.
  std::vector<const float*> Shards(std::vector<const float*> shards) const {
    const size_t chips = shards.size();
    for (size_t c = 0; c < chips; ++c) {
      shards.push_back(c < logs_.size() ? logs_[c].before.data() : nullptr);
    }
    return shards;
  }

  // `ids` with each id of a logged row redirected to its "before" values.
  std::vector<CsrId> Redirect(const std::vector<CsrId>& ids) const {
    std::vector<CsrId> out = ids;
    const int64_t chips = static_cast<int64_t>(slot_of_.size());
    for (CsrId& id : out) {
      if (id.chip < 0 || id.chip >= chips) continue;
      const auto& slots = slot_of_[id.chip];
      auto it = slots.find(id.row);
      if (it == slots.end()) continue;
      id.row = it->second;
      id.chip += chips;
    }
    return out;
  }

 private:
  std::vector<ShardLog> logs_;
  std::vector<std::unordered_map<int64_t, int64_t>> slot_of_;  // per chip: row -> log slot
  bool any_ = false;
};

}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_SPARSECORE_PIPELINE_H_
