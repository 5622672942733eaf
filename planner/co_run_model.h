#pragma once
// How two ops slow each other down when they run at the same time on two streams of one
// device (compute and communication share memory bandwidth and SMs). The planner only
// needs a progress rate: while b runs, a advances `rate(a, b)` microseconds of its solo
// work per microsecond of wall time, 1 meaning no slowdown.
//
// Profiles measure pairs as finish times: start a and b together, a ends at f_a, b at
// f_b. With solo times T_a, T_b and, say, f_a <= f_b, a ran with b the whole time and b
// ran alone for the last f_b - f_a, so
//     rate_a = T_a / f_a,      rate_b = (T_b - (f_b - f_a)) / f_a
// (rates_from_pair_finish_times; clamped into [kMinCoRunRate, 1]). PairTimesCoRunModel is
// the adapter a profile plugs into. With three ops running at once (one per stream) the
// planner multiplies pairwise rates: rate of a = rate(a, b) * rate(a, c). That is an
// assumption (independent slowdowns), not a measurement; see docs/planner.md.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "planner/strand_graph.h"

namespace dhelix {

/// Rates are clamped to at least this, so that every op eventually finishes.
inline constexpr double kMinCoRunRate = 1e-3;

/// The pairwise slowdown model the block simulation asks.
class CoRunModel {
 public:
  virtual ~CoRunModel() = default;
  /// Progress rate in (0, 1] of op a while op b runs on another stream (1 = no slowdown).
  virtual double rate(const StrandOp& a, const StrandOp& b) const = 0;
};

/// No op slows any other down (rate 1 everywhere): the ideal-overlap model.
class NoSlowdownModel final : public CoRunModel {
 public:
  double rate(const StrandOp&, const StrandOp&) const override { return 1.0; }
};

/// Rates from a table keyed by StrandOp::cost_key, with a default for absent pairs.
class TableCoRunModel final : public CoRunModel {
 public:
  explicit TableCoRunModel(double default_rate = 1.0);
  /// Rate of ops keyed key_a while ops keyed key_b run. DHELIX_CHECKs 0 < rate <= 1.
  void set_rate(const std::string& key_a, const std::string& key_b, double rate);
  /// Both directions at once.
  void set_pair(const std::string& key_a, const std::string& key_b, double rate_a, double rate_b);
  double rate(const StrandOp& a, const StrandOp& b) const override;

 private:
  double default_rate_;
  std::map<std::pair<std::string, std::string>, double> rates_;
};

/// Finish times of two ops started together on an otherwise idle device, in us.
struct PairFinishTimes {
  double finish_a_us = 0;
  double finish_b_us = 0;
};

/// The rates (rate_a, rate_b) that reproduce measured pair finish times under the
/// constant-rate model (formula above), clamped into [kMinCoRunRate, 1]. solo times > 0.
std::pair<double, double> rates_from_pair_finish_times(double solo_a_us, double solo_b_us,
                                                       const PairFinishTimes& pair);

/// The adapter a profile connects to: a lookup of measured pair finish times (nullopt
/// when the pair was not measured: no slowdown assumed). Ops with zero solo time run at 1.
class PairTimesCoRunModel final : public CoRunModel {
 public:
  using Lookup = std::function<std::optional<PairFinishTimes>(const StrandOp&, const StrandOp&)>;
  explicit PairTimesCoRunModel(Lookup lookup);
  double rate(const StrandOp& a, const StrandOp& b) const override;

 private:
  Lookup lookup_;
};

}  // namespace dhelix
