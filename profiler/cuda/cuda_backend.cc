#include "profiler/cuda/cuda_backend.h"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "lib/cluster_reader.h"
#include "lib/error.h"
#include "lib/job_reader.h"
#include "lib/placement.h"
#include "profiler/cpu/cpu_timing.h"
#include "profiler/cuda/cuda_device.h"
#include "profiler/cuda/cuda_op_runner.h"
#include "profiler/cuda/cuda_setup.h"
#include "profiler/cuda/cuda_timer.h"
#include "runtime/comm/mpi_environment.h"
#include "runtime/cuda/device_choice.h"

namespace dhelix {
namespace {

using cuda_profile::CoRunSample;
using cuda_profile::CudaOpRunner;
using cuda_profile::CudaRunnableOp;
using cuda_profile::CudaTimer;
using cuda_profile::StreamRole;

int64_t local_rank(MPI_Comm world) {
  const int64_t from_launcher =
      cuda::local_rank_from_environment([](const char* name) { return std::getenv(name); });
  if (from_launcher >= 0) return from_launcher;
  MPI_Comm node = MPI_COMM_NULL;
  rt::check_mpi(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node),
                "MPI_Comm_split_type");
  int rank = 0;
  rt::check_mpi(MPI_Comm_rank(node, &rank), "MPI_Comm_rank");
  rt::check_mpi(MPI_Comm_free(&node), "MPI_Comm_free");
  return rank;
}

// Every rank's host name, by world rank.
std::vector<std::string> all_hosts(MPI_Comm world, int64_t world_size) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  rt::check_mpi(MPI_Get_processor_name(name, &length), "MPI_Get_processor_name");
  std::vector<char> all(static_cast<size_t>(world_size) * MPI_MAX_PROCESSOR_NAME, '\0');
  rt::check_mpi(MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                              MPI_MAX_PROCESSOR_NAME, MPI_CHAR, world),
                "MPI_Allgather");
  std::vector<std::string> hosts;
  for (int64_t r = 0; r < world_size; ++r) {
    hosts.emplace_back(all.data() + r * MPI_MAX_PROCESSOR_NAME);
  }
  return hosts;
}

// Rank 0 gets every rank's values (each rank the same count), others their own.
std::vector<double> gather(const std::vector<double>& mine, MPI_Comm world, int64_t world_rank,
                           int64_t world_size) {
  const auto count = static_cast<int>(mine.size());
  std::vector<double> all(world_rank == 0 ? mine.size() * static_cast<size_t>(world_size) : 0);
  rt::check_mpi(MPI_Gather(mine.data(), count, MPI_DOUBLE, all.data(), count, MPI_DOUBLE, 0, world),
                "MPI_Gather");
  return world_rank == 0 ? all : mine;
}

struct Counts {
  int64_t outliers = 0;
  int64_t raised_to_solo = 0;
  int64_t capped_at_oef_minus_one = 0;
};

// The measuring loop: device, streams, communicators and what the meta block collects.
class CudaMeasurer {
 public:
  CudaMeasurer(const JobSpec& job, const ProfileSpace& space, const CudaProfileOptions& options,
               const cuda_profile::DeviceInfo& device, const ProgressCallback& progress)
      : options_(options),
        timer_(device.l2_bytes),
        runner_(Placement(job.parallel, job.cluster.gpus_per_node),
                cuda_profile::communication_dims(space), options.world_rank, MPI_COMM_WORLD),
        progress_(progress),
        total_(static_cast<int64_t>(space.ops.size() + space.pairs.size())) {}

  ProfiledOp measure_op(const Op& op) {
    const bool comm = is_communication(op.kind);
    const CudaRunnableOp runnable = runner_.make(op, 0);
    note_approximate(op, runnable);
    const StreamRole role = comm ? StreamRole::kComm0 : StreamRole::kCompute;
    const auto run = [&](int64_t runs) {
      return timer_.time_solo(runnable.enqueue, role, runs, barrier_if(comm));
    };
    const std::vector<double> mine = sample_adaptively(run);
    const std::vector<double> pooled = gather(mine, MPI_COMM_WORLD, options_.world_rank, ranks());
    record_rank_spread(op, pooled, mine.size());
    const sampling::OutlierSplit split = sampling::remove_outliers(pooled);
    counts_.outliers += split.outliers;
    const TimeStats stats = sampling::summarize(split.kept).quantized();
    tick();
    return profiled_op(op, stats, static_cast<int64_t>(split.kept.size()));
  }

  // Pair (a, b) with solo medians: a compute op on the compute stream, communication on the
  // communication streams (strand 1 for the second of two collectives).
  ProfiledPair measure_pair(const Op& a, const Op& b, double solo_a_us, double solo_b_us) {
    const bool comm_a = is_communication(a.kind), comm_b = is_communication(b.kind);
    const StreamRole role_a = comm_a ? StreamRole::kComm0 : StreamRole::kCompute;
    const StreamRole role_b =
        !comm_b ? StreamRole::kCompute : (comm_a ? StreamRole::kComm1 : StreamRole::kComm0);
    const CudaRunnableOp run_a = runner_.make(a, 0);
    const CudaRunnableOp run_b = runner_.make(b, role_b == StreamRole::kComm1 ? 1 : 0);
    std::vector<CoRunSample> samples;
    const auto run = [&](int64_t runs) {
      const std::vector<CoRunSample> more = timer_.time_pair(
          run_a.enqueue, role_a, run_b.enqueue, role_b, runs, barrier_if(comm_a || comm_b));
      std::vector<double> makespans;
      for (const CoRunSample& s : more) makespans.push_back(std::max(s.finish_a_us, s.finish_b_us));
      samples.insert(samples.end(), more.begin(), more.end());
      return makespans;
    };
    sample_adaptively(run);
    samples.erase(samples.begin(), samples.begin() + options_.sampling.warmup);
    std::vector<double> finish_a, finish_b;
    for (const CoRunSample& s : samples) {
      finish_a.push_back(s.finish_a_us);
      finish_b.push_back(s.finish_b_us);
    }
    const std::vector<double> pooled_a =
        gather(finish_a, MPI_COMM_WORLD, options_.world_rank, ranks());
    const std::vector<double> pooled_b =
        gather(finish_b, MPI_COMM_WORLD, options_.world_rank, ranks());
    std::vector<cpu_profile::PairSample> pooled;
    for (size_t i = 0; i < pooled_a.size(); ++i) pooled.push_back({pooled_a[i], pooled_b[i]});
    cpu_profile::PairAdjustment adjustment = cpu_profile::PairAdjustment::kNone;
    ProfiledPair pair = cpu_profile::pair_from_samples(a.signature(), b.signature(), solo_a_us,
                                                       solo_b_us, pooled, &adjustment);
    if (adjustment == cpu_profile::PairAdjustment::kRaisedToSolo) ++counts_.raised_to_solo;
    if (adjustment == cpu_profile::PairAdjustment::kCappedAtOefMinusOne) {
      ++counts_.capped_at_oef_minus_one;
    }
    tick();
    return pair;
  }

  OrderedJson meta(const cuda_profile::DeviceInfo& device) const {
    OrderedJson json = OrderedJson::object();
    json["backend"] = "cuda";
    json["ranks"] = options_.world_size;
    const sampling::SamplingPolicy& p = options_.sampling;
    json["warmup"] = p.warmup;
    json["min_samples"] = p.min_samples;
    json["max_samples"] = p.max_samples;
    json["target_relative_ci"] = p.target_relative_ci;
    json["timing"] =
        "CUDA events per rank; L2 flushed (memset of 2 x L2) before every sample; samples of "
        "all ranks pooled, outliers beyond 5 scaled MADs left out";
    json["device"] = cuda_profile::device_to_json(device);
    json["environment"] = cuda_profile::environment_to_json();
    json["max_start_lag_us"] = quantize_profile_value(timer_.max_start_lag_us());
    json["outliers_removed"] = counts_.outliers;
    json["pairs_raised_to_solo"] = counts_.raised_to_solo;
    json["pairs_capped_at_oef_minus_one"] = counts_.capped_at_oef_minus_one;
    json["approximate_ops"] = approximate_;
    json["rank_spread"] = rank_spread_;
    return json;
  }

 private:
  int64_t ranks() const { return options_.world_size; }

  std::function<void()> barrier_if(bool needed) const {
    if (!needed) return {};
    return [] { rt::check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); };
  }

  // Runs warm-ups, then rounds of samples until every rank's policy is satisfied; `run`
  // returns one value per run. Returns the kept samples (warm-ups dropped).
  template <typename Run>
  std::vector<double> sample_adaptively(const Run& run) {
    const sampling::SamplingPolicy& policy = options_.sampling;
    if (policy.warmup > 0) run(policy.warmup);
    std::vector<double> samples;
    while (true) {
      int64_t more = sampling::samples_to_add(samples, policy);
      // Collectives need every member: all ranks take the largest count any rank asks for.
      rt::check_mpi(MPI_Allreduce(MPI_IN_PLACE, &more, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD),
                    "MPI_Allreduce");
      if (more == 0) return samples;
      const std::vector<double> batch = run(more);
      samples.insert(samples.end(), batch.begin(), batch.end());
    }
  }

  void note_approximate(const Op& op, const CudaRunnableOp& runnable) {
    if (!runnable.plan.approximate) return;
    OrderedJson entry = OrderedJson::object();
    entry["signature"] = op.signature();
    entry["stand_in"] = runnable.plan.stand_in;
    approximate_.push_back(std::move(entry));
  }

  void record_rank_spread(const Op& op, const std::vector<double>& pooled, size_t per_rank) {
    if (options_.world_rank != 0 || per_rank == 0) return;
    std::vector<double> medians;
    for (size_t at = 0; at + per_rank <= pooled.size(); at += per_rank) {
      std::vector<double> own(pooled.begin() + static_cast<std::ptrdiff_t>(at),
                              pooled.begin() + static_cast<std::ptrdiff_t>(at + per_rank));
      medians.push_back(sampling::summarize(own).median_us);
    }
    const sampling::RankSpread spread = sampling::rank_spread(medians);
    OrderedJson entry = OrderedJson::object();
    entry["signature"] = op.signature();
    entry["min_us"] = quantize_profile_value(spread.min_us);
    entry["median_us"] = quantize_profile_value(spread.median_us);
    entry["max_us"] = quantize_profile_value(spread.max_us);
    entry["slowest_rank"] = spread.slowest_rank;
    rank_spread_.push_back(std::move(entry));
  }

  void tick() {
    if (progress_) progress_(++done_, total_);
  }

  const CudaProfileOptions& options_;
  CudaTimer timer_;
  CudaOpRunner runner_;
  const ProgressCallback& progress_;
  int64_t done_ = 0;
  int64_t total_ = 0;
  Counts counts_;
  OrderedJson approximate_ = OrderedJson::array();
  OrderedJson rank_spread_ = OrderedJson::array();
};

// Picks and describes this rank's GPU; throws alike on every rank when the ranks are not
// placed in node blocks.
cuda_profile::DeviceInfo prepare_rank(const JobSpec& job, const CudaProfileOptions& options) {
  const int count = cuda_profile::visible_device_count();
  const int device = cuda::choose_device(options.world_rank, local_rank(MPI_COMM_WORLD), count,
                                         std::getenv("CUDA_VISIBLE_DEVICES"));
  const cuda_profile::DeviceInfo info = cuda_profile::use_device(device);
  const std::string problem = cuda_profile::node_layout_problem(
      all_hosts(MPI_COMM_WORLD, options.world_size), job.cluster.gpus_per_node);
  if (!problem.empty()) throw Error(ErrorCode::kInvalidInput, problem);
  return info;
}

}  // namespace

void check_cuda_device_present() { (void)cuda_profile::visible_device_count(); }

Profile make_cuda_profile(const JobSpec& job, const OrderedJson& meta,
                          const CudaProfileOptions& options, const ProgressCallback& progress) {
  sampling::check_sampling_policy(options.sampling);
  cuda_profile::check_cuda_world_size(job, options.world_size);
  const ProfileSpace space = collect_profile_space(job);
  const cuda_profile::DeviceInfo device = prepare_rank(job, options);
  Profile profile;
  profile.backend = ProfileBackend::kCuda;
  profile.cluster = cluster_to_json(job.cluster);
  profile.model_name = job.model.name;
  profile.parallel = parallel_to_json(job.parallel);
  CudaMeasurer measurer(job, space, options, device, progress);
  std::vector<double> medians;
  for (const Op& op : space.ops) {
    profile.add_op(measurer.measure_op(op));
    medians.push_back(profile.ops().back().time_us.median_us);
  }
  for (const auto& [i, j] : space.pairs) {
    const auto a = static_cast<size_t>(i), b = static_cast<size_t>(j);
    profile.add_pair(measurer.measure_pair(space.ops[a], space.ops[b], medians[a], medians[b]));
  }
  profile.meta = meta;
  profile.meta["measurement"] = measurer.meta(device);
  return profile;
}

}  // namespace dhelix
