#pragma once
// Errors. Library code throws dhelix::Error; only a tool's main catches it and maps
// its code to an exit status. Broken internal invariants use DHELIX_CHECK, which
// aborts: they are bugs, not user errors.

#include <stdexcept>
#include <string>
#include <vector>

namespace dhelix {

/// What kind of failure an Error reports; each maps to one exit status (exit_status()).
enum class ErrorCode {
  kInvalidInput,   ///< a file or flag breaks a rule (exit 2)
  kIo,             ///< a file cannot be read or written (exit 3)
  kUnsupported,    ///< valid, but not something dhelix can do (exit 4)
  kSchemaVersion,  ///< a file of another major schema version (exit 5)
  kInfeasible,     ///< the job cannot run as asked, e.g. it does not fit in memory (exit 6)
  kInternal,       ///< a failure that is our fault (exit 70)
};

/// Exit status a tool returns for an error of this code.
int exit_status(ErrorCode code);

/// The error every library function throws. what() is the full, user-facing message
/// without the tool prefix ("job.json: /parallel/tp: 3 does not divide ...").
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

/// One broken rule: where (file and JSON pointer), what (the value) and why (the rule).
struct Problem {
  std::string file;     ///< file name as the user gave it, or "<flags>" for the command line
  std::string pointer;  ///< JSON pointer of the field ("/parallel/tp"), or "" for the file
  std::string value;    ///< the offending value as text, or "" when none applies
  std::string rule;     ///< the rule broken, in words ("does not divide num_attention_heads = 32")

  /// "file: /pointer: value rule" with empty parts left out.
  std::string to_string() const;
};

/// Collects every problem of an input before stopping, so that a user fixes them all
/// in one round. throw_if_any() throws one Error listing them, one per line.
class ProblemList {
 public:
  void add(Problem problem);
  void add(std::string file, std::string pointer, std::string value, std::string rule);
  bool empty() const { return problems_.empty(); }
  const std::vector<Problem>& problems() const { return problems_; }
  /// Appends another list's problems (used when validation runs in parts).
  void append(const ProblemList& other);
  /// Throws Error(code) whose message holds every problem, one per line.
  void throw_if_any(ErrorCode code = ErrorCode::kInvalidInput) const;

 private:
  std::vector<Problem> problems_;
};

[[noreturn]] void check_failed(const char* condition, const char* file, int line,
                               const std::string& message);

}  // namespace dhelix

/// Internal invariant: aborts with the condition, file and line when false.
#define DHELIX_CHECK(cond)                                              \
  do {                                                                  \
    if (!(cond)) ::dhelix::check_failed(#cond, __FILE__, __LINE__, ""); \
  } while (0)
#define DHELIX_CHECK_MSG(cond, msg)                                      \
  do {                                                                   \
    if (!(cond)) ::dhelix::check_failed(#cond, __FILE__, __LINE__, msg); \
  } while (0)
