// The op -> parameter-gradient table of gradient_writers.h.
#include "runtime/model/gradient_writers.h"

#include <array>
#include <string>
#include <utility>

namespace dhelix::rt {
namespace {

// (op, the written parameter's name within its layer), for layer ops.
constexpr std::array<std::pair<std::string_view, std::string_view>, 12> kLayerWriters = {{
    {"bwd.ln_attn", "ln_attn"},
    {"bwd.qkv_wgrad", "w_qkv"},
    {"bwd.proj_wgrad", "w_proj"},
    {"bwd.ln_mlp", "ln_mlp"},
    {"bwd.fc1_wgrad", "w_fc1"},
    {"bwd.fc2_wgrad", "w_fc2"},
    {"bwd.router_wgrad", "router"},
    {"bwd.grouped_fc1_wgrad", "experts_fc1"},
    {"bwd.grouped_fc2_wgrad", "experts_fc2"},
    {"bwd.shared_fc2_dgrad", "shared_gate"},
    {"bwd.shared_fc1_wgrad", "shared_fc1"},
    {"bwd.shared_fc2_wgrad", "shared_fc2"},
}};

// (op, parameter name), for the stage extras (layer -1).
constexpr std::array<std::pair<std::string_view, std::string_view>, 3> kExtraWriters = {{
    {"bwd.embedding", "embedding"},
    {"bwd.final_norm", "final_norm"},
    {"bwd.head_wgrad", "head"},
}};

}  // namespace

std::vector<std::string> gradients_written_by(std::string_view op, int64_t layer) {
  if (layer < 0) {
    for (const auto& [name, parameter] : kExtraWriters) {
      if (name == op) return {std::string(parameter)};
    }
    return {};
  }
  for (const auto& [name, parameter] : kLayerWriters) {
    if (name == op) return {"layers." + std::to_string(layer) + "." + std::string(parameter)};
  }
  return {};
}

}  // namespace dhelix::rt
