// bfloat16 storage of table rows (the opt-in reduced-precision storage,
// README "Reduced-precision storage"): the upper 16 bits of an IEEE float32.
// Widening is exact; narrowing rounds to nearest even (Load of fp32 values)
// or stochastically (row updates: rounds up with probability equal to the
// remainder's share of the gap, so E[round(x)] = x).
#ifndef TF_TPU_EMB_CORE_BF16_H_
#define TF_TPU_EMB_CORE_BF16_H_

#include <cstdint>
#include <cstring>

#include "core/cpu_dispatch.h"

namespace tf_tpu_emb {

struct Bf16 {
  uint16_t bits;
};

inline float ToFloat(float x) { return x; }

inline float ToFloat(Bf16 x) {
  const uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint32_t FloatBits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

inline bool IsNanOrInf(uint32_t u) { return (u & 0x7F800000u) == 0x7F800000u; }

// Round to nearest, ties to even; NaN stays NaN (quiet), infinities stay.
inline Bf16 RoundNearestEven(float x) {
  const uint32_t u = FloatBits(x);
  if (IsNanOrInf(u)) return Bf16{static_cast<uint16_t>((u >> 16) | ((u & 0xFFFF) ? 0x40 : 0))};
  return Bf16{static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}

// Stochastic rounding with the 16 random bits in the high half of `r`:
// adding them to the discarded low half carries into the kept half with
// probability (low half) / 2^16.  NaN and infinities round to nearest.
// Branch-free, so that a loop of it vectorises.
inline uint16_t RoundStochasticBits(float x, uint32_t r) {
  const uint32_t u = FloatBits(x);
  const uint32_t stochastic = (u + (r >> 16)) >> 16;
  const uint32_t special = (u >> 16) | ((u & 0xFFFFu) != 0 ? 0x40u : 0u);  // quiet NaN
  return static_cast<uint16_t>(IsNanOrInf(u) ? special : stochastic);
}

// The same with the 16 random bits in the low half of `r`.
inline Bf16 RoundStochastic(float x, uint32_t r) { return Bf16{RoundStochasticBits(x, r << 16)}; }

// murmur3's 32-bit finaliser: a bijection whose every output bit depends on
// every input bit; vectorises (32-bit multiplies).
inline uint32_t Mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  h *= 0xC2B2AE35u;
  return h ^ (h >> 16);
}

// Rounds x[0..n) stochastically into out[0..n): element d takes the random
// bits Mix32(key + (first + d) * 0x9E3779B9), so they depend only on (key,
// element index), never on the thread or the ISA the loop runs on.
TF_TPU_EMB_INLINE_INTO_CLONES void RoundStochasticRow(const float* x, int n, uint32_t key,
                                                      uint32_t first, Bf16* out) {
  for (int d = 0; d < n; ++d) {
    const uint32_t r = Mix32(key + (first + static_cast<uint32_t>(d)) * 0x9E3779B9u);
    out[d].bits = RoundStochasticBits(x[d], r);
  }
}

// A counter-based generator (splitmix64 finaliser): the random bits of an
// element depend only on (seed, index), never on the thread that updates it.
inline uint64_t MixBits(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace tf_tpu_emb

#endif  // TF_TPU_EMB_CORE_BF16_H_
