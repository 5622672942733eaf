// The plan checker's fast path (lib/plan/plan_check.h): checks 1 to 4, 9 and 10 on one
// program per class of ranks instead of one per rank.
//
// Failure rules:
//   * It reports no problem, ever. It answers "passes" (the summary's counts) only when
//     checking every rank's program would find no problem in checks 1 to 4, 9 and 10 and
//     count the same; in every other case (a rank that does not lower, any problem, a
//     world without the symmetry below) it answers "cannot tell" and check_plan checks
//     every rank as before, whose messages are the checker's. A wrong plan is therefore
//     checked twice, and its messages are unchanged.
//   * It throws nothing the full check would not: lowering errors are caught.
//
// Why one program per class suffices. A class is the ranks with equal RankLoweringInput
// (same stage, same DAGs as lowering reads them). Every rank's program is its class's
// stage program relabelled (lib/plan/rank_program.h: lower_rank_program is
// relabel_stage_program(lower_stage_program(input))), so:
//   1. Dependencies and streams do not depend on the relabelling: check 1 on the class
//      program is check 1 on each of its ranks.
//   2. The collectives a rank issues on a (group, stream) are its class program's: a
//      communicator is consistent when its members' classes issue equal sequences.
//   3, 10. Transfers are few (two per micro-batch and stage boundary): every rank's are
//      relabelled and checked as before.
//   9. Both modes' programs of a rank are its class's: check 9 per class.
//   4. The simulation's outcome is the least fixpoint of monotone rules (an instruction
//      runs once its stream's earlier instructions, its dependencies, its send or every
//      member's arrival have), so it does not depend on the order of events. Let the
//      quotient world have one rank per class, running the class program, where a
//      transfer's peer is the class of the rank's peer and a collective's members are the
//      classes of the rank's group. This is well defined when (a) every rank of a class has
//      its peer on a stage in the same class and (b) every rank of a class has a group of a
//      dimension whose members fall in the same set of classes; both are checked, and the
//      check gives up otherwise. Then instruction i of rank r runs in the world iff
//      instruction i of class(r) runs in the quotient, by induction on the order in which
//      the rules fire: a rank's stream order and dependencies are its class's; a receive's
//      send is instruction j of the peer's class in both (its key: tag, stream, stage); a
//      collective's members' classes are, by (b), the quotient members of its class, and a
//      member arrives at its k-th collective in one world iff its class does in the other.
//      Hence the world runs every instruction iff the quotient does, in both orders.
//
// Cost: lowering one program per class and mode (one class per stage for the shipped
// plans; the DAGs of every rank are built to find the classes), plus the ranks' transfers.

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "lib/plan/plan_check.h"
#include "lib/plan/rank_dags.h"

namespace dhelix {
namespace {

struct RankClass {
  RankLoweringInput input;
  std::vector<int64_t> ranks;
};

struct World {
  Placement placement;
  std::vector<RankClass> classes;
  std::vector<size_t> class_of;  // by rank
  // By mode (co-executed, sequential), by class: the stage programs. check 4 turns them
  // into the quotient's in place (rank: the class; peers: classes).
  std::array<std::vector<RankProgram>, 2> programs;
};

bool is_transfer(const Instruction& ins) {
  return ins.kind == InstructionKind::kSend || ins.kind == InstructionKind::kRecv;
}

// The classes of the job's ranks; nullopt when some rank has no input (it does not lower).
std::optional<World> classify(const Plan& plan, const JobSpec& job, bool class_per_rank) {
  World world{Placement(job.parallel, job.cluster.gpus_per_node), {}, {}, {}};
  for (int64_t rank = 0; rank < world.placement.world_size(); ++rank) {
    try {
      RankLoweringInput input(plan, job, rank);
      size_t c = 0;
      while (!class_per_rank && c < world.classes.size() && !(world.classes[c].input == input)) {
        ++c;
      }
      if (class_per_rank) c = world.classes.size();
      if (c == world.classes.size()) world.classes.push_back({std::move(input), {}});
      world.classes[c].ranks.push_back(rank);
      world.class_of.push_back(c);
    } catch (const Error&) {
      return std::nullopt;
    }
  }
  return world;
}

// Lowers every class in `mode` on every core; false when some class does not lower.
bool lower_classes(const Plan& plan, const JobSpec& job, ExecutionMode mode, World& world,
                   const std::function<void(int64_t)>& lowered) {
  const auto n = static_cast<int64_t>(world.classes.size());
  std::vector<RankProgram>& programs =
      world.programs[static_cast<size_t>(mode == ExecutionMode::kSequential)];
  programs.resize(static_cast<size_t>(n));
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::atomic<bool> failed{false};
  auto lower_some = [&](bool calling_thread) {
    for (int64_t c = next++; c < n; c = next++) {
      try {
        programs[static_cast<size_t>(c)] =
            lower_stage_program(plan, job, world.classes[static_cast<size_t>(c)].input, mode);
      } catch (const Error&) {
        failed = true;
      }
      const int64_t so_far = ++done;
      if (calling_thread) lowered(so_far);
    }
  };
  const int64_t threads =
      std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::max<int64_t>(n, 1));
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(lower_some, false);
  lower_some(true);
  for (std::thread& thread : pool) thread.join();
  return !failed;
}

// Check 2: every communicator's members issue equal sequences. Returns the number of
// communicators, nullopt when one differs or a collective has no group.
std::optional<int64_t> consistent_collectives(const World& world, size_t mode) {
  using Stream = std::pair<ParallelDim, StreamClass>;
  // Per class: its collectives on each (dimension, communicator stream), in order.
  std::vector<std::map<Stream, std::vector<const Instruction*>>> sequences(world.classes.size());
  for (size_t c = 0; c < world.classes.size(); ++c) {
    const RankProgram& program = world.programs[mode][c];
    for (const Instruction& ins : program.instructions) {
      if (ins.kind != InstructionKind::kCollective) continue;
      if (!ins.group) return std::nullopt;
      sequences[c][{*ins.group, communicator_stream(program, ins)}].push_back(&ins);
    }
  }
  const auto equal = [&](size_t a, size_t b, const Stream& stream) {
    if (a == b) return true;
    const auto ia = sequences[a].find(stream);
    const auto ib = sequences[b].find(stream);
    if (ia == sequences[a].end() || ib == sequences[b].end()) return false;
    const auto& [sa, sb] = std::tie(ia->second, ib->second);
    if (sa.size() != sb.size()) return false;
    for (size_t k = 0; k < sa.size(); ++k) {
      const Instruction& x = *sa[k];
      const Instruction& y = *sb[k];
      if (x.collective != y.collective || x.bytes != y.bytes || x.op != y.op ||
          x.layer != y.layer || x.micro_batch != y.micro_batch) {
        return false;
      }
    }
    return true;
  };
  std::set<std::tuple<ParallelDim, int64_t, StreamClass>> communicators;
  std::map<std::tuple<size_t, size_t, Stream>, bool> compared;
  for (int64_t rank = 0; rank < world.placement.world_size(); ++rank) {
    const size_t c = world.class_of[static_cast<size_t>(rank)];
    for (const auto& [stream, sequence] : sequences[c]) {
      const std::vector<int64_t> members = world.placement.group(stream.first, rank).ranks;
      if (!communicators.insert({stream.first, members.front(), stream.second}).second) continue;
      for (int64_t m : members) {
        const size_t other = world.class_of[static_cast<size_t>(m)];
        auto [it, added] = compared.try_emplace({c, other, stream}, false);
        if (added) it->second = equal(c, other, stream);
        if (!it->second) return std::nullopt;
      }
    }
  }
  return static_cast<int64_t>(communicators.size());
}

// Every rank's transfers, relabelled, as programs of their own (checks 3 and 10).
std::vector<RankProgram> transfer_programs(const World& world, size_t mode) {
  std::vector<RankProgram> by_class;  // each class's transfers, once
  for (const RankProgram& program : world.programs[mode]) {
    RankProgram transfers;
    transfers.stage = program.stage;
    transfers.mode = program.mode;
    transfers.op_ids = program.op_ids;
    for (const Instruction& ins : program.instructions) {
      if (!is_transfer(ins)) continue;
      transfers.instructions.push_back(ins);
      transfers.instructions.back().deps.clear();
    }
    by_class.push_back(std::move(transfers));
  }
  std::vector<RankProgram> out;
  for (int64_t rank = 0; rank < world.placement.world_size(); ++rank) {
    out.push_back(relabel_stage_program(by_class[world.class_of[static_cast<size_t>(rank)]],
                                        world.placement, rank));
  }
  return out;
}

// The quotient world of check 4 (see the file comment): the class programs become its
// ranks (rank: the class, peers: classes, in place); returns the group members by (class,
// dimension). nullopt when conditions (a) or (b) do not hold.
using QuotientGroups = std::map<std::pair<int64_t, ParallelDim>, std::vector<int64_t>>;

std::optional<QuotientGroups> make_quotient(World& world, size_t mode) {
  QuotientGroups members;
  std::map<std::pair<size_t, int64_t>, int64_t> peer_class;  // class, peer stage -> class
  // Per class: the stages of its peers, the dimensions of its groups.
  std::vector<std::set<int64_t>> peer_stages(world.classes.size());
  std::vector<std::set<ParallelDim>> dims(world.classes.size());
  for (size_t c = 0; c < world.classes.size(); ++c) {
    for (const Instruction& ins : world.programs[mode][c].instructions) {
      if (is_transfer(ins)) peer_stages[c].insert(ins.peer_stage);
      if (ins.kind == InstructionKind::kCollective && ins.group) dims[c].insert(*ins.group);
    }
  }
  const int64_t ranks = world.placement.world_size();
  for (int64_t rank = 0; rank < ranks; ++rank) {
    const size_t c = world.class_of[static_cast<size_t>(rank)];
    RankCoordinates coordinates = world.placement.coordinates(rank);
    for (int64_t stage : peer_stages[c]) {  // (a)
      coordinates.pp = stage;
      const int64_t peer = world.placement.rank_of(coordinates);
      // A peer stage outside the job would alias another rank's coordinates.
      if (peer < 0 || peer >= ranks || world.placement.coordinates(peer).pp != stage) {
        return std::nullopt;
      }
      const auto peer_c = static_cast<int64_t>(world.class_of[static_cast<size_t>(peer)]);
      if (peer_class.try_emplace({c, stage}, peer_c).first->second != peer_c) return std::nullopt;
    }
    for (ParallelDim dim : dims[c]) {  // (b)
      std::set<int64_t> classes;
      for (int64_t m : world.placement.group(dim, rank).ranks) {
        classes.insert(static_cast<int64_t>(world.class_of[static_cast<size_t>(m)]));
      }
      const std::vector<int64_t> listed(classes.begin(), classes.end());
      const auto [it, added] = members.try_emplace({static_cast<int64_t>(c), dim}, listed);
      if (!added && it->second != listed) return std::nullopt;
    }
  }
  for (size_t c = 0; c < world.classes.size(); ++c) {
    RankProgram& program = world.programs[mode][c];
    program.rank = static_cast<int64_t>(c);
    for (Instruction& ins : program.instructions) {
      if (is_transfer(ins)) ins.peer = peer_class.at({c, ins.peer_stage});
    }
  }
  return members;
}

// Checks 1 to 4 of one mode on the classes; adds the co-executed counts to `summary`.
// Returns "" when they pass, else why not.
std::string check_mode(const Plan& plan, World& world, size_t mode, const std::string& plan_file,
                       PlanCheckSummary& summary) {
  ProblemList problems;  // any problem: the full check runs and reports it
  const std::vector<RankProgram>& programs = world.programs[mode];
  check_dependencies(plan, programs, plan_file, problems);
  if (!problems.empty()) return "check 1 (dependencies)";
  const std::optional<int64_t> groups = consistent_collectives(world, mode);
  if (!groups) return "check 2 (collectives)";
  const int64_t transfers =
      check_transfers(plan, transfer_programs(world, mode), plan_file, problems);
  if (!problems.empty()) return "check 3 (transfers)";
  const std::optional<QuotientGroups> groups_of = make_quotient(world, mode);
  if (!groups_of) return "no quotient (peers or groups differ within a class)";
  const GroupMembers members = [&groups_of](ParallelDim dim, int64_t c) {
    return groups_of->at({c, dim});
  };
  const bool co_executed = programs.front().mode == ExecutionMode::kCoExecuted;
  for (SimulatedOrder order : {SimulatedOrder::kStreams, SimulatedOrder::kProgramOrder}) {
    if (order == SimulatedOrder::kProgramOrder && !co_executed) break;
    if (!check_no_deadlock(plan, programs, members, order, plan_file, problems)) {
      return "check 4 (no deadlock)";
    }
  }
  if (!co_executed) return "";
  summary.ranks = world.placement.world_size();
  for (size_t c = 0; c < world.classes.size(); ++c) {
    const auto& instructions = programs[c].instructions;
    const auto size = static_cast<int64_t>(world.classes[c].ranks.size());
    summary.instructions += size * static_cast<int64_t>(instructions.size());
    summary.collectives +=
        size * std::count_if(instructions.begin(), instructions.end(), [](const Instruction& i) {
          return i.kind == InstructionKind::kCollective;
        });
  }
  summary.collective_groups = *groups;
  summary.transfers = transfers;
  return "";
}

}  // namespace

std::optional<PlanCheckSummary> check_rank_classes(const Plan& plan, const JobSpec& job,
                                                   const std::string& plan_file,
                                                   const PlanCheckProgress& progress,
                                                   std::string* why_not, bool class_per_rank) {
  const auto cannot_tell = [why_not](const std::string& why) {
    if (why_not != nullptr) *why_not = why;
    return std::nullopt;
  };
  std::optional<World> world = classify(plan, job, class_per_rank);
  if (!world || world->classes.empty()) return cannot_tell("a rank has no stage program");
  // Steps: per mode, one per class lowered and one for that mode's checks.
  const auto n = static_cast<int64_t>(world->classes.size());
  const int64_t total = 2 * (n + 1);
  const auto report = [&](int64_t done) {
    if (progress) progress(done, total);
  };
  PlanCheckSummary summary;
  for (ExecutionMode mode : {ExecutionMode::kCoExecuted, ExecutionMode::kSequential}) {
    const int64_t start = mode == ExecutionMode::kCoExecuted ? 0 : n + 1;
    if (!lower_classes(plan, job, mode, *world,
                       [&](int64_t lowered) { report(start + lowered); })) {
      return cannot_tell("a class does not lower");
    }
    const auto m = static_cast<size_t>(mode == ExecutionMode::kSequential);
    const std::string why = check_mode(plan, *world, m, plan_file, summary);
    if (!why.empty()) return cannot_tell(fmt::format("{}: {}", execution_mode_name(mode), why));
    if (mode == ExecutionMode::kCoExecuted) report(start + n + 1);  // the last step: below
  }
  ProblemList problems;
  check_same_ops(plan, world->programs[0], world->programs[1], plan_file, problems);
  if (!problems.empty()) return cannot_tell("check 9 (same ops)");
  check_waits_for(plan, transfer_programs(*world, 0), plan_file, problems);
  if (!problems.empty()) return cannot_tell("check 10 (waits_for)");
  report(total);
  return summary;
}

}  // namespace dhelix
