// bfloat16 storage of table rows (the opt-in reduced-precision storage,
// README "Reduced-precision storage"): the upper 16 bits of an IEEE float32.
// Widening is exact; narrowing rounds to nearest even (Load of fp32 values)
// or stochastically (row updates: rounds up with probability equal to the
// remainder's share of the gap, so E[round(x)] = x).
#ifndef TF_TPU_EMB_CORE_BF16_H_
#define TF_TPU_EMB_CORE_BF16_H_

#include <cstdint>
#include <cstring>

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

// Stochastic rounding with 16 random bits `r`: adding r to the discarded
// low half carries into the kept half with probability (low half) / 2^16.
inline Bf16 RoundStochastic(float x, uint32_t r) {
  const uint32_t u = FloatBits(x);
  if (IsNanOrInf(u)) return RoundNearestEven(x);
  return Bf16{static_cast<uint16_t>((u + (r & 0xFFFFu)) >> 16)};
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
