#include "runtime/exec/affinity.h"

#include <pthread.h>

#include <cstring>
#include <string>

#include "lib/error.h"

namespace dhelix::rt {

void pin_current_thread(int cpu) {
  if (cpu < 0) return;
  if (cpu >= CPU_SETSIZE) {
    throw Error(ErrorCode::kInvalidInput,
                "cannot pin to CPU " + std::to_string(cpu) + ": beyond CPU_SETSIZE");
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0) {
    throw Error(ErrorCode::kInvalidInput,
                "cannot pin a thread to CPU " + std::to_string(cpu) + ": " + std::strerror(rc));
  }
}

ScopedPin::ScopedPin(int cpu) {
  if (cpu < 0) return;
  if (pthread_getaffinity_np(pthread_self(), sizeof(previous_), &previous_) != 0) return;
  pin_current_thread(cpu);
  pinned_ = true;
}

ScopedPin::~ScopedPin() {
  if (pinned_) pthread_setaffinity_np(pthread_self(), sizeof(previous_), &previous_);
}

}  // namespace dhelix::rt
