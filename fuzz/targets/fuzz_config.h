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

namespace tf_tpu_emb {
namespace fuzz {

struct ConfigLimits {
  int max_tables = 3;
  int64_t max_vocabulary = 64;
  int max_dimension = 8;
  bool every_optimizer = false;  // else stochastic gradient descent only
};

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
  }
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
