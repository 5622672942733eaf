#pragma once
// The planner's own view of one strand: the ops of one pass of one layer (or of a few
// layers concatenated) on one rank, each with its stream, its solo time and its
// predecessors. It is deliberately smaller than LayerDag (lib/layer_dag.h) so that the
// search can be tested on random DAGs: tests build StrandGraphs by hand, the tools build
// them from a LayerDag and a profile's solo times (from_layer_dag).
//
// Invariants: at most kMaxStrandOps ops; indices are a topological order (every
// predecessor of op i has an index below i); ids are unique. Sets of ops are bit masks
// (OpMask, bit i = op i), which is what lets the search memoize block costs cheaply.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lib/error.h"
#include "lib/layer_dag.h"
#include "lib/op_catalogue.h"

namespace dhelix {

/// A set of ops of one strand: bit i stands for op i.
using OpMask = uint64_t;

/// The most ops one StrandGraph may hold (the width of OpMask).
inline constexpr int64_t kMaxStrandOps = 64;

/// Which of the two co-running strands an op belongs to. The forward strand runs the
/// forward pass of one micro-batch, the backward strand the backward pass of another.
enum class Strand { kForward, kBackward };

const char* strand_name(Strand strand);  ///< "fwd", "bwd"

/// Number of ops in a mask.
inline int64_t mask_size(OpMask mask) { return __builtin_popcountll(mask); }

/// One op of a strand.
struct StrandOp {
  std::string id;                              ///< unique within the strand, e.g. "fwd.gemm_qkv"
  StreamClass stream = StreamClass::kCompute;  ///< the one resource the op occupies
  double solo_time_us = 0;                     ///< run time alone on an idle device, >= 0
  std::vector<int64_t> predecessors;           ///< ascending, each below this op's index
  /// What a CoRunModel looks the op up by: Op::signature() for ops of a real layer (equal
  /// signatures, equal behaviour), the id for hand-built graphs unless given.
  std::string cost_key;
  /// FSDP's parameter all-gather or gradient reduce-scatter (lib/dag_builder_fsdp.cc):
  /// concatenate_layers chains neither a gather after the previous layer nor the next layer
  /// after a reduce-scatter, so a window may gather layer k+1's parameters while layer k
  /// computes and reduce-scatter layer k's gradients under layer k+1 (FSDP's prefetch).
  bool fsdp_collective = false;
};

/// One strand's ops in a topological order, with the masks the search needs precomputed.
class StrandGraph {
 public:
  /// Appends an op and returns its index. DHELIX_CHECKs: fewer than kMaxStrandOps ops so
  /// far, a new id, solo_time_us >= 0, every predecessor an existing index. An empty
  /// cost_key means "use the id".
  int64_t add_op(std::string id, StreamClass stream, double solo_time_us,
                 std::vector<int64_t> predecessors, std::string cost_key = "",
                 bool fsdp_collective = false);

  int64_t size() const { return static_cast<int64_t>(ops_.size()); }
  const StrandOp& op(int64_t index) const {
    DHELIX_CHECK(index >= 0 && index < size());
    return ops_[static_cast<size_t>(index)];
  }
  const std::vector<StrandOp>& ops() const { return ops_; }
  /// Index of the op with this id, or -1.
  int64_t find(const std::string& id) const;

  /// Direct predecessors.
  OpMask predecessor_mask(int64_t index) const {
    return predecessor_masks_[static_cast<size_t>(index)];
  }
  /// Direct successors.
  OpMask successor_mask(int64_t index) const {
    return successor_masks_[static_cast<size_t>(index)];
  }
  OpMask all_ops() const;  ///< every op
  /// Ops of one stream.
  OpMask stream_mask(StreamClass stream) const;
  /// True when every predecessor of every op in the mask is in the mask (an order ideal).
  bool is_downset(OpMask mask) const;
  /// Sum of solo times of the ops in mask, in us.
  double solo_time_sum_us(OpMask mask) const;
  /// Longest path by solo times from each op to a sink, the op included, in us.
  const std::vector<double>& tail_time_us() const { return tail_time_us_; }

 private:
  std::vector<StrandOp> ops_;
  std::vector<OpMask> predecessor_masks_;
  std::vector<OpMask> successor_masks_;
  std::vector<double> tail_time_us_;
};

/// solo_time_us(op), checked: Error(kInvalidInput) "op <id>: solo time <t> us must be finite
/// and non-negative" unless it is both (every StrandGraph built from a LayerDag uses this).
double checked_solo_time_us(const Op& op, const std::function<double(const Op&)>& solo_time_us);

/// The StrandGraph of one LayerDag: ops in the DAG's deterministic topological order, ids
/// and streams copied, cost_key = Op::signature(), solo times from the lookup (in us; a
/// negative time is an Error(kInvalidInput) naming the op). Edges are kept as they are.
/// Throws Error(kUnsupported) when the DAG holds more than kMaxStrandOps ops.
StrandGraph from_layer_dag(const LayerDag& dag,
                           const std::function<double(const Op&)>& solo_time_us);

/// Several layers of one strand as one graph: layer k's ops get ids "L<k>.<id>", and every
/// sink of layer k (an op nothing in layer k waits for, e.g. a weight-gradient GEMM)
/// precedes every source of layer k + 1: a movable op moves within its own layer only,
/// as Op::movable_sink promises. DHELIX_CHECKs the total size.
StrandGraph concatenate_layers(const std::vector<StrandGraph>& layers);

}  // namespace dhelix
