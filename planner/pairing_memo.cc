#include "planner/pairing_memo.h"

#include <fmt/format.h>

namespace dhelix {
namespace {

void append_graph(std::string& key, const StrandGraph& graph) {
  for (const StrandOp& op : graph.ops()) {
    key += fmt::format("{}:{}:{:.17g}:", op.id, stream_class_name(op.stream), op.solo_time_us);
    for (int64_t p : op.predecessors) key += fmt::format("{},", p);
    key += ':';
    key += op.cost_key;
    key += ';';
  }
}

}  // namespace

const PairingResult& PairingMemo::find_or_search(const std::string& key,
                                                 const std::function<PairingResult()>& search) {
  Entry* entry = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<Entry>& slot = entries_[key];
    if (!slot) slot = std::make_unique<Entry>();
    entry = slot.get();
  }
  bool searched = false;
  std::call_once(entry->once, [&] {
    entry->result = search();
    searched = true;
  });
  std::lock_guard<std::mutex> lock(mutex_);
  ++(searched ? searches_ : hits_);
  return entry->result;
}

int64_t PairingMemo::searches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return searches_;
}

int64_t PairingMemo::hits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return hits_;
}

std::string pairing_memo_key(MemoSearch search, const StrandGraph& forward,
                             const StrandGraph& backward, int64_t layers,
                             const PairingOptions& options) {
  std::string key =
      fmt::format("search={} layers={} segment={} prune={} limits={},{},{},{} gap={:.17g}|",
                  static_cast<int>(search), layers, options.max_segment_ops, options.prune,
                  options.max_downsets, options.max_steps, options.max_states,
                  options.max_block_pairs, options.paired_block_gap_us);
  append_graph(key, forward);
  key += '|';
  append_graph(key, backward);
  return key;
}

}  // namespace dhelix
