// The TensorFlow version the library is compiled against, for the few
// `#if` blocks that keep one source building on TF 2.16-2.21 (README,
// "TensorFlow versions").
//
// TF's own macros are TF_MAJOR_VERSION / TF_MINOR_VERSION.  Up to TF 2.20,
// tensorflow/core/public/version.h defines them; from TF 2.21 on it no longer
// does (release_version.h expects them from TF's own build), so a plugin
// built against pip TF's headers sees neither.  setup.py and BUILD pass
// TF_TPU_EMB_TF_VERSION_INTEGER (major * 1000 + minor * 10, read from the
// installed tensorflow) for that case; where both exist they must agree.
#ifndef TF_TPU_EMB_CORE_TF_VERSION_H_
#define TF_TPU_EMB_CORE_TF_VERSION_H_

#include "tensorflow/core/public/version.h"

#if defined(TF_MAJOR_VERSION) && defined(TF_MINOR_VERSION)
#define TF_TPU_EMB_TF_VERSION (TF_MAJOR_VERSION * 1000 + TF_MINOR_VERSION * 10)
#if defined(TF_TPU_EMB_TF_VERSION_INTEGER) && TF_TPU_EMB_TF_VERSION_INTEGER != TF_TPU_EMB_TF_VERSION
#error "TF_TPU_EMB_TF_VERSION_INTEGER disagrees with TensorFlow's version.h"
#endif
#elif defined(TF_TPU_EMB_TF_VERSION_INTEGER)
#define TF_TPU_EMB_TF_VERSION TF_TPU_EMB_TF_VERSION_INTEGER
#else
#error "Unknown TensorFlow version: build with setup.py (it passes TF_TPU_EMB_TF_VERSION_INTEGER)"
#endif

// True when compiling against TensorFlow major.minor or newer.
#define TF_TPU_EMB_TF_AT_LEAST(major, minor) \
  (TF_TPU_EMB_TF_VERSION >= (major) * 1000 + (minor) * 10)

// OptimizationParameters.frequency_aware_adagrad and
// TPUEmbeddingConfiguration.SpmdSharding.use_manual_partitioning first
// appear in TF 2.19's protos.
#define TF_TPU_EMB_HAS_TF219_PROTOS TF_TPU_EMB_TF_AT_LEAST(2, 19)

#endif  // TF_TPU_EMB_CORE_TF_VERSION_H_
