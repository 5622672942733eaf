#include "lib/plan/program_builder.h"

#include <fmt/format.h>

#include <algorithm>

#include "lib/error.h"

namespace dhelix {

ProgramBuilder::ProgramBuilder(int64_t rank, int64_t stage, ExecutionMode mode) {
  program_.rank = rank;
  program_.stage = stage;
  program_.mode = mode;
  last_on_stream_.fill(-1);
}

void ProgramBuilder::fail(const std::string& what) const {
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("plan: stage {} task {}{}: {}", program_.stage, task_,
                          block_ >= 0 ? fmt::format(" block {}", block_) : "", what));
}

void ProgramBuilder::fail_at(int64_t task, const std::string& what) const {
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("plan: stage {} task {}: {}", program_.stage, task, what));
}

void ProgramBuilder::begin_task(int64_t task) {
  task_ = task;
  block_ = -1;
  start_barrier();
}

void ProgramBuilder::begin_block(int64_t block) {
  block_ = block;
  start_barrier();
}

void ProgramBuilder::start_barrier() {
  barrier_.clear();
  for (int64_t index : last_on_stream_) {
    if (index >= 0) barrier_.push_back(index);
  }
}

int64_t ProgramBuilder::push(Instruction instruction) {
  const auto index = static_cast<int64_t>(program_.instructions.size());
  std::vector<int64_t>& deps = instruction.deps;
  if (program_.mode == ExecutionMode::kSequential) {
    if (index > 0) deps.push_back(index - 1);
  } else {
    deps.insert(deps.end(), barrier_.begin(), barrier_.end());
  }
  std::sort(deps.begin(), deps.end());
  deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
  deps.shrink_to_fit();
  instruction.task = task_;
  instruction.block = block_;
  last_on_stream_[static_cast<size_t>(instruction.stream)] = index;
  program_.instructions.push_back(std::move(instruction));
  return index;
}

int64_t ProgramBuilder::push_beside(Instruction instruction) {
  const size_t stream = static_cast<size_t>(instruction.stream);
  const int64_t last = last_on_stream_[stream];
  const int64_t index = push(std::move(instruction));
  if (program_.mode == ExecutionMode::kCoExecuted) last_on_stream_[stream] = last;
  return index;
}

}  // namespace dhelix
