// A TF Allocator whose large buffers are 2 MiB aligned and advised for
// transparent huge pages, as the engine's tables are (engine/table.cc).
// The SparseCore in-place updates (kernels/sparsecore_matmul_kernels.cc)
// move a large table or slot variable into such a buffer the first time
// they update it: its rows are read and written at random, and with 4 KiB
// pages nearly every row is a TLB miss (benchmarks/bench_sparsecore.py;
// TF's own CPU allocator gives no huge pages where THP is "madvise").
#ifndef TF_TPU_EMB_KERNELS_HUGE_PAGE_ALLOCATOR_H_
#define TF_TPU_EMB_KERNELS_HUGE_PAGE_ALLOCATOR_H_

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_set>

#include "tensorflow/core/framework/allocator.h"

namespace tf_tpu_emb {
namespace kernels {

class HugePageAllocator : public ::tensorflow::Allocator {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;
  // Buffers smaller than this gain little and waste up to 2 MiB each.
  static constexpr size_t kMinBytes = size_t{4} << 20;

  // The process's one instance (never destroyed: tensors may outlive any
  // owner).
  static HugePageAllocator* Get() {
    static HugePageAllocator* const instance = new HugePageAllocator;
    return instance;
  }

  std::string Name() override { return "tf_tpu_emb_huge_pages"; }

  // Whether moving a buffer here can gain anything: false where transparent
  // huge pages are off ("[never]" in sysfs) or unknown (no sysfs file).
  // The move copies the buffer once, so for that moment the variable takes
  // twice its memory.
  static bool Worthwhile() {
    static const bool worthwhile = [] {
      std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
      std::string modes;
      std::getline(f, modes);
      return !modes.empty() && modes.find("[never]") == std::string::npos;
    }();
    return worthwhile;
  }

  void* AllocateRaw(size_t alignment, size_t num_bytes) override {
    const size_t rounded = (std::max<size_t>(num_bytes, 1) + kHugePage - 1) / kHugePage * kHugePage;
    void* p = std::aligned_alloc(std::max(kHugePage, alignment), rounded);
    if (p == nullptr) return nullptr;
#ifdef MADV_HUGEPAGE
    madvise(p, rounded, MADV_HUGEPAGE);
#endif
    std::lock_guard<std::mutex> lock(mu_);
    mine_.insert(p);
    return p;
  }

  void DeallocateRaw(void* ptr) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      mine_.erase(ptr);
    }
    std::free(ptr);
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

}  // namespace kernels
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_KERNELS_HUGE_PAGE_ALLOCATOR_H_
