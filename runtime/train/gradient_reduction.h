#pragma once
// The CPU engine's data-parallel gradient reduction, as Megatron-LM's distributed data
// parallel with --overlap-grad-reduce (the planner's model of it: planner/dp_overlap.h).
//
// Layout, once per run (connect time): each parameter's gradient is final after the last
// instruction of the rank program that writes it (runtime/model/gradient_writers.h). The
// parameters, ordered by that instruction, are cut into buckets of about --ddp-bucket-size
// elements (plan_gradient_buckets, runtime/train/gradient_buckets.h; default the planner's
// megatron_dp_bucket_parameters(dp x cp)); under expert parallelism the MoE experts'
// gradients get buckets of their own, summed over the expert-data-parallel group instead of
// DP x CP. A bucket is complete when its last writing instruction has run; the buckets are
// numbered in that order.
//
// Work, per iteration: one thread of its own, with communicators of its own (an MPI
// communicator never runs two collectives at once; runtime/comm/process_groups.h,
// reduction_*), sums bucket 0, 1, ... in that fixed order, each as soon as it is complete:
// first the TP sum of the parameters that ask for one (sum_gradient_over_tp, per parameter),
// then one all-reduce of the bucket's gradients packed back to back. With overlap the
// interpreter reports each finished instruction (ExecutionOptions::on_instruction_done) and
// the buckets run while the backward goes on; without, they all start in finish(), after the
// iteration. The fixed order keeps every member of a group calling the same collectives in
// the same order whatever the thread timing.
//
// Bits: the communicators sum element by element in group-rank order (runtime/comm/
// communicator.h), so packing, bucket size and overlap change no bit: the gradients equal
// those of the per-parameter sums after the iteration, and --verify stays bitwise.
//
// Distributed optimizer (the plan's options.distributed_optimizer; sharded_adamw.h): the
// bucket is reduce-scattered instead, each member of its group keeping the sum of its
// shard, elements [r·s, (r+1)·s) of the bucket padded to n·s (s = ceil(elements / n)):
// the same additions as the all-reduce's, so the same bits.
//
// Parameter gathers (distributed optimizer with overlap_param_gather): after the optimizer
// step the same thread all-gathers the updated weights bucket by bucket, last bucket first
// (the order the next forward needs them, as Megatron-LM dispatches them), before any
// reduction of the next iteration. An instruction of layer l reads only layer l's
// parameters (of the stage extras' ops, the embedding's read the embedding, the others the
// final norm and head: the model binds each op to its own layer's tensors), so the interpreter's
// before_instruction hook makes it wait for the gathers of the buckets holding its layer's
// parameters only: the first layers' forward starts while the later buckets are still being
// gathered.
//
// Failure: a collective's error is passed to the execution's failure handler (which ends a
// multi-rank job) and rethrown by finish(); the buckets after it are skipped.

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lib/plan/rank_program.h"
#include "runtime/comm/communicator.h"
#include "runtime/exec/stream.h"
#include "runtime/model/stage_model.h"

namespace dhelix::rt {

/// One bucket's reduction in one iteration, steady_clock nanoseconds (dhelix-run --trace).
struct BucketTiming {
  int64_t bucket = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  bool gather = false;  ///< a parameter all-gather (distributed optimizer), else a reduction
};

/// One bucket: parameters (indices into the rank's parameter list, in the order their
/// gradients become final), packed back to back.
struct ReductionBucket {
  std::vector<int64_t> parameters;
  std::vector<int64_t> offsets;  ///< per parameter, elements from the bucket's start
  int64_t elements = 0;
  bool expert = false;        ///< summed over the expert-data-parallel group, else DP x CP
  int64_t completed_by = -1;  ///< the instruction after which it is complete (-1: at once)
};

/// For each parameter named in `names`, the index of the last instruction of `program`
/// writing its gradient (gradients_written_by); -1 when none does.
std::vector<int64_t> last_gradient_writers(const std::vector<std::string>& names,
                                           const RankProgram& program);

/// The buckets (see the file comment) of parameters of `sizes` elements whose gradients
/// are final after instruction `last_writer[i]`; `expert[i]` parameters get buckets apart
/// when `experts_apart` (ep > 1). Ordered by completed_by, dense before expert on a tie.
/// Throws Error(kInvalidInput) naming --ddp-bucket-size for bucket_elements < 1.
std::vector<ReductionBucket> plan_reduction_buckets(const std::vector<int64_t>& sizes,
                                                    const std::vector<bool>& expert,
                                                    const std::vector<int64_t>& last_writer,
                                                    int64_t bucket_elements, bool experts_apart);

/// A parameter as the bucket layout sees it (either backend's parameter views).
struct BucketedParameter {
  std::string name;
  int64_t count = 0;
  bool expert = false;
};

/// plan_reduction_buckets for `params` (a rank's parameters), their gradients final as
/// `program` finishes them (last_gradient_writers); without a program, all at -1.
std::vector<ReductionBucket> reduction_buckets_of(const std::vector<BucketedParameter>& params,
                                                  const RankProgram* program,
                                                  int64_t bucket_elements, bool experts_apart);
/// The same for a rank's StageModel::parameters().
std::vector<ReductionBucket> reduction_buckets_of(const std::vector<ParameterView>& params,
                                                  const RankProgram* program,
                                                  int64_t bucket_elements, bool experts_apart);

/// For `program` (any program of the rank, not only the one the buckets follow): per
/// bucket, the last instruction writing a gradient of it; -1 when none does. `names`: the
/// parameters' names, by index.
std::vector<int64_t> bucket_last_writers(const std::vector<ReductionBucket>& buckets,
                                         const std::vector<std::string>& names,
                                         const RankProgram& program);

/// For `program`: per instruction, the buckets holding the parameters it may read
/// (read_key_of_instruction / read_key_of_parameter), ascending.
std::vector<std::vector<int32_t>> buckets_read_by(const std::vector<ReductionBucket>& buckets,
                                                  const std::vector<std::string>& names,
                                                  const RankProgram& program);

/// Which parameters an instruction may read, as keys: an instruction reads only
/// parameters with its key (see the file comment; tested instruction by instruction in
/// tests/runtime/gradient_reduction_test.cc). A parameter's: the layer of
/// "layers.<l>.<part>", -1 for the embedding, -2 for the final norm and head.
int64_t read_key_of_parameter(const std::string& name);
/// An instruction's: its layer; for the stage extras -1 (the embedding's ops) or -2 (the
/// final norm's, head's and loss's); nullopt for a transfer (reads no parameter).
std::optional<int64_t> read_key_of_instruction(const Instruction& instruction);

/// The reduction thread's communicators (not used by any other thread).
/// Distributed optimizer: the elements of a bucket of `elements` each of `members` owns
/// (the last shards padded with zeros).
inline int64_t shard_elements(int64_t elements, int64_t members) {
  return (elements + members - 1) / members;
}

struct ReductionGroups {
  Communicator* tp = nullptr;
  Communicator* dense = nullptr;   ///< DP x CP
  Communicator* expert = nullptr;  ///< expert data parallel
};

class GradientReducer {
 public:
  /// Starts the reduction thread. `params` are the rank's parameters (their gradient
  /// buffers stay valid for the reducer's life); `buckets` index into them.
  /// `sharded`: reduce-scatter each bucket (distributed optimizer) instead of
  /// all-reducing it; the gradient buffers then keep the local sums and shard_gradient()
  /// holds this rank's shard of the total.
  GradientReducer(std::vector<ParameterView> params, std::vector<ReductionBucket> buckets,
                  ReductionGroups groups, bool sharded = false);
  /// Finishes the gathers started (every member of a group runs the same collectives),
  /// then stops the thread.
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  /// Before an execution of `program`: every bucket pending, timings cleared. With
  /// `overlap`, returns the hook for ExecutionOptions::on_instruction_done that starts each
  /// bucket once its last writer has run; without, an empty function. Call only when idle
  /// (after finish() or wait_for_started()).
  std::function<void(size_t)> start(const RankProgram& program, bool overlap,
                                    FailureHandler on_failure);
  /// Starts every bucket not started yet and waits until all are summed; rethrows the
  /// reduction's failure. Does nothing more when called again before the next start().
  void finish();
  /// Waits until every started bucket is summed (after an overlapped execution: all of
  /// them), so that the gradients may be read or zeroed.
  void wait_for_started();
  /// Each bucket's reduction in the last iteration, in bucket order (after finish()), then
  /// the parameter gathers that ran since the previous finish().
  std::vector<BucketTiming> timings();

  /// Distributed optimizer: `gather(b)` all-gathers bucket b's updated weights; run on the
  /// reduction thread for every bucket, last first, from the next start_gathers() on.
  void set_gather(std::function<void(size_t)> gather) { gather_ = std::move(gather); }
  /// Starts the gathers (after the optimizer step; the reductions are finished).
  void start_gathers();
  /// Waits until every started gather has run (the weights may then be read whole).
  void wait_for_gathers();
  /// The hook for ExecutionOptions::before_instruction: waits until the buckets holding
  /// the parameters of the instruction's layer are gathered. Empty when none is pending.
  std::function<void(size_t)> gather_waits(const RankProgram& program);
  const std::vector<ReductionBucket>& buckets() const { return buckets_; }
  /// Sharded: this rank's shard of bucket `bucket`'s summed gradients (shard_elements of
  /// it, zero past the bucket's end), valid after finish().
  const std::vector<float>& shard_gradient(size_t bucket) const { return shards_[bucket]; }
  /// The group bucket `bucket` is summed over.
  Communicator& group_of(size_t bucket) const;
  /// Members of the DP x CP group (the dense buckets').
  int64_t dense_group_size() const { return groups_.dense->size(); }
  /// The expert-data-parallel group's size (1 without it).
  int64_t expert_group_size() const { return groups_.expert ? groups_.expert->size() : 1; }

 private:
  // Per program: the buckets each instruction writes into, and each bucket's writers.
  struct Writers {
    std::vector<std::vector<int32_t>> buckets_of;
    std::vector<int64_t> count;
    std::vector<std::vector<int32_t>> reads;  // per instruction: buckets of its layer
  };
  const Writers& writers_of(const RankProgram& program);
  void instruction_done(size_t index);
  void release(size_t bucket);  // with mutex_ held
  void run();
  void reduce(size_t bucket);
  bool idle() const;  // with mutex_ held: no reduction released and not yet summed
  bool gathering() const { return next_gather_ < gather_order_.size(); }  // with mutex_ held
  void run_gather(std::unique_lock<std::mutex>& lock);
  void fail(std::unique_lock<std::mutex>& lock, std::exception_ptr failure);
  void wait_for_gathered(const std::vector<int32_t>& buckets);

  std::vector<ParameterView> params_;
  std::vector<std::string> names_;
  std::vector<ReductionBucket> buckets_;
  ReductionGroups groups_;
  bool sharded_ = false;
  std::vector<std::vector<float>> shards_;  // sharded: per bucket
  std::vector<float> staging_;
  std::map<const RankProgram*, Writers> writers_;

  std::mutex mutex_;
  std::condition_variable changed_;
  const Writers* current_ = nullptr;
  std::vector<int64_t> pending_;  // writers still to run, per bucket
  std::vector<char> released_;
  size_t next_ = 0;           // the bucket the thread sums next
  bool busy_ = false;         // summing a bucket
  bool gather_busy_ = false;  // gathering a bucket
  bool stopping_ = false;
  std::exception_ptr failure_;
  FailureHandler on_failure_;
  std::vector<BucketTiming> timings_;
  std::function<void(size_t)> gather_;
  std::vector<size_t> gather_order_;  // last bucket first
  size_t next_gather_ = 0;            // index into gather_order_; its size: none pending
  std::vector<char> gathered_;
  std::vector<BucketTiming> gather_timings_;
  std::thread thread_;
};

}  // namespace dhelix::rt
