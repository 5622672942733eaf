#include "runtime/exec/prompt_wakeup.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "runtime/comm/mpi_wait.h"

namespace dhelix::rt {
namespace {

// struct sched_attr of sched_setattr(2); glibc has no wrapper before 2.41.
struct SchedAttr {
  uint32_t size = sizeof(SchedAttr);
  uint32_t sched_policy = SCHED_OTHER;
  uint64_t sched_flags = 0;
  int32_t sched_nice = 0;
  uint32_t sched_priority = 0;
  uint64_t sched_runtime = 0;  // SCHED_OTHER: the requested slice, ns (Linux 6.12+)
  uint64_t sched_deadline = 0;
  uint64_t sched_period = 0;
};

}  // namespace

bool request_prompt_wakeups() {
  mark_beside_computation();
  if (std::getenv("DHELIX_NO_PROMPT_WAKEUPS") != nullptr) return false;
#ifdef SYS_sched_setattr
  SchedAttr attr;
  // Keep the thread's nice value: sched_setattr sets every field it is given.
  errno = 0;
  const int nice = getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)));
  if (errno == 0) attr.sched_nice = nice;
  attr.sched_runtime = static_cast<uint64_t>(kCommSliceUs) * 1000;
  return syscall(SYS_sched_setattr, 0, &attr, 0) == 0;
#else
  return false;
#endif
}

long long requested_slice_ns() {
#ifdef SYS_sched_getattr
  SchedAttr attr;
  if (syscall(SYS_sched_getattr, 0, &attr, sizeof(attr), 0) != 0) return -1;
  return static_cast<long long>(attr.sched_runtime);
#else
  return -1;
#endif
}

}  // namespace dhelix::rt
