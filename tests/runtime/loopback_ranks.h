#pragma once
// One thread per rank over a LoopbackWorld (runtime/comm/loopback_communicator.h), as the
// interpreter tests run a plan's ranks in one process: each rank's result is kept, and an
// exception a rank throws becomes that rank's `error` (Result has a std::string error), so
// that one failing rank never leaves its peers' threads unjoined.

#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include "runtime/comm/loopback_communicator.h"

namespace dhelix::rt::testing {

/// `run_rank(world, rank)` on a thread per rank of a world of `ranks`, joined.
template <class Result, class RunRank>
std::vector<Result> run_loopback_ranks(int64_t ranks, RunRank run_rank) {
  LoopbackWorld world(ranks);
  std::vector<Result> results(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        results[static_cast<size_t>(rank)] = run_rank(world, rank);
      } catch (const std::exception& error) {
        results[static_cast<size_t>(rank)].error = error.what();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return results;
}

}  // namespace dhelix::rt::testing
