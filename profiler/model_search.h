#pragma once
// The configuration search (planner/config_search.h) with the analytic model as the profile
// of every configuration: what dhelix-plan --search, its tests and its benchmark use. The
// planner does not link the profiler, so the search takes these as callbacks.

#include "planner/config_search.h"
#include "profiler/interference.h"
#include "profiler/model_backend.h"

namespace dhelix {

/// Sets the request's make_profile (make_model_profile), unprofiled_op_time_us (the
/// analytic op time) and solo_time_us (that time as the model profile stores it).
inline void use_model_profiles(SearchRequest& request) {
  request.make_profile = [](const JobSpec& job) {
    return make_model_profile(job, OrderedJson::object());
  };
  request.unprofiled_op_time_us = [](const ClusterSpec& cluster, const Op& op) {
    return op_time_us(cluster, op);
  };
  request.solo_time_us = [](const ClusterSpec& cluster, const Op& op) {
    return quantize_profile_value(op_time_us(cluster, op));  // as make_model_profile stores it
  };
}

}  // namespace dhelix
