// The hosts' side of the sharded data path (engine/routing.h): the input
// mapper of EnqueueTPUEmbeddingRoutedBatch.  A packed batch is checked whole
// against this host's engine, then built.
#include "engine/routed_mapper.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/config.h"
#include "engine/engine.h"
#include "engine/mapper_base.h"
#include "engine/routing.h"

namespace tf_tpu_emb {
namespace {

using mapping::ParallelForStatus;
using packed::Align8;
using packed::PayloadBytes;

class RoutedMapper : public InputMapper {
 public:
  explicit RoutedMapper(std::string op) : op_(std::move(op)) {}

  absl::Status Map(const Engine& e, const EnqueueInputs& in, ::tsl::thread::ThreadPool* pool,
                   Batch* batch) const override {
    if (in.ids.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(op_, ": expected one packed batch"));
    }
    const char* data = in.ids[0]->tensor_data().data();
    const int64_t size = in.ids[0]->tensor_data().size();
    const int outputs = e.outputs().size();
    View v;
    TF_RETURN_IF_ERROR(ReadHeader(e, data, size, &v));
    // Every array of every output checked before anything is built.
    TF_RETURN_IF_ERROR(ParallelForStatus(pool, outputs, [&](int o) { return Check(e, v, o); }));
    batch->training = v.training;
    batch->sequence = v.sequence;
    batch->outputs.assign(outputs, OutputBatch());
    return ParallelForStatus(pool, outputs, [&](int o) {
      Build(e, v, o, &batch->outputs[o]);
      return absl::OkStatus();
    });
  }

 private:
  struct Part {
    int64_t form, bags, ids, flags;
    const char* at;
  };
  struct View {
    bool training = false, filter = false;
    int64_t sequence = 0;
    std::vector<Part> parts;
  };

  absl::Status Error(const Engine& e, int o, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(mapping::Describe(op_, e, o, o), ": the routed batch: ", what));
  }

  // "host k of S" (this engine).
  static std::string Host(const Engine& e) {
    return absl::StrCat("host ", e.host_id(), " of ", e.num_hosts());
  }

  // The packet's integrity and layout, in engine/routing.h's order
  // ("Packet integrity"): nothing of `data` is trusted before its checksum.
  absl::Status ReadHeader(const Engine& e, const char* data, int64_t size, View* v) const {
    const int outputs = e.outputs().size();
    const int64_t fixed = (packed::kHeaderWords + packed::kOutputWords * int64_t{outputs}) * 8;
    int64_t h[packed::kHeaderWords];
    if (size < packed::kHeaderWords * 8) {
      return absl::DataLossError(absl::StrCat(op_, ": ", Host(e), ": the routed packet has ", size,
                                              " bytes, fewer than its ", packed::kHeaderWords * 8,
                                              "-byte header: truncated (or not a batch made by "
                                              "RouteTPUEmbeddingArbitraryTensorBatch)"));
    }
    std::memcpy(h, data, sizeof h);
    if (h[0] != packed::kMagic || h[1] != packed::kVersion) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_, ": ", Host(e),
                       ": not a packed batch of this tf_tpu_emb version (made by "
                       "RouteTPUEmbeddingArbitraryTensorBatch of the same library on the worker)"));
    }
    const std::string packet = absl::StrCat("routed packet #", h[7], " (", size, " bytes)");
    // The layout the header gives: a packet shorter than it is truncated.
    absl::Status layout = absl::OkStatus();
    int64_t at = fixed;
    if (h[4] == outputs && size < fixed) {
      return absl::DataLossError(absl::StrCat(op_, ": ", Host(e), ": the ", packet,
                                              " is truncated: its header and output words "
                                              "alone take ",
                                              fixed, " bytes"));
    }
    const bool filter = h[6] == 1;
    if (h[4] == outputs) {
      const int64_t* meta = reinterpret_cast<const int64_t*>(data) + packed::kHeaderWords;
      for (int o = 0; o < outputs; ++o) {
        const int64_t* m = meta + packed::kOutputWords * o;
        Part part{m[0], m[1], m[2], m[3], nullptr};
        const int64_t limit = int64_t{1} << 40;
        if ((part.form != packed::kBags && part.form != packed::kRows) || part.bags < 0 ||
            part.ids < 0 || part.bags > limit || part.ids > limit ||
            (part.flags & ~int64_t{packed::kWeights | packed::kScales | packed::kIds64}) != 0 ||
            (part.form == packed::kRows &&
             (part.bags != part.ids || filter || (part.flags & ~int64_t{packed::kIds64}) != 0))) {
          layout = Error(e, o,
                         absl::StrCat("bad layout (form ", part.form, ", ", part.bags, " bags, ",
                                      part.ids, " ids, flags ", part.flags, ")"));
          break;
        }
        part.at = data + at;
        at += PayloadBytes(static_cast<packed::Form>(part.form), part.bags, part.ids, part.flags);
        v->parts.push_back(part);
      }
      if (layout.ok() && at > size) {
        return absl::DataLossError(absl::StrCat(op_, ": ", Host(e), ": the ", packet,
                                                " is truncated: its header lays out ", at,
                                                " bytes"));
      }
    }
    const uint64_t checksum = packed::Checksum(data, size);
    if (static_cast<uint64_t>(h[packed::kChecksumWord]) != checksum) {
      return absl::DataLossError(absl::StrCat(op_, ": ", Host(e), ": the ", packet,
                                              " is corrupt: its checksum is ",
                                              static_cast<uint64_t>(h[packed::kChecksumWord]),
                                              " but its bytes give ", checksum));
    }
    // Intact: what the router wrote, checked against this host's engine.
    if (h[2] != e.num_hosts() || (filter ? h[3] != -1 : h[3] != e.host_id())) {
      return absl::InvalidArgumentError(absl::StrCat(op_, ": the batch was routed for host ", h[3],
                                                     " of ", h[2], " but this engine is host ",
                                                     e.host_id(), " of ", e.num_hosts(),
                                                     " (ConfigureTPUEmbeddingHostShard)"));
    }
    if (h[4] != outputs || (h[5] != 0 && h[5] != 1) || (h[6] != 0 && h[6] != 1)) {
      return absl::InvalidArgumentError(absl::StrCat(op_, ": the batch has ", h[4], " outputs (",
                                                     size,
                                                     " bytes) but the engine's config "
                                                     "has ",
                                                     outputs));
    }
    TF_RETURN_IF_ERROR(layout);
    if (at != size) {
      return absl::InvalidArgumentError(
          absl::StrCat(op_, ": the packed batch has ", size, " bytes; its layout says ", at));
    }
    const uint64_t session = static_cast<uint64_t>(h[packed::kSessionWord]);
    if (session != e.routed_session()) {
      return absl::FailedPreconditionError(absl::StrCat(
          op_, ": ", Host(e), " belongs to session ", e.routed_session(), " but the ", packet,
          " was routed for session ", session,
          ": a packet of another model or trainer (ConfigureTPUEmbeddingHostShard's session and "
          "RouteTPUEmbeddingArbitraryTensorBatch's must be the same)"));
    }
    v->training = h[5] == 1;
    v->filter = filter;
    v->sequence = h[7];
    return absl::OkStatus();
  }

  template <typename Id>
  static const Id* Ids(const Part& p) {
    return reinterpret_cast<const Id*>(p.at + (p.form == packed::kRows ? 0 : Align8(p.bags * 4)));
  }
  static const float* Weights(const Part& p) {
    const int64_t id_bytes = (p.flags & packed::kIds64) ? 8 : 4;
    return reinterpret_cast<const float*>(p.at + Align8(p.bags * 4) + Align8(p.ids * id_bytes));
  }
  static const float* Scales(const Part& p) {
    const int64_t id_bytes = (p.flags & packed::kIds64) ? 8 : 4;
    return reinterpret_cast<const float*>(p.at + Align8(p.bags * 4) + Align8(p.ids * id_bytes) +
                                          ((p.flags & packed::kWeights) ? Align8(p.ids * 4) : 0));
  }
  template <typename Fn>
  static auto WithIds(const Part& p, Fn fn) {
    return (p.flags & packed::kIds64) ? fn(Ids<int64_t>(p)) : fn(Ids<int32_t>(p));
  }

  absl::Status Check(const Engine& e, const View& v, int o) const {
    const Part& p = v.parts[o];
    const OutputSpec& spec = e.outputs()[o];
    const Table& table = e.table(spec.table);
    // Ids are local rows, or with the host filter the table's global ids.
    const int64_t rows = v.filter ? e.config().table_descriptor(spec.table).vocabulary_size()
                                  : table.vocabulary_size;
    const int64_t max_bags = p.form == packed::kRows ? rows : spec.positions;
    if (p.bags > max_bags || (v.filter && p.bags != spec.positions)) {
      return Error(e, o, absl::StrCat(p.bags, " bags, more than the output's ", max_bags));
    }
    if (p.form == packed::kBags) {
      const int32_t* length = reinterpret_cast<const int32_t*>(p.at);
      int64_t total = 0;
      for (int64_t b = 0; b < p.bags; ++b) {
        if (length[b] < 0) return Error(e, o, absl::StrCat("bag ", b, " has a negative length"));
        total += length[b];
      }
      if (total != p.ids) {
        return Error(e, o, absl::StrCat("the bags hold ", total, " ids, not ", p.ids));
      }
    }
    const bool in_range = WithIds(p, [&](const auto* ids) {
      bool ok = true;
      for (int64_t j = 0; j < p.ids; ++j) {
        ok &= static_cast<uint64_t>(int64_t{ids[j]}) < static_cast<uint64_t>(rows);
      }
      return ok;
    });
    if (!in_range) {
      return Error(e, o,
                   absl::StrCat("an id is outside the ", rows,
                                v.filter ? " rows of the table" : " rows this host holds"));
    }
    auto finite = [](const float* x, int64_t n) {
      bool ok = true;
      for (int64_t j = 0; j < n; ++j) ok &= std::isfinite(x[j]);
      return ok;
    };
    if ((p.flags & packed::kWeights) && !finite(Weights(p), p.ids)) {
      return Error(e, o, "an aggregation weight is not finite");
    }
    if ((p.flags & packed::kScales) && !finite(Scales(p), p.bags)) {
      return Error(e, o, "a combiner scale is not finite");
    }
    return absl::OkStatus();
  }

  void Build(const Engine& e, const View& v, int o, OutputBatch* ob) const {
    const Part& p = v.parts[o];
    ob->slot_combiners = {Combiner::kSum};  // the worker applies the combiner
    if (p.form == packed::kRows) {
      ob->offsets.resize(p.bags + 1);
      for (int64_t b = 0; b <= p.bags; ++b) ob->offsets[b] = b;
      ob->ids.resize(p.ids);
      WithIds(p, [&](const auto* ids) {
        std::copy(ids, ids + p.ids, ob->ids.begin());
        return 0;
      });
      return;
    }
    const int32_t* length = reinterpret_cast<const int32_t*>(p.at);
    const float* weights = (p.flags & packed::kWeights) ? Weights(p) : nullptr;
    const float* scales = (p.flags & packed::kScales) ? Scales(p) : nullptr;
    if (!v.filter) {
      ob->offsets.resize(p.bags + 1);
      ob->offsets[0] = 0;
      for (int64_t b = 0; b < p.bags; ++b) ob->offsets[b + 1] = ob->offsets[b] + length[b];
      ob->ids.resize(p.ids);
      WithIds(p, [&](const auto* ids) {
        std::copy(ids, ids + p.ids, ob->ids.begin());
        return 0;
      });
      if (weights) ob->weights.assign(weights, weights + p.ids);
      if (scales) ob->bag_scales.assign(scales, scales + p.bags);
      return;
    }
    // Host filter: this host's ids of every bag, its non-empty bags.
    const ShardLayout layout = HostLayout(e.config(), e.outputs()[o].table);
    const int64_t me = e.host_id();
    ob->offsets.assign(1, 0);
    WithIds(p, [&](const auto* ids) {
      int64_t j = 0;
      for (int64_t b = 0; b < p.bags; ++b) {
        const int64_t before = ob->ids.size();
        for (int64_t end = j + length[b]; j < end; ++j) {
          const int64_t id = ids[j];
          const int64_t k = layout.Owner(id);
          if (k != me) continue;
          ob->ids.push_back(layout.Local(id, k));
          if (weights) ob->weights.push_back(weights[j]);
        }
        if (static_cast<int64_t>(ob->ids.size()) > before) {
          ob->offsets.push_back(ob->ids.size());
          if (scales) ob->bag_scales.push_back(scales[b]);
        }
      }
      return 0;
    });
  }

  const std::string op_;
};

}  // namespace

std::unique_ptr<InputMapper> RoutedBatchMapper(std::string op) {
  return std::make_unique<RoutedMapper>(std::move(op));
}

absl::Status EnqueueRoutedBatch(const InputMapper& mapper, const std::string& op, Engine* engine,
                                int replica, const ::tensorflow::Tensor& packet,
                                ::tsl::thread::ThreadPool* pool) {
  EnqueueInputs in;
  in.ids = {&packet};
  Batch batch;
  TF_RETURN_IF_ERROR(mapper.Map(*engine, in, pool, &batch));
  return engine->EnqueueRouted(op, replica, std::move(batch));
}

}  // namespace tf_tpu_emb
