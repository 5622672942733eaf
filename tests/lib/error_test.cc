#include "lib/error.h"

#include <gtest/gtest.h>

namespace dhelix {
namespace {

TEST(ProblemTest, JoinsFilePointerValueAndRule) {
  const Problem problem{"job.json", "/parallel/tp", "3",
                        "does not divide num_attention_heads = 32"};
  EXPECT_EQ(problem.to_string(),
            "job.json: /parallel/tp: 3 does not divide num_attention_heads = 32");
}

TEST(ProblemTest, LeavesOutEmptyParts) {
  EXPECT_EQ((Problem{"model.json", "", "", "is empty"}).to_string(), "model.json: is empty");
  EXPECT_EQ((Problem{"model.json", "/name", "", "is required but missing"}).to_string(),
            "model.json: /name: is required but missing");
}

TEST(ProblemListTest, ThrowsEveryProblemOnePerLine) {
  ProblemList problems;
  EXPECT_NO_THROW(problems.throw_if_any());
  problems.add("a.json", "/x", "1", "must be at least 2");
  problems.add("a.json", "/y", "", "is required but missing");
  try {
    problems.throw_if_any();
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidInput);
    EXPECT_STREQ(error.what(),
                 "a.json: /x: 1 must be at least 2\na.json: /y: is required but missing");
  }
}

TEST(ProblemListTest, UsesTheGivenCode) {
  ProblemList problems;
  problems.add("plan.json", "", "", "does not fit");
  try {
    problems.throw_if_any(ErrorCode::kInfeasible);
    FAIL() << "expected an Error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInfeasible);
  }
}

TEST(ExitStatusTest, EachCodeHasItsOwnStatus) {
  EXPECT_EQ(exit_status(ErrorCode::kInvalidInput), 2);
  EXPECT_EQ(exit_status(ErrorCode::kIo), 3);
  EXPECT_EQ(exit_status(ErrorCode::kUnsupported), 4);
  EXPECT_EQ(exit_status(ErrorCode::kSchemaVersion), 5);
  EXPECT_EQ(exit_status(ErrorCode::kInfeasible), 6);
  EXPECT_EQ(exit_status(ErrorCode::kInternal), 70);
}

TEST(CheckDeathTest, AbortsWithTheCondition) {
  EXPECT_DEATH(DHELIX_CHECK_MSG(1 + 1 == 3, "arithmetic"),
               "check failed: 1 \\+ 1 == 3: arithmetic");
}

}  // namespace
}  // namespace dhelix
