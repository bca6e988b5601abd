// The one huge-page allocation of the library: buffers 2 MiB aligned, whole
// huge pages long and advised for transparent huge pages (for buffers of at
// least kMinBytes: AllocateRows gives smaller ones plain memory); and the advice for
// a buffer someone else allocated (the JAX handlers' tables, which XLA
// owns: AdviseBuffer).  The engine's
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
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

// Linux 6.1's synchronous collapse into huge pages; older C libraries do
// not name it, older kernels answer EINVAL (then only the advice holds).
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif

namespace tf_tpu_emb {
namespace huge_pages {

constexpr size_t kHugePage = size_t{2} << 20;
// Buffers smaller than this gain little from huge pages and would waste up
// to 2 MiB each (a model of many small tables: each table and slot a whole
// huge page): they get plain memory (AllocateRows).
constexpr size_t kMinBytes = size_t{4} << 20;
// The alignment of a plain buffer: a cache line.
constexpr size_t kLine = 64;

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

// Memory for rows read and written at random (an embedding table or slot)
// of `bytes` bytes: huge pages (Allocate) from kMinBytes on, else a plain
// buffer aligned to a cache line and rounded up to one.  nullptr when the
// size overflows or the memory is not there.  Released with Free.
inline void* AllocateRows(size_t bytes) {
  if (bytes >= kMinBytes) return Allocate(bytes);
  const size_t rounded = (std::max<size_t>(bytes, 1) + kLine - 1) / kLine * kLine;
  return std::aligned_alloc(kLine, rounded);
}

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

// The whole huge pages inside a buffer that was not allocated here, [p, p +
// bytes): advised for transparent huge pages, so that its pages faulted from
// now on are huge (a buffer about to be written for the first time), and,
// with `collapse`, made huge now (its pages are already there: the kernel
// copies them into huge pages once; a few hundred ms a GiB).  Buffers under
// `min_bytes` and systems without huge pages are left alone.  Only a hint:
// the contents never change, and callers ignore the result, which says
// whether the collapse was asked for and the kernel did it (tests/cpp).
inline bool AdviseRange(void* p, size_t bytes, bool collapse, size_t min_bytes = kMinBytes) {
  if (bytes < min_bytes || !Available()) return false;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kHugePage - 1) / kHugePage * kHugePage;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + bytes) / kHugePage * kHugePage;
  if (end <= begin) return false;
  void* start = reinterpret_cast<void*>(begin);
#ifdef MADV_HUGEPAGE
  madvise(start, end - begin, MADV_HUGEPAGE);
#endif
  return collapse && madvise(start, end - begin, MADV_COLLAPSE) == 0;
}

// A buffer that persists between calls and is updated in place where it
// lies (a donated JAX variable): collapsed into huge pages the first time
// it is seen (AdviseRange); later calls with the same buffer cost a lookup
// in a short list of the buffers collapsed last.  A buffer freed and another
// allocated at the same address is not collapsed again, which costs speed
// only.
inline void AdvisePersistent(void* p, size_t bytes) {
  static std::mutex mu;
  static std::vector<std::pair<void*, size_t>> seen;  // the newest last, at most kKeep
  constexpr size_t kKeep = 64;
  {
    std::lock_guard<std::mutex> lock(mu);
    const std::pair<void*, size_t> key(p, bytes);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) return;
    if (seen.size() == kKeep) seen.erase(seen.begin());
    seen.push_back(key);
  }
  AdviseRange(p, bytes, /*collapse=*/true);
}

}  // namespace huge_pages
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_HUGE_PAGES_H_
