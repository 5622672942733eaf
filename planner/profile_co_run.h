#pragma once
// The profile as the planner's cost source: solo times by op signature and a co-run model
// over the profile's measured pairs (co_run_model.h: PairTimesCoRunModel). A profile that
// lacks an op or a co-run pair the job needs is refused with the missing ones named: the
// planner never guesses a solo time, and a missing pair would silently mean "no slowdown"
// (an optimistic plan). The pairs needed are those the model backend profiles (see
// profiler/model_backend.h): every pair of the job's op signatures, a signature with itself
// included, in which at least one op communicates.

#include <string>
#include <vector>

#include "lib/op_catalogue.h"
#include "lib/profile.h"
#include "planner/co_run_model.h"

namespace dhelix {

/// Throws Error(kInvalidInput) when `profile` has no solo time for some of `ops`, naming
/// every missing signature and how to make a profile that covers them:
/// "profile.json: lacks 2 op signatures the job needs: gemm:bf16:..., ...; re-profile the
/// job with `dhelix-profile JOB -o profile.json` (or plan without --profile)".
/// With every signature present, throws the same way when a co-run pair the planner may
/// need (compute x communication or communication x communication, see the file comment)
/// is absent, naming the first 5 missing pairs and how many there are.
void check_profile_covers(const Profile& profile, const std::vector<Op>& ops,
                          const std::string& profile_name);

/// The op's median solo time in us; DHELIX_CHECKs that the profile has it (call
/// check_profile_covers first).
double profile_solo_time_us(const Profile& profile, const Op& op);

/// Co-run rates from the profile's pairs, looked up by StrandOp::cost_key (the signature).
/// The profile must outlive the model.
PairTimesCoRunModel profile_co_run_model(const Profile& profile);

}  // namespace dhelix
