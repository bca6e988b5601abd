// Fuzz target: the SparseCore (TPUEmbeddingV2) input preprocessing as its
// kernels run it (kernels/sparsecore/preprocess.h: the computations the
// kernels of kernels/sparsecore/coo_kernels.cc and csr_kernels.cc call
// after reading their attrs), with arbitrary ids, row splits, weights,
// limits and attributes (docs/sparsecore_semantics.md §1-§4).
// fuzz-sources: kernels/sparsecore/coo_preprocess.cc kernels/sparsecore/csr_preprocess.cc
// fuzz-needs: tensorflow
//
// Input: byte 0 picks a path, the rest are its attrs and tensors (read by
// FuzzInput: mostly well-formed batches, sometimes a corrupted or extreme
// value; fuzz/seeds.py writes the seeds):
//   0  ConvertToListOfSparseCoreCooTensors of 1-3 features ->
//      SortListOfSparseCoreCooTensors + GetStatsFromListOfSparseCoreCooTensors
//      -> ConvertToSparseCoreCsrWrappedCooTensor (per SparseCore), the
//      pipeline TPUEmbeddingV2 runs without minibatching;
//   1  ConvertToCooTensor -> GetMinibatchSplitsWithPhysicalReplica ->
//      GetMinibatchesInCsrWithPhysicalReplica (the minibatching path);
//   2  Sort / GetStats of arbitrary lists;
//   3  ConvertToSparseCoreCsrWrappedCooTensor of arbitrary sorted lists
//      and id counts;
//   4  GetMinibatchSplits / GetMinibatchesInCsr of arbitrary inputs.
// The attrs stay within what the op defs allow (ops/sparsecore_ops.cc:
// TF refuses a node outside them before any kernel runs).
//
// Invariants (a violation traps): every call returns OK or an
// InvalidArgument / FailedPrecondition whose message starts with the op's
// name; an OK call allocated each of its outputs once, with the op def's
// dtypes and the shapes the semantics give; the COO lists' rows ascend per
// SparseCore; the sort's id counts run from 0 to its length, within the
// limits, and the stats op's maxima are the sort's; every CSR buffer is
// well-formed: row pointers within [segment start, ids_unpadded_size],
// the padding entries of a group empty, the unpadded sizes as the attrs
// say, every id slot past a segment's end padded, and, where the ids came
// through the pipeline, every sample id below the samples of a SparseCore
// and every token id within its shard of the table; without dropping,
// every kept id is in the buffers.  Buffers larger than the semantics'
// int32 limit must be refused; the target does not call ops whose buffers
// are legal but larger than it lets one input allocate.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/sparsecore.h"
#include "fuzz/targets/fuzz_input.h"
#include "kernels/sparsecore/preprocess.h"
#include "tensorflow/core/framework/tensor.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {
namespace {

namespace sc = ::tf_tpu_emb::sparsecore;
using fuzz::FuzzInput;
using ::tensorflow::DataType;
using ::tensorflow::DT_FLOAT;
using ::tensorflow::DT_INT32;
using ::tensorflow::DT_INT64;

// The most elements one output may have before the target leaves the call
// out (legal, but more than one input should allocate).
constexpr int64_t kMaxElements = int64_t{1} << 20;
constexpr int64_t kInt32 = std::numeric_limits<int32_t>::max();

// A preprocessing context of one thread (parallel_for runs the ranges one
// unit at a time, last first: the parts must not depend on their order)
// whose outputs are kept here, each filled with a poison pattern when
// allocated (a slot the computation leaves unwritten shows).
class Outputs {
 public:
  explicit Outputs(std::vector<DataType> dtypes, int num_threads = 1) : dtypes_(std::move(dtypes)) {
    ctx_.num_threads = num_threads;
    ctx_.parallel_for = [](int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& fn) {
      for (int64_t i = n - 1; i >= 0; --i) fn(i, i + 1);
    };
    ctx_.allocate = [this](int index, const TensorShape& shape, Tensor** out) {
      FUZZ_CHECK(index >= 0 && index < static_cast<int>(dtypes_.size()), "output %d", index);
      FUZZ_CHECK(tensors_.count(index) == 0, "output %d allocated twice", index);
      FUZZ_CHECK(shape.num_elements() <= kMaxElements, "output %d: %s", index,
                 shape.DebugString().c_str());
      Tensor& t = tensors_[index];
      t = Tensor(dtypes_[index], shape);
      if (t.NumElements() > 0) {
        std::memset(const_cast<char*>(t.tensor_data().data()), 0xAB, t.tensor_data().size());
      }
      *out = &t;
      return absl::OkStatus();
    };
  }

  PreprocessContext& ctx() { return ctx_; }
  // Every output allocated (an OK call's).
  void CheckComplete(const char* op) const {
    for (size_t i = 0; i < dtypes_.size(); ++i) {
      FUZZ_CHECK(tensors_.count(static_cast<int>(i)) == 1, "%s: output %zu not allocated", op, i);
    }
  }
  const Tensor& operator[](int i) const { return tensors_.at(i); }
  int32_t Scalar(int i) const {
    FUZZ_CHECK((*this)[i].dims() == 0);
    return (*this)[i].scalar<int32_t>()();
  }

 private:
  std::vector<DataType> dtypes_;
  std::map<int, Tensor> tensors_;
  PreprocessContext ctx_;
};

// OK, or an InvalidArgument / FailedPrecondition naming the op.
bool Clean(const absl::Status& s, const std::string& op) {
  if (s.ok()) return true;
  const bool code = s.code() == absl::StatusCode::kInvalidArgument ||
                    s.code() == absl::StatusCode::kFailedPrecondition;
  FUZZ_CHECK(code, "%s: unexpected status %s", op.c_str(), s.ToString().c_str());
  FUZZ_CHECK(s.message().rfind(op + ":", 0) == 0, "%s: error does not name the op: %s", op.c_str(),
             std::string(s.message()).c_str());
  return false;
}

Tensor Int32s(const std::vector<int32_t>& v) {
  Tensor t(DT_INT32, TensorShape({static_cast<int64_t>(v.size())}));
  std::copy(v.begin(), v.end(), t.flat<int32_t>().data());
  return t;
}

Tensor Floats(const std::vector<float>& v) {
  Tensor t(DT_FLOAT, TensorShape({static_cast<int64_t>(v.size())}));
  std::copy(v.begin(), v.end(), t.flat<float>().data());
  return t;
}

Tensor Int64Scalar(int64_t v) {
  Tensor t(DT_INT64, TensorShape({}));
  t.scalar<int64_t>()() = v;
  return t;
}

std::vector<int32_t> ToVector(const Tensor& t) {
  const auto f = t.flat<int32_t>();
  return std::vector<int32_t>(f.data(), f.data() + f.size());
}

// An op def attr `int >= lo`: mostly in [lo, hi], sometimes a power of two,
// sometimes large.
int Attr(FuzzInput& in, int lo, int hi) {
  switch (in.In<int>(0, 15)) {
    case 0: return in.In<int>(lo, std::numeric_limits<int>::max());
    case 1: return std::max(lo, 1 << in.In<int>(0, 30));
    default: return in.In<int>(lo, hi);
  }
}

// Ids: mostly below `bound`, sometimes anything.
std::vector<int32_t> Ids(FuzzInput& in, size_t n, int32_t bound) {
  std::vector<int32_t> ids(n);
  const bool wild = in.In<int>(0, 7) == 0;
  for (int32_t& id : ids) {
    id = wild && in.In<int>(0, 3) == 0 ? in.ConsumeIntegral<int32_t>()
                                       : in.In<int32_t>(0, std::max<int32_t>(0, bound - 1));
  }
  return ids;
}

std::vector<float> Gains(FuzzInput& in, size_t n) {
  std::vector<float> g(n);
  for (float& x : g) x = in.In<int>(0, 3) == 0 ? in.Float() : in.FiniteIn(-2.0f, 2.0f);
  return g;
}

// A feature's batch for §1 (split, values, weights) of `sample_count`
// samples: dense, SparseTensor indices or ragged row splits, sometimes
// with one element corrupted, sometimes a wrong rank.
struct Batch {
  Tensor split, values, weights;
};

Batch MakeBatch(FuzzInput& in, int sample_count, int32_t vocab) {
  Batch b;
  const int form = in.In<int>(0, 2);
  const int max_per_sample = in.In<int>(0, 4);
  std::vector<int32_t> lengths(std::min(sample_count, 64));
  for (int32_t& l : lengths) l = in.In<int>(0, max_per_sample);
  std::vector<int32_t> splits(sample_count + 1, 0);
  for (int r = 0; r < sample_count; ++r) {
    splits[r + 1] = splits[r] + (r < static_cast<int>(lengths.size()) ? lengths[r] : 0);
  }
  int64_t n = splits[sample_count];
  if (form == 0) n = in.In<int>(0, 3) == 0 ? 0 : sample_count;  // dense
  if (n > 4096) n = 4096;
  std::vector<int32_t> ids = Ids(in, n, vocab);
  // Runs of equal ids (adjacent deduplication).
  for (size_t i = 1; i < ids.size(); ++i) {
    if (in.In<int>(0, 3) == 0) ids[i] = ids[i - 1];
  }
  if (form == 0) {
    b.split = Tensor(DT_INT32, TensorShape({0}));
  } else if (form == 1) {
    const int cols = in.In<int>(0, 7) == 0 ? in.In<int>(0, 3) : 2;
    b.split = Tensor(DT_INT32, TensorShape({n, cols}));
    auto m = b.split.flat<int32_t>();
    int64_t i = 0;
    for (int r = 0; r < sample_count && i < n; ++r) {
      for (int32_t k = splits[r]; k < splits[r + 1] && i < n; ++k, ++i) {
        for (int c = 0; c < cols; ++c) m(i * cols + c) = c == 0 ? r : k - splits[r];
      }
    }
    for (; i < n; ++i) {
      for (int c = 0; c < cols; ++c) m(i * cols + c) = 0;
    }
  } else {
    b.split = Int32s(splits);
  }
  if (in.In<int>(0, 7) == 0 && b.split.NumElements() > 0) {  // corrupt one element
    auto f = b.split.flat<int32_t>();
    f(in.In<int64_t>(0, f.size() - 1)) = in.ConsumeIntegral<int32_t>();
  }
  if (in.In<int>(0, 15) == 0) {  // a matrix of values
    b.values = Tensor(DT_INT32, TensorShape({1, n}));
    std::copy(ids.begin(), ids.end(), b.values.flat<int32_t>().data());
  } else {
    b.values = Int32s(ids);
  }
  switch (in.In<int>(0, 5)) {
    case 0:
      b.weights = Tensor(DT_FLOAT, TensorShape({}));
      b.weights.scalar<float>()() = in.Float();
      break;
    case 1: b.weights = Floats(Gains(in, in.In<int64_t>(0, n + 1))); break;  // maybe wrong length
    default: b.weights = Floats(Gains(in, n));
  }
  return b;
}

sc::Combiner DrawCombiner(FuzzInput& in) {
  switch (in.In<int>(0, 2)) {
    case 0: return sc::Combiner::kSum;
    case 1: return sc::Combiner::kMean;
    default: return sc::Combiner::kSqrtn;
  }
}

// What a CSR buffer must look like (semantics §3), for `num_sc` SparseCores
// of `p` physical replicas and `max_ids` id slots; `samples`/`shard_rows`
// bound the ids where they came through the pipeline (0: not checked);
// `expected_ids` the ids it must hold (-1: not checked).
void CheckCsr(const char* op, const Outputs& out, int num_sc, int64_t p, int max_minibatches,
              int64_t max_ids, int64_t samples, int64_t shard_rows, int64_t expected_ids) {
  out.CheckComplete(op);
  const int64_t group = sc::RoundUp(p, sc::kXlaPadSize);
  const Tensor& pointers_t = out[0];
  FUZZ_CHECK(pointers_t.dims() == 1 &&
             pointers_t.NumElements() == int64_t{max_minibatches} * num_sc * group);
  for (int i = 1; i <= 3; ++i) FUZZ_CHECK(out[i].dims() == 1 && out[i].NumElements() == max_ids);
  const int32_t pointers_unpadded = out.Scalar(4);
  const int32_t ids_unpadded = out.Scalar(5);
  const int32_t minibatches = out.Scalar(6);
  FUZZ_CHECK(minibatches >= 1 && minibatches <= max_minibatches, "%d minibatches", minibatches);
  FUZZ_CHECK(pointers_unpadded == num_sc * minibatches * group);
  FUZZ_CHECK(ids_unpadded >= 0 && ids_unpadded <= max_ids && ids_unpadded % sc::kXlaPadSize == 0,
             "ids_unpadded_size %d of %lld", ids_unpadded, static_cast<long long>(max_ids));
  const auto pointers = pointers_t.flat<int32_t>();
  const auto samples_ids = out[1].flat<int32_t>();
  const auto tokens = out[2].flat<int32_t>();
  const auto gains = out[3].flat<float>();
  std::vector<char> in_segment(max_ids, 0);
  int64_t held = 0;
  for (int64_t k = 0; k < pointers.size(); ++k) {
    const int64_t begin = k == 0 ? 0 : sc::RoundUp(pointers(k - 1), sc::kXlaPadSize);
    const int64_t end = pointers(k);
    FUZZ_CHECK(begin <= end && end <= ids_unpadded, "row_pointers[%lld] = %lld, segment start %lld",
               static_cast<long long>(k), static_cast<long long>(end),
               static_cast<long long>(begin));
    if (k % group >= p || k >= pointers_unpadded) {
      FUZZ_CHECK(begin == end, "padding row pointer %lld holds ids", static_cast<long long>(k));
    }
    for (int64_t i = begin; i < end; ++i) {
      in_segment[i] = 1;
      if (samples > 0) {
        FUZZ_CHECK(samples_ids(i) >= 0 && samples_ids(i) < samples, "sample id %d at %lld",
                   samples_ids(i), static_cast<long long>(i));
      }
      if (shard_rows > 0) {
        FUZZ_CHECK(tokens(i) >= 0 && tokens(i) < shard_rows, "token id %d at %lld of %lld rows",
                   tokens(i), static_cast<long long>(i), static_cast<long long>(shard_rows));
      }
    }
    held += end - begin;
  }
  // Every slot outside the segments is padding.
  for (int64_t i = 0; i < max_ids; ++i) {
    if (in_segment[i]) continue;
    FUZZ_CHECK(samples_ids(i) == sc::kXlaPadValue && tokens(i) == sc::kXlaPadValue &&
                   gains(i) == static_cast<float>(sc::kXlaPadValue),
               "id slot %lld is neither in a segment nor padding", static_cast<long long>(i));
  }
  if (expected_ids >= 0) {
    FUZZ_CHECK(held == expected_ids, "%lld ids in the buffers, %lld expected",
               static_cast<long long>(held), static_cast<long long>(expected_ids));
  }
}

// The sizes §3's attrs ask for, exactly (no overflow): the op must refuse
// sizes beyond int32; the target leaves out legal ones above kMaxElements.
enum class Fit { kRefused, kTooLarge, kFits };
Fit CsrFit(bool per_sc, int num_replica, int sample_count, int max_minibatches, int per_sample,
           int num_sc) {
  const __int128 p = static_cast<__int128>(num_replica) * num_sc;
  const __int128 max_ids = static_cast<__int128>(per_sample) * sample_count * (per_sc ? num_sc : 1);
  const __int128 pointers =
      static_cast<__int128>(max_minibatches) * num_sc * ((p + sc::kXlaPadSize - 1) / 8 * 8);
  const __int128 counts = per_sc ? 0 : p * num_sc * sc::kMaxDivisions;
  if (max_ids > kInt32 || pointers > kInt32 || counts >= kInt32) return Fit::kRefused;
  if (max_ids > kMaxElements || pointers > kMaxElements || counts > kMaxElements ||
      p > kMaxElements) {
    return Fit::kTooLarge;
  }
  return Fit::kFits;
}

std::string Table(FuzzInput& in) { return in.Name({"table_a", "t"}); }

// ------------------------------------------------------------------ paths

// 0: ConvertToListOfSparseCoreCooTensors -> Sort + GetStats -> CSR.
void Pipeline(FuzzInput& in) {
  const int num_sc = in.In<int>(0, 3) == 0 ? Attr(in, 1, 4) : 1 << in.In<int>(0, 2);
  const int num_replica = in.In<int>(0, 3) == 0 ? Attr(in, 1, 4) : 1 << in.In<int>(0, 2);
  const int64_t p = int64_t{num_replica} * num_sc;
  // Each SparseCore's lists, sort and CSR segments are P-sized: a few
  // thousand SparseCores run for seconds (legal, but not one input's time).
  if (p > 1024 || num_sc > 64) return;
  const int num_features = in.In<int>(1, 3);
  // Each feature: a table of the stack (col_offset) and its samples.
  const int per_sc = in.In<int>(1, 8);
  std::vector<int32_t> sample_counts, col_offsets;
  std::vector<int32_t> vocab_of;
  std::vector<std::vector<Tensor>> lists(3 * num_sc);  // per SparseCore: rows, cols, gains
  int32_t stacked_vocab = 0, row_offset = 0;
  std::vector<int32_t> table_offset;
  const int num_tables = in.In<int>(1, num_features);
  for (int t = 0; t < num_tables; ++t) {
    table_offset.push_back(stacked_vocab);
    // TF's stacking pads each table to a multiple of the shards; sometimes not.
    stacked_vocab +=
        in.In<int>(0, 3) == 0 ? in.In<int>(1, 40) : static_cast<int>(p) * in.In<int>(1, 8);
  }
  table_offset.push_back(stacked_vocab);
  const int stacked_per_sc = per_sc * num_features;
  for (int f = 0; f < num_features; ++f) {
    const int t = in.In<int>(0, num_tables - 1);
    CooAttrs a;
    a.sample_count = per_sc * num_sc;
    a.num_sc = num_sc;
    a.row_offset = row_offset * num_sc;
    a.col_offset = table_offset[t];
    a.col_shift = in.In<int>(0, 3) == 0 ? Attr(in, 0, 16) : in.In<int>(0, 4);
    a.num_sc_shards = in.In<int>(0, 7) == 0 ? Attr(in, 1, 8) : static_cast<int>(p);
    a.stacked_sample_count = stacked_per_sc * num_sc;
    a.combiner = DrawCombiner(in);
    row_offset += per_sc;
    const int32_t vocab = table_offset[t + 1] - table_offset[t];
    Batch b = MakeBatch(in, a.sample_count, vocab);
    const std::string op = "ConvertToListOfSparseCoreCooTensors";
    std::vector<DataType> dtypes(3 * num_sc, DT_INT32);
    std::fill(dtypes.begin() + 2 * num_sc, dtypes.end(), DT_FLOAT);
    Outputs out(dtypes, in.In<int>(1, 4));
    if (!Clean(a.CheckList(op), op)) return;
    if (!Clean(ConvertToCooList(op, a, b.split, b.values, b.weights, out.ctx()), op)) return;
    out.CheckComplete(op.c_str());
    const int64_t tokens = b.values.NumElements();
    int64_t kept = 0;
    for (int s = 0; s < num_sc; ++s) {
      const int64_t m = out[s].NumElements();
      FUZZ_CHECK(out[num_sc + s].NumElements() == m && out[2 * num_sc + s].NumElements() == m);
      const auto rows = out[s].flat<int32_t>();
      const auto cols = out[num_sc + s].flat<int32_t>();
      for (int64_t i = 0; i < m; ++i) {
        // SparseCore s's rows: this feature's samples of its stacked rows.
        const int64_t lo = int64_t{stacked_per_sc} * s + a.row_offset / num_sc;
        FUZZ_CHECK(rows(i) >= lo && rows(i) < lo + per_sc, "row %d of sparse core %d", rows(i), s);
        FUZZ_CHECK(i == 0 || rows(i) >= rows(i - 1), "rows descend in sparse core %d", s);
        FUZZ_CHECK(cols(i) >= a.col_offset, "col %d below col_offset %d", cols(i), a.col_offset);
      }
      kept += m;
      for (int k = 0; k < 3; ++k) lists[k * num_sc + s].push_back(out[k * num_sc + s]);
    }
    FUZZ_CHECK(kept <= tokens);
    sample_counts.push_back(per_sc);
    col_offsets.push_back(a.col_offset);
    vocab_of.push_back(vocab);
  }
  // Per SparseCore: the sort and the stats, then the CSR buffers of all.
  const std::string table = Table(in);
  const int max_ids_sc = in.In<int>(0, 3) == 0 ? Attr(in, 1, 64) : kInt32;
  const int max_uniques_sc = in.In<int>(0, 3) == 0 ? Attr(in, 1, 64) : kInt32;
  std::vector<Tensor> sorted_rows, sorted_cols, sorted_gains, id_counts;
  int64_t total = 0;
  // The stacked table's rows split over the P shards: where every col the
  // conversion wrote is below them, every token id is within a shard.
  const int64_t stacked_rows = sc::RoundUp(stacked_vocab, p);
  bool within = true;
  for (int s = 0; s < num_sc; ++s) {
    for (const Tensor& t : lists[num_sc + s]) {
      const auto cols = t.flat<int32_t>();
      for (int64_t i = 0; i < cols.size(); ++i) within = within && cols(i) < stacked_rows;
    }
  }
  for (int s = 0; s < num_sc; ++s) {
    SortedList list;
    const std::string op = "SortListOfSparseCoreCooTensors";
    if (!Clean(list.Init(op, num_features, sample_counts, col_offsets, num_replica, num_sc), op)) {
      return;
    }
    Outputs sorted({DT_INT32, DT_INT32, DT_FLOAT, DT_INT32});
    const absl::Status st = SortCooList(list, table, max_ids_sc, max_uniques_sc, lists[s],
                                        lists[num_sc + s], lists[2 * num_sc + s], sorted.ctx());
    SortedList stats_list;
    const std::string stats_op = "GetStatsFromListOfSparseCoreCooTensors";
    FUZZ_CHECK(
        stats_list.Init(stats_op, num_features, sample_counts, col_offsets, num_replica, num_sc)
            .ok());
    Outputs stats({DT_INT32, DT_INT32});
    FUZZ_CHECK(Clean(GetStatsFromCooList(stats_list, lists[s], lists[num_sc + s],
                                         lists[2 * num_sc + s], stats.ctx()),
                     stats_op),
               "the stats refuse what the conversion made");
    stats.CheckComplete(stats_op.c_str());
    if (!Clean(st, op)) {
      // Only the limits refuse the conversion's output.
      FUZZ_CHECK(stats.Scalar(0) > max_ids_sc || stats.Scalar(1) > max_uniques_sc, "%s",
                 std::string(st.message()).c_str());
      return;
    }
    sorted.CheckComplete(op.c_str());
    const auto counts = sorted[3].flat<int32_t>();
    const int64_t n = sorted[0].NumElements();
    FUZZ_CHECK(counts.size() == p + 1 && counts(0) == 0 && counts(p) == n);
    FUZZ_CHECK(sorted[1].NumElements() == n && sorted[2].NumElements() == n);
    int64_t most = 0;
    for (int64_t r = 0; r < p; ++r) {
      FUZZ_CHECK(counts(r + 1) >= counts(r));
      most = std::max<int64_t>(most, counts(r + 1) - counts(r));
    }
    FUZZ_CHECK(most == stats.Scalar(0), "stats' max_ids %d, the sort's %lld", stats.Scalar(0),
               static_cast<long long>(most));
    FUZZ_CHECK(most <= max_ids_sc && stats.Scalar(1) <= max_uniques_sc);
    FUZZ_CHECK(stats.Scalar(1) <= stats.Scalar(0));
    const auto rows = sorted[0].flat<int32_t>();
    const auto cols = sorted[1].flat<int32_t>();
    for (int64_t i = 0; i < n; ++i) {
      FUZZ_CHECK(rows(i) >= 0 && rows(i) < stacked_per_sc, "sorted row %d", rows(i));
      FUZZ_CHECK(cols(i) >= 0);
    }
    sorted_rows.push_back(sorted[0]);
    sorted_cols.push_back(sorted[1]);
    sorted_gains.push_back(sorted[2]);
    id_counts.push_back(sorted[3]);
    total += n;
  }
  // The CSR buffers.  sample_count_per_sc: the stack's samples per SparseCore.
  const int per_sample = in.In<int>(0, 3) == 0 ? Attr(in, 1, 8) : in.In<int>(1, 8);
  const int max_minibatches = in.In<int>(0, 3) == 0 ? Attr(in, 1, 4) : in.In<int>(1, 2);
  const bool allow_dropping = in.ConsumeBool();
  const int64_t splits = in.In<int>(0, 3) == 0 ? in.ConsumeIntegral<int64_t>() : 0;
  const std::string op = "ConvertToSparseCoreCsrWrappedCooTensor";
  const Fit fit = CsrFit(true, num_replica, stacked_per_sc, max_minibatches, per_sample, num_sc);
  if (fit == Fit::kTooLarge) return;
  CsrAttrs a;
  const absl::Status init =
      a.Init(op, true, table, num_replica, stacked_per_sc, max_minibatches, per_sample, num_sc);
  if (fit == Fit::kRefused) {
    FUZZ_CHECK(!Clean(init, op), "%s accepted buffers beyond int32", op.c_str());
    return;
  }
  if (!Clean(init, op)) return;
  Outputs out({DT_INT32, DT_INT32, DT_INT32, DT_FLOAT, DT_INT32, DT_INT32, DT_INT32});
  const absl::Status st =
      ConvertToCsrWrappedCoo(op, a, allow_dropping, sorted_rows, sorted_cols, sorted_gains,
                             id_counts, Int64Scalar(splits), out.ctx());
  if (!Clean(st, op)) return;
  const int64_t shard_rows = within ? stacked_rows / p : 0;
  const int64_t expected = allow_dropping ? -1 : total * out.Scalar(6);
  CheckCsr(op.c_str(), out, num_sc, p, max_minibatches, a.max_ids, stacked_per_sc, shard_rows,
           expected);
}

// 1: ConvertToCooTensor -> GetMinibatchSplits -> GetMinibatchesInCsr.
void Minibatching(FuzzInput& in) {
  const int num_sc = in.In<int>(0, 3) == 0 ? Attr(in, 1, 4) : 1 << in.In<int>(0, 2);
  const int num_replica = in.In<int>(0, 3) == 0 ? Attr(in, 1, 4) : in.In<int>(1, 4);
  const int per_sc = in.In<int>(1, 8);
  const int sample_count =
      in.In<int>(0, 15) == 0 || num_sc > 4096 ? Attr(in, 1, 32) : per_sc * num_sc;
  const int vocab = in.In<int>(0, 7) == 0 ? Attr(in, 1, 200) : in.In<int>(1, 200);
  CooAttrs coo;
  coo.sample_count = std::min(sample_count, 1 << 16);
  coo.combiner = DrawCombiner(in);
  Batch b = MakeBatch(in, coo.sample_count, vocab);
  Outputs c({DT_INT32, DT_INT32, DT_FLOAT}, in.In<int>(1, 4));
  const std::string coo_op = "ConvertToCooTensor";
  if (!Clean(ConvertToCoo(coo_op, coo, b.split, b.values, b.weights, c.ctx()), coo_op)) return;
  c.CheckComplete(coo_op.c_str());
  const int64_t n = c[0].NumElements();
  FUZZ_CHECK(n <= b.values.NumElements() && c[1].NumElements() == n && c[2].NumElements() == n);
  const auto coo_rows = c[0].flat<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    FUZZ_CHECK(coo_rows(i) >= 0 && coo_rows(i) < coo.sample_count);
    FUZZ_CHECK(i == 0 || coo_rows(i) >= coo_rows(i - 1), "COO rows descend");
  }
  const std::string op = "GetMinibatchSplitsWithPhysicalReplica";
  MinibatchSplitsAttrs ma;
  const __int128 counts_wanted = static_cast<__int128>(num_replica) * num_sc * num_sc * 64;
  const absl::Status init = ma.Init(op, sample_count, num_replica, vocab, num_sc);
  if (counts_wanted >= kInt32) {
    FUZZ_CHECK(!Clean(init, op), "%s accepted %lld id counts", op.c_str(),
               static_cast<long long>(counts_wanted));
    return;
  }
  if (!Clean(init, op)) return;
  if (counts_wanted >= kMaxElements) return;  // the id counts: one more
  Outputs sp({DT_INT32, DT_INT32, DT_FLOAT, DT_INT64, DT_INT32, DT_INT32, DT_INT32});
  if (!Clean(GetMinibatchSplits(op, ma, c[0], c[1], c[2], sp.ctx()), op)) return;
  sp.CheckComplete(op.c_str());
  const int64_t p = int64_t{num_replica} * num_sc;
  const int64_t kept = sp[0].NumElements();
  FUZZ_CHECK(kept <= n && sp[1].NumElements() == kept && sp[2].NumElements() == kept);
  FUZZ_CHECK(sp[3].scalar<int64_t>()() == 0);
  const auto counts = sp[4].flat<int32_t>();
  FUZZ_CHECK(counts.size() == 64 * num_sc * p + 1 && counts(0) == 0 &&
             counts(counts.size() - 1) == kept);
  int64_t most = 0;
  for (int64_t sr = 0; sr < num_sc * p; ++sr) {
    for (int d = 0; d < 64; ++d) FUZZ_CHECK(counts(sr * 64 + d + 1) >= counts(sr * 64 + d));
    most = std::max<int64_t>(most, counts((sr + 1) * 64) - counts(sr * 64));
  }
  FUZZ_CHECK(most == sp.Scalar(5), "max_ids %d, the id counts' %lld", sp.Scalar(5),
             static_cast<long long>(most));
  FUZZ_CHECK(sp.Scalar(6) <= sp.Scalar(5));
  // The CSR of the minibatches (splits as the splits op said, or fuzzed).
  const std::string csr_op = "GetMinibatchesInCsrWithPhysicalReplica";
  const int per_sample = in.In<int>(0, 3) == 0 ? Attr(in, 1, 8) : in.In<int>(1, 8);
  const int max_minibatches = in.In<int>(0, 3) == 0 ? Attr(in, 1, 4) : in.In<int>(1, 2);
  const int64_t splits = in.In<int>(0, 3) == 0 ? in.ConsumeIntegral<int64_t>() : 0;
  const Fit fit = CsrFit(false, num_replica, sample_count, max_minibatches, per_sample, num_sc);
  if (fit == Fit::kTooLarge) return;
  CsrAttrs a;
  const absl::Status csr_init = a.Init(csr_op, false, Table(in), num_replica, sample_count,
                                       max_minibatches, per_sample, num_sc);
  if (fit == Fit::kRefused) {
    FUZZ_CHECK(!Clean(csr_init, csr_op), "%s accepted buffers beyond int32", csr_op.c_str());
    return;
  }
  if (!Clean(csr_init, csr_op)) return;
  Outputs out({DT_INT32, DT_INT32, DT_INT32, DT_FLOAT, DT_INT32, DT_INT32, DT_INT32});
  if (!Clean(GetMinibatchesInCsr(csr_op, a, sp[0], sp[1], sp[2], Int64Scalar(splits), sp[4],
                                 out.ctx()),
             csr_op)) {
    return;
  }
  const int64_t shard_rows = (int64_t{vocab} + p - 1) / p;
  CheckCsr(csr_op.c_str(), out, num_sc, p, max_minibatches, a.max_ids, sample_count / num_sc,
           shard_rows, kept);
}

// Arbitrary row / col / gain lists (some of a wrong length).
void Lists(FuzzInput& in, int n, int32_t bound, std::vector<Tensor>* rows,
           std::vector<Tensor>* cols, std::vector<Tensor>* gains) {
  for (int f = 0; f < n; ++f) {
    const size_t m = in.In<int>(0, 48);
    const size_t skew = in.In<int>(0, 15) == 0 ? in.In<int>(0, 3) : 0;
    rows->push_back(Int32s(Ids(in, m + (skew == 1), bound)));
    cols->push_back(Int32s(Ids(in, m, bound)));
    gains->push_back(Floats(Gains(in, m + (skew == 2))));
  }
}

// 2: the sort and the stats of arbitrary lists.
void RawSort(FuzzInput& in) {
  const int n = in.In<int>(1, 4);
  std::vector<int32_t> sample_counts, col_offsets;
  const int list_len = in.In<int>(0, 7) == 0 ? in.In<int>(0, 5) : n;
  for (int f = 0; f < list_len; ++f) {
    sample_counts.push_back(in.In<int>(0, 7) == 0 ? in.ConsumeIntegral<int32_t>()
                                                  : in.In<int32_t>(1, 16));
    col_offsets.push_back(in.In<int>(0, 7) == 0 ? in.ConsumeIntegral<int32_t>()
                                                : in.In<int>(0, 3) * 8);
  }
  const int num_replica = Attr(in, 1, 8), num_sc = Attr(in, 1, 4);
  const std::string op = in.ConsumeBool() ? "SortListOfSparseCoreCooTensors"
                                          : "GetStatsFromListOfSparseCoreCooTensors";
  SortedList list;
  const __int128 p = static_cast<__int128>(num_replica) * num_sc;
  const absl::Status init = list.Init(op, n, sample_counts, col_offsets, num_replica, num_sc);
  if (p > (int64_t{1} << 30) || (p & (p - 1)) != 0) {
    FUZZ_CHECK(!Clean(init, op), "%s accepted %lld physical replicas", op.c_str(),
               static_cast<long long>(p));
    return;
  }
  if (!Clean(init, op) || p > 4096) return;
  std::vector<Tensor> rows, cols, gains;
  Lists(in, in.In<int>(0, 15) == 0 ? in.In<int>(0, 5) : n, in.In<int>(1, 1 << 20), &rows, &cols,
        &gains);
  if (op == "SortListOfSparseCoreCooTensors") {
    const int max_ids = Attr(in, 1, 64), max_uniques = Attr(in, 1, 64);
    Outputs out({DT_INT32, DT_INT32, DT_FLOAT, DT_INT32});
    if (!Clean(SortCooList(list, Table(in), max_ids, max_uniques, rows, cols, gains, out.ctx()),
               op)) {
      return;
    }
    out.CheckComplete(op.c_str());
    const auto counts = out[3].flat<int32_t>();
    const int64_t m = out[0].NumElements();
    FUZZ_CHECK(counts.size() == p + 1 && counts(0) == 0 && counts(p) == m);
    int64_t tokens = 0;
    for (const Tensor& t : cols) tokens += t.NumElements();
    FUZZ_CHECK(m <= tokens);
    for (int64_t r = 0; r < p; ++r) {
      FUZZ_CHECK(counts(r + 1) >= counts(r) && counts(r + 1) - counts(r) <= max_ids);
    }
    const auto sorted_rows = out[0].flat<int32_t>();
    for (int64_t i = 0; i < m; ++i) {
      FUZZ_CHECK(sorted_rows(i) >= 0 && sorted_rows(i) < list.batch());
    }
  } else {
    Outputs out({DT_INT32, DT_INT32});
    if (!Clean(GetStatsFromCooList(list, rows, cols, gains, out.ctx()), op)) return;
    out.CheckComplete(op.c_str());
    FUZZ_CHECK(out.Scalar(0) >= out.Scalar(1) && out.Scalar(1) >= 0);
  }
}

// An id_counts vector of `size` entries over `n` ids: mostly a valid
// running sum, sometimes corrupted.
Tensor IdCounts(FuzzInput& in, int64_t size, int64_t n) {
  std::vector<int32_t> counts(size, 0);
  for (int64_t i = 1; i < size; ++i) {
    counts[i] =
        std::min<int64_t>(n, counts[i - 1] + (in.In<int>(0, 3) == 0 ? in.In<int>(0, 4) : 0));
  }
  if (size > 0 && in.ConsumeBool()) counts[size - 1] = n;
  if (size > 0 && in.In<int>(0, 7) == 0) {
    counts[in.In<int64_t>(0, size - 1)] = in.ConsumeIntegral<int32_t>();
  }
  return Int32s(counts);
}

// 3: the CSR buffers of arbitrary sorted lists.
void RawCsr(FuzzInput& in) {
  const int num_sc = Attr(in, 1, 4), num_replica = Attr(in, 1, 4);
  const int sample_count_per_sc = Attr(in, 1, 8), per_sample = Attr(in, 1, 8);
  const int max_minibatches = Attr(in, 1, 4);
  const std::string op = "ConvertToSparseCoreCsrWrappedCooTensor";
  const Fit fit =
      CsrFit(true, num_replica, sample_count_per_sc, max_minibatches, per_sample, num_sc);
  if (fit == Fit::kTooLarge) return;
  CsrAttrs a;
  const absl::Status init = a.Init(op, true, Table(in), num_replica, sample_count_per_sc,
                                   max_minibatches, per_sample, num_sc);
  if (fit == Fit::kRefused) {
    FUZZ_CHECK(!Clean(init, op), "%s accepted buffers beyond int32", op.c_str());
    return;
  }
  if (!Clean(init, op)) return;
  const int64_t p = a.num_physical;
  if (num_sc > 64 || num_sc * (p * 64 + 1) > kMaxElements) return;
  const bool minibatching = in.ConsumeBool();
  std::vector<Tensor> rows, cols, gains, counts;
  Lists(in, num_sc, in.In<int>(1, 64), &rows, &cols, &gains);
  for (int s = 0; s < num_sc; ++s) {
    const int64_t size =
        in.In<int>(0, 15) == 0 ? in.In<int>(0, 70) : (minibatching ? p * 64 + 1 : p + 1);
    counts.push_back(IdCounts(in, size, rows[s].NumElements()));
  }
  const int64_t splits = in.ConsumeBool() ? in.ConsumeIntegral<int64_t>() : 0;
  Outputs out({DT_INT32, DT_INT32, DT_INT32, DT_FLOAT, DT_INT32, DT_INT32, DT_INT32});
  const bool allow_dropping = in.ConsumeBool();
  if (!Clean(ConvertToCsrWrappedCoo(op, a, allow_dropping, rows, cols, gains, counts,
                                    Int64Scalar(splits), out.ctx()),
             op)) {
    return;
  }
  // Each SparseCore's segments cover its id counts' first to last.
  int64_t expected = 0;
  for (const Tensor& c : counts) {
    expected += c.flat<int32_t>()(c.NumElements() - 1) - c.flat<int32_t>()(0);
  }
  if (counts[0].NumElements() == p + 1) expected *= out.Scalar(6);
  CheckCsr(op.c_str(), out, num_sc, p, max_minibatches, a.max_ids, 0, 0,
           allow_dropping ? -1 : expected);
}

// 4: the minibatching ops on arbitrary inputs.
void RawMinibatches(FuzzInput& in) {
  const int num_sc = Attr(in, 1, 4), num_replica = Attr(in, 1, 4);
  const int sample_count = Attr(in, 1, 16), vocab = Attr(in, 1, 100);
  std::vector<Tensor> rows, cols, gains;
  Lists(in, 1, std::max(sample_count, vocab), &rows, &cols, &gains);
  if (in.ConsumeBool()) {
    std::vector<int32_t> r = ToVector(rows[0]);
    std::sort(r.begin(), r.end());
    rows[0] = Int32s(r);
  }
  if (in.ConsumeBool()) {
    const std::string op = "GetMinibatchSplitsWithPhysicalReplica";
    MinibatchSplitsAttrs ma;
    const __int128 wanted = static_cast<__int128>(num_replica) * num_sc * num_sc * 64;
    const absl::Status init = ma.Init(op, sample_count, num_replica, vocab, num_sc);
    if (wanted >= kInt32) {
      FUZZ_CHECK(!Clean(init, op), "%s accepted %lld id counts", op.c_str(),
                 static_cast<long long>(wanted));
      return;
    }
    if (!Clean(init, op) || wanted >= kMaxElements) return;
    Outputs out({DT_INT32, DT_INT32, DT_FLOAT, DT_INT64, DT_INT32, DT_INT32, DT_INT32});
    if (!Clean(GetMinibatchSplits(op, ma, rows[0], cols[0], gains[0], out.ctx()), op)) return;
    out.CheckComplete(op.c_str());
    const auto counts = out[4].flat<int32_t>();
    FUZZ_CHECK(counts(counts.size() - 1) == out[0].NumElements());
    return;
  }
  const std::string op = "GetMinibatchesInCsrWithPhysicalReplica";
  const int per_sample = Attr(in, 1, 8), max_minibatches = Attr(in, 1, 4);
  const Fit fit = CsrFit(false, num_replica, sample_count, max_minibatches, per_sample, num_sc);
  if (fit == Fit::kTooLarge) return;
  CsrAttrs a;
  const absl::Status init =
      a.Init(op, false, Table(in), num_replica, sample_count, max_minibatches, per_sample, num_sc);
  if (fit == Fit::kRefused) {
    FUZZ_CHECK(!Clean(init, op), "%s accepted buffers beyond int32", op.c_str());
    return;
  }
  if (!Clean(init, op) || 64 * num_sc * a.num_physical + 1 > kMaxElements) return;
  const int64_t size =
      in.In<int>(0, 15) == 0 ? in.In<int>(0, 70) : 64 * num_sc * a.num_physical + 1;
  const Tensor counts = IdCounts(in, size, rows[0].NumElements());
  const int64_t splits = in.ConsumeBool() ? in.ConsumeIntegral<int64_t>() : 0;
  Outputs out({DT_INT32, DT_INT32, DT_INT32, DT_FLOAT, DT_INT32, DT_INT32, DT_INT32});
  if (!Clean(GetMinibatchesInCsr(op, a, rows[0], cols[0], gains[0], Int64Scalar(splits), counts,
                                 out.ctx()),
             op)) {
    return;
  }
  CheckCsr(op.c_str(), out, num_sc, a.num_physical, max_minibatches, a.max_ids, 0, 0,
           counts.flat<int32_t>()(size - 1) - counts.flat<int32_t>()(0));
}

}  // namespace
}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ::tf_tpu_emb::kernels::sc_kernels;  // NOLINT
  if (size == 0) return 0;
  ::tf_tpu_emb::fuzz::FuzzInput in(data + 1, size - 1);
  switch (data[0] % 5) {
    case 0: Pipeline(in); break;
    case 1: Minibatching(in); break;
    case 2: RawSort(in); break;
    case 3: RawCsr(in); break;
    default: RawMinibatches(in); break;
  }
  return 0;
}
