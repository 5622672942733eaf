#include "profiler/cpu/cpu_backend.h"

#include <mpi.h>

#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "lib/cluster_reader.h"
#include "lib/error.h"
#include "lib/job_reader.h"
#include "profiler/cpu/cold_operands.h"
#include "profiler/cpu/cpu_groups.h"
#include "profiler/cpu/cpu_op_runner.h"
#include "profiler/sampling.h"
#include "runtime/comm/mpi_environment.h"
#include "runtime/cpu/kernels_cpu.h"
#include "runtime/exec/prompt_wakeup.h"

namespace dhelix {
namespace {

using cpu_profile::MeasureGroups;
using cpu_profile::PairAdjustment;
using cpu_profile::RunnableOp;

// The first communication op with the largest group, or null.
const Op* widest_comm_op(const ProfileSpace& space) {
  const Op* widest = nullptr;
  for (const Op& op : space.ops) {
    if (is_communication(op.kind) && (widest == nullptr || op.group_size > widest->group_size)) {
      widest = &op;
    }
  }
  return widest;
}

std::string cpu_model_name() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
  }
  return "unknown";
}

std::string mpi_library_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  if (MPI_Get_library_version(text, &length) != MPI_SUCCESS) return "unknown";
  const std::string version(text, static_cast<size_t>(length));
  return version.substr(0, version.find_first_of(",\n"));
}

struct Adjustments {
  int64_t raised_to_solo = 0;
  int64_t capped_at_oef_minus_one = 0;
};

OrderedJson measurement_meta(const CpuProfileOptions& options, const Adjustments& adjusted) {
  OrderedJson json = OrderedJson::object();
  json["backend"] = "cpu";
  json["ranks"] = options.world_size;
  json["warmup"] = options.timing.warmup;
  json["samples"] = options.timing.samples;
  json["blas_threads"] = options.blas_threads;
  // profiler/cpu/cold_operands.h: 0 when compute ops were timed on hot operands.
  json["cold_operand_bytes"] = options.cold_operand_bytes;
  json["cpu"] = cpu_model_name();
  json["hardware_threads"] = std::thread::hardware_concurrency();
  json["mpi"] = mpi_library_version();
  json["kernels"] =
      "fp32 CPU kernels of runtime/cpu whatever the op's dtype; collectives through "
      "runtime/comm's MpiCommunicator over this host's MPI transport, also for cross-node ops";
  if (options.link_emulation.enabled()) {
    json["link_emulation"] = options.link_emulation.to_json();
  }
  json["pairs_raised_to_solo"] = adjusted.raised_to_solo;
  json["pairs_capped_at_oef_minus_one"] = adjusted.capped_at_oef_minus_one;
  return json;
}

// The measuring loop's state: the communicators, the options and the progress count.
class CpuMeasurer {
 public:
  CpuMeasurer(const ProfileSpace& space, const CpuProfileOptions& options,
              const ProgressCallback& progress)
      : space_(space),
        options_(options),
        groups_(group_sizes(space), options.world_rank, options.world_size, options.link_emulation),
        progress_(progress),
        total_(static_cast<int64_t>(space.ops.size() + space.pairs.size())) {}

  ProfiledOp measure_op(const Op& op) {
    const RunnableOp runnable = runnable_op(op, 0);
    const std::vector<double> samples = cpu_profile::time_samples(
        options_.timing, [this] { groups_.world().barrier(); }, runnable.run,
        cpu_profile::steady_clock_us);
    const TimeStats stats = sampling::summarize(samples).quantized();
    tick();
    return profiled_op(op, stats, options_.timing.samples);
  }

  // Pair (a, b) with solo medians; the compute op, if any, runs on the calling thread.
  ProfiledPair measure_pair(const Op& a, const Op& b, double solo_a_us, double solo_b_us,
                            Adjustments& adjusted) {
    const bool swap = is_communication(a.kind) && !is_communication(b.kind);
    const Op& first = swap ? b : a;
    const Op& second = swap ? a : b;
    const double solo_first_us = swap ? solo_b_us : solo_a_us;
    const double solo_second_us = swap ? solo_a_us : solo_b_us;
    const RunnableOp run_first = runnable_op(first, 0);
    const RunnableOp run_second = prompt_if_communication(second, runnable_op(second, 1));
    const cpu_profile::PairRepeats repeats = agreed_repeats(solo_first_us, solo_second_us);
    std::vector<cpu_profile::PairSample> samples = cpu_profile::time_pair_samples(
        options_.timing, [this] { groups_.world().barrier(); }, repeated(run_first, repeats.a),
        repeated(run_second, repeats.b), cpu_profile::steady_clock_us);
    for (auto& s : samples) {
      if (solo_first_us > 0 && solo_second_us > 0) {
        s = cpu_profile::single_op_equivalent(s, solo_first_us, solo_second_us, repeats);
      }
      if (swap) std::swap(s.finish_a_us, s.finish_b_us);
    }
    PairAdjustment adjustment = PairAdjustment::kNone;
    ProfiledPair pair = cpu_profile::pair_from_samples(a.signature(), b.signature(), solo_a_us,
                                                       solo_b_us, samples, &adjustment);
    if (adjustment == PairAdjustment::kRaisedToSolo) ++adjusted.raised_to_solo;
    if (adjustment == PairAdjustment::kCappedAtOefMinusOne) ++adjusted.capped_at_oef_minus_one;
    tick();
    return pair;
  }

 private:
  static std::vector<int64_t> group_sizes(const ProfileSpace& space) {
    std::vector<int64_t> sizes;
    for (const Op& op : space.ops) {
      if (is_communication(op.kind)) sizes.push_back(op.group_size);
    }
    return sizes;
  }

  // cpu_timing.h's repeats, the same on every rank (each has its own solo medians, and a
  // collective must run as many times on all of them): the largest over the ranks.
  cpu_profile::PairRepeats agreed_repeats(double solo_first_us, double solo_second_us) {
    const cpu_profile::PairRepeats mine = cpu_profile::pair_repeats(solo_first_us, solo_second_us);
    return {.a = groups_.world().all_reduce_max(mine.a),
            .b = groups_.world().all_reduce_max(mine.b)};
  }

  // A collective's thread asks for prompt wake-ups, as a run's communication streams do
  // (runtime/exec/prompt_wakeup.h), once per thread: the pair's second thread is new for
  // every pair, and the request happens in its first (warm-up) run, outside the samples.
  static RunnableOp prompt_if_communication(const Op& op, RunnableOp runnable) {
    if (!is_communication(op.kind)) return runnable;
    runnable.run = [run = std::move(runnable.run)] {
      thread_local bool asked = false;
      if (!asked) {
        rt::request_prompt_wakeups();
        asked = true;
      }
      run();
    };
    return runnable;
  }

  static std::function<void()> repeated(const RunnableOp& op, int64_t times) {
    return [&op, times] {
      for (int64_t i = 0; i < times; ++i) op.run();
    };
  }

  RunnableOp runnable_op(const Op& op, int strand) const {
    return cpu_profile::make_cold_runnable_op(op, binding(op, strand), options_.cold_operand_bytes);
  }

  cpu_profile::CommBinding binding(const Op& op, int strand) const {
    if (!is_communication(op.kind)) return {};
    return groups_.binding(op.group_size, strand, op.group);
  }

  void tick() {
    if (progress_) progress_(++done_, total_);
  }

  const ProfileSpace& space_;
  const CpuProfileOptions& options_;
  MeasureGroups groups_;
  const ProgressCallback& progress_;
  int64_t done_ = 0;
  int64_t total_ = 0;
};

}  // namespace

int64_t cpu_ranks_needed(const ProfileSpace& space) {
  const Op* widest = widest_comm_op(space);
  return widest == nullptr ? 1 : widest->group_size;
}

void check_cpu_world_size(const ProfileSpace& space, int64_t world_size) {
  const int64_t needed = cpu_ranks_needed(space);
  // A multiple works too: every group of `needed` ranks measures at once, so the host is as
  // busy as in a run of that many ranks (4 ranks of a CP 2 x TP 2 job on 2 cores).
  if (world_size >= needed && world_size % needed == 0) return;
  const Op* widest = widest_comm_op(space);
  const std::string what = widest == nullptr ? std::string("this job's ops")
                                             : std::string(parallel_dim_name(widest->group)) + "-" +
                                                   std::to_string(needed) + " collectives";
  throw Error(ErrorCode::kInvalidInput,
              "the cpu backend measures " + what + " with " + std::to_string(needed) +
                  (needed == 1 ? " rank" : " ranks") + ": run mpirun -np " +
                  std::to_string(needed) + " dhelix-profile ..., or a multiple of " +
                  std::to_string(needed) + " (this run has " + std::to_string(world_size) +
                  (world_size == 1 ? " rank)" : " ranks)"));
}

Profile make_cpu_profile(const JobSpec& job, const OrderedJson& meta,
                         const CpuProfileOptions& options, const ProgressCallback& progress) {
  const ProfileSpace space = collect_profile_space(job);
  check_cpu_world_size(space, options.world_size);
  cpu::set_blas_threads(options.blas_threads);
  Profile profile;
  profile.backend = ProfileBackend::kCpu;
  profile.cluster = cluster_to_json(job.cluster);
  profile.model_name = job.model.name;
  profile.parallel = parallel_to_json(job.parallel);
  CpuMeasurer measurer(space, options, progress);
  std::vector<double> medians;
  for (const Op& op : space.ops) {
    profile.add_op(measurer.measure_op(op));
    medians.push_back(profile.ops().back().time_us.median_us);
  }
  Adjustments adjusted;
  for (const auto& [i, j] : space.pairs) {
    const auto a = static_cast<size_t>(i), b = static_cast<size_t>(j);
    profile.add_pair(
        measurer.measure_pair(space.ops[a], space.ops[b], medians[a], medians[b], adjusted));
  }
  profile.meta = meta;
  profile.meta["measurement"] = measurement_meta(options, adjusted);
  return profile;
}

}  // namespace dhelix
