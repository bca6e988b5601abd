// Fuzz target: the JAX front end's XLA FFI handlers (jax_ffi/sparsecore_ffi.cc:
// jax-tpu-embedding's SparseCore lookup, gradient + update of each built-in
// optimizer, and the custom optimizer's row gradients on CPU), called through
// their implementation functions (jax_ffi/sparsecore_ffi.h) with buffers and
// a thread pool made as XLA's decoding makes them.
// fuzz-sources: jax_ffi/sparsecore_ffi.cc
// fuzz-needs: jax
//
// Input: byte 0 picks the handler (lookup, gradient, row gradients); the
// rest (fuzz/targets/fuzz_input.h) the attrs (SparseCores per device,
// devices, sources, minibatching, the optimizer and its clipping), the CSR
// buffers -- mostly a well-formed layout of docs/sparsecore_semantics.md
// §11.1, sometimes with ids outside the shard, row pointers going
// backwards or past the ids, sizes disagreeing with the attrs -- gains and
// hyper-parameters that may be NaN or infinite, and table, slot, activation
// and result shapes that may be wrong.
//
// Invariants (a violation traps): every call returns OK or InvalidArgument;
// a gradient that fails leaves the table, the slots and the results (the
// same buffers as the operands or not, as XLA's aliasing makes them)
// bit-equal; row gradients that succeed list `count` rows of the table
// operand, -1 after them.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/sparsecore.h"
#include "core/sparsecore_optimizers.gen.h"
#include "fuzz/targets/fuzz_input.h"
#include "jax_ffi/sparsecore_ffi.h"
#include "xla/ffi/api/c_api.h"
#include "xla/ffi/api/ffi.h"

namespace tf_tpu_emb {
namespace jax_sc {
namespace {

namespace ffi = ::xla::ffi;
using fuzz::FuzzInput;

// The thread pool XLA hands a handler, over a fake API whose Schedule runs
// the task at once (the handlers' parts then run one after the other) and
// whose thread count is the input's.
int64_t g_threads = 1;

XLA_FFI_Error* Schedule(XLA_FFI_ThreadPool_Schedule_Args* args) {
  args->task(args->data);
  return nullptr;
}

XLA_FFI_Error* NumThreads(XLA_FFI_ThreadPool_NumThreads_Args* args) {
  *args->num_threads = g_threads;
  return nullptr;
}

const XLA_FFI_Api* Api() {
  static XLA_FFI_Api* api = [] {
    auto* a = new XLA_FFI_Api();
    std::memset(a, 0, sizeof(*a));
    a->struct_size = XLA_FFI_Api_STRUCT_SIZE;
    a->XLA_FFI_ThreadPool_Schedule = Schedule;
    a->XLA_FFI_ThreadPool_NumThreads = NumThreads;
    return a;
  }();
  return api;
}

// A buffer XLA passes: its data, dims and the C struct the view reads.
// An empty buffer's data is not null (the handlers' memset / memcpy of 0
// bytes at a null pointer is undefined behaviour: reported, not fixed here).
template <typename T>
struct Buf {
  std::vector<T> data;
  std::vector<int64_t> dims;
  XLA_FFI_Buffer c{};

  Buf(std::vector<int64_t> d, XLA_FFI_DataType dtype) : dims(std::move(d)) {
    int64_t n = 1;
    for (int64_t x : dims) n *= x;
    data.reserve(std::max<int64_t>(n, 1));
    data.assign(n, T{});
    c.struct_size = XLA_FFI_Buffer_STRUCT_SIZE;
    c.dtype = dtype;
    c.rank = static_cast<int64_t>(dims.size());
    c.dims = dims.data();
    c.data = data.data();
  }
  Buf(const Buf&) = delete;
  XLA_FFI_Buffer* get() { return &c; }
};

using I32 = Buf<int32_t>;
using F32 = Buf<float>;

std::unique_ptr<I32> Ints(std::vector<int64_t> dims) {
  return std::make_unique<I32>(std::move(dims), XLA_FFI_DataType_S32);
}
std::unique_ptr<F32> Floats(std::vector<int64_t> dims) {
  return std::make_unique<F32>(std::move(dims), XLA_FFI_DataType_F32);
}

// Mostly `want`, sometimes another size (a shape disagreeing with the attrs).
int64_t Size(FuzzInput& in, int64_t want) {
  return in.In<int>(0, 15) == 0 ? in.In<int64_t>(0, 2 * want + 8) : want;
}

// The CSR operands of `sources` devices, each of `num_sc` SparseCores:
// row pointers in groups of `group` per SparseCore (and minibatch), ids
// whose embedding id is below `shard_rows` and sample id below `batch`,
// mostly.
struct Csr {
  std::unique_ptr<I32> rp, ids, samples, num_minibatches;
  std::unique_ptr<F32> gains;
};

Csr MakeCsr(FuzzInput& in, int64_t sources, int64_t num_sc, int64_t global_sc, bool minibatching,
            int64_t shard_rows, int64_t batch) {
  Csr c;
  const int64_t group = ::tf_tpu_emb::sparsecore::RoundUp(std::max<int64_t>(1, global_sc), 8);
  const int64_t minibatches = minibatching ? in.In<int>(1, 3) : 1;
  const int64_t slice = 8 * in.In<int>(0, 4);  // ids per (device, SparseCore) slice
  const int64_t n = Size(in, sources * num_sc * slice);
  c.rp = Ints({Size(in, sources * num_sc * minibatches * group)});
  c.ids = Ints({n});
  c.samples = Ints({Size(in, n)});
  c.gains = Floats({Size(in, n)});
  c.num_minibatches = Ints({Size(in, sources)});
  for (int32_t& m : c.num_minibatches->data) {
    m = in.In<int>(0, 7) == 0 ? in.ConsumeIntegral<int32_t>() : static_cast<int32_t>(minibatches);
  }
  // Row pointers: each group's segments within its slice, ascending.
  std::vector<int32_t>& rp = c.rp->data;
  const int64_t groups = static_cast<int64_t>(rp.size()) / group;
  for (int64_t g = 0; g < groups; ++g) {
    int64_t at = 0;  // within the group's slice
    const int64_t limit = slice;
    for (int64_t j = 0; j < group && g * group + j < static_cast<int64_t>(rp.size()); ++j) {
      if (j < global_sc)
        at = std::min<int64_t>(limit, ::tf_tpu_emb::sparsecore::RoundUp(at, 8) + in.In<int>(0, 8));
      rp[g * group + j] = static_cast<int32_t>(at);
    }
  }
  if (minibatching) {  // counted from the device's buffer start
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t offset = (g % (num_sc * minibatches)) / minibatches * slice;
      for (int64_t j = 0; j < group && g * group + j < static_cast<int64_t>(rp.size()); ++j) {
        rp[g * group + j] += static_cast<int32_t>(offset);
      }
    }
  }
  for (int32_t& id : c.ids->data) id = in.In<int32_t>(0, std::max<int64_t>(0, shard_rows - 1));
  for (int32_t& s : c.samples->data) s = in.In<int32_t>(0, std::max<int64_t>(0, batch - 1));
  for (float& g : c.gains->data) g = in.In<int>(0, 3) == 0 ? in.Float() : in.FiniteIn(-2, 2);
  // Corruptions: a row pointer, an id, a sample id anywhere.
  for (int k = in.In<int>(0, 3); k > 0; --k) {
    switch (in.In<int>(0, 2)) {
      case 0:
        if (!rp.empty()) rp[in.In<size_t>(0, rp.size() - 1)] = in.ConsumeIntegral<int32_t>();
        break;
      case 1:
        if (!c.ids->data.empty()) {
          c.ids->data[in.In<size_t>(0, c.ids->data.size() - 1)] = in.ConsumeIntegral<int32_t>();
        }
        break;
      default:
        if (!c.samples->data.empty()) {
          c.samples->data[in.In<size_t>(0, c.samples->data.size() - 1)] =
              in.ConsumeIntegral<int32_t>();
        }
    }
  }
  return c;
}

struct Attrs {
  int64_t num_sc, num_devices, sources, shard_rows, batch_per_sc, width;
  bool minibatching;
};

Attrs MakeAttrs(FuzzInput& in) {
  Attrs a;
  a.num_sc = in.In<int>(0, 15) == 0 ? in.ConsumeIntegral<int32_t>() : in.In<int>(1, 4);
  a.num_devices = in.In<int>(0, 15) == 0 ? in.ConsumeIntegral<int32_t>() : in.In<int>(1, 3);
  a.sources = in.ConsumeBool() ? a.num_devices : 1;
  a.shard_rows = in.In<int>(1, 6);
  a.batch_per_sc = in.In<int>(1, 4);
  a.width = in.In<int>(1, 5);
  a.minibatching = in.ConsumeBool();
  g_threads = in.In<int>(0, 4);
  return a;
}

bool Sane(const Attrs& a) {
  return a.num_sc >= 1 && a.num_sc <= 8 && a.num_devices >= 1 && a.num_devices <= 8;
}

// A table operand of `rows` x width (rank 2, or rank 1 of width 1).
std::unique_ptr<F32> Table(FuzzInput& in, int64_t rows, int64_t width) {
  std::vector<int64_t> dims = {Size(in, rows), width};
  if (width == 1 && in.ConsumeBool()) dims = {dims[0]};
  if (in.In<int>(0, 31) == 0) dims = {dims[0], width, 1};
  auto t = Floats(dims);
  for (float& x : t->data) x = in.FiniteIn(-1, 1);
  return t;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0);
}

void CheckError(const ffi::Error& e) {
  if (e.success()) return;
  FUZZ_CHECK(e.errc() == ffi::ErrorCode::kInvalidArgument, "%s", e.message().c_str());
}

void Lookup(FuzzInput& in) {
  const Attrs a = MakeAttrs(in);
  if (!Sane(a) && in.ConsumeBool()) return;
  const int64_t num_sc = Sane(a) ? a.num_sc : 1, devices = Sane(a) ? a.num_devices : 1;
  const int64_t global_sc = num_sc * devices;
  Csr c = MakeCsr(in, 1, num_sc, global_sc, a.minibatching, a.shard_rows, a.batch_per_sc);
  auto table = Table(in, global_sc * a.shard_rows, a.width);
  auto out = Floats({Size(in, num_sc * a.batch_per_sc), a.width});
  ffi::DiagnosticEngine diagnostic;
  ffi::ThreadPool pool = *ffi::CtxDecoding<ffi::ThreadPool>::Decode(Api(), nullptr, diagnostic);
  const ffi::Error e =
      LookupImpl(ffi::Buffer<ffi::S32>(c.rp->get()), ffi::Buffer<ffi::S32>(c.ids->get()),
                 ffi::Buffer<ffi::S32>(c.samples->get()), ffi::Buffer<ffi::F32>(c.gains->get()),
                 ffi::Buffer<ffi::S32>(c.num_minibatches->get()),
                 ffi::Buffer<ffi::F32>(table->get()),
                 ffi::ResultBuffer<ffi::F32>(ffi::Buffer<ffi::F32>(out->get())), a.num_sc,
                 a.num_devices, a.minibatching, pool);
  CheckError(e);
}

void Grad(FuzzInput& in, bool row_grads) {
  const Attrs a = MakeAttrs(in);
  if (!Sane(a) && in.ConsumeBool()) return;
  const int64_t num_sc = Sane(a) ? a.num_sc : 1, devices = Sane(a) ? a.num_devices : 1;
  const int64_t global_sc = num_sc * devices;
  const int64_t sources = Sane(a) ? a.sources : 1;
  Csr c = MakeCsr(in, sources, num_sc, global_sc, a.minibatching, a.shard_rows, a.batch_per_sc);
  auto act_grad = Floats({Size(in, sources * num_sc * a.batch_per_sc), a.width});
  for (float& x : act_grad->data) x = in.In<int>(0, 7) == 0 ? in.Float() : in.FiniteIn(-1, 1);
  auto shard_offset = Ints({Size(in, 1)});
  for (int32_t& s : shard_offset->data) {
    s = in.In<int>(0, 7) == 0 ? in.ConsumeIntegral<int32_t>()
                              : static_cast<int32_t>(num_sc * in.In<int64_t>(0, devices - 1));
  }
  // This device's table operand: its num_sc shards.
  const int64_t rows = num_sc * a.shard_rows;
  ffi::DiagnosticEngine diagnostic;
  ffi::ThreadPool pool = *ffi::CtxDecoding<ffi::ThreadPool>::Decode(Api(), nullptr, diagnostic);
  const int64_t attr_sc = a.num_sc, attr_devices = a.num_devices,
                attr_sources = Sane(a) ? sources : a.sources;
  if (row_grads) {
    auto table = Table(in, rows, a.width);
    const int64_t capacity = Size(in, rows);
    auto out_rows = Ints({capacity});
    auto count = Ints({Size(in, 1)});
    auto grads = Floats({Size(in, capacity), a.width});
    const ffi::Error e = RowGradsImpl(
        ffi::Buffer<ffi::S32>(c.rp->get()), ffi::Buffer<ffi::S32>(c.ids->get()),
        ffi::Buffer<ffi::S32>(c.samples->get()), ffi::Buffer<ffi::F32>(c.gains->get()),
        ffi::Buffer<ffi::S32>(c.num_minibatches->get()), ffi::Buffer<ffi::F32>(act_grad->get()),
        ffi::Buffer<ffi::S32>(shard_offset->get()), ffi::Buffer<ffi::F32>(table->get()),
        ffi::ResultBuffer<ffi::S32>(ffi::Buffer<ffi::S32>(out_rows->get())),
        ffi::ResultBuffer<ffi::S32>(ffi::Buffer<ffi::S32>(count->get())),
        ffi::ResultBuffer<ffi::F32>(ffi::Buffer<ffi::F32>(grads->get())), attr_sc, attr_devices,
        attr_sources, a.minibatching, pool);
    CheckError(e);
    if (e.failure()) return;
    const int32_t n = count->data[0];
    FUZZ_CHECK(n >= 0 && n <= capacity, "count %d of %lld", n, static_cast<long long>(capacity));
    const int64_t table_rows = table->dims[0];
    for (int64_t i = 0; i < capacity; ++i) {
      if (i < n) {
        FUZZ_CHECK(out_rows->data[i] >= 0 && out_rows->data[i] < table_rows, "row %d",
                   out_rows->data[i]);
      } else {
        FUZZ_CHECK(out_rows->data[i] == -1, "rows[%lld] = %d past the count",
                   static_cast<long long>(i), out_rows->data[i]);
      }
    }
    return;
  }
  // The optimizer: one of jax-tpu-embedding's, sometimes an unknown name.
  std::vector<std::string> names;
  for (int k = 0; k < sc_opt::kNumOptimizers; ++k) {
    if (sc_opt::kJaxNames[k] != nullptr) names.push_back(sc_opt::kJaxNames[k]);
  }
  const std::string optimizer = in.Name(names);
  sc_opt::Opt opt = sc_opt::Opt::kSgd;
  const bool known = sc_opt::FindJaxOptimizer(optimizer, &opt);
  int64_t nvars = known ? 1 + sc_opt::NumSlotsOf(opt) : in.In<int>(1, 3);
  int64_t hypers = known ? sc_opt::NumJaxScalars(opt) : in.In<int>(0, 3);
  if (in.In<int>(0, 31) == 0) nvars += in.In<int>(-1, 1);
  if (in.In<int>(0, 31) == 0) hypers += in.In<int>(-1, 1);
  nvars = std::max<int64_t>(0, nvars);
  hypers = std::max<int64_t>(0, hypers);
  std::vector<std::unique_ptr<F32>> vars, results, scalars;
  for (int64_t v = 0; v < nvars; ++v) vars.push_back(Table(in, rows, a.width));
  for (int64_t h = 0; h < hypers; ++h) {
    scalars.push_back(
        Floats(in.In<int>(0, 31) == 0 ? std::vector<int64_t>{2} : std::vector<int64_t>{}));
    for (float& x : scalars.back()->data)
      x = in.In<int>(0, 3) == 0 ? in.Float() : in.FiniteIn(0, 1);
  }
  // Results: the operands themselves (XLA's aliasing) or buffers of their own.
  const bool alias = in.ConsumeBool();
  std::vector<XLA_FFI_Buffer*> ret_ptrs;
  for (int64_t v = 0; v < nvars; ++v) {
    if (alias) {
      ret_ptrs.push_back(vars[v]->get());
    } else {
      std::vector<int64_t> dims = vars[v]->dims;
      if (in.In<int>(0, 31) == 0 && !dims.empty()) dims[0] = Size(in, dims[0]);
      results.push_back(Floats(dims));
      for (float& x : results.back()->data) x = in.FiniteIn(-1, 1);
      ret_ptrs.push_back(results.back()->get());
    }
  }
  std::vector<XLA_FFI_Buffer*> arg_ptrs;
  for (auto& v : vars) arg_ptrs.push_back(v->get());
  for (auto& s : scalars) arg_ptrs.push_back(s->get());
  std::vector<XLA_FFI_ArgType> arg_types(arg_ptrs.size(), XLA_FFI_ArgType_BUFFER);
  std::vector<XLA_FFI_RetType> ret_types(ret_ptrs.size(), XLA_FFI_RetType_BUFFER);
  XLA_FFI_Args args{XLA_FFI_Args_STRUCT_SIZE, nullptr, static_cast<int64_t>(arg_ptrs.size()),
                    arg_types.data(), reinterpret_cast<void**>(arg_ptrs.data())};
  XLA_FFI_Rets rets{XLA_FFI_Rets_STRUCT_SIZE, nullptr, static_cast<int64_t>(ret_ptrs.size()),
                    ret_types.data(), reinterpret_cast<void**>(ret_ptrs.data())};
  // Snapshots of every table, slot and result buffer.
  std::vector<std::vector<float>> before;
  for (auto& v : vars) before.push_back(v->data);
  for (auto& r : results) before.push_back(r->data);
  const bool clip_min = in.ConsumeBool(), clip_max = in.ConsumeBool();
  const float min_value = in.Float(), max_value = in.Float();
  const ffi::Error e =
      GradImpl(ffi::Buffer<ffi::S32>(c.rp->get()), ffi::Buffer<ffi::S32>(c.ids->get()),
               ffi::Buffer<ffi::S32>(c.samples->get()), ffi::Buffer<ffi::F32>(c.gains->get()),
               ffi::Buffer<ffi::S32>(c.num_minibatches->get()),
               ffi::Buffer<ffi::F32>(act_grad->get()), ffi::Buffer<ffi::S32>(shard_offset->get()),
               ffi::RemainingArgs(&args, 0), ffi::RemainingRets(&rets, 0), optimizer, attr_sc,
               attr_devices, attr_sources, clip_min, min_value, clip_max, max_value,
               in.ConsumeBool(), a.minibatching, pool);
  CheckError(e);
  if (e.success()) return;
  size_t k = 0;
  for (auto& v : vars) {
    FUZZ_CHECK(BitEqual(v->data, before[k]),
               "a failed gradient (%s) changed a table or slot operand", e.message().c_str());
    ++k;
  }
  for (auto& r : results) {
    FUZZ_CHECK(BitEqual(r->data, before[k]), "a failed gradient (%s) wrote a result",
               e.message().c_str());
    ++k;
  }
}

}  // namespace
}  // namespace jax_sc
}  // namespace tf_tpu_emb

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ::tf_tpu_emb::jax_sc;  // NOLINT
  if (size == 0) return 0;
  ::tf_tpu_emb::fuzz::FuzzInput in(data + 1, size - 1);
  switch (data[0] % 3) {
    case 0: Lookup(in); break;
    case 1: Grad(in, false); break;
    default: Grad(in, true); break;
  }
  return 0;
}
