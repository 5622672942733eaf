#include "planner/profile_co_run.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

#include "lib/error.h"

namespace dhelix {

namespace {

constexpr size_t kMaxPairsNamed = 5;

// The fix names a new file: suggesting `-o <the profile given>` would have the user
// overwrite a profile that is right for another job.
std::string reprofile_hint(const std::string& profile_name) {
  return fmt::format(
      "{} was probably made for another job: profile this job into a new file "
      "(`dhelix-profile JOB -o JOB-profile.json`, then --profile JOB-profile.json), or plan "
      "without --profile",
      profile_name);
}

// At most kMaxPairsNamed items, one a line, then how many more.
std::string short_list(const std::vector<std::string>& items) {
  std::string list;
  for (size_t i = 0; i < std::min(items.size(), kMaxPairsNamed); ++i) list += "\n  " + items[i];
  if (items.size() > kMaxPairsNamed) {
    list += fmt::format("\n  ... and {} more", items.size() - kMaxPairsNamed);
  }
  return list;
}

// Pairs the planner may co-run, as "a x b" in first-seen order, that `profile` lacks. The
// same rule as the model backend's (profiler/model_backend.cc), derived from the ops here so
// that the planner does not link the profiler: compute x communication, and communication x
// communication of any stream classes (local x cross, and same-class pairs such as the two
// strands' copies of one collective).
std::vector<std::string> missing_pairs(const Profile& profile, const std::vector<Op>& ops) {
  std::vector<const Op*> distinct;
  std::unordered_set<std::string> seen;
  for (const Op& op : ops) {
    if (seen.insert(op.signature()).second) distinct.push_back(&op);
  }
  std::vector<std::string> missing;
  for (size_t i = 0; i < distinct.size(); ++i) {
    const std::string a = distinct[i]->signature();
    const bool comm_a = is_communication(distinct[i]->kind);
    for (size_t j = i; j < distinct.size(); ++j) {
      if (!comm_a && !is_communication(distinct[j]->kind)) continue;
      const std::string b = distinct[j]->signature();
      if (!profile.find_pair(a, b)) missing.push_back(a + " x " + b);
    }
  }
  return missing;
}

}  // namespace

void check_profile_covers(const Profile& profile, const std::vector<Op>& ops,
                          const std::string& profile_name) {
  const std::vector<std::string> missing = profile.missing_signatures(ops);
  if (!missing.empty()) {
    throw Error(ErrorCode::kInvalidInput,
                fmt::format("{}: lacks {} op signature{} the job needs:{}\n{}", profile_name,
                            missing.size(), missing.size() == 1 ? "" : "s", short_list(missing),
                            reprofile_hint(profile_name)));
  }
  const std::vector<std::string> pairs = missing_pairs(profile, ops);
  if (pairs.empty()) return;
  const std::string list = short_list(pairs);
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("{}: lacks {} co-run pair{} the job needs (the planner would assume "
                          "they do not slow each other):{}\n{}",
                          profile_name, pairs.size(), pairs.size() == 1 ? "" : "s", list,
                          reprofile_hint(profile_name)));
}

double profile_solo_time_us(const Profile& profile, const Op& op) {
  const ProfiledOp* found = profile.find_op(op.signature());
  DHELIX_CHECK_MSG(found != nullptr, "profile lacks " + op.signature());
  return found->time_us.median_us;
}

PairTimesCoRunModel profile_co_run_model(const Profile& profile) {
  return PairTimesCoRunModel(
      [&profile](const StrandOp& a, const StrandOp& b) -> std::optional<PairFinishTimes> {
        const std::optional<ProfiledPair> pair = profile.find_pair(a.cost_key, b.cost_key);
        if (!pair) return std::nullopt;
        return PairFinishTimes{.finish_a_us = pair->finish_a_us, .finish_b_us = pair->finish_b_us};
      });
}

}  // namespace dhelix
