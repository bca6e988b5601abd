// The one C++ home of host-sharding arithmetic: which host holds an id, at
// which local row, and how many rows each host's shard has
// (TPUEmbeddingConfiguration.sharding_strategy; docs/tpu_embedding_semantics.md
// §2.7 "Sharding order inside a shard").  Its Python twin, for whole-table
// checkpoints, is tf_tpu_emb/sharding.py; tests/cluster/
// test_shard_arithmetic.py checks that the two agree.
//
// Shard k of S holds vocab / S rows, plus one for the first vocab % S shards.
// DIV_DEFAULT: contiguous ranges (13 ids over 5 shards -> [0..2] [3..5] [6..8]
// [9,10] [11,12]); MOD: id % S (-> [0,5,10] [1,6,11] [2,7,12] [3,8] [4,9]).
// With fewer rows than shards the last shards are empty: TF's own TPU layout
// (tpu_embedding_v2.py's sharded variable creator gives host k
// `vocab // S + (k < vocab % S)` rows, 0 for k >= vocab).  Only TF's
// LoadAll/RetrieveAll shape rule refuses empty shards (NumIdsInShard in
// core/config.h keeps that error).
#ifndef TF_TPU_EMB_CORE_SHARDING_H_
#define TF_TPU_EMB_CORE_SHARDING_H_

#include <cstdint>

namespace tf_tpu_emb {

// n / d for 0 <= n < 2^62 and a fixed d >= 1, without a hardware division
// (the router maps every id of a batch): a double reciprocal, corrected.
struct Divider {
  int64_t d = 1;
  double inverse = 1.0;
  Divider() = default;
  explicit Divider(int64_t divisor)
      : d(divisor < 1 ? 1 : divisor),
        inverse(1.0 / static_cast<double>(divisor < 1 ? 1 : divisor)) {}
  int64_t Div(int64_t n) const {
    int64_t q = static_cast<int64_t>(static_cast<double>(n) * inverse);
    while (q > 0 && q * d > n) --q;
    while ((q + 1) * d <= n) ++q;
    return q;
  }
};

// TPUEmbeddingConfiguration.ShardingStrategy's values.
enum class ShardingStrategy : int { kDivDefault = 0, kMod = 1 };

// The layout of one table of `vocab` rows over `shards` shards (vocab >= 1,
// shards >= 1; ids in [0, vocab), shard ids in [0, shards)).
struct ShardLayout {
  int64_t vocab = 1;
  int64_t shards = 1;
  ShardingStrategy strategy = ShardingStrategy::kDivDefault;

  int64_t base() const { return vocab / shards; }
  int64_t extra() const { return vocab % shards; }
  // Rows of shard k (0 when vocab <= k).
  int64_t Rows(int64_t k) const { return base() + (k < extra() ? 1 : 0); }
  // DIV_DEFAULT: the first global row of shard k.
  int64_t Start(int64_t k) const { return k * base() + (k < extra() ? k : extra()); }
  // Global row of local row r of shard k.
  int64_t Global(int64_t k, int64_t r) const {
    return strategy == ShardingStrategy::kMod ? r * shards + k : Start(k) + r;
  }
  // The shard holding global row `id` (Router: the same with Dividers).
  int64_t Owner(int64_t id) const {
    if (shards == 1) return 0;
    if (strategy == ShardingStrategy::kMod) return id % shards;
    const int64_t cut = extra() * (base() + 1);  // ids below it: the longer shards
    return id < cut ? id / (base() + 1) : extra() + (id - cut) / base();
  }
  // Local row of global row `id` in its shard `owner` (= Owner(id)).
  int64_t Local(int64_t id, int64_t owner) const {
    if (shards == 1) return id;
    return strategy == ShardingStrategy::kMod ? id / shards : id - Start(owner);
  }
};

// ShardLayout's Owner and Local with precomputed divisions (the worker's
// router maps every id of every batch): the same results.
struct FastShardLayout {
  ShardLayout layout;
  Divider by_shards, by_long, by_short;  // S; the longer and shorter shards' rows
  FastShardLayout() = default;
  explicit FastShardLayout(const ShardLayout& l)
      : layout(l), by_shards(l.shards), by_long(l.base() + 1), by_short(l.base()) {}
  // (owner, local row) of global row `id`.
  void Map(int64_t id, int64_t* owner, int64_t* local) const {
    const ShardLayout& l = layout;
    if (l.shards == 1) {
      *owner = 0, *local = id;
    } else if (l.strategy == ShardingStrategy::kMod) {
      const int64_t q = by_shards.Div(id);
      *owner = id - q * l.shards, *local = q;
    } else {
      const int64_t cut = l.extra() * (l.base() + 1);
      if (id < cut) {
        const int64_t q = by_long.Div(id);
        *owner = q, *local = id - q * (l.base() + 1);
      } else {
        const int64_t q = by_short.Div(id - cut);
        *owner = l.extra() + q, *local = id - cut - q * l.base();
      }
    }
  }
};

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_SHARDING_H_
