// Check 4 of the plan checker (lib/plan/plan_check.h): simulates the whole world, every rank's
// streams at once, to prove that the programs cannot hang.
//
// The simulation is event driven. An instruction starts when it is at the head of its
// stream and every dependency is done; a compute op or a send then completes at once (sends
// never block: receives are posted before work starts); a receive completes once its send
// has; a collective "arrives", and the k-th collective of a communicator completes when all
// its members have arrived at their k-th. Each completion pushes the instructions it may
// unblock (the stream's next head, the dependents, a waiting receive) onto a work list, so
// the whole run costs O(instructions + dependencies); no timing is modelled, since a
// deadlock does not depend on how long anything takes.
//
// When the work list empties before every instruction ran, every instruction left waits
// for exactly one other thing: a queued instruction for its stream's head, a head for its
// first unfinished dependency, a receive for its send, a collective for the first member
// that has not arrived. Following those edges from every blocked head finds the wait cycles
// (each edge goes to a head within two steps, so a cycle is short) or the waits that can
// never end (a receive nobody sends, a collective a member never issues).

#include <fmt/format.h>

#include <array>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "lib/placement.h"
#include "lib/plan/plan_check.h"

namespace dhelix {
namespace {

constexpr size_t kMaxReported = 3;     // cycles, and waits that never end, each
constexpr size_t kMaxCycleSteps = 16;  // steps printed of one cycle

enum class State : uint8_t { kIdle, kArrived, kWaiting, kDone };

struct SimCommunicator {
  std::string name;                            // "tp group [0, 1] on stream local_comm"
  std::vector<int64_t> members;                // world ranks
  std::vector<std::vector<int64_t>> sequence;  // per member: its collectives (global ids)
  std::vector<int32_t> arrivals;               // per position
};

// Why an instruction has not run, and what it waits for (-1: something that never comes).
struct Wait {
  int64_t next = -1;
  std::string why;
};

class WorldSimulation {
 public:
  WorldSimulation(const Plan& plan, const std::vector<RankProgram>& programs,
                  const GroupMembers& members, SimulatedOrder order);
  /// True when every instruction ran.
  bool run();
  void report_stuck(const std::string& plan_file, ProblemList& problems) const;

 private:
  const RankProgram& program_of(int64_t g) const { return programs_[rank_of_[g]]; }
  const Instruction& instruction(int64_t g) const {
    return program_of(g).instructions[static_cast<size_t>(g - offset_[rank_of_[g]])];
  }
  std::string describe(int64_t g) const;
  void index_streams_and_deps();
  void index_collectives(const GroupMembers& group_members);
  void index_transfers();
  void try_start(int64_t g);
  void complete(int64_t g);
  int64_t head_of_stream(int64_t g) const;
  Wait wait_of(int64_t g) const;

  const Plan& plan_;
  const std::vector<RankProgram>& programs_;
  SimulatedOrder order_;
  std::vector<int64_t> offset_;  // rank -> global id of its first instruction
  std::vector<size_t> rank_of_;  // global id -> rank
  int64_t total_ = 0;

  std::vector<int64_t> stream_of_;             // global id -> stream
  std::vector<std::vector<int64_t>> streams_;  // stream -> its instructions, in order
  std::vector<SimulatedStream> stream_name_;
  std::vector<size_t> head_;  // stream -> position of its first instruction not done

  std::vector<int32_t> pending_;           // dependencies not done
  std::vector<int64_t> dependents_start_;  // CSR over global ids
  std::vector<int64_t> dependents_;

  std::vector<int64_t> comm_of_;      // collective -> communicator; -1 otherwise
  std::vector<int64_t> position_of_;  // collective -> index in its member's sequence
  std::vector<SimCommunicator> comms_;

  std::vector<int64_t> partner_;  // send <-> receive; -1 when unmatched

  std::vector<State> state_;
  std::vector<int64_t> work_;
  int64_t done_count_ = 0;
};

WorldSimulation::WorldSimulation(const Plan& plan, const std::vector<RankProgram>& programs,
                                 const GroupMembers& members, SimulatedOrder order)
    : plan_(plan), programs_(programs), order_(order) {
  for (size_t r = 0; r < programs.size(); ++r) {
    offset_.push_back(total_);
    total_ += static_cast<int64_t>(programs[r].instructions.size());
    rank_of_.insert(rank_of_.end(), programs[r].instructions.size(), r);
  }
  state_.assign(static_cast<size_t>(total_), State::kIdle);
  index_streams_and_deps();
  index_collectives(members);
  index_transfers();
}

std::string WorldSimulation::describe(int64_t g) const {
  return fmt::format("{} [{} stream]", describe_instruction(plan_, program_of(g), instruction(g)),
                     kSimulatedStreamNames.name(
                         stream_name_[static_cast<size_t>(stream_of_[static_cast<size_t>(g)])]));
}

void WorldSimulation::index_streams_and_deps() {
  stream_of_.resize(static_cast<size_t>(total_));
  pending_.assign(static_cast<size_t>(total_), 0);
  std::vector<int64_t> count(static_cast<size_t>(total_) + 1, 0);
  for (size_t r = 0; r < programs_.size(); ++r) {
    const RankProgram& program = programs_[r];
    // This rank's streams, numbered in the order they first appear; -1: not yet.
    std::array<int64_t, kSimulatedStreamNames.names.size()> streams;
    streams.fill(-1);
    const auto n = static_cast<int64_t>(program.instructions.size());
    for (int64_t i = 0; i < n; ++i) {
      const Instruction& ins = program.instructions[static_cast<size_t>(i)];
      const int64_t g = offset_[r] + i;
      const SimulatedStream stream = execution_stream(program, ins, order_);
      int64_t& s = streams[static_cast<size_t>(stream)];
      if (s < 0) {
        s = static_cast<int64_t>(streams_.size());
        streams_.emplace_back();
        stream_name_.push_back(stream);
      }
      stream_of_[static_cast<size_t>(g)] = s;
      streams_[static_cast<size_t>(s)].push_back(g);
      for (int64_t dep : ins.deps) {
        if (dep < 0 || dep >= n || dep == i) continue;  // check_dependencies reports these
        ++pending_[static_cast<size_t>(g)];
        ++count[static_cast<size_t>(offset_[r] + dep) + 1];
      }
    }
  }
  head_.assign(streams_.size(), 0);
  for (size_t g = 0; g < static_cast<size_t>(total_); ++g) count[g + 1] += count[g];
  dependents_start_ = count;
  dependents_.resize(static_cast<size_t>(count.back()));
  for (size_t r = 0; r < programs_.size(); ++r) {
    const auto n = static_cast<int64_t>(programs_[r].instructions.size());
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t dep : programs_[r].instructions[static_cast<size_t>(i)].deps) {
        if (dep < 0 || dep >= n || dep == i) continue;
        dependents_[static_cast<size_t>(count[static_cast<size_t>(offset_[r] + dep)]++)] =
            offset_[r] + i;
      }
    }
  }
}

void WorldSimulation::index_collectives(const GroupMembers& group_members) {
  comm_of_.assign(static_cast<size_t>(total_), -1);
  position_of_.assign(static_cast<size_t>(total_), -1);
  // Collectives without a group (check 2 reports them) form one-member communicators.
  std::map<std::tuple<std::optional<ParallelDim>, int64_t, StreamClass>, int64_t> index;
  for (size_t r = 0; r < programs_.size(); ++r) {
    const RankProgram& program = programs_[r];
    for (size_t i = 0; i < program.instructions.size(); ++i) {
      const Instruction& ins = program.instructions[i];
      if (ins.kind != InstructionKind::kCollective) continue;
      const std::vector<int64_t> members =
          ins.group ? group_members(*ins.group, program.rank) : std::vector<int64_t>{program.rank};
      const StreamClass stream = communicator_stream(program, ins);
      auto [it, added] = index.try_emplace({ins.group, members.front(), stream},
                                           static_cast<int64_t>(comms_.size()));
      if (added) {
        SimCommunicator comm;
        std::vector<std::string> names;
        for (int64_t m : members) names.push_back(std::to_string(m));
        comm.name = fmt::format("{} group [{}] on stream {}",
                                ins.group ? parallel_dim_name(*ins.group) : "",
                                fmt::join(names, ", "), stream_class_name(stream));
        comm.members = members;
        comm.sequence.resize(members.size());
        comms_.push_back(std::move(comm));
      }
      SimCommunicator& comm = comms_[static_cast<size_t>(it->second)];
      size_t member = 0;
      while (member < comm.members.size() && comm.members[member] != program.rank) ++member;
      if (member == comm.members.size()) continue;  // a rank outside the group: unreachable
      const int64_t g = offset_[r] + static_cast<int64_t>(i);
      comm_of_[static_cast<size_t>(g)] = it->second;
      position_of_[static_cast<size_t>(g)] = static_cast<int64_t>(comm.sequence[member].size());
      comm.sequence[member].push_back(g);
      if (comm.arrivals.size() < comm.sequence[member].size()) comm.arrivals.push_back(0);
    }
  }
}

// The k-th send of a message pairs with the k-th receive of it, as MPI matches them.
void WorldSimulation::index_transfers() {
  partner_.assign(static_cast<size_t>(total_), -1);
  using Key = std::tuple<int64_t, int64_t, int64_t, StreamClass>;  // from, to, tag, stream
  std::map<Key, std::pair<std::vector<int64_t>, std::vector<int64_t>>> ends;
  for (size_t r = 0; r < programs_.size(); ++r) {
    const RankProgram& program = programs_[r];
    for (size_t i = 0; i < program.instructions.size(); ++i) {
      const Instruction& ins = program.instructions[i];
      const int64_t g = offset_[r] + static_cast<int64_t>(i);
      const StreamClass stream = communicator_stream(program, ins);
      if (ins.kind == InstructionKind::kSend) {
        ends[{program.rank, ins.peer, ins.tag, stream}].first.push_back(g);
      } else if (ins.kind == InstructionKind::kRecv) {
        ends[{ins.peer, program.rank, ins.tag, stream}].second.push_back(g);
      }
    }
  }
  for (const auto& [key, both] : ends) {
    for (size_t k = 0; k < std::min(both.first.size(), both.second.size()); ++k) {
      partner_[static_cast<size_t>(both.first[k])] = both.second[k];
      partner_[static_cast<size_t>(both.second[k])] = both.first[k];
    }
  }
}

int64_t WorldSimulation::head_of_stream(int64_t g) const {
  const auto s = static_cast<size_t>(stream_of_[static_cast<size_t>(g)]);
  return head_[s] < streams_[s].size() ? streams_[s][head_[s]] : -1;
}

void WorldSimulation::try_start(int64_t g) {
  const auto at = static_cast<size_t>(g);
  if (state_[at] != State::kIdle || pending_[at] > 0 || head_of_stream(g) != g) return;
  switch (instruction(g).kind) {
    case InstructionKind::kCompute:
    case InstructionKind::kSend:
      complete(g);
      return;
    case InstructionKind::kRecv: {
      const int64_t send = partner_[at];
      if (send >= 0 && state_[static_cast<size_t>(send)] == State::kDone) {
        complete(g);
      } else {
        state_[at] = State::kWaiting;
      }
      return;
    }
    case InstructionKind::kCollective: {
      state_[at] = State::kArrived;
      SimCommunicator& comm = comms_[static_cast<size_t>(comm_of_[at])];
      const auto k = static_cast<size_t>(position_of_[at]);
      if (++comm.arrivals[k] < static_cast<int32_t>(comm.members.size())) return;
      for (const auto& sequence : comm.sequence) complete(sequence[k]);
      return;
    }
  }
}

void WorldSimulation::complete(int64_t g) {
  const auto at = static_cast<size_t>(g);
  state_[at] = State::kDone;
  ++done_count_;
  const auto s = static_cast<size_t>(stream_of_[at]);
  ++head_[s];  // g was the head: only heads start
  if (head_[s] < streams_[s].size()) work_.push_back(streams_[s][head_[s]]);
  for (int64_t d = dependents_start_[at]; d < dependents_start_[at + 1]; ++d) {
    const int64_t next = dependents_[static_cast<size_t>(d)];
    if (--pending_[static_cast<size_t>(next)] == 0) work_.push_back(next);
  }
  if (instruction(g).kind == InstructionKind::kSend) {
    const int64_t receive = partner_[at];
    if (receive >= 0 && state_[static_cast<size_t>(receive)] == State::kWaiting) complete(receive);
  }
}

bool WorldSimulation::run() {
  for (const auto& stream : streams_) {
    if (!stream.empty()) work_.push_back(stream.front());
  }
  while (!work_.empty()) {
    const int64_t g = work_.back();
    work_.pop_back();
    try_start(g);
  }
  return done_count_ == total_;
}

Wait WorldSimulation::wait_of(int64_t g) const {
  const auto at = static_cast<size_t>(g);
  const int64_t head = head_of_stream(g);
  if (head != g) return {head, "is queued behind"};
  const Instruction& ins = instruction(g);
  if (pending_[at] > 0) {
    const auto n = static_cast<int64_t>(program_of(g).instructions.size());
    for (int64_t dep : ins.deps) {
      if (dep < 0 || dep >= n) continue;
      const int64_t d = offset_[rank_of_[at]] + dep;
      if (d != g && state_[static_cast<size_t>(d)] != State::kDone) {
        return {d, "waits for its dependency"};
      }
    }
  }
  if (ins.kind == InstructionKind::kRecv) {
    if (partner_[at] < 0)
      return {-1, fmt::format("waits for a send that rank {} never issues", ins.peer)};
    return {partner_[at], "waits for its send"};
  }
  DHELIX_CHECK(ins.kind == InstructionKind::kCollective);
  const SimCommunicator& comm = comms_[static_cast<size_t>(comm_of_[at])];
  const auto k = static_cast<size_t>(position_of_[at]);
  for (size_t m = 0; m < comm.members.size(); ++m) {
    if (k >= comm.sequence[m].size()) {
      return {-1, fmt::format("waits for rank {}, which issues only {} collectives on the {}",
                              comm.members[m], comm.sequence[m].size(), comm.name)};
    }
    const int64_t other = comm.sequence[m][k];
    if (state_[static_cast<size_t>(other)] != State::kArrived) {
      return {other, fmt::format("waits on the {} for", comm.name)};
    }
  }
  DHELIX_CHECK_MSG(false, "a collective every member reached did not complete");
  return {};
}

void WorldSimulation::report_stuck(const std::string& plan_file, ProblemList& problems) const {
  const bool enqueue_order =
      order_ == SimulatedOrder::kProgramOrder && programs_[0].mode == ExecutionMode::kCoExecuted;
  const std::string prefix = fmt::format(
      "{}{}: deadlock: {} of {} instructions never run", execution_mode_name(programs_[0].mode),
      enqueue_order ? " in program order (the CUDA executor's enqueue order, which a full "
                      "launch queue enforces)"
                    : "",
      total_ - done_count_, total_);
  std::vector<uint8_t> color(static_cast<size_t>(total_), 0);  // 1: on the path, 2: explored
  size_t cycles = 0;
  size_t dead_ends = 0;
  auto report = [&](int64_t at, const std::string& text) {
    problems.add(plan_file, instruction_pointer(plan_, program_of(at), instruction(at)), "",
                 prefix + text);
  };
  for (size_t s = 0; s < streams_.size(); ++s) {
    if (head_[s] >= streams_[s].size()) continue;
    std::vector<std::pair<int64_t, Wait>> path;
    int64_t g = streams_[s][head_[s]];
    while (g >= 0 && color[static_cast<size_t>(g)] == 0) {
      color[static_cast<size_t>(g)] = 1;
      path.emplace_back(g, wait_of(g));
      g = path.back().second.next;
    }
    if (g < 0 && dead_ends++ < kMaxReported) {
      const auto& [last, wait] = path.back();
      report(last, fmt::format("; {} {}", describe(last), wait.why));
    } else if (g >= 0 && color[static_cast<size_t>(g)] == 1 && cycles++ < kMaxReported) {
      size_t first = 0;
      while (path[first].first != g) ++first;
      // "A waits for its send B, which is queued behind C, ..., which waits for ... A".
      std::string text = "; wait cycle: " + describe(g);
      const size_t steps = path.size() - first;
      for (size_t i = first; i < path.size() && i < first + kMaxCycleSteps; ++i) {
        const int64_t next = i + 1 < path.size() ? path[i + 1].first : g;
        text += fmt::format("{}{} {}", i == first ? " " : ", which ", path[i].second.why,
                            describe(next));
      }
      if (steps > kMaxCycleSteps)
        text += fmt::format(", ... ({} more steps)", steps - kMaxCycleSteps);
      report(g, text);
    }
    for (const auto& step : path) color[static_cast<size_t>(step.first)] = 2;
  }
}

}  // namespace

bool check_no_deadlock(const Plan& plan, const JobSpec& job,
                       const std::vector<RankProgram>& programs, SimulatedOrder order,
                       const std::string& plan_file, ProblemList& problems) {
  const Placement placement(job.parallel, job.cluster.gpus_per_node);
  return check_no_deadlock(
      plan, programs,
      [&placement](ParallelDim dim, int64_t rank) { return placement.group(dim, rank).ranks; },
      order, plan_file, problems);
}

bool check_no_deadlock(const Plan& plan, const std::vector<RankProgram>& programs,
                       const GroupMembers& members, SimulatedOrder order,
                       const std::string& plan_file, ProblemList& problems) {
  if (programs.empty()) return true;
  WorldSimulation world(plan, programs, members, order);
  if (world.run()) return true;
  world.report_stuck(plan_file, problems);
  return false;
}

}  // namespace dhelix
