#include "lib/error.h"

#include <cstdio>
#include <cstdlib>

namespace dhelix {

int exit_status(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidInput:
      return 2;
    case ErrorCode::kIo:
      return 3;
    case ErrorCode::kUnsupported:
      return 4;
    case ErrorCode::kSchemaVersion:
      return 5;
    case ErrorCode::kInfeasible:
      return 6;
    case ErrorCode::kInternal:
      return 70;
  }
  return 70;
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

std::string Problem::to_string() const {
  std::string out;
  auto append = [&out](const std::string& part) {
    if (part.empty()) return;
    if (!out.empty()) out += ": ";
    out += part;
  };
  append(file);
  append(pointer);
  if (value.empty()) {
    append(rule);
  } else {
    append(value + (rule.empty() ? "" : " " + rule));
  }
  return out;
}

void ProblemList::add(Problem problem) { problems_.push_back(std::move(problem)); }

void ProblemList::add(std::string file, std::string pointer, std::string value, std::string rule) {
  problems_.push_back({std::move(file), std::move(pointer), std::move(value), std::move(rule)});
}

void ProblemList::append(const ProblemList& other) {
  problems_.insert(problems_.end(), other.problems_.begin(), other.problems_.end());
}

void ProblemList::throw_if_any(ErrorCode code) const {
  if (problems_.empty()) return;
  std::string message;
  for (const Problem& problem : problems_) {
    if (!message.empty()) message += "\n";
    message += problem.to_string();
  }
  throw Error(code, message);
}

void check_failed(const char* condition, const char* file, int line, const std::string& message) {
  std::fprintf(stderr, "dhelix: internal error: %s:%d: check failed: %s%s%s\n", file, line,
               condition, message.empty() ? "" : ": ", message.c_str());
  std::abort();
}

}  // namespace dhelix
