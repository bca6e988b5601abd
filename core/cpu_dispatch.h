// Run-time CPU feature dispatch for the hot loops.  The default build targets
// a portable baseline (x86-64-v2, setup.py) so one wheel runs on any x86-64
// CPU of the last decade; a function marked TF_TPU_EMB_CPU_DISPATCH is also
// compiled for x86-64-v3 (AVX2, FMA) and x86-64-v4 (AVX-512), and the dynamic
// loader picks the best clone for the running CPU once (GCC target_clones, an
// ifunc).  Callees inlined into a marked function are vectorised for its ISA.
//
// The mark is empty where it cannot or need not apply: other compilers and
// architectures, the opt-in native build (TF_TPU_EMB_NATIVE=1, which already
// compiles everything for the build machine) and sanitizer builds.
#ifndef TF_TPU_EMB_CORE_CPU_DISPATCH_H_
#define TF_TPU_EMB_CORE_CPU_DISPATCH_H_

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(TF_TPU_EMB_NATIVE_BUILD) && !defined(__SANITIZE_ADDRESS__)
#define TF_TPU_EMB_CPU_DISPATCH \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TF_TPU_EMB_CPU_DISPATCH
#endif

// A hot callee of a marked function: always inlined, so that each clone
// compiles it for its own ISA (GCC's inliner may otherwise keep one
// out-of-line baseline copy that every clone calls).
#if defined(__GNUC__)
#define TF_TPU_EMB_INLINE_INTO_CLONES inline __attribute__((always_inline))
#else
#define TF_TPU_EMB_INLINE_INTO_CLONES inline
#endif

#endif  // TF_TPU_EMB_CORE_CPU_DISPATCH_H_
