#include "lib/plan/plan_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "lib/placement.h"
#include "lib/plan/plan_job.h"
#include "lib/text.h"

namespace dhelix {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string mode_prefix(const std::vector<RankProgram>& programs) {
  return programs.empty() ? "" : fmt::format("{}: ", execution_mode_name(programs[0].mode));
}

std::string ranks_text(const std::vector<int64_t>& ranks) {
  std::vector<std::string> parts;
  for (int64_t r : ranks) parts.push_back(std::to_string(r));
  return "[" + join(parts, ", ") + "]";
}

void add_problem(ProblemList& problems, const std::string& file, const Plan& plan,
                 const RankProgram& program, const Instruction& instruction,
                 const std::string& rule) {
  problems.add(file, instruction_pointer(plan, program, instruction), "", rule);
}

// ----- collectives -------------------------------------------------------------------------

// One communicator: a process group of one dimension, on one stream.
struct CommunicatorKey {
  ParallelDim dim = ParallelDim::kTp;
  int64_t first_rank = 0;
  StreamClass stream = StreamClass::kCompute;
  auto operator<=>(const CommunicatorKey&) const = default;
};

struct Communicator {
  std::vector<int64_t> members;
  std::map<int64_t, std::vector<int64_t>> sequence;  // member -> its collectives, in order
};

bool same_collective(const Instruction& a, const Instruction& b) {
  return a.collective == b.collective && a.bytes == b.bytes && a.op == b.op && a.layer == b.layer &&
         a.micro_batch == b.micro_batch;
}

std::string collective_text(const Plan& plan, const RankProgram& program, const Instruction& i) {
  return fmt::format("{} issues {} of {} bytes", describe_instruction(plan, program, i),
                     i.collective ? op_kind_name(*i.collective) : "no collective", i.bytes);
}

// The first position where two members' sequences differ; nullopt when identical.
std::optional<size_t> first_difference(const std::vector<RankProgram>& programs, int64_t a,
                                       const std::vector<int64_t>& seq_a, int64_t b,
                                       const std::vector<int64_t>& seq_b) {
  const auto& ia = programs[static_cast<size_t>(a)].instructions;
  const auto& ib = programs[static_cast<size_t>(b)].instructions;
  const size_t n = std::min(seq_a.size(), seq_b.size());
  for (size_t k = 0; k < n; ++k) {
    if (!same_collective(ia[static_cast<size_t>(seq_a[k])], ib[static_cast<size_t>(seq_b[k])])) {
      return k;
    }
  }
  if (seq_a.size() != seq_b.size()) return n;
  return std::nullopt;
}

// The member whose sequence most members share: the reference the others are compared to,
// so that one corrupted rank is reported once, not by every other member.
int64_t majority_member(const std::vector<RankProgram>& programs, const Communicator& comm) {
  std::vector<std::pair<int64_t, int64_t>> classes;  // representative, size
  for (int64_t m : comm.members) {
    bool placed = false;
    for (auto& [rep, size] : classes) {
      if (!first_difference(programs, rep, comm.sequence.at(rep), m, comm.sequence.at(m))) {
        ++size;
        placed = true;
        break;
      }
    }
    if (!placed) classes.emplace_back(m, 1);
  }
  return std::max_element(classes.begin(), classes.end(),
                          [](const auto& x, const auto& y) { return x.second < y.second; })
      ->first;
}

void report_difference(const Plan& plan, const std::vector<RankProgram>& programs,
                       const std::string& file, const std::string& where, int64_t ref,
                       int64_t other, const Communicator& comm, ProblemList& problems) {
  const auto& seq_ref = comm.sequence.at(ref);
  const auto& seq_other = comm.sequence.at(other);
  const auto k = first_difference(programs, ref, seq_ref, other, seq_other);
  if (!k) return;
  const RankProgram& p_ref = programs[static_cast<size_t>(ref)];
  const RankProgram& p_other = programs[static_cast<size_t>(other)];
  const std::string prefix = mode_prefix(programs);
  if (*k < seq_ref.size() && *k < seq_other.size()) {
    const Instruction& a = p_ref.instructions[static_cast<size_t>(seq_ref[*k])];
    const Instruction& b = p_other.instructions[static_cast<size_t>(seq_other[*k])];
    add_problem(problems, file, plan, p_other, b,
                fmt::format("{}{}: collective {} differs: {}; {}", prefix, where, *k,
                            collective_text(plan, p_ref, a), collective_text(plan, p_other, b)));
    return;
  }
  // One sequence is a prefix of the other: name the first collective the shorter lacks.
  const bool other_longer = seq_other.size() > seq_ref.size();
  const RankProgram& longer = other_longer ? p_other : p_ref;
  const RankProgram& shorter = other_longer ? p_ref : p_other;
  const auto& seq_long = other_longer ? seq_other : seq_ref;
  const Instruction& extra = longer.instructions[static_cast<size_t>(seq_long[*k])];
  add_problem(problems, file, plan, longer, extra,
              fmt::format("{}{}: rank {} issues {} collectives, rank {} issues {}; the first "
                          "without a partner is collective {}: {}",
                          prefix, where, longer.rank, seq_long.size(), shorter.rank, *k, *k,
                          collective_text(plan, longer, extra)));
}

using Clock = std::chrono::steady_clock;

double elapsed_ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
}

// Lowers every rank of the job in `mode`, on as many threads as the machine has (lowering
// dominates the check's cost, and each rank lowers on its own). Returns false, with one
// problem per rank, when some rank does not lower.
// `report(lowered)` is called on the calling thread after each rank it lowers itself.
bool lower_all_ranks(const Plan& plan, const JobSpec& job, ExecutionMode mode,
                     const std::string& plan_file, std::vector<RankProgram>& programs,
                     ProblemList& problems, const std::function<void(int64_t)>& report) {
  const int64_t world = Placement(job.parallel, job.cluster.gpus_per_node).world_size();
  programs.assign(static_cast<size_t>(world), RankProgram{});
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> lowered_ranks{0};
  auto lower_some = [&](bool calling_thread) {
    for (int64_t rank = next++; rank < world; rank = next++) {
      try {
        programs[static_cast<size_t>(rank)] = lower_rank_program(plan, job, rank, mode);
      } catch (const Error& error) {
        errors[static_cast<size_t>(rank)] = error.what();
      }
      const int64_t lowered_so_far = ++lowered_ranks;
      if (calling_thread) report(lowered_so_far);
    }
  };
  const int64_t threads =
      std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(world, 1));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(lower_some, false);
  lower_some(true);
  for (std::thread& thread : pool) thread.join();
  report(world);
  bool lowered = true;
  for (int64_t rank = 0; rank < world; ++rank) {
    const std::string& error = errors[static_cast<size_t>(rank)];
    if (error.empty()) continue;
    lowered = false;
    problems.add(
        plan_file, "", "",
        fmt::format("{}: rank {} does not lower: {}", execution_mode_name(mode), rank, error));
  }
  return lowered;
}

// "1.2 GiB", or "512.0 MiB" below a GiB.
std::string bytes_text(int64_t bytes) {
  if (bytes >= int64_t{1} << 30) return fmt::format("{:.1f} GiB", bytes / kGiB);
  return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0));
}

}  // namespace

// ----- shared helpers ----------------------------------------------------------------------

SimulatedStream execution_stream(const RankProgram& program, const Instruction& instruction,
                                 SimulatedOrder order) {
  if (program.mode == ExecutionMode::kSequential || order == SimulatedOrder::kProgramOrder) {
    return SimulatedStream::kInOrder;
  }
  if (instruction.kind == InstructionKind::kRecv) return SimulatedStream::kReceive;
  switch (instruction.stream) {
    case StreamClass::kCompute:
      return SimulatedStream::kCompute;
    case StreamClass::kLocalComm:
      return SimulatedStream::kLocalComm;
    case StreamClass::kCrossComm:
      return SimulatedStream::kCrossComm;
  }
  return SimulatedStream::kInOrder;
}

StreamClass communicator_stream(const RankProgram& program, const Instruction& instruction) {
  return program.mode == ExecutionMode::kSequential ? StreamClass::kCompute : instruction.stream;
}

std::string instruction_pointer(const Plan& plan, const RankProgram& program,
                                const Instruction& instruction) {
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    if (plan.stages[s].stage != program.stage) continue;
    const auto& tasks = plan.stages[s].tasks;
    for (size_t t = 0; t < tasks.size(); ++t) {
      if (tasks[t].index == instruction.task) return fmt::format("/stages/{}/tasks/{}", s, t);
    }
    return fmt::format("/stages/{}", s);
  }
  return "";
}

// ----- check 1: dependencies ---------------------------------------------------------------

void check_dependencies(const Plan& plan, const std::vector<RankProgram>& programs,
                        const std::string& plan_file, ProblemList& problems) {
  const std::string prefix = mode_prefix(programs);
  for (const RankProgram& program : programs) {
    const auto n = static_cast<int64_t>(program.instructions.size());
    for (int64_t i = 0; i < n; ++i) {
      const Instruction& ins = program.instructions[static_cast<size_t>(i)];
      for (int64_t dep : ins.deps) {
        if (dep >= 0 && dep < i) continue;
        const std::string what =
            dep >= i && dep < n
                ? fmt::format("a later instruction: {} (instruction {} of {})",
                              describe_instruction(plan, program,
                                                   program.instructions[static_cast<size_t>(dep)]),
                              dep, n)
                : fmt::format("instruction {}, which does not exist ({} instructions)", dep, n);
        add_problem(problems, plan_file, plan, program, ins,
                    fmt::format("{}{} (instruction {}) uses the result of {}", prefix,
                                describe_instruction(plan, program, ins), i, what));
      }
    }
  }
}

// ----- check 2: collectives ----------------------------------------------------------------

int64_t check_collectives(const Plan& plan, const JobSpec& job,
                          const std::vector<RankProgram>& programs, const std::string& plan_file,
                          ProblemList& problems) {
  const Placement placement(job.parallel, job.cluster.gpus_per_node);
  const std::string prefix = mode_prefix(programs);
  std::map<CommunicatorKey, Communicator> comms;
  for (const RankProgram& program : programs) {
    for (size_t i = 0; i < program.instructions.size(); ++i) {
      const Instruction& ins = program.instructions[i];
      if (ins.kind != InstructionKind::kCollective) continue;
      if (!ins.group) {
        add_problem(problems, plan_file, plan, program, ins,
                    fmt::format("{}{}: a collective without a process group", prefix,
                                describe_instruction(plan, program, ins)));
        continue;
      }
      const ProcessGroup group = placement.group(*ins.group, program.rank);
      Communicator& comm =
          comms[{*ins.group, group.ranks.front(), communicator_stream(program, ins)}];
      if (comm.members.empty()) {
        comm.members = group.ranks;
        for (int64_t m : group.ranks) comm.sequence[m];
      }
      comm.sequence[program.rank].push_back(static_cast<int64_t>(i));
    }
  }
  for (const auto& [key, comm] : comms) {
    const std::string where = fmt::format("{} group {} on stream {}", parallel_dim_name(key.dim),
                                          ranks_text(comm.members), stream_class_name(key.stream));
    const int64_t ref = majority_member(programs, comm);
    for (int64_t m : comm.members) {
      if (m != ref) report_difference(plan, programs, plan_file, where, ref, m, comm, problems);
    }
  }
  return static_cast<int64_t>(comms.size());
}

// ----- check 3: transfers ------------------------------------------------------------------

int64_t check_transfers(const Plan& plan, const std::vector<RankProgram>& programs,
                        const std::string& plan_file, ProblemList& problems) {
  const std::string prefix = mode_prefix(programs);
  const auto world = static_cast<int64_t>(programs.size());
  using Key = std::tuple<int64_t, int64_t, int64_t, StreamClass>;     // from, to, tag, stream
  using Ref = std::pair<int64_t, size_t>;                             // rank, instruction
  std::map<Key, std::pair<std::vector<Ref>, std::vector<Ref>>> ends;  // sends, receives
  for (const RankProgram& program : programs) {
    for (size_t i = 0; i < program.instructions.size(); ++i) {
      const Instruction& ins = program.instructions[i];
      const bool send = ins.kind == InstructionKind::kSend;
      if (!send && ins.kind != InstructionKind::kRecv) continue;
      if (ins.peer < 0 || ins.peer >= world || ins.peer == program.rank) {
        add_problem(problems, plan_file, plan, program, ins,
                    fmt::format("{}{}: peer rank {} is not another rank of the {} ranks", prefix,
                                describe_instruction(plan, program, ins), ins.peer, world));
        continue;
      }
      const Key key{send ? program.rank : ins.peer, send ? ins.peer : program.rank, ins.tag,
                    communicator_stream(program, ins)};
      (send ? ends[key].first : ends[key].second).push_back({program.rank, i});
    }
  }
  auto text = [&](const Ref& ref) {
    const RankProgram& p = programs[static_cast<size_t>(ref.first)];
    const Instruction& ins = p.instructions[ref.second];
    return fmt::format("{} ({} of {} bytes, tag {}, {} rank {})",
                       describe_instruction(plan, p, ins), instruction_kind_name(ins.kind),
                       ins.bytes, ins.tag, ins.kind == InstructionKind::kSend ? "to" : "from",
                       ins.peer);
  };
  auto report = [&](const Ref& ref, const std::string& rule) {
    const RankProgram& p = programs[static_cast<size_t>(ref.first)];
    add_problem(problems, plan_file, plan, p, p.instructions[ref.second], prefix + rule);
  };
  int64_t matched = 0;
  for (const auto& [key, both] : ends) {
    const auto& [sends, receives] = both;
    if (sends.size() == 1 && receives.size() == 1) {
      const int64_t sent =
          programs[static_cast<size_t>(sends[0].first)].instructions[sends[0].second].bytes;
      const int64_t expected =
          programs[static_cast<size_t>(receives[0].first)].instructions[receives[0].second].bytes;
      if (sent == expected) {
        ++matched;
      } else {
        report(receives[0], fmt::format("{} expects {} bytes, but its send {} sends {}",
                                        text(receives[0]), expected, text(sends[0]), sent));
      }
      continue;
    }
    for (const Ref& s : sends) {
      report(s,
             receives.empty()
                 ? fmt::format("{} has no matching receive on rank {}", text(s), std::get<1>(key))
                 : fmt::format("{} is one of {} sends for {} receives of the same message", text(s),
                               sends.size(), receives.size()));
    }
    for (const Ref& r : receives) {
      report(r, sends.empty()
                    ? fmt::format("{} has no matching send on rank {}", text(r), std::get<0>(key))
                    : fmt::format("{} is one of {} receives for {} sends of the same message",
                                  text(r), receives.size(), sends.size()));
    }
  }
  return matched;
}

// ----- check 5: memory ---------------------------------------------------------------------

void check_memory(const Plan& plan, const std::string& plan_file, PlanCheckReport& report) {
  const int64_t usable = plan.memory_budget.usable_bytes;
  report.summary.usable_memory_bytes = usable;
  const PlanScheme* scheme = plan.find_scheme(PipelineScheme::kDHelix);
  if (scheme == nullptr) {
    report.problems.add(plan_file, "/schemes", "", "has no dhelix scheme to check memory of");
    return;
  }
  const auto scheme_index = static_cast<size_t>(scheme - plan.schemes.data());
  bool over = false;
  for (size_t s = 0; s < scheme->memory.size(); ++s) {
    const PlanStageMemory& m = scheme->memory[s];
    report.summary.peak_memory_bytes = std::max(report.summary.peak_memory_bytes, m.total_bytes);
    if (m.total_bytes <= usable) continue;
    over = true;
    const std::string rule = fmt::format(
        "stage {} needs {} ({} bytes: weights {}, gradients {}, optimizer states {}, "
        "activations {}) but the {} offers {} usable",
        m.stage, bytes_text(m.total_bytes), m.total_bytes, bytes_text(m.weight_bytes),
        bytes_text(m.gradient_bytes), bytes_text(m.optimizer_bytes), bytes_text(m.activation_bytes),
        plan.memory_budget.gpu, bytes_text(usable));
    const std::string pointer = fmt::format("/schemes/{}/memory/{}", scheme_index, s);
    if (plan.options.allow_oom) {
      report.warnings.push_back(
          fmt::format("{}: {}: {} (the plan was made with --allow-oom)", plan_file, pointer, rule));
    } else {
      report.problems.add(plan_file, pointer, "", rule);
    }
  }
  if (!scheme->fits && !over && !plan.options.allow_oom) {
    report.problems.add(plan_file, fmt::format("/schemes/{}/fits", scheme_index), "false",
                        "but every stage's memory is within the usable bytes");
  }
}

// ----- the whole check ---------------------------------------------------------------------

void check_programs(const Plan& plan, const JobSpec& job, const std::vector<RankProgram>& programs,
                    const std::string& plan_file, PlanCheckReport& report) {
  ProblemList& problems = report.problems;
  check_dependencies(plan, programs, plan_file, problems);
  const int64_t groups = check_collectives(plan, job, programs, plan_file, problems);
  const int64_t transfers = check_transfers(plan, programs, plan_file, problems);
  const bool free =
      check_no_deadlock(plan, job, programs, SimulatedOrder::kStreams, plan_file, problems);
  if (programs.empty() || programs[0].mode != ExecutionMode::kCoExecuted) return;
  if (free) {
    check_no_deadlock(plan, job, programs, SimulatedOrder::kProgramOrder, plan_file, problems);
  }
  PlanCheckSummary& summary = report.summary;
  summary.ranks = static_cast<int64_t>(programs.size());
  summary.instructions = 0;
  summary.collectives = 0;
  for (const RankProgram& program : programs) {
    summary.instructions += static_cast<int64_t>(program.instructions.size());
    for (const Instruction& ins : program.instructions) {
      if (ins.kind == InstructionKind::kCollective) ++summary.collectives;
    }
  }
  summary.collective_groups = groups;
  summary.transfers = transfers;
}

namespace {

// Checks 1 to 4, 9 and 10 on every rank's programs, lowered and held for the whole world
// (one mode at a time): the checker's messages.
void check_every_rank(const Plan& plan, const JobSpec& job, const std::string& plan_file,
                      PlanCheckReport& report, const PlanCheckProgress& progress) {
  std::vector<RankProgram> co_executed;  // kept for checks 9 and 10
  bool both_lowered = true;
  // Steps: per mode, one per rank lowered and one for that mode's checks.
  const int64_t world = Placement(job.parallel, job.cluster.gpus_per_node).world_size();
  const int64_t total = 2 * (world + 1);
  int64_t done = 0;
  const auto advance_to = [&](int64_t step) {
    if (step <= done) return;
    done = step;
    if (progress) progress(done, total);
  };
  for (ExecutionMode mode : {ExecutionMode::kCoExecuted, ExecutionMode::kSequential}) {
    const int64_t mode_start = done;
    const Clock::time_point start = Clock::now();
    std::vector<RankProgram> programs;
    const bool lowered =
        lower_all_ranks(plan, job, mode, plan_file, programs, report.problems,
                        [&](int64_t lowered_ranks) { advance_to(mode_start + lowered_ranks); });
    both_lowered = both_lowered && lowered;
    report.summary.lowering_ms += elapsed_ms(start);
    const Clock::time_point checked = Clock::now();
    if (lowered) check_programs(plan, job, programs, plan_file, report);
    if (both_lowered && mode == ExecutionMode::kCoExecuted) {
      check_waits_for(plan, programs, plan_file, report.problems);
      co_executed = std::move(programs);
    } else if (both_lowered) {
      check_same_ops(plan, co_executed, programs, plan_file, report.problems);
    }
    report.summary.checking_ms += elapsed_ms(checked);
    advance_to(mode_start + world + 1);
  }
}

}  // namespace

PlanCheckReport check_plan(const Plan& plan, const std::string& plan_file,
                           const PlanCheckProgress& progress, const PlanFiguresCheck& figures) {
  PlanCheckReport report;
  const JobSpec job = job_from_plan(plan, plan_file);
  check_plan_fields(plan, job, plan_file, report.problems);
  // Check 11: what the plan states but its job determines is recomputed, not trusted.
  check_op_records(plan, job, plan_file, report.problems);
  if (figures) figures(plan, job, plan_file, report.problems);
  // The classes of ranks first (lib/plan/plan_check_classes.cc): when they pass, every
  // rank passes. Otherwise every rank is checked, after the classes' steps.
  int64_t class_steps = 0;
  const Clock::time_point start = Clock::now();
  const std::optional<PlanCheckSummary> summary =
      check_rank_classes(plan, job, plan_file, [&](int64_t done, int64_t total) {
        class_steps = total;
        if (progress) progress(done, total);
      });
  if (summary) {
    report.summary = *summary;
    report.summary.checking_ms = elapsed_ms(start);
  } else {
    check_every_rank(plan, job, plan_file, report, [&](int64_t done, int64_t total) {
      if (progress) progress(class_steps + done, class_steps + total);
    });
  }
  check_memory(plan, plan_file, report);
  return report;
}

PlanCheckReport require_valid_plan(const Plan& plan, const std::string& plan_file,
                                   const PlanFiguresCheck& figures) {
  PlanCheckReport report = check_plan(plan, plan_file, {}, figures);
  report.problems.throw_if_any(ErrorCode::kInvalidInput);
  return report;
}

std::string plan_check_summary_text(const PlanCheckReport& report, const std::string& plan_file) {
  const PlanCheckSummary& s = report.summary;
  if (!report.ok()) {
    return fmt::format("{}: {} problem{}", plan_file, report.problems.problems().size(),
                       report.problems.problems().size() == 1 ? "" : "s");
  }
  return fmt::format(
      "{}: ok: {} ranks, {} instructions, {} collective groups consistent, {} transfers "
      "matched, no wait cycle, memory {} (peak {} of {})",
      plan_file, s.ranks, s.instructions, s.collective_groups, s.transfers,
      s.peak_memory_bytes <= s.usable_memory_bytes ? "fits" : "over budget (--allow-oom)",
      bytes_text(s.peak_memory_bytes), bytes_text(s.usable_memory_bytes));
}

}  // namespace dhelix
