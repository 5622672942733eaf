// Whole-tensor loops of causal GQA flash attention (math in runtime/kernels/attention.h).

#include <vector>

#include "lib/error.h"
#include "runtime/cpu/kernels_cpu.h"

namespace dhelix::cpu {
namespace {

void check_shape(const kernels::AttentionShape& shape) {
  DHELIX_CHECK(shape.batch >= 0 && shape.seq >= 0 && shape.head_dim > 0);
  DHELIX_CHECK(shape.kv_heads > 0 && shape.heads % shape.kv_heads == 0);
}

}  // namespace

void attention_forward(const kernels::AttentionShape& shape, const float* q, const float* k,
                       const float* v, int64_t tile_keys, float* out, float* lse) {
  check_shape(shape);
  DHELIX_CHECK(tile_keys >= 1);
  const int64_t d = shape.head_dim;
  const int64_t group = shape.heads / shape.kv_heads;
  const int64_t q_stride = shape.heads * d;
  const int64_t kv_stride = shape.kv_heads * d;
  std::vector<float> scores(static_cast<size_t>(tile_keys));
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads; ++h) {
      const float* k_head = k + b * shape.seq * kv_stride + (h / group) * d;
      const float* v_head = v + b * shape.seq * kv_stride + (h / group) * d;
      for (int64_t i = 0; i < shape.seq; ++i) {
        int64_t row = (b * shape.seq + i) * q_stride + h * d;
        lse[(b * shape.heads + h) * shape.seq + i] = kernels::attention_forward_row(
            d, q + row, k_head, v_head, kv_stride, i + 1, tile_keys, scores.data(), out + row);
      }
    }
  }
}

void attention_backward(const kernels::AttentionShape& shape, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const float* dout,
                        float* dq, float* dk, float* dv) {
  check_shape(shape);
  const int64_t d = shape.head_dim;
  const int64_t group = shape.heads / shape.kv_heads;
  const int64_t q_stride = shape.heads * d;
  const int64_t kv_stride = shape.kv_heads * d;
  // delta[batch, heads, seq], laid out like lse.
  std::vector<float> delta(static_cast<size_t>(shape.batch * shape.heads * shape.seq));
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads; ++h) {
      for (int64_t i = 0; i < shape.seq; ++i) {
        int64_t row = (b * shape.seq + i) * q_stride + h * d;
        delta[(b * shape.heads + h) * shape.seq + i] =
            kernels::attention_backward_delta(d, dout + row, out + row);
      }
    }
  }
  // Pass 1: each query row owns its dq.
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t h = 0; h < shape.heads; ++h) {
      const float* k_head = k + b * shape.seq * kv_stride + (h / group) * d;
      const float* v_head = v + b * shape.seq * kv_stride + (h / group) * d;
      for (int64_t i = 0; i < shape.seq; ++i) {
        int64_t row = (b * shape.seq + i) * q_stride + h * d;
        int64_t stat = (b * shape.heads + h) * shape.seq + i;
        kernels::attention_backward_dq_row(d, q + row, dout + row, lse[stat], delta[stat], k_head,
                                           v_head, kv_stride, i + 1, dq + row);
      }
    }
  }
  // Pass 2: each key row owns its dk and dv, summed over its group's query heads.
  for (int64_t b = 0; b < shape.batch; ++b) {
    for (int64_t g = 0; g < shape.kv_heads; ++g) {
      const float* q_group = q + b * shape.seq * q_stride + g * group * d;
      const float* dout_group = dout + b * shape.seq * q_stride + g * group * d;
      int64_t stat = (b * shape.heads + g * group) * shape.seq;
      for (int64_t j = 0; j < shape.seq; ++j) {
        int64_t row = (b * shape.seq + j) * kv_stride + g * d;
        kernels::attention_backward_dkdv_row(d, k + row, v + row, j, shape.seq, group, q_group,
                                             dout_group, q_stride, lse + stat, delta.data() + stat,
                                             dk + row, dv + row);
      }
    }
  }
}

}  // namespace dhelix::cpu
