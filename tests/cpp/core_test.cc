// Unit tests of core/ (header-only semantics shared by the op definitions and
// the engine), against values written by hand from
// docs/tpu_embedding_semantics.md.  Built and run by tests/cpp/build.py.
#include <sys/mman.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/bag.h"
#include "core/bf16.h"
#include "core/config.h"
#include "core/huge_pages.h"
#include "core/optimizers.h"
#include "core/sparsecore.h"
#include "tests/cpp/unit.h"

namespace tf_tpu_emb {
namespace {

using Code = absl::StatusCode;

TPUEmbeddingConfiguration TableModeConfig() {
  TPUEmbeddingConfiguration c;
  c.set_batch_size_per_tensor_core(4);
  auto* t = c.add_table_descriptor();
  t->set_name("video");
  t->set_vocabulary_size(13);
  t->set_dimension(5);
  t->set_num_features(3);
  t->mutable_optimization_parameters()->mutable_adagrad();
  return c;
}

// §2.1: without feature descriptors, one Recv output per table of shape
// [batch_size_per_tensor_core * num_features, dim]; completion adds the
// matching feature descriptor.
// docs/sparsecore_semantics.md §10: the stand-in's SparseCore system (chips,
// SparseCores per chip, a generation per Set) and where a shard lives: chip
// k holds shards [k*S, (k+1)*S) of TF's stacked table.
TEST(SparseCoreChipSystem) {
  const sparsecore::ChipSystem before = sparsecore::CurrentChipSystem();
  ASSERT_TRUE(sparsecore::SetChipSystem(8, 4));
  sparsecore::ChipSystem now = sparsecore::CurrentChipSystem();
  EXPECT_EQ(now.replicas, int64_t{8});
  EXPECT_EQ(now.sparsecores_per_chip, int64_t{4});
  const int64_t generation = now.generation;
  ASSERT_TRUE(sparsecore::SetChipSystem(8, 4));
  EXPECT_EQ(sparsecore::CurrentChipSystem().generation, generation + 1);
  EXPECT_TRUE(!sparsecore::SetChipSystem(-1, 4));
  EXPECT_TRUE(!sparsecore::SetChipSystem(70000, 4));
  EXPECT_EQ(sparsecore::CurrentChipSystem().replicas, int64_t{8});  // unchanged by a refusal
  ASSERT_TRUE(sparsecore::SetChipSystem(0, 0));
  EXPECT_EQ(sparsecore::CurrentChipSystem().replicas, int64_t{0});
  EXPECT_EQ(sparsecore::HomeOfShard(0, 4).chip, int64_t{0});
  EXPECT_EQ(sparsecore::HomeOfShard(5, 4).chip, int64_t{1});
  EXPECT_EQ(sparsecore::HomeOfShard(5, 4).local_shard, int64_t{1});
  EXPECT_EQ(sparsecore::HomeOfShard(31, 4).chip, int64_t{7});
  EXPECT_EQ(sparsecore::HomeOfShard(31, 4).local_shard, int64_t{3});
  sparsecore::SetChipSystem(before.replicas, before.sparsecores_per_chip);
}

TEST(OutputShapesTableMode) {
  TPUEmbeddingConfiguration c = TableModeConfig();
  std::vector<TensorShapeProto> shapes;
  ASSERT_OK(ComputeOutputShapes(c, &shapes));
  ASSERT_EQ(shapes.size(), size_t{1});
  ASSERT_EQ(shapes[0].dim_size(), 2);
  EXPECT_EQ(shapes[0].dim(0).size(), 12);
  EXPECT_EQ(shapes[0].dim(1).size(), 5);
  ASSERT_OK(CompleteConfig(&c));
  ASSERT_EQ(c.feature_descriptor_size(), 1);
  EXPECT_EQ(c.feature_descriptor(0).table_id(), 0);
  ASSERT_EQ(c.feature_descriptor(0).input_shape_size(), 1);
  EXPECT_EQ(c.feature_descriptor(0).input_shape(0), 12);
}

// §2.1: with feature descriptors, input_shape + [dim] per feature.
TEST(OutputShapesFeatureMode) {
  TPUEmbeddingConfiguration c = TableModeConfig();
  c.set_batch_size_per_tensor_core(0);
  c.mutable_table_descriptor(0)->set_num_features(0);
  auto* f = c.add_feature_descriptor();
  f->set_name("watched");
  f->set_table_id(0);
  f->add_input_shape(2);
  f->add_input_shape(3);
  std::vector<TensorShapeProto> shapes;
  ASSERT_OK(ComputeOutputShapes(c, &shapes));
  ASSERT_EQ(shapes.size(), size_t{1});
  ASSERT_EQ(shapes[0].dim_size(), 3);
  EXPECT_EQ(shapes[0].dim(0).size(), 2);
  EXPECT_EQ(shapes[0].dim(1).size(), 3);
  EXPECT_EQ(shapes[0].dim(2).size(), 5);
  // A feature naming a table that does not exist is an error, not a read
  // out of bounds.
  f->set_table_id(7);
  EXPECT_TRUE(!ComputeOutputShapes(c, &shapes).ok());
}

// §2.8: batch_size_per_tensor_core must be positive in table mode.
TEST(CompleteConfigRefusesZeroBatch) {
  TPUEmbeddingConfiguration c = TableModeConfig();
  c.set_batch_size_per_tensor_core(0);
  EXPECT_ERROR(CompleteConfig(&c), Code::kInvalidArgument, "batch_size_per_tensor_core");
}

TEST(CheckedArithmeticAndBoundedProduct) {
  int64_t out = 0;
  EXPECT_TRUE(CheckedMul(int64_t{1} << 31, int64_t{1} << 31, &out));
  EXPECT_EQ(out, int64_t{1} << 62);
  EXPECT_TRUE(!CheckedMul(int64_t{1} << 32, int64_t{1} << 32, &out));
  EXPECT_TRUE(!CheckedAdd(std::numeric_limits<int64_t>::max(), 1, &out));
  absl::StatusOr<int64_t> p = BoundedProduct({3, 4, 5}, 60, "x");
  ASSERT_OK(p.status());
  EXPECT_EQ(*p, 60);
  EXPECT_ERROR(BoundedProduct({3, 4, 5}, 59, "positions").status(), Code::kInvalidArgument,
               "positions is 3 x 4 x 5 = 60, more than the limit 59");
  EXPECT_ERROR(
      BoundedProduct({int64_t{1} << 40, int64_t{1} << 40}, kMaxFeaturePositions, "n").status(),
      Code::kInvalidArgument, "(overflows int64)");
}

// §2.7: 13 ids over 5 shards, DIV_DEFAULT = [[0,1,2],[3,4,5],[6,7,8],[9,10],[11,12]];
// MOD: shard s holds the ids with id % 5 == s.
TEST(ShardRowMapping) {
  const int64_t want_rows[] = {3, 3, 3, 2, 2};
  const int64_t want_first[] = {0, 3, 6, 9, 11};
  const ShardLayout div{13, 5, ShardingStrategy::kDivDefault};
  const ShardLayout mod{13, 5, ShardingStrategy::kMod};
  for (int s = 0; s < 5; ++s) {
    absl::StatusOr<int64_t> rows = NumIdsInShard(13, s, 5);
    ASSERT_OK(rows.status());
    EXPECT_EQ(*rows, want_rows[s]);
    EXPECT_EQ(div.Rows(s), want_rows[s]);
    EXPECT_EQ(div.Global(s, 0), want_first[s]);
    for (int64_t r = 0; r < *rows; ++r) {
      EXPECT_EQ(mod.Global(s, r) % 5, s);
    }
  }
  EXPECT_EQ(div.Global(3, 1), 10);
  EXPECT_EQ(mod.Global(2, 1), 7);
  EXPECT_ERROR(NumIdsInShard(13, 0, 0).status(), Code::kInvalidArgument, "must be > 0");
  EXPECT_ERROR(NumIdsInShard(13, 5, 5).status(), Code::kInvalidArgument, "shard_id");
  // TF's table shard shapes refuse an empty shard; a host's layout has one.
  EXPECT_ERROR(NumIdsInShard(2, 2, 3).status(), Code::kInvalidArgument, "is empty");
  EXPECT_EQ((ShardLayout{2, 3, ShardingStrategy::kDivDefault}.Rows(2)), 0);
}

// Owner/Local invert Global for every id, both strategies, vocabularies
// below, at and above the shard count and not divisible by it; the
// router's FastShardLayout (divisions by reciprocal) gives the same.
TEST(ShardOwnerLocalInvertGlobal) {
  for (ShardingStrategy strategy : {ShardingStrategy::kDivDefault, ShardingStrategy::kMod}) {
    for (int64_t vocab : {1, 2, 3, 5, 13, 64, 1000, 100003}) {
      for (int64_t shards : {1, 2, 3, 4, 5, 7, 8}) {
        const ShardLayout l{vocab, shards, strategy};
        const FastShardLayout fast(l);
        int64_t total = 0;
        for (int64_t k = 0; k < shards; ++k) {
          total += l.Rows(k);
          for (int64_t r = 0; r < l.Rows(k); ++r) {
            const int64_t id = l.Global(k, r);
            ASSERT_TRUE(id >= 0 && id < vocab);
            EXPECT_EQ(l.Owner(id), k);
            EXPECT_EQ(l.Local(id, k), r);
            int64_t owner = -1, local = -1;
            fast.Map(id, &owner, &local);
            EXPECT_EQ(owner, k);
            EXPECT_EQ(local, r);
          }
        }
        EXPECT_EQ(total, vocab);
      }
    }
  }
}

TEST(DividerIsExactAtTheEdges) {
  for (int64_t d : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{100001},
                    int64_t{1} << 31, (int64_t{1} << 40) + 1}) {
    const Divider div(d);
    for (int64_t n :
         {int64_t{0}, int64_t{1}, d - 1, d, d + 1, 3 * d - 1, 3 * d, (int64_t{1} << 53) - 1,
          int64_t{1} << 53, (int64_t{1} << 53) + 1, (int64_t{1} << 61) + 12345}) {
      if (n < 0) continue;
      EXPECT_EQ(div.Div(n), n / d);
    }
  }
}

// §4.2: sum, mean (/ sum w), sqrtn (/ sqrt(sum w^2)); 0 for a zero denominator.
TEST(CombinerScale) {
  EXPECT_NEAR(CombinerScale(Combiner::kSum, 4.0f, 9.0f), 1.0f, 0.0f);
  EXPECT_NEAR(CombinerScale(Combiner::kMean, 4.0f, 9.0f), 0.25f, 1e-7f);
  EXPECT_NEAR(CombinerScale(Combiner::kSqrtn, 4.0f, 9.0f), 1.0f / 3.0f, 1e-7f);
  EXPECT_NEAR(CombinerScale(Combiner::kMean, 0.0f, 0.0f), 0.0f, 0.0f);
  EXPECT_NEAR(CombinerScale(Combiner::kSqrtn, 0.0f, 0.0f), 0.0f, 0.0f);
  const float w[] = {1.0f, 3.0f};
  EXPECT_NEAR(BagScale(Combiner::kMean, w, 2), 0.25f, 1e-7f);
  EXPECT_NEAR(BagScale(Combiner::kSqrtn, w, 2), 1.0f / std::sqrt(10.0f), 1e-7f);
  EXPECT_NEAR(BagScale(Combiner::kMean, nullptr, 4), 0.25f, 1e-7f);
}

TEST(ReduceBagWeightedMean) {
  // Three rows of dimension 2.
  const float table[] = {1, 2, 10, 20, 100, 200};
  const int64_t ids[] = {0, 2, 2};
  const float w[] = {1, 2, 3};
  float out[2];
  auto identity = [](float x) { return x; };
  ReduceBag<true>(table, 2, ids, w, 3, Combiner::kMean, out, identity);
  EXPECT_NEAR(out[0], (1 * 1 + 2 * 100 + 3 * 100) / 6.0f, 1e-4f);
  EXPECT_NEAR(out[1], (1 * 2 + 2 * 200 + 3 * 200) / 6.0f, 1e-4f);
  ReduceBag<false>(table, 2, ids, nullptr, 0, Combiner::kSqrtn, out, identity);
  EXPECT_NEAR(out[0], 0.0f, 0.0f);  // empty bag: zero vector
  EXPECT_NEAR(out[1], 0.0f, 0.0f);
}

// bfloat16 rows widen exactly inside the bag reduction.
TEST(ReduceBagOfBf16Rows) {
  const Bf16 table[] = {RoundNearestEven(1.5f), RoundNearestEven(-0.25f), RoundNearestEven(3.0f),
                        RoundNearestEven(0.125f)};
  const int64_t ids[] = {1, 0};
  float out[2];
  auto identity = [](float x) { return x; };
  ReduceBag<false>(table, 2, ids, nullptr, 2, Combiner::kSum, out, identity);
  EXPECT_NEAR(out[0], 4.5f, 0.0f);
  EXPECT_NEAR(out[1], -0.125f, 0.0f);
}

// Stochastic rounding: the 16 random bits decide between the two
// neighbours; r = 0 truncates, r = 0xFFFF rounds up any remainder, an exact
// value never moves; NaN and infinities pass through.
TEST(Bf16Rounding) {
  const float x = 1.0f + 0x1p-9f;  // a quarter of the way to 1 + 2^-7
  EXPECT_NEAR(ToFloat(RoundStochastic(x, 0)), 1.0f, 0.0f);
  EXPECT_NEAR(ToFloat(RoundStochastic(x, 0xBFFF)), 1.0f, 0.0f);
  EXPECT_NEAR(ToFloat(RoundStochastic(x, 0xC000)), 1.0f + 0x1p-7f, 0.0f);
  EXPECT_NEAR(ToFloat(RoundStochastic(-x, 0xC000)), -1.0f - 0x1p-7f, 0.0f);
  EXPECT_NEAR(ToFloat(RoundStochastic(2.0f, 0xFFFF)), 2.0f, 0.0f);
  EXPECT_TRUE(std::isnan(ToFloat(RoundStochastic(std::nanf(""), 0xFFFF))));
  EXPECT_TRUE(std::isnan(ToFloat(RoundNearestEven(std::nanf("")))));
  EXPECT_TRUE(std::isinf(ToFloat(RoundStochastic(std::numeric_limits<float>::infinity(), 7))));
  EXPECT_NEAR(ToFloat(RoundNearestEven(1.0f + 0x1p-8f)), 1.0f, 0.0f);
}

// A row's stochastic rounding (the bfloat16 update's store): unbiased, and
// each element's random bits depend only on (key, element index), so a
// row rounded in one call or in pieces gives the same bits.
TEST(Bf16RowRounding) {
  const int n = 1 << 16;
  std::vector<float> x(n, 1.0f + 0x1p-9f);  // rounds up with probability 1/4
  x[7] = std::numeric_limits<float>::infinity();
  x[9] = std::nanf("");
  std::vector<Bf16> whole(n), pieces(n);
  RoundStochasticRow(x.data(), n, 12345u, 0u, whole.data());
  RoundStochasticRow(x.data(), 100, 12345u, 0u, pieces.data());
  RoundStochasticRow(x.data() + 100, n - 100, 12345u, 100u, pieces.data() + 100);
  int up = 0;
  for (int d = 0; d < n; ++d) {
    EXPECT_TRUE(whole[d].bits == pieces[d].bits);
    if (d == 7 || d == 9) continue;
    const float v = ToFloat(whole[d]);
    EXPECT_TRUE(v == 1.0f || v == 1.0f + 0x1p-7f);
    up += v != 1.0f;
  }
  EXPECT_NEAR(static_cast<double>(up) / (n - 2), 0.25, 0.01);
  EXPECT_TRUE(std::isinf(ToFloat(whole[7])));
  EXPECT_TRUE(std::isnan(ToFloat(whole[9])));
  std::vector<Bf16> other(n);
  RoundStochasticRow(x.data(), n, 54321u, 0u, other.data());
  int differ = 0;
  for (int d = 0; d < n; ++d) differ += whole[d].bits != other[d].bits;
  EXPECT_TRUE(differ > n / 4);  // another key, other bits (about 3/8 differ)
}

RowArgs Row(float* w, float* s0, const float* g, float lr) {
  RowArgs a{};
  a.w = w;
  a.s[0] = s0;
  a.g = g;
  a.dim = 2;
  a.lr = lr;
  return a;
}

// §5.1: w <- w - lr * g.
TEST(SgdFormula) {
  float w[] = {1.0f, -2.0f};
  const float g[] = {0.5f, 4.0f};
  opt::StochasticGradientDescent(Row(w, nullptr, g, 0.1f), opt::StochasticGradientDescentHyper{});
  EXPECT_NEAR(w[0], 0.95f, 1e-6f);
  EXPECT_NEAR(w[1], -2.4f, 1e-6f);
}

// §5.2: a <- a + g^2; w <- w - lr * g / sqrt(a) with the updated a.
TEST(AdagradFormula) {
  float w[] = {1.0f, 0.0f};
  float acc[] = {0.1f, 0.1f};
  const float g[] = {0.5f, -1.0f};
  opt::Adagrad(Row(w, acc, g, 0.1f), opt::AdagradHyper{});
  EXPECT_NEAR(acc[0], 0.35f, 1e-6f);
  EXPECT_NEAR(acc[1], 1.1f, 1e-6f);
  EXPECT_NEAR(w[0], 1.0f - 0.05f / std::sqrt(0.35f), 1e-6f);
  EXPECT_NEAR(w[1], 0.1f / std::sqrt(1.1f), 1e-6f);
  // The table entry runs the same formula.
  const OptimizerSpec* spec = FindOptimizer(OptimizationParameters::kAdagrad);
  ASSERT_TRUE(spec != nullptr);
  EXPECT_EQ(spec->slots.size(), size_t{1});
  EXPECT_EQ(std::string(spec->slots[0].name), std::string("accumulators"));
}

// The kB of AnonHugePages /proc/self/smaps gives the mapping holding `p`.
int64_t HugeKbAt(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t lo, hi;
    char dash;
    std::istringstream head(line);
    if (line.find(':') > line.find(' ') && (head >> std::hex >> lo >> dash >> hi) && dash == '-') {
      inside = a >= lo && a < hi;
    } else if (inside && line.rfind("AnonHugePages:", 0) == 0) {
      return std::stoll(line.substr(14));
    }
  }
  return -1;
}

// core/huge_pages.h's advice for a buffer allocated elsewhere (the JAX
// handlers' donated tables): the contents stay as they were; where the
// kernel reports the collapse done, the range is backed by huge pages.
TEST(HugePagesAdviseRangeKeepsContents) {
  const size_t bytes = size_t{12} << 20;
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_TRUE(m != MAP_FAILED);
  // Not 2 MiB aligned on purpose: only the whole huge pages inside count.
  float* f = reinterpret_cast<float*>(static_cast<char*>(m) + 4096);
  const size_t n = (bytes - 8192) / sizeof(float);
  for (size_t i = 0; i < n; ++i) f[i] = static_cast<float>(i % 1000003) * 0.5f;
  EXPECT_TRUE(!huge_pages::AdviseRange(f, size_t{1} << 20, true));  // under the minimum
  errno = 0;
  const bool collapsed = huge_pages::AdviseRange(f, n * sizeof(float), true);
  const int why = errno;
  bool same = true;
  for (size_t i = 0; i < n; ++i) same = same && f[i] == static_cast<float>(i % 1000003) * 0.5f;
  EXPECT_TRUE(same);
  if (collapsed) {
    EXPECT_TRUE(HugeKbAt(f + n / 2) >= 2048);
  } else if (huge_pages::Available()) {
    // No collapse: a kernel before 6.1 (EINVAL) or no huge page free now.
    EXPECT_TRUE(why == EINVAL || why == EAGAIN || why == ENOMEM);
  }
  huge_pages::AdvisePersistent(f, n * sizeof(float));  // listed once, then a lookup
  huge_pages::AdvisePersistent(f, n * sizeof(float));
  munmap(m, bytes);
}

}  // namespace
}  // namespace tf_tpu_emb
