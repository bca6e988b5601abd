// The one huge-page allocation of the library: buffers 2 MiB aligned, whole
// huge pages long and advised for transparent huge pages.  The engine's
// tables and slots (engine/table.cc's FloatBuffer) and the SparseCore
// variables the in-place updates move (kernels/sparsecore/huge_page_allocator.h,
// a TF Allocator over these functions) take their memory here: their rows are
// read and written at random, and with 4 KiB pages nearly every row is a TLB
// miss (benchmarks/bench_sparsecore.py).  Free of TensorFlow.
#ifndef TF_TPU_EMB_CORE_HUGE_PAGES_H_
#define TF_TPU_EMB_CORE_HUGE_PAGES_H_

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <string>

namespace tf_tpu_emb {
namespace huge_pages {

constexpr size_t kHugePage = size_t{2} << 20;

// `bytes` (at least 1) rounded up to whole huge pages; false on overflow.
inline bool RoundUp(size_t bytes, size_t* rounded) {
  bytes = std::max<size_t>(bytes, 1);
  if (bytes > static_cast<size_t>(-1) - (kHugePage - 1)) return false;
  *rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  return true;
}

// A buffer of at least `bytes` bytes, aligned to 2 MiB (or `alignment`, if
// larger: a power of two), advised for transparent huge pages; nullptr when
// the size overflows or the memory is not there.  Released with Free.
inline void* Allocate(size_t bytes, size_t alignment = kHugePage) {
  size_t rounded;
  if (!RoundUp(bytes, &rounded)) return nullptr;
  void* p = std::aligned_alloc(std::max(kHugePage, alignment), rounded);
  if (p == nullptr) return nullptr;
#ifdef MADV_HUGEPAGE
  madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return p;
}

inline void Free(void* p) { std::free(p); }

// Whether huge pages can be had at all: false where transparent huge pages
// are off ("[never]" in sysfs) or unknown (no sysfs file).
inline bool Available() {
  static const bool available = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string modes;
    std::getline(f, modes);
    return !modes.empty() && modes.find("[never]") == std::string::npos;
  }();
  return available;
}

}  // namespace huge_pages
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_HUGE_PAGES_H_
