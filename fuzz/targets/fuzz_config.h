// A valid TPUEmbeddingConfiguration built from a fuzz input (the targets
// that fuzz what comes after configure: the input mappers, Load/Retrieve).
// Small tables (so that an input runs in microseconds), every optimizer of
// the optimizer table (core/optimizer_table.gen.h) by its proto field, DIV
// or MOD sharding, feature-descriptor or table mode, up to 4 replicas and
// hosts.  Needs TensorFlow's protos (a `fuzz-needs: tensorflow` target).
#ifndef TF_TPU_EMB_FUZZ_TARGETS_FUZZ_CONFIG_H_
#define TF_TPU_EMB_FUZZ_TARGETS_FUZZ_CONFIG_H_

#include <string>
#include <vector>

#include "core/config.h"
#include "core/optimizers.h"
#include "fuzz/targets/fuzz_input.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace tf_tpu_emb {
namespace fuzz {

struct ConfigLimits {
  int max_tables = 3;
  int64_t max_vocabulary = 64;
  int max_dimension = 8;
  bool every_optimizer = false;  // else stochastic gradient descent only
  // Every scalar of each table's optimization parameters fuzzed (the
  // optimizer's hyper-parameters, clipping, weight decay, gradient
  // accumulation, a dynamic learning rate, simulated quantization: whatever
  // the proto holds), and the pipelining flag; else proto defaults.
  bool fuzz_parameters = false;
};

// Every scalar field of `m` set from the input (numbers mostly small and
// finite, sometimes anything fuzz::FuzzInput::Float gives), its message
// fields recursed into `depth` levels; of a oneof only the member set
// already (the table's optimizer) or, where none is, one the input picks.
inline void FuzzScalars(FuzzInput& in, google::protobuf::Message* m, int depth) {
  using FD = google::protobuf::FieldDescriptor;
  const auto* d = m->GetDescriptor();
  const auto* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FD* f = d->field(i);
    if (f->is_repeated() || !in.ConsumeBool()) continue;
    if (const auto* oneof = f->containing_oneof()) {
      const FD* set = r->GetOneofFieldDescriptor(*m, oneof);
      if (set != nullptr ? set != f : in.ConsumeBool()) continue;
    }
    switch (f->cpp_type()) {
      case FD::CPPTYPE_FLOAT:
        r->SetFloat(m, f, in.In(0, 3) == 0 ? in.Float() : in.FiniteIn(0, 2));
        break;
      case FD::CPPTYPE_DOUBLE:
        r->SetDouble(m, f, in.In(0, 3) == 0 ? in.Float() : in.FiniteIn(0, 2));
        break;
      case FD::CPPTYPE_BOOL: r->SetBool(m, f, in.ConsumeBool()); break;
      case FD::CPPTYPE_INT32: r->SetInt32(m, f, in.Mostly(0, 8)); break;
      case FD::CPPTYPE_INT64: r->SetInt64(m, f, in.Mostly<int64_t>(0, 8)); break;
      case FD::CPPTYPE_UINT32: r->SetUInt32(m, f, in.Mostly<uint32_t>(0, 8)); break;
      case FD::CPPTYPE_UINT64: r->SetUInt64(m, f, in.Mostly<uint64_t>(0, 8)); break;
      case FD::CPPTYPE_ENUM: {
        const auto* e = f->enum_type();
        r->SetEnum(m, f, e->value(in.In(0, e->value_count() - 1)));
        break;
      }
      case FD::CPPTYPE_STRING: r->SetString(m, f, in.Name({"lr", "a", "b"})); break;
      case FD::CPPTYPE_MESSAGE:
        if (depth > 0) FuzzScalars(in, r->MutableMessage(m, f), depth - 1);
        break;
    }
  }
}

// The implemented optimizers, in the table's order.
inline std::vector<const OptimizerSpec*> ImplementedOptimizers() {
  std::vector<const OptimizerSpec*> out;
  for (const OptimizerSpec& spec : AllOptimizers()) {
    if (spec.implemented) out.push_back(&spec);
  }
  return out;
}

// Sets `p`'s optimizer to `spec` (its oneof field, hyper-parameters at
// their proto defaults) with a constant learning rate.
inline void SetOptimizer(const OptimizerSpec& spec, OptimizationParameters* p) {
  const auto* field = p->GetDescriptor()->FindFieldByName(spec.proto_field);
  if (field != nullptr) p->GetReflection()->MutableMessage(p, field);
  p->mutable_learning_rate()->set_constant(0.1f);
}

inline TPUEmbeddingConfiguration BuildConfig(FuzzInput& in, const ConfigLimits& limits) {
  TPUEmbeddingConfiguration c;
  c.set_mode(in.ConsumeBool() ? TPUEmbeddingConfiguration::TRAINING
                              : TPUEmbeddingConfiguration::INFERENCE);
  c.set_num_tensor_cores(in.In(1, 4));
  c.set_num_hosts(in.In(1, 4));
  c.set_sharding_strategy(in.ConsumeBool() ? TPUEmbeddingConfiguration::MOD
                                           : TPUEmbeddingConfiguration::DIV_DEFAULT);
  const std::vector<const OptimizerSpec*> optimizers = ImplementedOptimizers();
  const int num_tables = in.In(1, limits.max_tables);
  for (int t = 0; t < num_tables; ++t) {
    auto* d = c.add_table_descriptor();
    d->set_name("t" + std::to_string(t));
    d->set_vocabulary_size(in.In<int64_t>(1, limits.max_vocabulary));
    d->set_dimension(in.In(1, limits.max_dimension));
    const OptimizerSpec* spec = optimizers[0];
    if (limits.every_optimizer) {
      spec = optimizers[in.In<size_t>(0, optimizers.size() - 1)];
    } else {
      for (const OptimizerSpec* s : optimizers) {
        if (std::string(s->proto_field) == "stochastic_gradient_descent") spec = s;
      }
    }
    SetOptimizer(*spec, d->mutable_optimization_parameters());
    if (limits.fuzz_parameters) {
      FuzzScalars(in, d->mutable_optimization_parameters(), 3);
      if (in.In(0, 3) == 0) {  // a dynamic learning rate: Send's learning_rates[tag]
        d->mutable_optimization_parameters()->mutable_learning_rate()->mutable_dynamic()->set_tag(
            in.Mostly(0, 2));
      }
    }
  }
  if (limits.fuzz_parameters) c.set_pipeline_execution_with_tensor_core(in.ConsumeBool());
  if (in.ConsumeBool()) {  // feature descriptors: every table has one
    const int extra = in.In(0, 2);
    for (int f = 0; f < num_tables + extra; ++f) {
      auto* fd = c.add_feature_descriptor();
      fd->set_name("f" + std::to_string(f));
      fd->set_table_id(f < num_tables ? f : in.In(0, num_tables - 1));
      const int rank = in.In(1, 3);
      for (int r = 0; r < rank; ++r) fd->add_input_shape(in.In(1, 5));
    }
  } else {  // table mode
    c.set_batch_size_per_tensor_core(in.In(1, 4));
    for (auto& d : *c.mutable_table_descriptor()) d.set_num_features(in.In(1, 3));
  }
  return c;
}

}  // namespace fuzz
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_FUZZ_TARGETS_FUZZ_CONFIG_H_
