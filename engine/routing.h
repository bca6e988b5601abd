// The sharded data path (README "Running on several machines"): a worker
// routes one replica's enqueue batch to the S embedding hosts that hold the
// rows (core/sharding.h), combines what the hosts return into the replica's
// activations, and splits the activation gradients per host.  One packed
// tensor per host and phase crosses the network: the batch, the host's Recv
// output, the host's gradients.
//
// The worker maps its inputs with the engine's own input mappers (an Engine
// of kind kRoutingOnly: the same checks and error messages as one engine, no
// table storage), so a batch any host would refuse is refused before any
// host sees it.  Per table it then picks the form that moves fewer bytes
// (counted exactly, both ways; every output of a table travels in the same
// form).  Counting the rows form's bytes needs the distinct rows, the costly
// part of routing; once bags won, a table keeps bags without counting for
// kRecheckSteps batches:
//
//  * bags: host k gets each bag (output position) holding ids of its rows:
//    those ids (local rows), their weights and, for training, the bag's
//    combiner scale over the whole bag; it returns each such bag's partial
//    sum_k w_k row_k (combiner "sum"); the worker adds the hosts' partial
//    sums in host order and applies the combiner scale; host k's gradient is
//    the rows of its bags, and it applies each id's contribution w * scale * g
//    exactly as one engine would (OutputBatch::bag_scales).  Bit-identical to
//    one engine for tables; activations up to the order of the hosts'
//    partial sums (bit-identical on one host).
//  * rows: host k gets the distinct local rows of the table the batch reads
//    there (over all the table's features; they travel with the table's
//    first output, its "carrier") and returns them (as the lookup reads them:
//    quantized if the table is); the worker reduces every bag as the
//    engine's lookup does (core/bag.h, same order: bit-identical
//    activations); host k's gradient is each row's sum over the batch of
//    w * scale * g (outputs in order, then bags: the engine's order), applied
//    as one contribution (bit-identical tables for one replica; with several
//    replicas the replicas' sums are added, a reassociation).  Not used to
//    train a table without gradient accumulation (it is updated once per id
//    occurrence).
//
// RouteChoice can force a form (tests, benchmarks; a forced rows form still
// trains a table without gradient accumulation with bags), or ask for the
// host filter: every host gets the same packed batch (every bag, global ids)
// and keeps its own ids -- the alternative design, measured in
// benchmarks/RESULTS.md, not used by the library.
//
// The worker keeps a Router per sharded model (by name): per replica a queue
// of routed batches (RoutePlan) and the one in flight (Recv'd, waiting for
// its gradients), mirroring the hosts' engine queues.  Each plan carries a
// sequence number that travels with the batch, the host's Recv output and
// the gradients, so the worker and every host agree on which batch a tensor
// answers.
//
// Implementation: engine/routing.cc (plan, pack, combine, split, the router
// registry); the hosts' mapper in engine/routed_mapper.{h,cc}.
#ifndef TF_TPU_EMB_ENGINE_ROUTING_H_
#define TF_TPU_EMB_ENGINE_ROUTING_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/sharding.h"
#include "engine/batch.h"
#include "engine/engine.h"

namespace tf_tpu_emb {

// Packed batch of one host (a uint8 tensor, native byte order; written and
// read by this library): int64 words kMagic, kVersion, num_hosts, host_id,
// num_outputs, training, host_filter, sequence, session, checksum; per
// output four int64 (form, bags, ids, flags); then per output its arrays,
// each starting at a multiple of 8 bytes:
//   bags form: int32 length[bags]; ids[ids] (int32, or int64 with kIds64);
//              float weight[ids] (kWeights); float scale[bags] (kScales)
//   rows form: ids[ids] (bags == ids)
// A host's Recv output and its gradients are float32 vectors: per output
// bags x dim floats, in output order; then (gradients) one float per
// dynamic learning rate; then two floats carrying the sequence's bits.
//
// Packet integrity (what a host checks before it builds anything, in this
// order; engine/routed_mapper.cc): the header's size, magic and version;
// the packet's length against the layout its header gives (a shorter one is
// truncated: DataLoss); the checksum, CRC32C of every byte with the
// checksum word zero (DataLoss: corrupt); the layout (InvalidArgument); the
// session, the random 64-bit id the sharded model's configure gave every
// host (ConfigureTPUEmbeddingHostShard's `session`) and its router stamps
// on every packet (FailedPrecondition: a packet of another model or
// trainer); then, as it enqueues, the sequence, which must exceed the last
// one the host's replica took (FailedPrecondition: a replayed packet,
// Engine::EnqueueRouted; not checked by an engine configured without a
// session, 0, which takes packets of session 0 only: hosts' kernels fed by
// hand, as benchmarks/cluster_breakdown.py does).  A refused packet changes
// nothing on the host.
namespace packed {
inline constexpr int64_t kMagic = 0x5454454d42524f55;  // "TTEMBROU"
inline constexpr int64_t kVersion = 2;
inline constexpr int kHeaderWords = 10;
inline constexpr int kSessionWord = 8, kChecksumWord = 9;
inline constexpr int kOutputWords = 4;
enum Form : int64_t { kBags = 0, kRows = 1 };
inline constexpr int64_t kWeights = 1, kScales = 2, kIds64 = 4;  // flags
inline constexpr int kSequenceFloats = 2;
inline int64_t Align8(int64_t bytes) { return (bytes + 7) & ~int64_t{7}; }
// The bytes of one output's arrays.
inline int64_t PayloadBytes(Form form, int64_t bags, int64_t ids, int64_t flags) {
  const int64_t id_bytes = (flags & kIds64) ? 8 : 4;
  if (form == kRows) return Align8(ids * id_bytes);
  return Align8(bags * 4) + Align8(ids * id_bytes) + ((flags & kWeights) ? Align8(ids * 4) : 0) +
         ((flags & kScales) ? Align8(bags * 4) : 0);
}
// The checksum of a packet of `size` >= kHeaderWords * 8 bytes: CRC32C of
// its bytes with the checksum word read as zero.
uint32_t Checksum(const char* data, int64_t size);
}  // namespace packed

// How the worker routes: the smaller form per output and step, one form,
// or the host filter.
enum class RouteChoice { kAuto, kBags, kRows, kHostFilter };
// RouteChoice of the Route op's `form` attr ("auto", "bags", "rows",
// "host_filter"); InvalidArgument otherwise.
absl::Status ParseRouteChoice(const std::string& form, RouteChoice* choice);

// The sequence number's bits in two floats (and back).
void PutSequence(int64_t sequence, float* out);
int64_t GetSequence(const float* in);

// How one output of a routed batch travels.
inline constexpr int kRecheckSteps = 16;

struct RoutedOutput {
  packed::Form form = packed::kBags;
  int64_t dim = 0;
  bool ids64 = false;          // some host's ids (local rows) need 64 bits
  bool scales = false;         // bags form: the hosts get bag scales (training, not "sum")
  std::vector<float> scale;    // per bag of the global batch: its combiner scale
  std::vector<int32_t> owner;  // per id: its host (empty on one host)
  std::vector<int64_t> local;  // per id: its local row
  // bags form: per host, the positions of the bags it holds ids of, and
  // the number of those ids.
  std::vector<std::vector<int64_t>> bags;
  std::vector<int64_t> host_ids;
  // rows form: the output carrying its table's rows (the table's first);
  // per host, the rows this output carries (the table's distinct rows in
  // first-use order on the carrier, none on the others); per id, the index
  // of its row in the carrier's rows of every host laid end to end
  // (host-major).
  int carrier = 0;
  std::vector<std::vector<int64_t>> rows;
  std::vector<int64_t> row_of_id;
  std::vector<int64_t> row_start;  // carrier: per host + 1, where its rows start

  int64_t HostBags(int k) const {
    return form == packed::kRows ? static_cast<int64_t>(rows[k].size())
                                 : static_cast<int64_t>(bags[k].size());
  }
};

// One replica's routed batch: the whole batch (global ids, as one engine
// would hold it) and how it was split.
struct RoutePlan {
  Batch batch;
  int64_t sequence = 0;
  uint64_t session = 0;  // the hosts' session (Route's `session` attr)
  bool host_filter = false;
  std::vector<RoutedOutput> outputs;
  // Per host: floats of its Recv output / gradients (without the rates and
  // the sequence), where each output starts in them, bytes of its batch.
  std::vector<int64_t> host_floats;
  std::vector<std::vector<int64_t>> host_float_offsets;
  std::vector<int64_t> host_bytes;
  std::vector<std::vector<int64_t>> host_byte_offsets;  // per output payload
};

class Router {
 public:
  // The router called `name`, created from the serialized config on first
  // use; FailedPrecondition when it exists for another config.
  static absl::Status Get(const std::string& name, const std::string& config,
                          std::shared_ptr<Router>* out);
  // Forgets the router called `name` (queued batches are dropped).
  static void Drop(const std::string& name);

  // The routing-only engine: outputs, tables, the input mappers' checks.
  const Engine& engine() const { return *engine_; }
  int num_hosts() const { return num_hosts_; }

  // Splits `batch` (what an input mapper made of one replica's inputs).
  absl::Status Plan(Batch batch, RouteChoice choice, ::tsl::thread::ThreadPool* pool,
                    RoutePlan* plan);
  // Writes every host's packed batch (plan.host_bytes[k] bytes at out[k];
  // with host_filter only out[0], the batch every host gets).
  absl::Status Pack(const RoutePlan& plan, const std::vector<char*>& out,
                    ::tsl::thread::ThreadPool* pool) const;

  // Queue of replica `replica` (FailedPrecondition out of range).
  absl::Status Push(int replica, std::unique_ptr<RoutePlan> plan);
  // The queued plan of `sequence` (older ones, whose hosts never got their
  // batch, are dropped); FailedPrecondition when there is none.
  absl::Status Pop(int replica, int64_t sequence, std::unique_ptr<RoutePlan>* plan);
  void SetInFlight(int replica, std::unique_ptr<RoutePlan> plan);
  // The in-flight training plan (FailedPrecondition otherwise), released.
  absl::Status TakeInFlight(const std::string& op, int replica, std::unique_ptr<RoutePlan>* plan);

  // The replica's activations (out[o]: Recv's output o) from the hosts'
  // Recv outputs (`host[k]`: plan.host_floats[k] floats).
  absl::Status Combine(const RoutePlan& plan, const std::vector<const float*>& host,
                       const std::vector<float*>& out, ::tsl::thread::ThreadPool* pool) const;
  // Host k's gradients (plan.host_floats[k] floats at out[k]) from the
  // replica's activation gradients (`grads[o]`, Recv's shapes).
  absl::Status Split(const RoutePlan& plan, const std::vector<const float*>& grads,
                     const std::vector<float*>& out, ::tsl::thread::ThreadPool* pool) const;

 private:
  Router() = default;
  EnginePtr engine_;
  std::string config_;
  int num_hosts_ = 1;
  std::vector<FastShardLayout> layouts_;         // per table
  std::vector<bool> per_id_updates_;             // per table: no gradient accumulation
  std::vector<std::vector<int>> table_outputs_;  // per table: its outputs, in order
  // Per table: batches left before bags, the last choice, is checked again.
  std::unique_ptr<std::atomic<int>[]> bags_for_;
  std::mutex mu_;
  int64_t next_sequence_ = 1;
  std::vector<std::deque<std::unique_ptr<RoutePlan>>> queues_;
  std::vector<std::unique_ptr<RoutePlan>> in_flight_;

  void PlanOutput(int o, bool host_filter, bool training, RoutePlan* plan) const;
  void PlanTable(int t, RouteChoice choice, bool training, RoutePlan* plan) const;
};

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_ENGINE_ROUTING_H_
