#include "runtime/train/gradient_reduction.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>
#include <unordered_map>
#include <utility>

#include "lib/error.h"
#include "runtime/exec/prompt_wakeup.h"
#include "runtime/model/gradient_writers.h"
#include "runtime/train/gradient_buckets.h"

namespace dhelix::rt {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What ran with the reducer's lock released: when, and what it threw.
struct UnlockedRun {
  int64_t start = 0;
  int64_t end = 0;
  std::exception_ptr failure;
};

// Runs `work` with `lock` released (the lock held again on return).
template <class Work>
UnlockedRun run_unlocked(std::unique_lock<std::mutex>& lock, Work&& work) {
  UnlockedRun run;
  lock.unlock();
  run.start = now_ns();
  try {
    work();
  } catch (...) {
    run.failure = std::current_exception();
  }
  run.end = now_ns();
  lock.lock();
  return run;
}

// name -> index in the parameter list.
std::unordered_map<std::string, int64_t> index_of(const std::vector<std::string>& names) {
  std::unordered_map<std::string, int64_t> index;
  for (size_t i = 0; i < names.size(); ++i) index.emplace(names[i], static_cast<int64_t>(i));
  return index;
}

// For each instruction of `program`, the parameters (indices) whose gradients it writes.
template <class Visit>
void for_each_gradient_write(const std::vector<std::string>& names, const RankProgram& program,
                             Visit&& visit) {
  const std::unordered_map<std::string, int64_t> index = index_of(names);
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const Instruction& instruction = program.instructions[i];
    if (instruction.kind != InstructionKind::kCompute) continue;
    for (const std::string& name : gradients_written_by(instruction.op, instruction.layer)) {
      const auto it = index.find(name);
      if (it != index.end()) visit(i, it->second);
    }
  }
}

}  // namespace

int64_t read_key_of_parameter(const std::string& name) {
  const std::string_view prefix = "layers.";
  if (name.starts_with(prefix)) return std::stoll(name.substr(prefix.size()));
  return name == "embedding" ? -1 : -2;
}

std::optional<int64_t> read_key_of_instruction(const Instruction& instruction) {
  if (instruction.kind != InstructionKind::kCompute &&
      instruction.kind != InstructionKind::kCollective) {
    return std::nullopt;  // transfers move activations only
  }
  if (instruction.layer >= 0) return instruction.layer;
  return instruction.op.find("embedding") != std::string_view::npos ? -1 : -2;
}

std::vector<int64_t> last_gradient_writers(const std::vector<std::string>& names,
                                           const RankProgram& program) {
  std::vector<int64_t> last(names.size(), -1);
  for_each_gradient_write(names, program, [&](size_t instruction, int64_t parameter) {
    last[static_cast<size_t>(parameter)] = static_cast<int64_t>(instruction);
  });
  return last;
}

std::vector<ReductionBucket> reduction_buckets_of(const std::vector<BucketedParameter>& params,
                                                  const RankProgram* program,
                                                  int64_t bucket_elements, bool experts_apart) {
  std::vector<std::string> names;
  std::vector<int64_t> sizes;
  std::vector<bool> expert;
  for (const BucketedParameter& p : params) {
    names.push_back(p.name);
    sizes.push_back(p.count);
    expert.push_back(p.expert);
  }
  const std::vector<int64_t> last_writer = program == nullptr
                                               ? std::vector<int64_t>(params.size(), -1)
                                               : last_gradient_writers(names, *program);
  return plan_reduction_buckets(sizes, expert, last_writer, bucket_elements, experts_apart);
}

std::vector<ReductionBucket> reduction_buckets_of(const std::vector<ParameterView>& params,
                                                  const RankProgram* program,
                                                  int64_t bucket_elements, bool experts_apart) {
  std::vector<BucketedParameter> shapes;
  for (const ParameterView& p : params) shapes.push_back({p.name, p.count, p.expert});
  return reduction_buckets_of(shapes, program, bucket_elements, experts_apart);
}

std::vector<int64_t> bucket_last_writers(const std::vector<ReductionBucket>& buckets,
                                         const std::vector<std::string>& names,
                                         const RankProgram& program) {
  const std::vector<int64_t> last = last_gradient_writers(names, program);
  std::vector<int64_t> of_bucket;
  for (const ReductionBucket& bucket : buckets) {
    int64_t writer = -1;
    for (int64_t p : bucket.parameters) writer = std::max(writer, last[static_cast<size_t>(p)]);
    of_bucket.push_back(writer);
  }
  return of_bucket;
}

std::vector<std::vector<int32_t>> buckets_read_by(const std::vector<ReductionBucket>& buckets,
                                                  const std::vector<std::string>& names,
                                                  const RankProgram& program) {
  // The buckets holding the parameters of each read key, ascending.
  std::map<int64_t, std::vector<int32_t>> of_key;
  for (size_t b = 0; b < buckets.size(); ++b) {
    for (int64_t p : buckets[b].parameters) {
      std::vector<int32_t>& list = of_key[read_key_of_parameter(names[static_cast<size_t>(p)])];
      if (list.empty() || list.back() != static_cast<int32_t>(b)) {
        list.push_back(static_cast<int32_t>(b));
      }
    }
  }
  std::vector<std::vector<int32_t>> reads(program.instructions.size());
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const std::optional<int64_t> key = read_key_of_instruction(program.instructions[i]);
    const auto found = key ? of_key.find(*key) : of_key.end();
    if (found != of_key.end()) reads[i] = found->second;
  }
  return reads;
}

std::vector<ReductionBucket> plan_reduction_buckets(const std::vector<int64_t>& sizes,
                                                    const std::vector<bool>& expert,
                                                    const std::vector<int64_t>& last_writer,
                                                    int64_t bucket_elements, bool experts_apart) {
  DHELIX_CHECK(sizes.size() == expert.size() && sizes.size() == last_writer.size());
  std::vector<ReductionBucket> buckets;
  for (const bool experts : {false, true}) {
    if (experts && !experts_apart) break;
    // This group's parameters in the order their gradients become final.
    std::vector<int64_t> order;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (!experts_apart || expert[i] == experts) order.push_back(static_cast<int64_t>(i));
    }
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return last_writer[static_cast<size_t>(a)] < last_writer[static_cast<size_t>(b)];
    });
    std::vector<int64_t> ordered_sizes;
    for (int64_t i : order) ordered_sizes.push_back(sizes[static_cast<size_t>(i)]);
    for (const GradientBucket& layout : plan_gradient_buckets(ordered_sizes, bucket_elements)) {
      ReductionBucket bucket;
      bucket.elements = layout.elements;
      bucket.offsets = layout.offsets;
      bucket.expert = experts_apart && experts;
      for (int64_t j = 0; j < layout.count; ++j) {
        const int64_t parameter = order[static_cast<size_t>(layout.first + j)];
        bucket.parameters.push_back(parameter);
        bucket.completed_by =
            std::max(bucket.completed_by, last_writer[static_cast<size_t>(parameter)]);
      }
      buckets.push_back(std::move(bucket));
    }
  }
  std::stable_sort(buckets.begin(), buckets.end(),
                   [](const ReductionBucket& a, const ReductionBucket& b) {
                     return a.completed_by < b.completed_by;
                   });
  return buckets;
}

GradientReducer::GradientReducer(std::vector<ParameterView> params,
                                 std::vector<ReductionBucket> buckets, ReductionGroups groups,
                                 bool sharded)
    : params_(std::move(params)), buckets_(std::move(buckets)), groups_(groups), sharded_(sharded) {
  DHELIX_CHECK(groups_.tp != nullptr && groups_.dense != nullptr && groups_.expert != nullptr);
  for (const ParameterView& p : params_) names_.push_back(p.name);
  int64_t largest = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const int64_t members = group_of(b).size();
    const int64_t shard = shard_elements(buckets_[b].elements, members);
    if (sharded_) {
      shards_.emplace_back(static_cast<size_t>(shard), 0.0f);
      largest = std::max(largest, shard * members);
    } else if (buckets_[b].parameters.size() > 1) {
      largest = std::max(largest, buckets_[b].elements);
    }
  }
  staging_.resize(static_cast<size_t>(largest));
  // Nothing pending until the first start(); finish() before it sums nothing.
  released_.assign(buckets_.size(), 1);
  next_ = buckets_.size();
  gathered_.assign(buckets_.size(), 1);
  for (size_t b = buckets_.size(); b-- > 0;) gather_order_.push_back(b);
  next_gather_ = gather_order_.size();
  thread_ = std::thread([this] { run(); });
}

GradientReducer::~GradientReducer() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return idle() && !gathering() && !gather_busy_; });
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

const GradientReducer::Writers& GradientReducer::writers_of(const RankProgram& program) {
  auto it = writers_.find(&program);
  if (it != writers_.end() && it->second.buckets_of.size() == program.instructions.size()) {
    return it->second;
  }
  std::vector<int32_t> bucket_of(params_.size(), -1);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (int64_t p : buckets_[b].parameters) {
      bucket_of[static_cast<size_t>(p)] = static_cast<int32_t>(b);
    }
  }
  Writers writers;
  writers.buckets_of.resize(program.instructions.size());
  writers.reads = buckets_read_by(buckets_, names_, program);
  writers.count.assign(buckets_.size(), 0);
  for_each_gradient_write(names_, program, [&](size_t instruction, int64_t parameter) {
    const int32_t b = bucket_of[static_cast<size_t>(parameter)];
    if (b < 0) return;
    std::vector<int32_t>& of = writers.buckets_of[instruction];
    if (std::find(of.begin(), of.end(), b) != of.end()) return;
    of.push_back(b);
    ++writers.count[static_cast<size_t>(b)];
  });
  return writers_[&program] = std::move(writers);
}

std::function<void(size_t)> GradientReducer::start(const RankProgram& program, bool overlap,
                                                   FailureHandler on_failure) {
  const Writers& writers = writers_of(program);
  const std::lock_guard<std::mutex> lock(mutex_);
  DHELIX_CHECK_MSG(idle(), "GradientReducer::start while buckets are being summed");
  current_ = &writers;
  pending_ = writers.count;
  released_.assign(buckets_.size(), 0);
  next_ = 0;
  failure_ = nullptr;
  on_failure_ = std::move(on_failure);
  timings_.assign(buckets_.size(), BucketTiming{});
  if (!overlap) return {};
  // A bucket no instruction writes is complete at once.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (pending_[b] == 0) release(b);
  }
  return [this](size_t index) { instruction_done(index); };
}

void GradientReducer::instruction_done(size_t index) {
  const std::vector<int32_t>& buckets = current_->buckets_of[index];
  if (buckets.empty()) return;
  const std::lock_guard<std::mutex> lock(mutex_);
  for (int32_t b : buckets) {
    int64_t& pending = pending_[static_cast<size_t>(b)];
    DHELIX_CHECK(pending > 0);
    if (--pending == 0) release(static_cast<size_t>(b));
  }
}

void GradientReducer::release(size_t bucket) {
  released_[bucket] = 1;
  changed_.notify_all();
}

std::vector<BucketTiming> GradientReducer::timings() {
  const std::lock_guard<std::mutex> lock(mutex_);
  std::vector<BucketTiming> all = timings_;
  all.insert(all.end(), gather_timings_.begin(), gather_timings_.end());
  return all;
}

void GradientReducer::start_gathers() {
  DHELIX_CHECK(gather_ != nullptr);
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    DHELIX_CHECK(!gathering());
    gathered_.assign(buckets_.size(), 0);
    next_gather_ = 0;
    gather_timings_.clear();
  }
  changed_.notify_all();
}

void GradientReducer::wait_for_gathers() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return !gathering() && !gather_busy_; });
  if (failure_) std::rethrow_exception(failure_);
}

void GradientReducer::wait_for_gathered(const std::vector<int32_t>& buckets) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] {
    return std::all_of(buckets.begin(), buckets.end(),
                       [this](int32_t b) { return gathered_[static_cast<size_t>(b)] != 0; });
  });
}

std::function<void(size_t)> GradientReducer::gather_waits(const RankProgram& program) {
  const Writers& writers = writers_of(program);
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (!gathering() && !gather_busy_) return {};
  }
  return [this, &writers](size_t index) {
    const std::vector<int32_t>& reads = writers.reads[index];
    if (!reads.empty()) wait_for_gathered(reads);
  };
}

bool GradientReducer::idle() const {
  return !busy_ && (next_ >= buckets_.size() || !released_[next_]);
}

void GradientReducer::finish() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (size_t b = 0; b < buckets_.size(); ++b) released_[b] = 1;
  changed_.notify_all();
  changed_.wait(lock, [this] { return idle(); });
  if (failure_) std::rethrow_exception(failure_);
}

void GradientReducer::wait_for_started() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return idle(); });
}

void GradientReducer::run() {
  // A communication thread: it runs when its bucket is due (runtime/exec/prompt_wakeup.h).
  request_prompt_wakeups();
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] {
      return stopping_ || gathering() || (next_ < buckets_.size() && released_[next_]);
    });
    if (stopping_) return;
    if (gathering()) {
      run_gather(lock);
      continue;
    }
    const size_t b = next_;
    busy_ = true;
    const UnlockedRun run = run_unlocked(lock, [&] { reduce(b); });
    timings_[b] = {static_cast<int64_t>(b), run.start, run.end, false};
    busy_ = false;
    ++next_;
    if (run.failure) {
      next_ = buckets_.size();  // skip the rest
      fail(lock, run.failure);
    }
    changed_.notify_all();
  }
}

Communicator& GradientReducer::group_of(size_t bucket) const {
  return buckets_[bucket].expert ? *groups_.expert : *groups_.dense;
}

// Keeps the first failure and tells on_failure_, with mutex_ held on entry and exit.
void GradientReducer::fail(std::unique_lock<std::mutex>& lock, std::exception_ptr failure) {
  failure_ = failure;
  if (on_failure_) {
    lock.unlock();
    on_failure_(failure);
    lock.lock();
  }
}

// One gather, with mutex_ held on entry and exit (released while it runs).
void GradientReducer::run_gather(std::unique_lock<std::mutex>& lock) {
  const size_t b = gather_order_[next_gather_];
  gather_busy_ = true;
  const UnlockedRun run = run_unlocked(lock, [&] { gather_(b); });
  gather_timings_.push_back({static_cast<int64_t>(b), run.start, run.end, true});
  gather_busy_ = false;
  gathered_[b] = 1;
  ++next_gather_;
  if (run.failure) {
    // Nothing waits forever: the rest counts as gathered (the failure ends the run).
    std::fill(gathered_.begin(), gathered_.end(), 1);
    next_gather_ = gather_order_.size();
    fail(lock, run.failure);
  }
  changed_.notify_all();
}

void GradientReducer::reduce(size_t index) {
  const ReductionBucket& bucket = buckets_[index];
  Communicator& tp = *groups_.tp;
  for (int64_t p : bucket.parameters) {
    const ParameterView& param = params_[static_cast<size_t>(p)];
    if (param.sum_gradient_over_tp && tp.size() > 1) tp.all_reduce_sum(param.gradient, param.count);
  }
  Communicator& replicas = group_of(index);
  if (sharded_) {
    // Packed, zero-padded to members x shard, reduce-scattered: the local gradients stay.
    std::vector<float>& shard = shards_[index];
    const auto padded = static_cast<int64_t>(shard.size()) * replicas.size();
    std::fill(staging_.begin() + bucket.elements, staging_.begin() + padded, 0.0f);
    for (size_t j = 0; j < bucket.parameters.size(); ++j) {
      const ParameterView& param = params_[static_cast<size_t>(bucket.parameters[j])];
      std::memcpy(staging_.data() + bucket.offsets[j], param.gradient,
                  static_cast<size_t>(param.count) * sizeof(float));
    }
    replicas.reduce_scatter_sum(staging_.data(), static_cast<int64_t>(shard.size()), shard.data());
    return;
  }
  if (replicas.size() == 1) return;
  if (bucket.parameters.size() == 1) {
    const ParameterView& param = params_[static_cast<size_t>(bucket.parameters.front())];
    replicas.all_reduce_sum(param.gradient, param.count);
    return;
  }
  for (size_t j = 0; j < bucket.parameters.size(); ++j) {
    const ParameterView& param = params_[static_cast<size_t>(bucket.parameters[j])];
    std::memcpy(staging_.data() + bucket.offsets[j], param.gradient,
                static_cast<size_t>(param.count) * sizeof(float));
  }
  replicas.all_reduce_sum(staging_.data(), bucket.elements);
  for (size_t j = 0; j < bucket.parameters.size(); ++j) {
    const ParameterView& param = params_[static_cast<size_t>(bucket.parameters[j])];
    std::memcpy(param.gradient, staging_.data() + bucket.offsets[j],
                static_cast<size_t>(param.count) * sizeof(float));
  }
}

}  // namespace dhelix::rt
