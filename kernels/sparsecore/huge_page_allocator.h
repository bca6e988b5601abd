// A TF Allocator over core/huge_pages.h (the engine's tables take their
// memory there too, engine/table.cc).
// The SparseCore in-place updates (kernels/sparsecore/matmul_kernels.cc)
// move a large table or slot variable into such a buffer the first time
// they update it: its rows are read and written at random, and with 4 KiB
// pages nearly every row is a TLB miss (benchmarks/bench_sparsecore.py;
// TF's own CPU allocator gives no huge pages where THP is "madvise").
#ifndef TF_TPU_EMB_KERNELS_SPARSECORE_HUGE_PAGE_ALLOCATOR_H_
#define TF_TPU_EMB_KERNELS_SPARSECORE_HUGE_PAGE_ALLOCATOR_H_

#include <cstddef>
#include <mutex>
#include <string>
#include <unordered_set>

#include "core/huge_pages.h"
#include "tensorflow/core/framework/allocator.h"

namespace tf_tpu_emb {
namespace kernels {
namespace sc_kernels {

class HugePageAllocator : public ::tensorflow::Allocator {
 public:
  // Buffers smaller than this gain little and waste up to 2 MiB each.
  static constexpr size_t kMinBytes = huge_pages::kMinBytes;

  // The process's one instance (never destroyed: tensors may outlive any
  // owner).
  static HugePageAllocator* Get() {
    static HugePageAllocator* const instance = new HugePageAllocator;
    return instance;
  }

  std::string Name() override { return "tf_tpu_emb_huge_pages"; }

  // Whether moving a buffer here can gain anything (huge pages are
  // available).  The move copies the buffer once, so for that moment the
  // variable takes twice its memory.
  static bool Worthwhile() { return huge_pages::Available(); }

  void* AllocateRaw(size_t alignment, size_t num_bytes) override {
    void* p = huge_pages::Allocate(num_bytes, alignment);
    if (p == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    mine_.insert(p);
    return p;
  }

  void DeallocateRaw(void* ptr) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      mine_.erase(ptr);
    }
    huge_pages::Free(ptr);
  }

  // Whether `ptr` is the start of a live buffer of this allocator.
  bool Owns(const void* ptr) {
    std::lock_guard<std::mutex> lock(mu_);
    return mine_.count(const_cast<void*>(ptr)) > 0;
  }

 private:
  HugePageAllocator() = default;
  std::mutex mu_;
  std::unordered_set<void*> mine_;
};

}  // namespace sc_kernels
}  // namespace kernels
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_SPARSECORE_HUGE_PAGE_ALLOCATOR_H_
