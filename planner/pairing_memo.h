#pragma once
// Pairing searches shared between plans. The configuration search (config_search.h) plans
// hundreds of configurations, and most of them repeat another's layers: changing pp or dp
// leaves a layer's operators, and so its exact pairing search, as they were. A PairingMemo
// keeps each search's result under a key that names everything the result depends on, so
// that the second plan with the same layers looks it up instead of searching again.
//
// The key of a search (pairing_memo_key) holds, for each op of both strands, its id,
// stream, solo time (all 17 significant digits), predecessors and cost key, plus the window
// (layers per side) and the search options. What it does not hold is the co-run model: two
// ops with equal cost keys must co-run alike in every plan the memo serves. That holds when
// all plans use profiles made by one generator for one cluster (the search's analytic model
// profiles: a pair's times are a function of the cluster and the two signatures), and that
// is the only use it is meant for. Results are identical with and without a memo
// (tests/planner/pairing_memo_test.cc plans with and without one and compares the bytes).
//
// Thread safety: any number of threads may call find_or_search at once. Callers of one key
// wait for the first caller's search instead of repeating it; a search that throws leaves
// no entry, and the next caller searches again.

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "planner/pairing_search.h"
#include "planner/strand_graph.h"

namespace dhelix {

class PairingMemo {
 public:
  /// The result stored under `key`; the first call for a key runs `search` and keeps its
  /// result. The reference stays valid for the memo's lifetime.
  const PairingResult& find_or_search(const std::string& key,
                                      const std::function<PairingResult()>& search);

  /// Searches run (misses) and lookups answered from the memo (hits), for benchmarks.
  int64_t searches() const;
  int64_t hits() const;

 private:
  struct Entry {
    std::once_flag once;
    PairingResult result;
  };
  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::unique_ptr<Entry>> entries_;
  int64_t searches_ = 0;
  int64_t hits_ = 0;
};

/// Which search a memo entry holds.
enum class MemoSearch {
  kPairing,        ///< search_pairing of the two strands
  kForwardAlone,   ///< search_single_strand of the forward strand (in PairingResult::blocks)
  kBackwardAlone,  ///< search_single_strand of the backward strand (likewise)
};

/// The memo key of `search` over `layers` repetitions of `forward` against as many of
/// `backward` with `options` (see the file comment for what it covers).
std::string pairing_memo_key(MemoSearch search, const StrandGraph& forward,
                             const StrandGraph& backward, int64_t layers,
                             const PairingOptions& options);

}  // namespace dhelix
