#include "engine/table.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tf_tpu_emb {

FloatBuffer::~FloatBuffer() { std::free(data_); }

absl::Status FloatBuffer::Allocate(int64_t num_floats, float fill) {
  constexpr int64_t kHugePage = int64_t{2} << 20;
  int64_t bytes, padded;
  if (num_floats < 0 || !CheckedMul(std::max<int64_t>(num_floats, 1), 4, &bytes) ||
      !CheckedAdd(bytes, kHugePage - 1, &padded)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot allocate ", num_floats, " floats for an embedding table: the byte count "
        "overflows int64"));
  }
  const size_t rounded = static_cast<size_t>(padded / kHugePage * kHugePage);
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", rounded, " bytes for an embedding table"));
  }
#ifdef MADV_HUGEPAGE
  madvise(p, rounded, MADV_HUGEPAGE);
#endif
  data_ = static_cast<float*>(p);
  std::fill(data_, data_ + num_floats, fill);
  return absl::OkStatus();
}

UpdateSettings ReadUpdateSettings(const OptimizationParameters& p, const OptimizerSpec& spec) {
  UpdateSettings s;
  spec.read(p, &s.hp);
  s.has_learning_rate =
      p.learning_rate().learning_rate_case() != ::tensorflow::tpu::LearningRate::LEARNING_RATE_NOT_SET;
  s.lr_tag = p.learning_rate().has_dynamic() ? p.learning_rate().dynamic().tag() : -1;
  s.lr_constant = p.learning_rate().constant();
  s.weight_decay = p.weight_decay_factor();
  s.decay_times_lr = p.multiply_weight_decay_factor_by_learning_rate();
  const auto& gc = p.gradient_clipping_limits();
  s.clip_g_lo = gc.has_lower(); s.g_lo = gc.lower().value();
  s.clip_g_hi = gc.has_upper(); s.g_hi = gc.upper().value();
  const auto& wc = p.clipping_limits();
  s.clip_w_lo = wc.has_lower(); s.w_lo = wc.lower().value();
  s.clip_w_hi = wc.has_upper(); s.w_hi = wc.upper().value();
  s.accumulate = UsesGradientAccumulation(p);
  s.non_lazy = spec.non_lazy(p);
  return s;
}

void CopyShard(const Table& table, bool mod_sharding, int num_shards, int shard_id,
               int64_t rows, float* state, float* shard, bool to_state) {
  const int dim = table.dimension;
  if (!mod_sharding || num_shards == 1) {
    float* base = state + GlobalRowOfShardRow(false, table.vocabulary_size, shard_id,
                                              num_shards, 0) * dim;
    if (to_state) std::memcpy(base, shard, sizeof(float) * rows * dim);
    else std::memcpy(shard, base, sizeof(float) * rows * dim);
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* row = state + GlobalRowOfShardRow(true, table.vocabulary_size, shard_id,
                                             num_shards, r) * dim;
    if (to_state) std::memcpy(row, shard + r * dim, sizeof(float) * dim);
    else std::memcpy(shard + r * dim, row, sizeof(float) * dim);
  }
}

}  // namespace tf_tpu_emb
