// How late a communication thread's backoff sleep wakes up (runtime/comm/mpi_wait.h), with
// Linux's default timer slack (50 us for a normal thread) and with the 1 ns slack that
// wait_for sets, on an idle CPU and on a CPU that a busy thread (a compute stream) keeps
// running. Every sleep in --comm-wait backoff delays the MPI progress of a collective over
// TCP by its length plus this lateness. Not a CTest test: it prints, per case, the median,
// p90 and p99 of (measured sleep - requested sleep) and the CPU time the sleeping thread
// used per sleep, both from the same run.
//
//   build/tests/bench/dhelix_sleep_latency_bench [SLEEPS]   (default 2000 per case)
//
// Measured on the 2-CPU development VM (docs/runtime.md, "Settings of the CPU backend").
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

double thread_cpu_us() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) * 1e-3;
}

struct Case {
  const char* name;
  bool exact_slack;  // PR_SET_TIMERSLACK 1 ns, as mpi_wait.cc does
  bool busy_cpu;     // a thread spinning on the same CPU
  int sleep_us;
};

void run_case(const Case& c, int sleeps, int cpu) {
  std::atomic<bool> stop{!c.busy_cpu};
  std::thread busy([&] {
    pin_to(cpu);
    volatile double x = 0;
    while (!stop.load(std::memory_order_relaxed)) x = x + 1;
  });
  std::vector<double> late;
  double cpu_us = 0;
  std::thread sleeper([&] {
    pin_to(cpu);
    prctl(PR_SET_TIMERSLACK, c.exact_slack ? 1UL : 50000UL, 0UL, 0UL, 0UL);
    const double cpu_start = thread_cpu_us();
    for (int i = 0; i < sleeps; ++i) {
      const auto start = Clock::now();
      std::this_thread::sleep_for(std::chrono::microseconds(c.sleep_us));
      const std::chrono::duration<double, std::micro> took = Clock::now() - start;
      late.push_back(took.count() - c.sleep_us);
    }
    cpu_us = thread_cpu_us() - cpu_start;
  });
  sleeper.join();
  stop = true;
  busy.join();
  std::sort(late.begin(), late.end());
  auto at = [&](double q) {
    return late[static_cast<size_t>(q * static_cast<double>(sleeps - 1))];
  };
  std::printf("%-34s sleep %2d us: late median %7.1f p90 %7.1f p99 %8.1f us; cpu %5.2f us/sleep\n",
              c.name, c.sleep_us, at(0.5), at(0.9), at(0.99), cpu_us / sleeps);
}

}  // namespace

int main(int argc, char** argv) {
  const int sleeps = argc > 1 ? std::max(10, std::atoi(argv[1])) : 2000;
  const int cpu = static_cast<int>(std::thread::hardware_concurrency()) - 1;
  const Case cases[] = {
      {"default slack, idle CPU", false, false, 1}, {"1 ns slack, idle CPU", true, false, 1},
      {"default slack, busy CPU", false, true, 1},  {"1 ns slack, busy CPU", true, true, 1},
      {"default slack, busy CPU", false, true, 50}, {"1 ns slack, busy CPU", true, true, 50},
  };
  for (const Case& c : cases) run_case(c, sleeps, cpu);
  return 0;
}
