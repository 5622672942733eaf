#include "planner/profile_co_run.h"

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix {

void check_profile_covers(const Profile& profile, const std::vector<Op>& ops,
                          const std::string& profile_name) {
  const std::vector<std::string> missing = profile.missing_signatures(ops);
  if (missing.empty()) return;
  std::string list;
  for (const std::string& signature : missing) list += "\n  " + signature;
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("{}: lacks {} op signature{} the job needs:{}\nre-profile the job with "
                          "`dhelix-profile JOB -o {}` (or plan without --profile)",
                          profile_name, missing.size(), missing.size() == 1 ? "" : "s", list,
                          profile_name));
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
