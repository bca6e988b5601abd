#include "engine/table.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/huge_pages.h"

namespace tf_tpu_emb {

FloatBuffer::~FloatBuffer() { huge_pages::Free(data_); }

absl::Status FloatBuffer::Allocate(int64_t num_floats, float fill, bool bf16) {
  const int64_t element = bf16 ? 2 : 4;
  int64_t bytes;
  size_t rounded;
  if (num_floats < 0 || !CheckedMul(std::max<int64_t>(num_floats, 1), element, &bytes) ||
      !huge_pages::RoundUp(static_cast<size_t>(bytes), &rounded)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", num_floats,
                     " floats for an embedding table: the byte count "
                     "overflows int64"));
  }
  // Huge pages for a large buffer, plain memory for a small one
  // (core/huge_pages.h: a huge page each would cost 2 MiB a small table).
  void* p = huge_pages::AllocateRows(static_cast<size_t>(bytes));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes for an embedding table"));
  }
  data_ = p;
  bf16_ = bf16;
  if (bf16) std::fill(half(), half() + num_floats, RoundNearestEven(fill));
  else std::fill(data(), data() + num_floats, fill);
  return absl::OkStatus();
}

absl::Status ReadStorageFromEnvironment(std::vector<Table>* tables) {
  const char* env = std::getenv("TF_TPU_EMB_STORAGE");
  const std::string setting = env == nullptr ? "" : env;
  if (setting.empty()) {
    for (Table& t : *tables) t.bf16 = false;
    return absl::OkStatus();
  }
  auto invalid = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("TF_TPU_EMB_STORAGE='", setting, "': ", why,
                     " (expected a comma list of fp32 / bf16 / TABLE=fp32 / TABLE=bf16)"));
  };
  auto kind = [](const std::string& k, bool* bf16) {
    if (k != "fp32" && k != "bf16") return false;
    *bf16 = k == "bf16";
    return true;
  };
  bool all_bf16 = false;
  std::map<std::string, bool> per_table;
  for (absl::string_view piece : absl::StrSplit(setting, ',')) {
    const std::string entry(piece);
    if (entry.empty()) return invalid("empty entry");
    const size_t eq = entry.find('=');
    bool bf16;
    if (eq == std::string::npos) {
      if (!kind(entry, &bf16)) return invalid(absl::StrCat("unknown storage '", entry, "'"));
      all_bf16 = bf16;
      continue;
    }
    const std::string name = entry.substr(0, eq), k = entry.substr(eq + 1);
    if (!kind(k, &bf16)) {
      return invalid(absl::StrCat("unknown storage '", k, "' for table '", name, "'"));
    }
    if (!per_table.emplace(name, bf16).second) {
      return invalid(absl::StrCat("names table '", name, "' twice"));
    }
  }
  for (const auto& entry : per_table) {
    // Not a structured binding: C++17 lambdas cannot capture one (clang).
    const std::string& name = entry.first;
    if (std::none_of(tables->begin(), tables->end(),
                     [&](const Table& t) { return t.name == name; })) {
      return invalid(
          absl::StrCat("names table '", name, "', which the configuration does not have"));
    }
  }
  for (Table& t : *tables) {
    const auto it = per_table.find(t.name);
    t.bf16 = it == per_table.end() ? all_bf16 : it->second;
  }
  return absl::OkStatus();
}

UpdateSettings ReadUpdateSettings(const OptimizationParameters& p, const OptimizerSpec& spec) {
  UpdateSettings s;
  spec.read(p, &s.hp);
  s.has_learning_rate = p.learning_rate().learning_rate_case() !=
                        ::tensorflow::tpu::LearningRate::LEARNING_RATE_NOT_SET;
  s.lr_tag = p.learning_rate().has_dynamic() ? p.learning_rate().dynamic().tag() : -1;
  s.lr_constant = p.learning_rate().constant();
  s.weight_decay = p.weight_decay_factor();
  s.decay_times_lr = p.multiply_weight_decay_factor_by_learning_rate();
  const auto& gc = p.gradient_clipping_limits();
  s.clip_g_lo = gc.has_lower();
  s.g_lo = gc.lower().value();
  s.clip_g_hi = gc.has_upper();
  s.g_hi = gc.upper().value();
  const auto& wc = p.clipping_limits();
  s.clip_w_lo = wc.has_lower();
  s.w_lo = wc.lower().value();
  s.clip_w_hi = wc.has_upper();
  s.w_hi = wc.upper().value();
  s.accumulate = UsesGradientAccumulation(p);
  s.non_lazy = spec.non_lazy(p);
  return s;
}

void CopyShard(const Table& table, ShardingStrategy strategy, int num_shards, int shard_id,
               int64_t rows, FloatBuffer* state, float* shard, bool to_state) {
  // An empty shard (a host past the vocabulary holds no rows) moves nothing;
  // its [0, dim] tensor's data may be null, which memcpy must not be given.
  if (rows <= 0) return;
  const int dim = table.dimension;
  // `n` consecutive table rows from table row `global` <-> shard row `r`.
  auto copy = [&](int64_t global, int64_t r, int64_t n) {
    float* f = shard + r * dim;
    if (!state->bf16()) {
      float* base = state->data() + global * dim;
      if (to_state) std::memcpy(base, f, sizeof(float) * n * dim);
      else std::memcpy(f, base, sizeof(float) * n * dim);
      return;
    }
    Bf16* base = state->half() + global * dim;
    if (to_state) {
      for (int64_t i = 0; i < n * dim; ++i) base[i] = RoundNearestEven(f[i]);
    } else {
      for (int64_t i = 0; i < n * dim; ++i) f[i] = ToFloat(base[i]);
    }
  };
  const ShardLayout layout{table.vocabulary_size, num_shards, strategy};
  if (strategy == ShardingStrategy::kDivDefault || num_shards == 1) {
    copy(layout.Global(shard_id, 0), 0, rows);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) copy(layout.Global(shard_id, r), r, 1);
}

}  // namespace tf_tpu_emb
