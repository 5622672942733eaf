// dhelix_dump_rank_programs PLAN...: prints, for every plan given, the rank program of the
// first rank of every stage in both execution modes, one instruction a line. The golden
// test (tests/golden/outputs_test.sh) compares these dumps byte for byte, so that a change
// to the lowering (lib/plan/rank_program.h) that alters what a rank runs is seen.
//
// Line: index kind op layer micro_batch stream group collective bytes peer tag gradient
// task block deps (comma-separated).

#include <cstdio>
#include <exception>
#include <string>

#include <fmt/format.h>

#include "lib/plan/plan_job.h"
#include "lib/plan/plan_reader.h"
#include "lib/plan/rank_program.h"

namespace {

std::string dump(const dhelix::RankProgram& program) {
  std::string out =
      fmt::format("rank {} stage {} mode {} instructions {}\n", program.rank, program.stage,
                  dhelix::execution_mode_name(program.mode), program.instructions.size());
  for (size_t i = 0; i < program.instructions.size(); ++i) {
    const dhelix::Instruction& in = program.instructions[i];
    std::string deps;
    for (int64_t d : in.deps) deps += (deps.empty() ? "" : ",") + std::to_string(d);
    out += fmt::format("{} {} {} {} {} {} {} {} {} {} {} {} {} {} [{}]\n", i,
                       dhelix::instruction_kind_name(in.kind), in.op, in.layer, in.micro_batch,
                       dhelix::stream_class_name(in.stream),
                       in.group ? dhelix::parallel_dim_name(*in.group) : "-",
                       in.collective ? dhelix::op_kind_name(*in.collective) : "-", in.bytes,
                       in.peer, in.tag, in.gradient ? 1 : 0, in.task, in.block, deps);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    for (int a = 1; a < argc; ++a) {
      const dhelix::Plan plan = dhelix::read_plan(argv[a]);
      const dhelix::JobSpec job = dhelix::job_from_plan(plan, argv[a]);
      for (const dhelix::PlanStage& stage : plan.stages) {
        for (dhelix::ExecutionMode mode :
             {dhelix::ExecutionMode::kCoExecuted, dhelix::ExecutionMode::kSequential}) {
          std::fputs(dump(dhelix::lower_rank_program(plan, job, stage.ranks.front(), mode)).c_str(),
                     stdout);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dhelix_dump_rank_programs: %s\n", e.what());
    return 1;
  }
  return 0;
}
