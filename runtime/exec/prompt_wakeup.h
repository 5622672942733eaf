#pragma once
// Communication threads that run the moment their transfer completes. A rank's
// communication streams (and the gradient-reduction thread) sleep through nearly all of a
// transfer, and the other strand's computation has the core meanwhile; when the transfer
// completes, the thread must run at once to mark it done, or the strand that waits for it
// and the next collective queued behind it are held back. Linux's EEVDF scheduler (6.6 and
// later) lets a running thread keep the core until its time slice ends (3 ms by default)
// before a thread it woke gets it, unless the woken thread asks for a shorter slice
// (sched_setattr's sched_runtime for SCHED_OTHER, Linux 6.12 and later): then it preempts at
// wake-up. That is the CPU counterpart of the high priority the CUDA executor gives its
// communication streams (stream_lowering.h), and it needs no privilege.
//
// Where the kernel does not take the request (older kernels, other systems) nothing
// changes: the call reports it and the run goes on. DHELIX_NO_PROMPT_WAKEUPS=1 in the
// environment turns the request off, to measure what it changes (docs/runtime.md: under
// load, a TP 2 step on an emulated 2 Gbit/s link took 1.25-1.28 s with it and 1.36-1.58 s
// without).

namespace dhelix::rt {

/// The slice a communication thread asks for, microseconds: the kernel's shortest (0.1 ms).
inline constexpr int kCommSliceUs = 100;

/// Asks the scheduler to give the calling thread a kCommSliceUs time slice (see the file
/// comment), keeping its nice value. Returns whether the kernel took it (false, asking
/// nothing, under DHELIX_NO_PROMPT_WAKEUPS). Either way it marks the thread as one that
/// shares its core with computation, which waits for MPI without yielding
/// (runtime/comm/mpi_wait.h, beside_computation).
bool request_prompt_wakeups();

/// The time slice the calling thread asked for, ns (0: the kernel's default; -1 where the
/// kernel cannot say).
long long requested_slice_ns();

}  // namespace dhelix::rt
