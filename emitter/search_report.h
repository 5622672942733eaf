#pragma once
// The configuration search's answer (planner/config_search.h), for people and for scripts.
//
// Text: the counts, the most common rejections, the best dhelix and the best Megatron-LM
// 1F1B configuration with the gain of the first over the second (the figure a user acts
// on), then the top k of each scheme. JSON: the same plus every configuration enumerated,
// with its status, reason, lower bound and figures.
// Neither depends on the thread count: runs with 1 and 8 threads print the same bytes.

#include <cstdint>
#include <string>

#include "lib/json_reader.h"
#include "planner/config_search.h"

namespace dhelix {

/// What the search was asked, for the report's heading.
struct SearchReportContext {
  std::string model;    ///< model name
  std::string cluster;  ///< cluster name (GPU)
  int64_t gpus = 0;
  int64_t global_batch_size = 0;
  int64_t seq_length = 0;
  int64_t top_k = 5;
  OrderedJson meta = OrderedJson::object();  ///< provenance of the run (JSON only)
  bool all_schemes = false;  ///< text: also the best configuration of every other scheme
};

std::string search_report_text(const SearchResult& result, const SearchReportContext& context);
std::string search_report_json(const SearchResult& result, const SearchReportContext& context);

}  // namespace dhelix
