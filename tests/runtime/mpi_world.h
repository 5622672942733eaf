#pragma once
// This process's rank and the size of MPI_COMM_WORLD, for the tests that run under mpirun.

#include <mpi.h>

#include <cstdint>

namespace dhelix::rt::test {

inline int64_t world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int64_t world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

}  // namespace dhelix::rt::test
