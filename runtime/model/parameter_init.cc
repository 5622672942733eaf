// Parameter initialisation from (seed, tensor name, global element index).
//
// Each value is a counter-based draw: splitmix64 (Steele, Lea and Flood 2014, "Fast
// splittable pseudorandom number generators") of a key made from the seed and an FNV-1a
// hash of the tensor's name, plus the element's index in the FULL (unsharded) tensor. A
// rank computes the global index of each element of its shard, so a TP layout's shards are
// exactly slices of the one full model every layout starts from.
//
// Full layouts (PyTorch's [out, in]): w_qkv [(H + 2G) d, h] with all q heads, then all k
// heads, then all v heads; w_proj [h, H d]; w_fc1 [2F, h] with the gate rows then the up
// rows; w_fc2 [h, F]; embedding and head [V, h]. Column-parallel shards (w_qkv, w_fc1, head,
// embedding) take rows of each part; row-parallel shards (w_proj, w_fc2) take columns.
// Linear weights are uniform in +-1/sqrt(fan_in) (PyTorch's nn.Linear bound), the embedding
// in +-1, norm gains are 1.

#include <cmath>
#include <functional>

#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt::model_detail {
namespace {

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a64(const std::string& text) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 0x100000001B3ull;
  }
  return hash;
}

HostTensor make_parameter(std::string name, int64_t count) {
  HostTensor p;
  p.name = std::move(name);
  p.values.assign(static_cast<size_t>(count), 0.0f);
  return p;
}

// Fills a [rows, cols] shard whose element (i, j) is element global(i, j) of the full tensor.
HostTensor make_matrix(uint64_t seed, std::string name, int64_t rows, int64_t cols, float bound,
                       const std::function<int64_t(int64_t, int64_t)>& global) {
  HostTensor p = make_parameter(std::move(name), rows * cols);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      p.values[static_cast<size_t>(i * cols + j)] = init_uniform(seed, p.name, global(i, j), bound);
    }
  }
  return p;
}

HostTensor make_gain(std::string name, int64_t count, bool sum_over_tp) {
  HostTensor p = make_parameter(std::move(name), count);
  p.values.assign(static_cast<size_t>(count), 1.0f);
  p.sum_gradient_over_tp = sum_over_tp;
  return p;
}

float linear_bound(int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); }

}  // namespace

float init_uniform(uint64_t seed, const std::string& name, int64_t global_index, float bound) {
  const uint64_t key = splitmix64(seed ^ splitmix64(fnv1a64(name)));
  const uint64_t bits = splitmix64(key + static_cast<uint64_t>(global_index));
  const float unit = static_cast<float>(bits >> 40) * 0x1.0p-24f;  // [0, 1), 24 bits
  return bound * (2.0f * unit - 1.0f);
}

HostLayer make_layer_parameters(const Dims& d, int64_t layer, uint64_t seed) {
  const std::string prefix = "layers." + std::to_string(layer) + ".";
  const int64_t h = d.hidden, r = d.tp_rank;
  const int64_t q_full = d.q_width * d.tp, kv_full = d.kv_width * d.tp, f_full = d.ffn * d.tp;
  HostLayer p;
  p.ln_attn = make_gain(prefix + "ln_attn", h, d.sp);
  p.ln_mlp = make_gain(prefix + "ln_mlp", h, d.sp);
  p.w_qkv = make_matrix(seed, prefix + "w_qkv", d.qkv_width, h, linear_bound(h),
                        [&](int64_t i, int64_t j) {
                          int64_t row = 0;
                          if (i < d.q_width) {
                            row = r * d.q_width + i;
                          } else if (i < d.q_width + d.kv_width) {
                            row = q_full + r * d.kv_width + (i - d.q_width);
                          } else {
                            row = q_full + kv_full + r * d.kv_width + (i - d.q_width - d.kv_width);
                          }
                          return row * h + j;
                        });
  p.w_proj = make_matrix(seed, prefix + "w_proj", h, d.q_width, linear_bound(q_full),
                         [&](int64_t i, int64_t j) { return i * q_full + r * d.q_width + j; });
  p.w_fc1 =
      make_matrix(seed, prefix + "w_fc1", 2 * d.ffn, h, linear_bound(h), [&](int64_t i, int64_t j) {
        int64_t row = i < d.ffn ? r * d.ffn + i : f_full + r * d.ffn + (i - d.ffn);
        return row * h + j;
      });
  p.w_fc2 = make_matrix(seed, prefix + "w_fc2", h, d.ffn, linear_bound(f_full),
                        [&](int64_t i, int64_t j) { return i * f_full + r * d.ffn + j; });
  return p;
}

HostTensor make_embedding(const Dims& d, uint64_t seed) {
  return make_matrix(seed, "embedding", d.vocab_local, d.hidden, 1.0f,
                     [&](int64_t i, int64_t j) { return (d.vocab_begin + i) * d.hidden + j; });
}

HostTensor make_head(const Dims& d, uint64_t seed) {
  return make_matrix(seed, "head", d.vocab_local, d.hidden, linear_bound(d.hidden),
                     [&](int64_t i, int64_t j) { return (d.vocab_begin + i) * d.hidden + j; });
}

HostTensor make_final_norm(const Dims& d) { return make_gain("final_norm", d.hidden, d.sp); }

namespace {

// [local, rows, cols] values; element (e, r, c) is element (first + e, full_row(r),
// full_col(c)) of the full [E, full_rows, full_cols] tensor.
template <class Row, class Col>
std::vector<float> expert_values(uint64_t seed, const std::string& name, const ExpertSlice& s,
                                 int64_t rows, int64_t cols, int64_t full_rows, int64_t full_cols,
                                 const Row& full_row, const Col& full_col, float bound) {
  std::vector<float> values(static_cast<size_t>(s.local * rows * cols));
  for (int64_t e = 0; e < s.local; ++e) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t index = ((s.first + e) * full_rows + full_row(r)) * full_cols + full_col(c);
        values[static_cast<size_t>((e * rows + r) * cols + c)] =
            init_uniform(seed, name, index, bound);
      }
    }
  }
  return values;
}

}  // namespace

std::vector<float> expert_fc1_initial_values(uint64_t seed, const std::string& name,
                                             const ExpertSlice& s, float bound) {
  const auto row = [&s](int64_t r) {  // gate rows, then up rows, of this rank's columns
    return r < s.ffn ? s.etp_rank * s.ffn + r : s.full_ffn + s.etp_rank * s.ffn + (r - s.ffn);
  };
  return expert_values(
      seed, name, s, 2 * s.ffn, s.hidden, 2 * s.full_ffn, s.hidden, row,
      [](int64_t c) { return c; }, bound);
}

std::vector<float> expert_fc2_initial_values(uint64_t seed, const std::string& name,
                                             const ExpertSlice& s, float bound) {
  return expert_values(
      seed, name, s, s.hidden, s.ffn, s.hidden, s.full_ffn, [](int64_t r) { return r; },
      [&s](int64_t c) { return s.etp_rank * s.ffn + c; }, bound);
}

}  // namespace dhelix::rt::model_detail
