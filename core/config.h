// TPUEmbeddingConfiguration semantics shared by the shape functions (ops/)
// and the engine (kernels/): output shapes, table shard shapes, state
// variables, and the configure-time completion/validation of a config.
#ifndef TF_TPU_EMB_CORE_CONFIG_H_
#define TF_TPU_EMB_CORE_CONFIG_H_

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/optimizers.h"
#include "core/sharding.h"
#include "core/tf_version.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"
#include "google/protobuf/unknown_field_set.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"
#include "tensorflow/core/platform/errors.h"
#include "tensorflow/core/protobuf/tpu/tpu_embedding_configuration.pb.h"

namespace tf_tpu_emb {

using TPUEmbeddingConfiguration = ::tensorflow::tpu::TPUEmbeddingConfiguration;
using ::tensorflow::TensorShapeProto;

// ------------------------------------------------------------------ limits
//
// Configure-time limits (README "Limits and errors").  TF bounds none of
// these on TPU because the hardware does; on CPU a config past them would
// overflow the engine's size arithmetic or make every op allocate without
// bound, so configure refuses it with InvalidArgument naming field and limit.

// num_tensor_cores: the engine keeps queues and step state per replica, and
// a replica is a (logical) CPU device; the largest TPU slices have a few
// thousand cores.
constexpr int64_t kMaxTensorCores = 4096;
// Rank of a feature's input_shape: Recv's output appends [dimension] and a
// TensorShape holds at most TensorShape::MaxDimensions() (254) dimensions.
constexpr int kMaxInputShapeRank = ::tensorflow::TensorShape::MaxDimensions() - 1;
// Output positions (bags) of one feature (table mode: batch_size_per_tensor_core
// x num_features) per replica and step: every enqueue allocates 8 bytes of
// bag offsets per position of every output, whatever the number of ids.
constexpr int64_t kMaxFeaturePositions = int64_t{1} << 24;
// Floats of one replica's Recv outputs (sum of positions x dimension over the
// outputs, 1 GiB): Recv allocates them, Send's gradients have the same size.
constexpr int64_t kMaxActivationFloats = int64_t{1} << 28;
// Embedding dimension: row updates keep dimension-sized scratch per thread
// and address a row's bytes (dimension x 4) with int arithmetic.
constexpr int64_t kMaxDimension = int64_t{1} << 20;

// Overflow-checked arithmetic for every size derived from a config: false
// when a * b (a + b) does not fit in int64.
inline bool CheckedMul(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool CheckedAdd(int64_t a, int64_t b, int64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

// The product of `factors` (all >= 0), or InvalidArgument "<what> is ...,
// more than <limit>" when it overflows int64 or exceeds `limit`.
template <typename Factors>
absl::StatusOr<int64_t> BoundedProduct(const Factors& factors, int64_t limit,
                                       const std::string& what) {
  int64_t product = 1;
  bool overflow = false;
  std::string expr;
  int n = 0;
  for (int64_t f : factors) {
    absl::StrAppend(&expr, n++ ? " x " : "", f);
    if (!overflow && !CheckedMul(product, f, &product)) overflow = true;
  }
  if (overflow || product > limit) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is ", expr,
                                                   overflow ? " (overflows int64)"
                                                   : n > 1  ? absl::StrCat(" = ", product)
                                                            : "",
                                                   ", more than the limit ", limit));
  }
  return product;
}
inline absl::StatusOr<int64_t> BoundedProduct(std::initializer_list<int64_t> factors, int64_t limit,
                                              const std::string& what) {
  return BoundedProduct<std::initializer_list<int64_t>>(factors, limit, what);
}

inline absl::Status CheckInputShapeRank(
    const ::tensorflow::tpu::TPUEmbeddingConfiguration::FeatureDescriptor& feature) {
  if (feature.input_shape_size() <= kMaxInputShapeRank) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("feature_descriptor '", feature.name(), "': input_shape has rank ",
                   feature.input_shape_size(), ", more than the limit ", kMaxInputShapeRank,
                   " (Recv's output appends the embedding dimension and a TensorShape has at most ",
                   ::tensorflow::TensorShape::MaxDimensions(), " dimensions)"));
}

inline absl::Status ParseConfig(const std::string& bytes, TPUEmbeddingConfiguration* config) {
  if (!config->ParseFromString(bytes)) {
    return absl::InvalidArgumentError("Malformed tpu_embedding_config.");
  }
  return absl::OkStatus();
}

inline TensorShapeProto MakeShapeProto(const std::vector<int64_t>& dims) {
  TensorShapeProto shape;
  for (int64_t d : dims) shape.add_dim()->set_size(d);
  return shape;
}

// Shapes of the RecvTPUEmbeddingActivations outputs, from a config as the
// user wrote it (not completed): one per feature descriptor
// (input_shape + [dim]) or, without feature descriptors, one per table
// ([num_features * batch_size_per_tensor_core, dim]).  With automatic SPMD
// partitioning the leading dimension covers every core of the replica.  Like
// TF, nothing else is validated here; unlike TF (which reads out of bounds),
// a feature whose table_id does not name a table is an error.
inline bool SpmdMultipliesOutputs(const TPUEmbeddingConfiguration& config) {
#if TF_TPU_EMB_HAS_TF219_PROTOS
  return config.spmd_sharding().enabled() && !config.spmd_sharding().use_manual_partitioning();
#else
  // Before TF 2.19 SPMD partitioning is automatic only; a config asking for
  // manual partitioning is refused at configure (RefuseNewerTfFeatures).
  return config.spmd_sharding().enabled();
#endif
}

inline absl::Status ComputeOutputShapes(const TPUEmbeddingConfiguration& config,
                                        std::vector<TensorShapeProto>* shapes) {
  shapes->clear();
  if (config.feature_descriptor_size() > 0) {
    for (const auto& feature : config.feature_descriptor()) {
      const int table_id = feature.table_id();
      if (table_id < 0 || table_id >= config.table_descriptor_size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("feature_descriptor '", feature.name(), "' has table_id ", table_id,
                         ", which is not in [0, ", config.table_descriptor_size(), ")"));
      }
      TF_RETURN_IF_ERROR(CheckInputShapeRank(feature));
      std::vector<int64_t> dims(feature.input_shape().begin(), feature.input_shape().end());
      dims.push_back(config.table_descriptor(table_id).dimension());
      shapes->push_back(MakeShapeProto(dims));
    }
  } else {
    for (const auto& table : config.table_descriptor()) {
      shapes->push_back(MakeShapeProto(
          {static_cast<int64_t>(table.num_features()) * config.batch_size_per_tensor_core(),
           table.dimension()}));
    }
  }
  if (SpmdMultipliesOutputs(config)) {
    for (TensorShapeProto& shape : *shapes) {
      auto* first = shape.mutable_dim(0);
      int64_t size;
      if (!CheckedMul(first->size(), config.spmd_sharding().num_cores_per_replica(), &size)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "spmd_sharding.num_cores_per_replica ", config.spmd_sharding().num_cores_per_replica(),
            " times the output's first "
            "dimension ",
            first->size(), " overflows int64"));
      }
      first->set_size(size);
    }
  }
  return absl::OkStatus();
}

// Number of rows of a table held by shard `shard_id` of `num_shards`
// (ShardLayout::Rows), with the errors of TF's table shard shapes
// (TpuEmbeddingShapeUtil): TF refuses an empty shard there.
inline absl::StatusOr<int64_t> NumIdsInShard(int64_t vocabulary_size, int shard_id,
                                             int num_shards) {
  if (num_shards <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("The number of shards for the embedding layer must be > 0. "
                     "Currently set to: ",
                     num_shards));
  }
  if (shard_id < 0 || shard_id >= num_shards) {
    return absl::InvalidArgumentError(absl::StrCat("The value of shard_id must be >= 0 and < ",
                                                   num_shards, ". Currently set to: ", shard_id));
  }
  int64_t rows;
  if (vocabulary_size >= 1) {
    rows = ShardLayout{vocabulary_size, num_shards}.Rows(shard_id);
  } else {  // TF's arithmetic (floor) for an invalid vocabulary: a negative is unknown
    rows = vocabulary_size / num_shards;
    if (vocabulary_size % num_shards != 0) --rows;
  }
  if (rows == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "All embedding shards must be non-empty, shard ID: ", shard_id,
        " is empty, vocabulary size: ", vocabulary_size, ", number of shards: ", num_shards));
  }
  return rows;
}

inline absl::Status TableShardShapes(const TPUEmbeddingConfiguration& config, int shard_id,
                                     int num_shards, std::vector<TensorShapeProto>* shapes) {
  shapes->clear();
  for (const auto& table : config.table_descriptor()) {
    absl::StatusOr<int64_t> rows = NumIdsInShard(table.vocabulary_size(), shard_id, num_shards);
    if (!rows.ok()) return rows.status();
    shapes->push_back(MakeShapeProto({*rows, table.dimension()}));
  }
  return absl::OkStatus();
}

// The config's sharding_strategy (core/sharding.h holds its arithmetic).
inline ShardingStrategy ShardingOf(const TPUEmbeddingConfiguration& config) {
  return config.sharding_strategy() == TPUEmbeddingConfiguration::MOD
             ? ShardingStrategy::kMod
             : ShardingStrategy::kDivDefault;
}

// The layout of table `t` over the config's num_hosts hosts.
inline ShardLayout HostLayout(const TPUEmbeddingConfiguration& config, int t) {
  return ShardLayout{config.table_descriptor(t).vocabulary_size(),
                     config.num_hosts() < 1 ? 1 : config.num_hosts(), ShardingOf(config)};
}

// The state variables of a table, in TF's order: "parameters", the
// optimizer's slots, and a trailing hidden "gradient_accumulators" when
// gradient accumulation is on.
inline absl::Status StateVariableNames(const OptimizationParameters& params,
                                       std::vector<std::string>* names) {
  names->clear();
  const OptimizerSpec* spec = FindOptimizer(params.parameters_case());
  if (spec == nullptr) {
    return absl::InvalidArgumentError("No optimization algorithm specified");
  }
  if (params.parameters_case() == OptimizationParameters::kUserDefinedProgram) {
    return absl::UnimplementedError(
        "The user_defined_program optimizer is not supported by tf_tpu_emb");
  }
  names->push_back("parameters");
  for (const SlotSpec& slot : spec->slots) names->push_back(slot.name);
  if (UsesGradientAccumulation(params)) names->push_back("gradient_accumulators");
  if (names->size() > kMaxStateVariables) {
    return absl::InvalidArgumentError(
        absl::StrCat("Optimization algorithm ", spec->op_infix,
                     " does not support gradient accumulation because it already has too "
                     "many other accumulators"));
  }
  return absl::OkStatus();
}

// True when `m` carries an unknown field numbered `number`: what this TF's
// parser makes of a field that only a newer TF's proto declares.
inline bool HasUnknownField(const ::google::protobuf::Message& m, int number) {
  const ::google::protobuf::UnknownFieldSet& unknown = m.GetReflection()->GetUnknownFields(m);
  for (int i = 0; i < unknown.field_count(); ++i) {
    if (unknown.field(i).number() == number) return true;
  }
  return false;
}

// The features whose proto fields the TensorFlow this library is built
// against lacks (a config serialized by a newer TF carries them as unknown
// fields): Unimplemented, naming the feature and the TF it needs.
inline absl::Status RefuseNewerTfFeatures(const TPUEmbeddingConfiguration& config) {
  const std::string built_for =
      absl::StrCat("; this build of tf_tpu_emb is for TensorFlow ", TF_TPU_EMB_TF_VERSION / 1000,
                   ".", TF_TPU_EMB_TF_VERSION % 1000 / 10);
  for (const auto& desc : config.table_descriptor()) {
    for (const VersionedOptimizer& v : VersionedOptimizers()) {
      if (TF_TPU_EMB_TF_AT_LEAST(v.min_tf_major, v.min_tf_minor)) continue;
      if (HasUnknownField(desc.optimization_parameters(), v.proto_number)) {
        return absl::UnimplementedError(
            absl::StrCat("table '", desc.name(), "': the ", v.op_infix,
                         " optimizer (OptimizationParameters.", v.proto_field,
                         ") needs TensorFlow >= ", v.min_tf_major, ".", v.min_tf_minor, built_for));
      }
    }
  }
#if !TF_TPU_EMB_HAS_TF219_PROTOS
  constexpr int kUseManualPartitioningField = 3;  // TPUEmbeddingConfiguration.SpmdSharding
  if (HasUnknownField(config.spmd_sharding(), kUseManualPartitioningField)) {
    return absl::UnimplementedError(
        absl::StrCat("spmd_sharding.use_manual_partitioning (manual SPMD partitioning) needs "
                     "TensorFlow >= 2.19",
                     built_for));
  }
#endif
  return absl::OkStatus();
}

// Fills in what TF's ConfigureTPUEmbedding rewrite fills in
// (PopulateMissingFieldsInTPUEmbeddingConfig), with the same errors: without
// feature descriptors one is synthesised per table; with them,
// batch_size_per_tensor_core becomes the gcd of the features' element counts
// and num_features the per-table sum of element count / batch size.
inline absl::Status CompleteConfig(TPUEmbeddingConfiguration* config) {
  TF_RETURN_IF_ERROR(RefuseNewerTfFeatures(*config));
  if (config->feature_descriptor_size() == 0) {
    if (config->batch_size_per_tensor_core() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Invalid batch_size_per_tensor_core: ", config->batch_size_per_tensor_core(),
                       " found in the TPU embedding configuration. Valid values are >0."));
    }
    for (const auto& table : config->table_descriptor()) {
      if (table.num_features() <= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Invalid num_features: ", table.num_features(), " found for table: ", table.name(),
            " in the TPU embedding configuration. Valid values are >0."));
      }
    }
    std::vector<int64_t> rows(config->table_descriptor_size());
    for (int t = 0; t < config->table_descriptor_size(); ++t) {
      const auto& table = config->table_descriptor(t);
      absl::StatusOr<int64_t> r = BoundedProduct(
          {config->batch_size_per_tensor_core(), table.num_features()}, kMaxFeaturePositions,
          absl::StrCat("table '", table.name(), "': batch_size_per_tensor_core x num_features"));
      if (!r.ok()) return r.status();
      rows[t] = *r;
    }
    for (int t = 0; t < config->table_descriptor_size(); ++t) {
      auto* feature = config->add_feature_descriptor();
      feature->set_name(config->table_descriptor(t).name());
      feature->set_table_id(t);
      feature->add_input_shape(static_cast<int32_t>(rows[t]));
    }
    return absl::OkStatus();
  }
  if (config->batch_size_per_tensor_core() != 0) {
    return absl::InvalidArgumentError(
        "Invalid TPU embedding configuration. The batch_size_per_tensor_core "
        "field must NOT be populated when the feature_descriptor fields are "
        "filled in.");
  }
  for (const auto& table : config->table_descriptor()) {
    if (table.num_features() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("Invalid TPU embedding configuration. The TableDescriptor."
                       "num_features field must NOT be populated when the "
                       "feature_descriptor fields are filled in, num_features is set to ",
                       table.num_features(), " for table ", table.name(), "."));
    }
  }
  const int num_tables = config->table_descriptor_size();
  std::vector<bool> used(num_tables, false);
  std::vector<int64_t> sizes;
  for (const auto& feature : config->feature_descriptor()) {
    if (feature.table_id() < 0 || feature.table_id() >= num_tables) {
      return absl::InvalidArgumentError(
          absl::StrCat("Invalid table_id: ", feature.table_id(),
                       " found in feature_descriptor: ", feature.ShortDebugString(),
                       ", all table_ids must be in the range[0, ", num_tables, ")"));
    }
    if (feature.input_shape().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("The input_shape field cannot be empty in feature_descriptor: ",
                       feature.ShortDebugString()));
    }
    for (int d : feature.input_shape()) {
      if (d <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("The input_shape dimension sizes must all be >0 in "
                         "feature_descriptor: ",
                         feature.ShortDebugString(), ", found dimension size set to ", d));
      }
    }
    TF_RETURN_IF_ERROR(CheckInputShapeRank(feature));
    absl::StatusOr<int64_t> positions =
        BoundedProduct(feature.input_shape(), kMaxFeaturePositions,
                       absl::StrCat("feature_descriptor '", feature.name(),
                                    "': the element count of input_shape"));
    if (!positions.ok()) return positions.status();
    const int64_t size = *positions;
    used[feature.table_id()] = true;
    sizes.push_back(size);
  }
  for (int t = 0; t < num_tables; ++t) {
    if (!used[t]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "No feature_descriptor fields found for table: ", config->table_descriptor(t).name(),
          " (ID: ", t, ") in the TPU embedding configuration."));
    }
  }
  int64_t batch = 0;
  for (int64_t s : sizes) batch = std::gcd(batch, s);
  config->set_batch_size_per_tensor_core(static_cast<int32_t>(batch));
  std::vector<int64_t> counts(num_tables, 0);
  for (int f = 0; f < config->feature_descriptor_size(); ++f) {
    counts[config->feature_descriptor(f).table_id()] += sizes[f] / batch;
  }
  for (int t = 0; t < num_tables; ++t) {
    if (counts[t] > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat("table '", config->table_descriptor(t).name(), "': its features have ",
                       counts[t], " x batch_size_per_tensor_core (", batch,
                       ") elements; num_features would exceed the limit ", INT32_MAX));
    }
    config->mutable_table_descriptor(t)->set_num_features(static_cast<int32_t>(counts[t]));
  }
  return absl::OkStatus();
}

// Every float/double field set anywhere in `m` (nested messages and
// repeated fields included) is finite; else InvalidArgument naming
// `label` and the field's path below `path`.  Generic on purpose: it covers
// every optimizer's constants, the learning rate, clipping limits and
// weight decay without a list to keep in step with the proto.
inline absl::Status CheckFiniteFields(const ::google::protobuf::Message& m,
                                      const std::string& label, const std::string& path) {
  using ::google::protobuf::FieldDescriptor;
  const auto* reflection = m.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(m, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string name = absl::StrCat(path, ".", field->name());
    const int n = field->is_repeated() ? reflection->FieldSize(m, field) : 1;
    for (int i = 0; i < n; ++i) {
      const std::string at = field->is_repeated() ? absl::StrCat(name, "[", i, "]") : name;
      double value = 0;
      switch (field->cpp_type()) {
        case FieldDescriptor::CPPTYPE_FLOAT:
          value = field->is_repeated() ? reflection->GetRepeatedFloat(m, field, i)
                                       : reflection->GetFloat(m, field);
          break;
        case FieldDescriptor::CPPTYPE_DOUBLE:
          value = field->is_repeated() ? reflection->GetRepeatedDouble(m, field, i)
                                       : reflection->GetDouble(m, field);
          break;
        case FieldDescriptor::CPPTYPE_MESSAGE:
          TF_RETURN_IF_ERROR(CheckFiniteFields(field->is_repeated()
                                                   ? reflection->GetRepeatedMessage(m, field, i)
                                                   : reflection->GetMessage(m, field),
                                               label, at));
          continue;
        default: continue;
      }
      if (!std::isfinite(value)) {
        return absl::InvalidArgumentError(
            absl::StrCat(label, ": ", at, " is ", value, "; hyper-parameters must be finite"));
      }
    }
  }
  return absl::OkStatus();
}

// The forward-pass simulated quantization of a table: enabled, and the
// clipping range and bucket width the lookup rounds to.
struct Quantization {
  bool enabled = false;
  float lower = 0, upper = 0, step = 0;
};

inline absl::StatusOr<Quantization> TableQuantization(const OptimizationParameters& p,
                                                      const std::string& label) {
  Quantization q;
  if (!p.has_simulated_quantization() || !p.simulated_quantization().enabled()) return q;
  const auto& sq = p.simulated_quantization();
  const auto& limits = sq.clipping_limits();
  q.enabled = true;
  q.lower = limits.has_lower() ? limits.lower().value() : -INFINITY;
  q.upper = limits.has_upper() ? limits.upper().value() : INFINITY;
  if (sq.num_buckets() < 2 || !std::isfinite(q.lower) || !std::isfinite(q.upper) ||
      !(q.lower < q.upper)) {
    return absl::InvalidArgumentError(
        absl::StrCat(label,
                     ": simulated_quantization needs finite clipping limits "
                     "lower < upper and num_buckets >= 2"));
  }
  q.step = (q.upper - q.lower) / static_cast<float>(sq.num_buckets() - 1);
  // The width must be a normal float: TF's threads flush denormals to zero,
  // and the lookup divides by it.
  if (!std::isfinite(q.upper - q.lower) || !(q.step >= std::numeric_limits<float>::min()) ||
      !std::isfinite(q.step)) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": simulated_quantization range [", q.lower, ", ", q.upper, "] with ",
                     sq.num_buckets(), " buckets has bucket width ", q.upper - q.lower, " / ",
                     sq.num_buckets() - 1, ", which is not a normal, finite float32"));
  }
  return q;
}

// "table 'video' (id 0)"
inline std::string TableLabel(const TPUEmbeddingConfiguration& config, int t) {
  return absl::StrCat("table '", config.table_descriptor(t).name(), "' (id ", t, ")");
}

// Bytes of a table's state the engine allocates at configure: parameters
// and one buffer per optimizer slot, vocabulary_size x dimension float32
// each (README "Memory budget").
// `rows`: the rows held (a host's shard); -1 = the whole vocabulary.
inline absl::StatusOr<int64_t> TableStateBytes(const TPUEmbeddingConfiguration& config, int t,
                                               int64_t rows = -1) {
  const auto& desc = config.table_descriptor(t);
  const OptimizerSpec* spec = FindOptimizer(desc.optimization_parameters().parameters_case());
  const int64_t buffers = 1 + (spec == nullptr ? 0 : spec->slots.size());
  return BoundedProduct(
      {rows < 0 ? desc.vocabulary_size() : rows, desc.dimension(), int64_t{4}, buffers}, INT64_MAX,
      absl::StrCat(TableLabel(config, t), ": vocabulary_size x dimension x 4 bytes x (1 + slots)"));
}

// Configure-time validation of a completed config (after CompleteConfig):
// the limits above, every size the engine derives from the config, and
// finite hyper-parameters.  ConfigureTPUEmbedding runs it before it
// allocates anything.
inline absl::Status ValidateConfig(const TPUEmbeddingConfiguration& config) {
  if (config.num_tensor_cores() < 0 || config.num_tensor_cores() > kMaxTensorCores) {
    return absl::InvalidArgumentError(
        absl::StrCat("Invalid num_tensor_cores: ", config.num_tensor_cores(), "; must be in [0, ",
                     kMaxTensorCores, "]"));
  }
  for (int t = 0; t < config.table_descriptor_size(); ++t) {
    const auto& desc = config.table_descriptor(t);
    const std::string label = TableLabel(config, t);
    if (desc.vocabulary_size() <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(label, " has vocabulary_size ", desc.vocabulary_size(), "; must be > 0"));
    }
    if (desc.dimension() <= 0 || desc.dimension() > kMaxDimension) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, " has dimension ", desc.dimension(),
          desc.dimension() <= 0 ? "; must be > 0"
                                : absl::StrCat(", more than the limit ", kMaxDimension)));
    }
    TF_RETURN_IF_ERROR(TableStateBytes(config, t).status());
    TF_RETURN_IF_ERROR(
        CheckFiniteFields(desc.optimization_parameters(), label, "optimization_parameters"));
    TF_RETURN_IF_ERROR(TableQuantization(desc.optimization_parameters(), label).status());
  }
  int64_t activations = 0;
  for (const auto& feature : config.feature_descriptor()) {
    std::vector<int64_t> dims(feature.input_shape().begin(), feature.input_shape().end());
    dims.push_back(config.table_descriptor(feature.table_id()).dimension());
    absl::StatusOr<int64_t> floats =
        BoundedProduct(dims, kMaxActivationFloats,
                       absl::StrCat("feature_descriptor '", feature.name(),
                                    "': the size of Recv's output (input_shape + [dimension])"));
    if (!floats.ok()) return floats.status();
    if (!CheckedAdd(activations, *floats, &activations) || activations > kMaxActivationFloats) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Recv's outputs have more than ", kMaxActivationFloats,
          " floats in all (the limit), reached at feature_descriptor '", feature.name(), "'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_CONFIG_H_
