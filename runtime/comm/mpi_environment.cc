#include "runtime/comm/mpi_environment.h"

#include <mpi.h>

#include <cstdlib>
#include <string>

#include "lib/error.h"

namespace dhelix::rt {
namespace {

// MPI_Error_string's text for rc, or the bare code when MPI cannot describe it.
std::string mpi_error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) {
    return "MPI error code " + std::to_string(rc);
  }
  return std::string(text, static_cast<size_t>(length));
}

// World rank for messages, or -1 outside MPI's lifetime.
int world_rank_or_unknown() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  int rank = -1;
  if (initialised && !finalised) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Throws Error(kUnsupported) unless `provided` reaches MPI_THREAD_MULTIPLE.
void require_thread_multiple(int provided) {
  if (provided >= MPI_THREAD_MULTIPLE) return;
  throw Error(ErrorCode::kUnsupported,
              std::string("the MPI library provides thread level ") +
                  mpi_thread_level_name(provided) + ", but dhelix needs " +
                  mpi_thread_level_name(MPI_THREAD_MULTIPLE) +
                  " (each communication stream is a thread of its own); use an MPI built "
                  "with thread support");
}

}  // namespace

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  const int rank = world_rank_or_unknown();
  throw Error(ErrorCode::kInternal, std::string(call) + " failed on rank " +
                                        (rank >= 0 ? std::to_string(rank) : "?") + ": " +
                                        mpi_error_text(rc));
}

void abort_world(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::abort();  // MPI_Abort does not return on a working MPI; this keeps [[noreturn]] true.
}

const char* mpi_thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "unknown thread level";
  }
}

MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
  int already = 0;
  check_mpi(MPI_Initialized(&already), "MPI_Initialized");
  int provided = MPI_THREAD_SINGLE;
  if (already) {
    check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread");
  } else {
    // MPI_Init_thread runs before any error handler can be set: its failures are fatal by
    // the standard's default, so its return code is checked for form's sake.
    check_mpi(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    initialised_here_ = true;
  }
  try {
    require_thread_multiple(provided);
    check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN),
              "MPI_Comm_set_errhandler");
    int rank = 0, size = 1;
    check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
    world_rank_ = rank;
    world_size_ = size;
  } catch (...) {
    // The destructor does not run for a constructor that throws.
    if (initialised_here_) MPI_Finalize();
    throw;
  }
}

MpiEnvironment::~MpiEnvironment() {
  if (!initialised_here_) return;
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (!finalised) MPI_Finalize();
}

}  // namespace dhelix::rt
