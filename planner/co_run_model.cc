#include "planner/co_run_model.h"

#include <algorithm>
#include <utility>

#include "lib/error.h"

namespace dhelix {

namespace {
double clamp_rate(double rate) { return std::clamp(rate, kMinCoRunRate, 1.0); }
}  // namespace

TableCoRunModel::TableCoRunModel(double default_rate) : default_rate_(default_rate) {
  DHELIX_CHECK(default_rate > 0 && default_rate <= 1);
}

void TableCoRunModel::set_rate(const std::string& key_a, const std::string& key_b, double rate) {
  DHELIX_CHECK(rate > 0 && rate <= 1);
  rates_[{key_a, key_b}] = rate;
}

void TableCoRunModel::set_pair(const std::string& key_a, const std::string& key_b, double rate_a,
                               double rate_b) {
  set_rate(key_a, key_b, rate_a);
  set_rate(key_b, key_a, rate_b);
}

double TableCoRunModel::rate(const StrandOp& a, const StrandOp& b) const {
  auto it = rates_.find({a.cost_key, b.cost_key});
  return it == rates_.end() ? default_rate_ : it->second;
}

std::pair<double, double> rates_from_pair_finish_times(double solo_a_us, double solo_b_us,
                                                       const PairFinishTimes& pair) {
  DHELIX_CHECK(solo_a_us > 0 && solo_b_us > 0);
  DHELIX_CHECK(pair.finish_a_us > 0 && pair.finish_b_us > 0);
  // The op that ends first ran co-scheduled all its life; the other ran co-scheduled up to
  // that moment and alone (rate 1) for the rest, which fixes how much it had done.
  auto first_and_second = [](double solo_first, double finish_first, double solo_second,
                             double finish_second) {
    const double rate_first = solo_first / finish_first;
    const double done_second = solo_second - (finish_second - finish_first);
    return std::pair{clamp_rate(rate_first), clamp_rate(done_second / finish_first)};
  };
  if (pair.finish_a_us <= pair.finish_b_us) {
    return first_and_second(solo_a_us, pair.finish_a_us, solo_b_us, pair.finish_b_us);
  }
  auto [rate_b, rate_a] =
      first_and_second(solo_b_us, pair.finish_b_us, solo_a_us, pair.finish_a_us);
  return {rate_a, rate_b};
}

PairTimesCoRunModel::PairTimesCoRunModel(Lookup lookup) : lookup_(std::move(lookup)) {}

double PairTimesCoRunModel::rate(const StrandOp& a, const StrandOp& b) const {
  if (a.solo_time_us <= 0 || b.solo_time_us <= 0) return 1.0;
  const std::optional<PairFinishTimes> pair = lookup_(a, b);
  if (!pair) return 1.0;
  return rates_from_pair_finish_times(a.solo_time_us, b.solo_time_us, *pair).first;
}

}  // namespace dhelix
