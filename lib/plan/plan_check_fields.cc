// Checks 6 to 9 of the plan checker (lib/plan_check.h): the fields the runtime reads besides
// the rank programs' own consistency. Each closes a way a plan edited by hand passed the
// checker and then trained wrongly or described itself wrongly:
//
//   6. num_micro_batches equals the job's global_batch_size / (micro_batch_size x dp): the
//      trainer divides the loss by it (4 -> 5 scaled every gradient by 4/5), and each
//      stage's tasks run every micro-batch's forward and backward over every layer the
//      stage holds, and the head stage its loss, exactly once (a split backward's input
//      part stands for it; the lowering pairs it with its weight part).
//   7. Every task's index is its position: the trainer and the transfers name tasks by it.
//   8. A block's forward_ops and backward_ops are its timings' ops of that strand in the
//      same order, and the timings are in start order within the block: a reordered block
//      no longer says what runs (the programs follow the timings).
//   9. The co-executed program of every rank runs exactly the ops its sequential program
//      runs (same op, layer and micro-batch, as often): a block that drops an op with no
//      consumer (a weight-gradient GEMM) would otherwise train that weight with no gradient.
//  10. Every task's waits_for names exactly the tasks of other stages whose transfers it
//      receives in the co-executed programs (what the Chrome trace draws as arrows).

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "lib/plan/plan_blocks.h"
#include "lib/plan/plan_check.h"
#include "lib/text.h"

namespace dhelix {
namespace {

// Times in a plan are rounded to 3 decimals.
constexpr double kTimeSlackUs = 2e-3;

std::string layers_text(const std::set<int64_t>& layers) {
  std::vector<std::string> parts;
  for (int64_t l : layers) parts.push_back(std::to_string(l));
  return "{" + join(parts, ", ") + "}";
}

// Check 6, second half: one stage's coverage of the micro-batches.
void check_stage_coverage(const Plan& plan, size_t s, const std::string& file,
                          ProblemList& problems) {
  const PlanStage& stage = plan.stages[s];
  std::set<int64_t> held;
  for (const PlanLayerRange& range : stage.layer_ranges()) {
    for (int64_t l = range.first; l < range.first + range.count; ++l) held.insert(l);
  }
  const int64_t n = plan.num_micro_batches;
  std::map<int64_t, std::multiset<int64_t>> forward, backward;
  std::multiset<int64_t> losses;
  for (const PlanTask& task : stage.tasks) {
    auto add = [&](const PlanTaskPart& part, std::map<int64_t, std::multiset<int64_t>>& into) {
      for (int64_t j = 0; j < part.layers.count; ++j) {
        into[part.micro_batch].insert(part.layers.first + j);
      }
    };
    if (task.forward) add(*task.forward, forward);
    // A split backward counts once, by its input part: the lowering pairs each I with its
    // W (lib/plan/rank_program.cc), so W parts are no second pass.
    if (task.backward && task.backward->work != BackwardShare::kWeight) {
      add(*task.backward, backward);
    }
    if (task.kind == TaskKind::kHeadLoss) losses.insert(task.head_loss_micro_batch);
  }
  const std::string where = fmt::format("/stages/{}/tasks", s);
  for (const auto& [strand, runs] :
       {std::pair{"forward", &forward}, std::pair{"backward", &backward}}) {
    for (const auto& [mb, layers] : *runs) {
      if (mb >= 0 && mb < n) continue;
      problems.add(file, where, fmt::format("micro-batch {}", mb),
                   fmt::format("a {} pass of a micro-batch outside 0..{} (num_micro_batches "
                               "= {})",
                               strand, n - 1, n));
    }
    for (int64_t mb = 0; mb < n; ++mb) {
      const auto it = runs->find(mb);
      const std::multiset<int64_t> ran = it == runs->end() ? std::multiset<int64_t>{} : it->second;
      if (ran == std::multiset<int64_t>(held.begin(), held.end())) continue;
      problems.add(file, where, fmt::format("micro-batch {}", mb),
                   fmt::format("the {} passes cover layers {} (with repeats: {} in all), the "
                               "stage holds {}: each must run exactly once",
                               strand, layers_text(std::set<int64_t>(ran.begin(), ran.end())),
                               ran.size(), layers_text(held)));
    }
  }
  if (!stage.head_loss) return;
  for (int64_t mb = 0; mb < n; ++mb) {
    if (losses.count(mb) == 1) continue;
    problems.add(file, where, fmt::format("micro-batch {}", mb),
                 fmt::format("the loss runs {} times on the head's stage; it must run once",
                             losses.count(mb)));
  }
}

// Check 8 on one block.
void check_block(const PlanBlock& block, const std::string& pointer, const std::string& file,
                 ProblemList& problems) {
  for (const auto& [strand, listed, key] :
       {std::tuple{"forward_ops", &block.forward_ops, Pass::kForward},
        std::tuple{"backward_ops", &block.backward_ops, Pass::kBackward}}) {
    std::vector<std::string> timed;
    for (const PlanOpTiming& t : block.timings) {
      if (t.strand == key) timed.push_back(t.op);
    }
    if (*listed == timed) continue;
    problems.add(file, pointer + "/" + strand, "[" + join(*listed, ", ") + "]",
                 fmt::format("differs from the block's {} timings in start order [{}]",
                             pass_name(key), join(timed, ", ")));
  }
  for (size_t i = 0; i < block.timings.size(); ++i) {
    const PlanOpTiming& t = block.timings[i];
    const std::string at = fmt::format("{}/timings/{}", pointer, i);
    if (i > 0 && t.start_us + kTimeSlackUs < block.timings[i - 1].start_us) {
      problems.add(file, at + "/start_us", fmt::format("{}", t.start_us),
                   fmt::format("is before the previous op's start {}: timings must be in start "
                               "order",
                               block.timings[i - 1].start_us));
    }
    if (t.start_us > t.finish_us + kTimeSlackUs || t.finish_us > block.time_us + kTimeSlackUs) {
      problems.add(file, at, fmt::format("{} .. {}", t.start_us, t.finish_us),
                   fmt::format("must lie within the block's 0 .. {} us", block.time_us));
    }
  }
}

}  // namespace

void check_plan_fields(const Plan& plan, const JobSpec& job, const std::string& plan_file,
                       ProblemList& problems) {
  // 6. The micro-batch count and its coverage.
  const ParallelSpec& p = job.parallel;
  if (plan.num_micro_batches != p.num_micro_batches()) {
    problems.add(plan_file, "/num_micro_batches", std::to_string(plan.num_micro_batches),
                 fmt::format("differs from the job's global_batch_size / (micro_batch_size x "
                             "dp) = {} / ({} x {}) = {}: the loss would be scaled by {} / {}",
                             p.global_batch_size, p.micro_batch_size, p.dp, p.num_micro_batches(),
                             p.num_micro_batches(), plan.num_micro_batches));
  }
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    check_stage_coverage(plan, s, plan_file, problems);
    // 7. Task indices.
    for (size_t t = 0; t < plan.stages[s].tasks.size(); ++t) {
      const int64_t index = plan.stages[s].tasks[t].index;
      if (index == static_cast<int64_t>(t)) continue;
      problems.add(plan_file, fmt::format("/stages/{}/tasks/{}/index", s, t), std::to_string(index),
                   "must be the task's position in the list");
    }
  }
  // 8. Blocks say what runs.
  for (size_t i = 0; i < plan.pairings.size(); ++i) {
    const PlanPairing& pairing = plan.pairings[i];
    for (const auto& [name, blocks] : {std::pair{"layer_blocks", &pairing.layer_blocks},
                                       std::pair{"window_blocks", &pairing.window_blocks},
                                       std::pair{"remainder_blocks", &pairing.remainder_blocks}}) {
      for (size_t b = 0; b < blocks->size(); ++b) {
        check_block((*blocks)[b], fmt::format("/pairings/{}/{}/{}", i, name, b), plan_file,
                    problems);
      }
    }
  }
}

void check_same_ops(const Plan& plan, const std::vector<RankProgram>& co_executed,
                    const std::vector<RankProgram>& sequential, const std::string& plan_file,
                    ProblemList& problems) {
  // Two sorted lists of (op, layer, micro-batch) walked side by side: the first key whose
  // counts differ, in key order. Op names are numbered in name order first, so that the
  // sort compares integers. (A map of counts gave the same answer at 30 % of a 64-rank
  // check's time: one tree node per key and rank; sorting the names themselves, 19 %.)
  using Key = std::tuple<int32_t, int64_t, int64_t>;  // op number, layer, micro-batch
  for (size_t r = 0; r < co_executed.size() && r < sequential.size(); ++r) {
    std::unordered_map<std::string_view, int32_t> number;
    for (const RankProgram* program : {&co_executed[r], &sequential[r]}) {
      for (const Instruction& i : program->instructions) number.emplace(i.op, 0);
    }
    std::vector<std::string_view> names;
    names.reserve(number.size());
    for (const auto& [name, n] : number) names.push_back(name);
    std::sort(names.begin(), names.end());
    for (size_t k = 0; k < names.size(); ++k) number[names[k]] = static_cast<int32_t>(k);
    const auto keys = [&number](const RankProgram& program) {
      std::vector<Key> out;
      out.reserve(program.instructions.size());
      for (const Instruction& i : program.instructions) {
        out.emplace_back(number.at(i.op), i.layer, i.micro_batch);
      }
      std::sort(out.begin(), out.end());
      return out;
    };
    const std::vector<Key> co = keys(co_executed[r]);
    const std::vector<Key> seq = keys(sequential[r]);
    size_t a = 0, b = 0;
    while (a < co.size() || b < seq.size()) {
      const Key& key = b == seq.size() || (a < co.size() && co[a] < seq[b]) ? co[a] : seq[b];
      int64_t count = 0;
      for (; a < co.size() && co[a] == key; ++a) ++count;
      for (; b < seq.size() && seq[b] == key; ++b) --count;
      if (count == 0) continue;
      const auto& [op, layer, mb] = key;
      problems.add(plan_file, fmt::format("/stages/{}", co_executed[r].stage),
                   fmt::format("rank {}", co_executed[r].rank),
                   fmt::format("the co-executed program runs {} of layer {} micro-batch {} {} "
                               "the sequential one: the pairing's blocks {} an op",
                               names[static_cast<size_t>(op)], layer, mb,
                               count > 0 ? "more often than" : "less often than",
                               count > 0 ? "repeat" : "leave out"));
      return;  // one rank's first difference says enough
    }
  }
  (void)plan;
}

void check_waits_for(const Plan& plan, const std::vector<RankProgram>& programs,
                     const std::string& plan_file, ProblemList& problems) {
  // (from rank, to rank, tag, stream) -> the sending task, then each task's senders.
  using Message = std::tuple<int64_t, int64_t, int64_t, StreamClass>;
  std::map<Message, std::pair<int64_t, int64_t>> sender;  // -> stage, task
  for (const RankProgram& program : programs) {
    for (const Instruction& ins : program.instructions) {
      if (ins.kind != InstructionKind::kSend) continue;
      sender[{program.rank, ins.peer, ins.tag, communicator_stream(program, ins)}] = {program.stage,
                                                                                      ins.task};
    }
  }
  std::map<std::pair<int64_t, int64_t>, std::set<std::pair<int64_t, int64_t>>> waits;
  for (const RankProgram& program : programs) {
    for (const Instruction& ins : program.instructions) {
      if (ins.kind != InstructionKind::kRecv) continue;
      const auto it =
          sender.find({ins.peer, program.rank, ins.tag, communicator_stream(program, ins)});
      if (it != sender.end()) waits[{program.stage, ins.task}].insert(it->second);
    }
  }
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PlanStage& stage = plan.stages[s];
    for (size_t t = 0; t < stage.tasks.size(); ++t) {
      std::set<std::pair<int64_t, int64_t>> listed;
      for (const PlanTaskRef& ref : stage.tasks[t].waits_for) listed.insert({ref.stage, ref.task});
      const auto& expected = waits[{stage.stage, static_cast<int64_t>(t)}];
      if (listed == expected) continue;
      auto text = [](const std::set<std::pair<int64_t, int64_t>>& refs) {
        std::vector<std::string> parts;
        for (const auto& [rs, rt] : refs) parts.push_back(fmt::format("stage {} task {}", rs, rt));
        return "[" + join(parts, ", ") + "]";
      };
      problems.add(plan_file, fmt::format("/stages/{}/tasks/{}/waits_for", s, t), text(listed),
                   fmt::format("differs from the transfers the task receives: {}", text(expected)));
    }
  }
}

}  // namespace dhelix
