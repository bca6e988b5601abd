// What every kernel file of the op glue shares: registration under our
// prefixed op name and TF's core name, the op's bare name for error
// messages, the replica a kernel serves and a reference to the engine.
#ifndef TF_TPU_EMB_KERNELS_REGISTRATION_H_
#define TF_TPU_EMB_KERNELS_REGISTRATION_H_

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/optimizers.h"
#include "engine/engine.h"
#include "kernels/guard.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/platform/refcount.h"

namespace tf_tpu_emb {
namespace kernels {

// The TF kernel API every kernel file of this folder uses.
using ::tensorflow::AsyncOpKernel;
using ::tensorflow::OpInputList;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::OpOutputList;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;

inline constexpr char kPrefix[] = "TfTpuEmb>";

// Registers `Kernel` for `bare_name` under our prefix and, if `core`, under
// TF's own op name; it runs as Guarded<Kernel> (kernels/guard.h).
template <typename Kernel>
void RegisterCpuKernel(const std::string& bare_name, bool core = true) {
  auto create = [](::tensorflow::OpKernelConstruction* c) -> ::tensorflow::OpKernel* {
    return CreateGuarded<Kernel>(c);
  };
  std::vector<std::string> names = {kPrefix + bare_name};
  if (core) names.push_back(bare_name);
  for (const std::string& name : names) {
    new ::tensorflow::kernel_factory::OpKernelRegistrar(
        ::tensorflow::KernelDefBuilder(name.c_str()).Device(::tensorflow::DEVICE_CPU).Build(), name,
        create);
  }
}

// Whether this TensorFlow registers the op `bare_name` (kernels go under
// TF's name only where TF has the op: the SparseCore family grew over TF
// versions).  Static registration runs after TF's own op registrations.
inline bool CoreOpRegistered(const std::string& bare_name) {
  const ::tensorflow::OpRegistrationData* data = nullptr;
  return ::tensorflow::OpRegistry::Global()->LookUp(bare_name, &data).ok();
}

// Registers a per-table Load/Retrieve kernel bound to its optimizer's table
// entry, under our prefix and, where TF has the op, under TF's name.
template <typename Kernel>
void RegisterTableKernel(const char* bare_name, const OptimizerSpec* spec) {
  struct Factory : ::tensorflow::kernel_factory::OpKernelFactory {
    explicit Factory(const OptimizerSpec* s) : spec(s) {}
    ::tensorflow::OpKernel* Create(::tensorflow::OpKernelConstruction* c) override {
      return new Kernel(c, spec);
    }
    const OptimizerSpec* spec;
  };
  std::vector<std::string> names = {kPrefix + std::string(bare_name)};
  if (spec->core_has_table_ops) names.push_back(bare_name);
  for (const std::string& name : names) {
    new ::tensorflow::kernel_factory::OpKernelRegistrar(
        ::tensorflow::KernelDefBuilder(name.c_str()).Device(::tensorflow::DEVICE_CPU).Build(), name,
        std::make_unique<Factory>(spec));
  }
}

// The op's name without our prefix, for error messages.
inline std::string BareOpName(::tensorflow::OpKernelConstruction* c) {
  std::string name = c->def().op();
  if (name.rfind(kPrefix, 0) == 0) name = name.substr(strlen(kPrefix));
  return name;
}

// Replica served by a kernel placed on this device: its task-local device id
// (CPU:k serves replica k; the default CPU:0 serves replica 0).
inline int DeviceReplica(::tensorflow::OpKernelContext* ctx) {
  const auto& parsed = ctx->device()->parsed_name();
  return parsed.has_id ? parsed.id : 0;
}

inline absl::Status ReplicaInRange(const std::string& op, int replica, const Engine& e) {
  if (replica < 0 || replica >= e.num_replicas()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": replica ", replica, " is out of range: the config has ",
                     e.num_replicas(), " tensor core(s) (num_tensor_cores)"));
  }
  return absl::OkStatus();
}

// The replica a kernel serves: `device_ordinal` (an enqueue op's) when >= 0,
// else its device's (DeviceReplica); InvalidArgument when `e` has no such
// replica.
inline absl::Status ServedReplica(::tensorflow::OpKernelContext* ctx, const std::string& op,
                                  const Engine& e, int64_t device_ordinal, int* replica) {
  *replica = device_ordinal < 0 ? DeviceReplica(ctx) : static_cast<int>(device_ordinal);
  return ReplicaInRange(op, *replica, e);
}

// The intra-op thread pool of the kernel's device.
inline ::tsl::thread::ThreadPool* CpuPool(::tensorflow::OpKernelContext* ctx) {
  return ctx->device()->tensorflow_cpu_worker_threads()->workers;
}

// The engine a kernel addresses: its `engine` attr on our prefixed ops, ""
// (the process's default engine) on TF's core-named ops, which have none.
inline std::string EngineName(const ::tensorflow::NodeDef& def) {
  const auto& attrs = def.attr();
  const auto it = attrs.find("engine");
  return it == attrs.end() ? std::string() : it->second.s();
}

// A reference to the kernel's configured engine for the duration of one
// Compute.
class EngineRef {
 public:
  absl::Status Acquire(::tensorflow::OpKernelContext* ctx, const std::string& op) {
    Engine* e = nullptr;
    TF_RETURN_IF_ERROR(Engine::Current(op, &e, EngineName(ctx->op_kernel().def())));
    ref_.reset(e);
    return absl::OkStatus();
  }
  // The kernels' common preamble: Acquire, then the replica the kernel serves
  // (ServedReplica; `device_ordinal` -1: its device's).
  absl::Status AcquireForReplica(::tensorflow::OpKernelContext* ctx, const std::string& op,
                                 int* replica, int64_t device_ordinal = -1) {
    TF_RETURN_IF_ERROR(Acquire(ctx, op));
    return ServedReplica(ctx, op, *ref_, device_ordinal, replica);
  }
  Engine* operator->() const { return ref_.get(); }
  Engine& operator*() const { return *ref_; }

 private:
  ::tensorflow::core::RefCountPtr<Engine> ref_;
};

}  // namespace kernels
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_REGISTRATION_H_
