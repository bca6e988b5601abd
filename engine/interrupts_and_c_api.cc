// Every C entry point of the op library (extern "C", exported despite
// -fvisibility=hidden, called with ctypes by the Python package) and the
// SIGINT machinery behind the waits' ones: Python's side of them is
// tf_tpu_emb/waits.py (Ctrl-C, the end of the main thread) and
// tf_tpu_emb/engine_registry.py (releasing an engine, the live state bytes)
// and tf_tpu_emb/tpu/system.py (the stand-in's SparseCore chips).
// The library links no Python: PyErr_SetInterruptEx is looked up at run time.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/sparsecore.h"
#include "engine/engine.h"
#include "engine/step_barrier.h"

namespace tf_tpu_emb {

// ------------------------------------------------------------------ Ctrl-C
//
// A Recv that waits holds no thread, so nothing would notice Ctrl-C until its
// timeout.  The Python side (tf_tpu_emb/waits.py, when it loads the library)
// installs this SIGINT handler in front of Python's.  While any Recv waits,
// the handler only wakes the watcher thread (async-signal-safe: one write to
// a pipe); the watcher calls `notify`, with which the Python side queues a
// KeyboardInterrupt for the main thread, and then ends every present wait with
// Cancelled -- the step fails at once and the engine is left as a timeout
// leaves it.  Python raises the KeyboardInterrupt once TensorFlow's error is
// out of C++ (raising it while TF's error is being converted garbles both).  With no Recv waiting
// the handler hands the signal straight to the previous handler (Python's).

namespace {

struct sigaction g_previous_sigint;
int g_interrupt_pipe[2] = {-1, -1};
void (*g_interrupt_notify)() = nullptr;
std::mutex g_interrupt_mu;  // install-once

void ChainSigint(int sig, siginfo_t* info, void* context) {
  if (g_previous_sigint.sa_flags & SA_SIGINFO) {
    if (g_previous_sigint.sa_sigaction != nullptr) {
      g_previous_sigint.sa_sigaction(sig, info, context);
    }
  } else if (g_previous_sigint.sa_handler == SIG_DFL) {
    signal(sig, SIG_DFL);
    raise(sig);
  } else if (g_previous_sigint.sa_handler != SIG_IGN) {
    g_previous_sigint.sa_handler(sig);
  }
}

void OnSigint(int sig, siginfo_t* info, void* context) {
  if (ActiveWaits().load() > 0) {
    const int saved_errno = errno;
    const char byte = 1;
    [[maybe_unused]] ssize_t n = write(g_interrupt_pipe[1], &byte, 1);
    errno = saved_errno;
    return;
  }
  ChainSigint(sig, info, context);
}

void WatchInterrupts() {
  for (;;) {
    char byte;
    const ssize_t n = read(g_interrupt_pipe[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    // Python first: its KeyboardInterrupt is queued while the waiting thread
    // is still in C++, so it is raised as soon as that thread is back.
    g_interrupt_notify();
    Engine::InterruptAllWaits("interrupted (SIGINT, Ctrl-C) while this op waited");
  }
}

}  // namespace
}  // namespace tf_tpu_emb

// ------------------------------------------------ tf_tpu_emb/waits.py

// Installs the SIGINT handler once (later calls: 0, nothing changes); -1
// when SIGINT is ignored (nothing to interrupt) or the pipe cannot be made.
extern "C" __attribute__((visibility("default"))) int TfTpuEmbInstallInterruptHandler(
    void (*notify)()) {
  using namespace tf_tpu_emb;  // NOLINT
  std::lock_guard<std::mutex> lock(g_interrupt_mu);
  if (g_interrupt_notify != nullptr) return 0;
  struct sigaction current;
  if (notify == nullptr || sigaction(SIGINT, nullptr, &current) != 0 ||
      (!(current.sa_flags & SA_SIGINFO) && current.sa_handler == SIG_IGN)) {
    return -1;
  }
  if (pipe2(g_interrupt_pipe, O_CLOEXEC) != 0) return -1;
  g_interrupt_notify = notify;
  std::thread(WatchInterrupts).detach();
  struct sigaction ours;
  memset(&ours, 0, sizeof ours);
  ours.sa_sigaction = OnSigint;
  ours.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&ours.sa_mask);
  sigaction(SIGINT, &ours, &g_previous_sigint);
  return 0;
}

// A pending call (Py_AddPendingCall) that raises SIGINT in Python's own
// handling (PyErr_SetInterruptEx, looked up at run time: the library does not
// link Python): KeyboardInterrupt at the main thread's next bytecode.  C, so
// that no Python code runs between this and that bytecode.
extern "C" __attribute__((visibility("default"))) int TfTpuEmbRaiseSigintInPython(void*) {
  using SetInterrupt = int (*)(int);
  static const auto set_interrupt =
      reinterpret_cast<SetInterrupt>(dlsym(RTLD_DEFAULT, "PyErr_SetInterruptEx"));
  if (set_interrupt != nullptr) set_interrupt(SIGINT);
  return 0;
}

// No wait of any engine lasts more than `grace_seconds` from now on.
extern "C" __attribute__((visibility("default"))) void TfTpuEmbCloseWaits(double grace_seconds) {
  tf_tpu_emb::Engine::CloseWaits(grace_seconds);
}

// ------------------------------------------ tf_tpu_emb/engine_registry.py
// Releasing an engine from a finalizer must create no TF op (it may run on
// any thread, inside another thread's tf.function trace).

extern "C" __attribute__((visibility("default"))) void TfTpuEmbReleaseEngine(const char* name) {
  try {
    tf_tpu_emb::Engine::Shutdown(name == nullptr ? "" : name);
  } catch (...) {  // nothing may cross the C boundary
  }
}

extern "C" __attribute__((visibility("default"))) int64_t TfTpuEmbLiveStateBytes() {
  return tf_tpu_emb::Engine::LiveStateBytes();
}

// ----------------------------------------------- tf_tpu_emb/tpu/system.py
// The stand-in SparseCore system the lookup and gradient kernels read
// (core/sparsecore.h ChipSystem; replicas 0 removes it).  Returns 0, or -1
// for counts out of range.

extern "C" __attribute__((visibility("default"))) int TfTpuEmbSetSparseCoreSystem(
    int64_t replicas, int64_t sparsecores_per_chip) {
  return tf_tpu_emb::sparsecore::SetChipSystem(replicas, sparsecores_per_chip) ? 0 : -1;
}
