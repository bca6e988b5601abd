// What every libFuzzer target of fuzz/targets shares (docs/contributing.md
// "Coverage-guided fuzzing"): a FuzzedDataProvider-style reader of the
// input's bytes with the few helpers the targets need (small counts, floats
// that are sometimes not finite), FUZZ_CHECK (an invariant that does not
// hold is a finding: a message, then a trap libFuzzer reports as a crash),
// and the sanitizer options built into each binary, so that a finding
// replays with the plain command REPLAY.txt gives.  Free of TensorFlow and
// jaxlib: every target may include it, whatever its fuzz-needs.
#ifndef TF_TPU_EMB_FUZZ_TARGETS_FUZZ_INPUT_H_
#define TF_TPU_EMB_FUZZ_TARGETS_FUZZ_INPUT_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

// An invariant of the target: when it does not hold, say which and trap.
#define FUZZ_CHECK(cond, ...)                                                                  \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "fuzz invariant failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, "" __VA_ARGS__);                                                    \
      std::fprintf(stderr, "\n");                                                              \
      __builtin_trap();                                                                        \
    }                                                                                          \
  } while (0)

// The sanitizers' settings of every fuzz binary (the environment's
// ASAN_OPTIONS / UBSAN_OPTIONS still override them).  The TensorFlow and
// jaxlib libraries the targets link are not instrumented: ODR checks across
// them report TF's own duplicate globals; container-overflow reports a
// protobuf RepeatedField grown by TF's code through an inline function this
// binary instrumented (annotations on one side only: a false positive, as
// ASan's documentation says for partly instrumented programs); and an
// allocation failing (a fuzzed size) is an error status, not a report.  This header is included by
// exactly one translation unit per binary (its target).
extern "C" const char* __asan_default_options() {
  return "detect_odr_violation=0:detect_container_overflow=0:allocator_may_return_null=1";
}
extern "C" const char* __ubsan_default_options() { return "halt_on_error=1:print_stacktrace=1"; }

namespace tf_tpu_emb {
namespace fuzz {

class FuzzInput : public FuzzedDataProvider {
 public:
  FuzzInput(const uint8_t* data, size_t size) : FuzzedDataProvider(data, size) {}

  // An integer in [lo, hi] (FuzzedDataProvider's ConsumeIntegralInRange).
  template <typename T>
  T In(T lo, T hi) {
    return ConsumeIntegralInRange<T>(lo, hi);
  }
  // Mostly `usual` in [lo, hi]; one time in 16 any value of T (negative and
  // huge counts, the extremes).
  template <typename T>
  T Mostly(T lo, T hi) {
    if (ConsumeIntegralInRange<int>(0, 15) == 0) return ConsumeIntegral<T>();
    return ConsumeIntegralInRange<T>(lo, hi);
  }
  // A float: mostly a small finite value, sometimes zero, a negative, NaN,
  // an infinity, the largest or the smallest float.
  float Float() {
    switch (ConsumeIntegralInRange<int>(0, 11)) {
      case 0: return 0.0f;
      case 1: return std::numeric_limits<float>::quiet_NaN();
      case 2: return std::numeric_limits<float>::infinity();
      case 3: return -std::numeric_limits<float>::infinity();
      case 4: return std::numeric_limits<float>::max();
      case 5: return std::numeric_limits<float>::denorm_min();
      case 6: return ConsumeFloatingPoint<float>();
      default: return ConsumeFloatingPointInRange<float>(-4.0f, 4.0f);
    }
  }
  // A finite float in [lo, hi].
  float FiniteIn(float lo, float hi) { return ConsumeFloatingPointInRange<float>(lo, hi); }
  // A short name: "", one of `names` or random bytes.
  std::string Name(const std::vector<std::string>& names) {
    const int pick = ConsumeIntegralInRange<int>(0, static_cast<int>(names.size()) + 1);
    if (pick < static_cast<int>(names.size())) return names[pick];
    if (pick == static_cast<int>(names.size())) return "";
    return ConsumeRandomLengthString(12);
  }
};

}  // namespace fuzz
}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_FUZZ_TARGETS_FUZZ_INPUT_H_
