#pragma once
// The plan checker (dhelix-plan --check, and dhelix-run before it executes): proves, on the
// rank programs the runtime would execute (lib/plan/rank_program.h), that a plan cannot hang or
// corrupt a run. What is checked is what runs: every rank is lowered exactly as the
// interpreter lowers it, in both execution modes, and the checks read those programs.
//
//   1. Lowering: every rank lowers (an op scheduled before its inputs, a layer no stage
//      holds, a block op the DAG lacks are refused by the lowering itself), and every
//      dependency of an instruction names an earlier instruction of its program.
//   2. Collectives: the runtime gives each (process group, stream) pair a communicator of
//      its own (runtime/exec/interpreter.cc: comms.group(dim, stream); sequential mode uses
//      the compute stream's for all), so on every communicator all members must issue the
//      same collectives (kind, bytes, op, layer, micro-batch) in the same order.
//   3. Transfers: every send has exactly one receive (ends swapped, same tag, same stream,
//      same bytes) and every receive exactly one send.
//   4. No deadlock: the whole world is simulated, each rank's streams running their
//      instructions in order (receives on a stream of their own, as the interpreter does),
//      an instruction once its dependencies are done, a collective once every member has it
//      at the head of the stream, a receive once its send has run; sends never block.
//      A world that stops before every instruction ran is reported with its wait cycle.
//      Co-executed programs are simulated a second time strictly in program order, one
//      instruction after another per rank: the order in which the CUDA executor enqueues
//      them (runtime/cuda/device_executor.h). When CUDA's queue of pending launches is
//      full, the host blocks in a launch and the GPU holds only a prefix of the program;
//      a world that completes in program order cannot hang that way, because every
//      message a blocked prefix waits for is sent within its sender's own prefix.
//   5. Memory: every stage of the dhelix scheme fits in memory_budget.usable_bytes (a
//      warning instead when the plan was made with --allow-oom).
//   6-10. The other fields the runtime reads or the plan states (lib/plan_check_fields.cc):
//      num_micro_batches against the job and the tasks, task indices, blocks' op lists
//      against their timings, co-executed against sequential ops, waits_for against the
//      transfers.
//   11. Recomputed figures: every pairing's op records (id, kind, stream, group,
//      signature) against the layer DAGs rebuilt from the plan's own job
//      (lib/plan/plan_check_ops.cc); and, through a PlanFiguresCheck the caller passes
//      (planner/plan_figures_check.h), the memory budget and every stage's memory, so that
//      an edited budget cannot make check 5 pass an out-of-memory plan.
//
// Problems name the plan file, the plan position (JSON pointer of the task), the mode, and
// each instruction involved (describe_instruction), e.g.
//   plan.json: /stages/1/tasks/3: co-executed: tp group [2, 3] on stream local_comm:
//   collective 5 differs: rank 2 ...: fwd.ag_qkv ... all_gather of 4096 bytes; rank 3 ...
//
// Checks 1 to 4, 9 and 10 run first on one program per class of ranks that run the same
// program but for rank numbers (check_rank_classes, lib/plan/plan_check_classes.cc, which
// states why that stands for every rank); only when that cannot tell are every rank's
// programs lowered and checked, which is where the messages come from.
//
// Cost: O(instructions + dependencies) per mode after lowering, which dominates; with the
// classes, the instructions of one program per class (docs/plan-check.md has figures).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "lib/error.h"
#include "lib/job_spec.h"
#include "lib/plan/plan.h"
#include "lib/plan/rank_program.h"

namespace dhelix {

/// What a check saw, for the one-line summary (co-executed mode, all ranks).
struct PlanCheckSummary {
  int64_t ranks = 0;
  int64_t instructions = 0;       ///< over all ranks
  int64_t collective_groups = 0;  ///< communicators (group x stream) that carry collectives
  int64_t collectives = 0;        ///< collective instructions over all ranks
  int64_t transfers = 0;          ///< send/receive pairs matched
  int64_t peak_memory_bytes = 0;  ///< the largest stage total of the dhelix scheme
  int64_t usable_memory_bytes = 0;
  double lowering_ms = 0;  ///< wall time lowering every rank, both modes
  double checking_ms = 0;  ///< wall time of checks 1 to 4, both modes
};

/// Every problem a check found (empty: the plan passes), warnings, and the summary.
struct PlanCheckReport {
  ProblemList problems;
  std::vector<std::string> warnings;
  PlanCheckSummary summary;

  bool ok() const { return problems.empty(); }
};

/// How far a check has come: `done` of `total` steps (each rank lowered in each mode, and
/// each mode's checks). Called on the calling thread only, with `done` never decreasing.
using PlanCheckProgress = std::function<void(int64_t done, int64_t total)>;

/// Recomputes figures `plan` states from `job` (its own) and adds a problem for each that
/// differs: planner/plan_figures_check.h's check_plan_memory_figures. A parameter rather than
/// a call so that the plan library does not depend on the planner; the tools pass it.
using PlanFiguresCheck = std::function<void(const Plan& plan, const JobSpec& job,
                                            const std::string& plan_file, ProblemList& problems)>;

/// Runs every check on `plan` (file name `plan_file`, for messages): lowers every rank in
/// co-executed and sequential mode (on every core) and checks the programs, then the memory. When a
/// rank does not lower in a mode, the cross-rank checks of that mode are skipped (they would only
/// repeat the lowering's problem). Throws only when plan.job is not a valid job. `progress`,
/// when given, hears how far it has come (dhelix-plan --check draws a bar from it). `figures`,
/// when given, recomputes the memory figures (check 11).
PlanCheckReport check_plan(const Plan& plan, const std::string& plan_file,
                           const PlanCheckProgress& progress = {},
                           const PlanFiguresCheck& figures = {});

/// Checks 1 to 4, 9 and 10 on one program per class of ranks (ranks with equal
/// RankLoweringInput), lib/plan/plan_check_classes.cc. Returns the summary's counts when
/// checking every rank would find no problem; nullopt when it cannot tell (a problem, a
/// rank that does not lower, a world without the symmetry it needs), with the reason in
/// `why_not` when given ("co-executed: check 4 (no deadlock)"). Reports no problem.
/// `class_per_rank` (tests): every rank a class of its own, so that the paths for classes
/// that differ (communicators and quotient groups over several classes) run on any plan.
std::optional<PlanCheckSummary> check_rank_classes(const Plan& plan, const JobSpec& job,
                                                   const std::string& plan_file,
                                                   const PlanCheckProgress& progress,
                                                   std::string* why_not = nullptr,
                                                   bool class_per_rank = false);

/// check_plan, then throws Error(kInvalidInput) listing every problem (one per line).
/// Returns the report of a plan that passes (warnings, summary). For dhelix-run.
PlanCheckReport require_valid_plan(const Plan& plan, const std::string& plan_file,
                                   const PlanFiguresCheck& figures = {});

/// Checks already-lowered programs of one mode: `programs[r]` is world rank r's program,
/// one per rank of the job. Runs checks 1 (dependencies), 2, 3 and 4; adds problems and
/// counts (the summary's instructions, collective groups, collectives, transfers) to
/// `report`.
void check_programs(const Plan& plan, const JobSpec& job, const std::vector<RankProgram>& programs,
                    const std::string& plan_file, PlanCheckReport& report);

/// Check 1 on lowered programs: every dependency names an earlier instruction, every
/// stream is one the runtime has.
void check_dependencies(const Plan& plan, const std::vector<RankProgram>& programs,
                        const std::string& plan_file, ProblemList& problems);

/// Check 2. Returns the number of communicators that carry collectives.
int64_t check_collectives(const Plan& plan, const JobSpec& job,
                          const std::vector<RankProgram>& programs, const std::string& plan_file,
                          ProblemList& problems);

/// Check 3. Returns the number of send/receive pairs matched.
int64_t check_transfers(const Plan& plan, const std::vector<RankProgram>& programs,
                        const std::string& plan_file, ProblemList& problems);

/// How check 4 runs a rank's instructions: on its streams (as the CPU interpreter does and
/// a GPU does with room in its launch queue), or strictly in program order (the enqueue
/// order of the CUDA executor; sequential programs always run so).
enum class SimulatedOrder { kStreams, kProgramOrder };

/// Check 4 (lib/plan/plan_check_deadlock.cc). Returns true when every instruction of every
/// rank ran; otherwise adds the wait cycles (or waits that can never end) it found.
bool check_no_deadlock(const Plan& plan, const JobSpec& job,
                       const std::vector<RankProgram>& programs, SimulatedOrder order,
                       const std::string& plan_file, ProblemList& problems);

/// The members (ascending) of the process group of `dim` that holds `rank`.
using GroupMembers = std::function<std::vector<int64_t>(ParallelDim dim, int64_t rank)>;

/// Check 4 on programs whose process groups `members` gives (check_no_deadlock above:
/// the job's placement; lib/plan/plan_check_classes.cc: classes of ranks as ranks).
bool check_no_deadlock(const Plan& plan, const std::vector<RankProgram>& programs,
                       const GroupMembers& members, SimulatedOrder order,
                       const std::string& plan_file, ProblemList& problems);

/// Checks 6 to 8 (lib/plan_check_fields.cc): num_micro_batches against the job and each
/// stage's tasks, task indices, and every block's op lists against its timings.
void check_plan_fields(const Plan& plan, const JobSpec& job, const std::string& plan_file,
                       ProblemList& problems);

/// Check 9: every rank's co-executed program runs the ops (op, layer, micro-batch) of its
/// sequential program, each as often.
void check_same_ops(const Plan& plan, const std::vector<RankProgram>& co_executed,
                    const std::vector<RankProgram>& sequential, const std::string& plan_file,
                    ProblemList& problems);

/// Check 10: every task's waits_for names the tasks it receives transfers from in
/// `programs` (co-executed).
void check_waits_for(const Plan& plan, const std::vector<RankProgram>& programs,
                     const std::string& plan_file, ProblemList& problems);

/// Check 11's op records (lib/plan/plan_check_ops.cc): every pairing's ops against the layer
/// DAGs rebuilt from `job` at the shape rank of the first stage using the pairing.
void check_op_records(const Plan& plan, const JobSpec& job, const std::string& plan_file,
                      ProblemList& problems);

/// Check 5; fills the summary's memory figures.
void check_memory(const Plan& plan, const std::string& plan_file, PlanCheckReport& report);

/// "plan.json: ok: 4 ranks, 1234 instructions, 8 collective groups consistent, 32
/// transfers matched, no wait cycle, memory fits (peak 1.2 GiB of 44.0 GiB)".
std::string plan_check_summary_text(const PlanCheckReport& report, const std::string& plan_file);

// ----- shared by the checks (lib/plan_check*.cc) ------------------------------------------

/// The streams of the simulation: a rank's three streams, the interpreter's receive stream,
/// and the single in-order queue of sequential mode and of program order.
enum class SimulatedStream { kCompute, kLocalComm, kCrossComm, kReceive, kInOrder };
inline constexpr EnumNames<SimulatedStream, 5> kSimulatedStreamNames{
    {"compute", "local_comm", "cross_comm", "receive", "in-order"}};

/// The stream an instruction runs on in the simulation: in-order for everything in
/// sequential mode or in program order; otherwise the receive stream for receives (the
/// interpreter's), else the instruction's own.
SimulatedStream execution_stream(const RankProgram& program, const Instruction& instruction,
                                 SimulatedOrder order);

/// The stream whose communicator an instruction uses (interpreter.cc comm_stream).
StreamClass communicator_stream(const RankProgram& program, const Instruction& instruction);

/// "/stages/1/tasks/3": where in the plan an instruction comes from ("" when unknown).
std::string instruction_pointer(const Plan& plan, const RankProgram& program,
                                const Instruction& instruction);

}  // namespace dhelix
