#pragma once
// The MPI library's lifetime in one process, and the one wrapper that checks MPI return
// codes. The runtime drives each communication stream from a thread of its own, so it needs
// MPI_THREAD_MULTIPLE; an MPI built without it is refused up front rather than left to
// corrupt messages later.
//
// Errors: MPI's default handler aborts the whole job on any error, with no word about
// which call or rank. MpiEnvironment and MpiCommunicator install MPI_ERRORS_RETURN on every
// communicator instead, so that check_mpi() turns a failing call into a dhelix::Error
// naming the call, the rank and MPI's own text.

#include <cstdint>

namespace dhelix::rt {

/// Throws Error(kInternal) "MPI_Isend failed on rank 3: <MPI's error text>" unless rc is
/// MPI_SUCCESS. `call` names the MPI function.
void check_mpi(int rc, const char* call);

/// Ends every rank of the job with exit status `code` (MPI_Abort on MPI_COMM_WORLD): for a
/// fatal error on one rank while the others may be blocked in a collective waiting for it.
[[noreturn]] void abort_world(int code);

/// "MPI_THREAD_SINGLE", "MPI_THREAD_FUNNELED", "MPI_THREAD_SERIALIZED",
/// "MPI_THREAD_MULTIPLE", or "unknown thread level" for anything else.
const char* mpi_thread_level_name(int level);

/// Initialises MPI for the lifetime of the object (one per process, made by main).
class MpiEnvironment {
 public:
  /// Calls MPI_Init_thread asking for MPI_THREAD_MULTIPLE (argc/argv may be null). Throws
  /// Error(kUnsupported) naming both levels when the library provides less, and
  /// Error(kInternal) when initialisation fails. When MPI is already initialised, checks the
  /// level it has and leaves finalisation to whoever initialised it.
  MpiEnvironment(int* argc, char*** argv);
  /// Calls MPI_Finalize if this object initialised MPI and nobody has finalised it yet.
  ~MpiEnvironment();
  MpiEnvironment(const MpiEnvironment&) = delete;
  MpiEnvironment& operator=(const MpiEnvironment&) = delete;

  /// This process's rank in MPI_COMM_WORLD.
  int64_t world_rank() const { return world_rank_; }
  /// Processes in MPI_COMM_WORLD (what mpirun -np started).
  int64_t world_size() const { return world_size_; }

 private:
  bool initialised_here_ = false;
  int64_t world_rank_ = 0;
  int64_t world_size_ = 1;
};

}  // namespace dhelix::rt
