#pragma once
// Pinning a thread to one CPU. dhelix-run --pin-compute pins each rank's compute stream
// (the thread that runs the GEMMs) to CPU (local rank mod online CPUs), so that the
// scheduler never moves it and the communication threads, which mostly sleep
// (runtime/comm/mpi_wait.h), run wherever a core is free. Nothing else is pinned: a thread
// created by a pinned thread inherits its mask, so the interpreter pins only inside the
// compute stream's own thread, and restores the calling thread's mask after a sequential run.

#include <sched.h>

namespace dhelix::rt {

/// Pins the calling thread to `cpu` (no-op for cpu < 0). Throws Error(kInvalidInput)
/// naming the CPU when the system refuses (a CPU outside the process's allowed set).
void pin_current_thread(int cpu);

/// Pins the calling thread for its lifetime and restores the previous mask afterwards.
class ScopedPin {
 public:
  explicit ScopedPin(int cpu);
  ~ScopedPin();
  ScopedPin(const ScopedPin&) = delete;
  ScopedPin& operator=(const ScopedPin&) = delete;

 private:
  bool pinned_ = false;
  cpu_set_t previous_{};
};

}  // namespace dhelix::rt
