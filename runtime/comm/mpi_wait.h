#pragma once
// How a rank's threads wait for MPI. OpenMPI's blocking calls (MPI_Wait, MPI_Allgather,
// MPI_Alltoall, MPI_Barrier) spin in the progress engine until the operation ends: a
// communication stream waiting for a slow link holds a core at 100 % the whole time, the
// core its rank's compute stream needs. On a host with fewer free cores than threads that
// spinning is what made co-execution lose on CPU ranks (docs/runtime.md).
//
//   kSpin     MPI's own blocking calls, spinning as the library does (the old behaviour;
//             lowest latency when every thread has a core of its own).
//   kBackoff  the non-blocking form of the call (MPI_Isend, MPI_Iallgather, ...) and
//             MPI_Test in a loop that gives the core away between tests: first
//             kYieldTests tests separated by sched_yield (a message that is about to arrive
//             costs no sleep), except on a thread beside computation (below), then sleeps
//             doubling from 1 us up to the longest sleep
//             (mpi_max_sleep_us: kDefaultMaxSleepUs, or dhelix-run --comm-max-sleep-us),
//             with the thread's timer slack set to 1 ns so that a sleep lasts what it says
//             (Linux's default 50 us slack made every sleep 50 us longer). The data moved
//             and the order of additions are the same, so results are bitwise equal in
//             both modes.
//
// No yields beside computation. Linux's EEVDF scheduler charges a thread that yields and
// is picked again for the time it spins, and a thread that has spun away its share is not
// eligible to run until the computing thread's virtual time catches up: up to that
// thread's whole 3 ms slice, even for a thread that asked for prompt wake-ups
// (runtime/exec/prompt_wakeup.h). A thread that sleeps keeps its share and preempts at
// wake-up. (That is our reading of the scheduler; what was measured is the late-return
// count below.) So a thread that shares its core with computation, one that asked for prompt
// wake-ups (communication streams, the gradient-reduction thread, the profiler's paired
// collective: beside_computation()), sleeps from its first test on. On the emulated-link
// benchmark (docs/runtime.md, TP 2 at 1 Gbit/s) the yields had 520-870 of a run's 3606
// collective calls return more than 100 us after their link was done (0.6-2.8 s in all);
// without them 20-190 (0.02-0.26 s). A thread alone on its core (a sequential step runs its
// collectives on the computing thread, between its ops) keeps the yields: there a yield
// returns at once and a message about to arrive costs no sleep.
//
// Over TCP the OpenMPI progress engine only moves data inside MPI calls: a rank that
// sleeps the longest sleep between tests lets at most that long pass with a socket buffer
// drained, which at 1 Gbit/s and 50 us is 6 KB, below the kernel's socket buffers.
//
// The mode is process-wide (every communicator of the rank waits the same way) and is set
// once, before any communication, by dhelix-run --comm-wait.

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace dhelix::rt {

enum class MpiWaitMode { kSpin, kBackoff };

/// "spin", "backoff".
const char* mpi_wait_mode_name(MpiWaitMode mode);
/// The mode named `name`, or nullopt.
std::optional<MpiWaitMode> parse_mpi_wait_mode(std::string_view name);

/// Sets the process-wide mode (default kBackoff). Call before communicating.
void set_mpi_wait_mode(MpiWaitMode mode);
MpiWaitMode mpi_wait_mode();

/// Tests with sched_yield between them before sleeping.
inline constexpr int kYieldTests = 64;
/// Longest sleep between two tests by default, microseconds.
inline constexpr int64_t kDefaultMaxSleepUs = 50;

/// Sets the process-wide longest sleep of kBackoff, us (>= 1). Call before communicating.
void set_mpi_max_sleep_us(int64_t us);
int64_t mpi_max_sleep_us();

/// Marks the calling thread as one that shares its core with computation: its waits never
/// yield (see the file comment). runtime/exec/prompt_wakeup.h's request_prompt_wakeups
/// marks every thread that asks for prompt wake-ups.
void mark_beside_computation();
/// Whether the calling thread was marked.
bool beside_computation();

/// Waits for `request` to finish (MPI_Wait in kSpin mode, test-and-back-off otherwise) and
/// throws Error(kInternal) naming `call` when MPI reports an error.
void wait_for(MPI_Request& request, const char* call);

}  // namespace dhelix::rt
