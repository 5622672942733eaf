#include "runtime/cpu/kernels_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "lib/error.h"
#include "runtime/kernels/cross_entropy.h"
#include "runtime/kernels/embedding.h"
#include "runtime/kernels/rmsnorm.h"
#include "runtime/kernels/rope.h"
#include "runtime/kernels/swiglu.h"

namespace dhelix::cpu {
namespace {

// cblas takes int sizes; a tensor dimension beyond that is a bug in the caller.
int blas_int(int64_t value) {
  DHELIX_CHECK(value >= 0 && value <= std::numeric_limits<int>::max());
  return static_cast<int>(value);
}

}  // namespace

void set_blas_threads(int threads) {
  DHELIX_CHECK(threads >= 1);
  openblas_set_num_threads(threads);
}

void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc) {
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, blas_int(m), blas_int(n), blas_int(k), alpha,
              a, blas_int(lda), b, blas_int(ldb), beta, c, blas_int(ldc));
}

void gemm_reference(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                    float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        double a_ip = transpose_a ? a[p * lda + i] : a[i * lda + p];
        double b_pj = transpose_b ? b[j * ldb + p] : b[p * ldb + j];
        sum += a_ip * b_pj;
      }
      // BLAS semantics: with beta = 0, C is not read (it may hold NaN).
      double previous = beta == 0.0f ? 0.0 : static_cast<double>(beta) * c[i * ldc + j];
      c[i * ldc + j] = static_cast<float>(alpha * sum + previous);
    }
  }
}

void linear_forward(int64_t rows, int64_t in, int64_t out, const float* x, const float* w,
                    float* y) {
  gemm(false, true, rows, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
}

void linear_dgrad(int64_t rows, int64_t in, int64_t out, const float* dy, const float* w,
                  float* dx) {
  gemm(false, false, rows, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}

void linear_wgrad_accumulate(int64_t rows, int64_t in, int64_t out, const float* dy, const float* x,
                             float* dw) {
  gemm(true, false, out, in, rows, 1.0f, dy, out, x, in, 1.0f, dw, in);
}

void rmsnorm_forward(int64_t rows, int64_t dim, const float* x, const float* gain, float eps,
                     float* y, float* rstd) {
  for (int64_t r = 0; r < rows; ++r) {
    rstd[r] = kernels::rmsnorm_forward_row(dim, x + r * dim, gain, eps, y + r * dim);
  }
}

void rmsnorm_backward(int64_t rows, int64_t dim, const float* x, const float* gain,
                      const float* rstd, const float* dy, float* dx, float* dgain) {
  for (int64_t r = 0; r < rows; ++r) {
    kernels::rmsnorm_backward_row(dim, x + r * dim, gain, rstd[r], dy + r * dim, dx + r * dim);
    kernels::rmsnorm_dgain_accumulate_row(dim, x + r * dim, rstd[r], dy + r * dim, dgain);
  }
}

RopeTable make_rope_table(int64_t positions, int64_t head_dim, double base) {
  DHELIX_CHECK(positions >= 0 && head_dim > 0 && head_dim % 2 == 0);
  RopeTable table;
  table.positions = positions;
  table.head_dim = head_dim;
  int64_t half = head_dim / 2;
  table.cos.resize(static_cast<size_t>(positions * half));
  table.sin.resize(static_cast<size_t>(positions * half));
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      kernels::rope_cos_sin(p, i, head_dim, base, &table.cos[p * half + i],
                            &table.sin[p * half + i]);
    }
  }
  return table;
}

namespace {

// Applies `rotate` to every head vector of x[batch, seq, heads, head_dim] with its row of
// the table.
template <class Rotate>
void rope_apply(const RopeTable& table, int64_t batch, int64_t seq, int64_t heads,
                int64_t position_offset, float* x, Rotate rotate) {
  DHELIX_CHECK(position_offset >= 0 && position_offset + seq <= table.positions);
  int64_t head_dim = table.head_dim;
  int64_t half = head_dim / 2;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t t = 0; t < seq; ++t) {
      const float* cos_row = table.cos.data() + (position_offset + t) * half;
      const float* sin_row = table.sin.data() + (position_offset + t) * half;
      for (int64_t h = 0; h < heads; ++h) {
        rotate(head_dim, cos_row, sin_row, x + ((b * seq + t) * heads + h) * head_dim);
      }
    }
  }
}

}  // namespace

void rope_forward(const RopeTable& table, int64_t batch, int64_t seq, int64_t heads,
                  int64_t position_offset, float* x) {
  rope_apply(table, batch, seq, heads, position_offset, x, kernels::rope_forward_head);
}

void rope_backward(const RopeTable& table, int64_t batch, int64_t seq, int64_t heads,
                   int64_t position_offset, float* dy) {
  rope_apply(table, batch, seq, heads, position_offset, dy, kernels::rope_backward_head);
}

void swiglu_forward(int64_t rows, int64_t ffn, const float* gate_up, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    kernels::swiglu_forward_row(ffn, gate_up + r * 2 * ffn, out + r * ffn);
  }
}

void swiglu_backward(int64_t rows, int64_t ffn, const float* gate_up, const float* dout,
                     float* d_gate_up) {
  for (int64_t r = 0; r < rows; ++r) {
    kernels::swiglu_backward_row(ffn, gate_up + r * 2 * ffn, dout + r * ffn,
                                 d_gate_up + r * 2 * ffn);
  }
}

void cross_entropy_forward(int64_t rows, int64_t vocab, const float* logits, const int64_t* targets,
                           float* loss, float* lse) {
  for (int64_t r = 0; r < rows; ++r) {
    DHELIX_CHECK(targets[r] < vocab);
    loss[r] = kernels::cross_entropy_forward_row(vocab, logits + r * vocab, targets[r], &lse[r]);
  }
}

void cross_entropy_backward(int64_t rows, int64_t vocab, const float* logits,
                            const int64_t* targets, const float* lse, float dloss, float* dlogits) {
  for (int64_t r = 0; r < rows; ++r) {
    kernels::cross_entropy_backward_row(vocab, 0, logits + r * vocab, targets[r], lse[r], dloss,
                                        dlogits + r * vocab);
  }
}

void embedding_forward(int64_t positions, int64_t dim, const int64_t* tokens, const float* table,
                       int64_t vocab_begin, int64_t vocab_local, float* out) {
  for (int64_t r = 0; r < positions; ++r) {
    kernels::embedding_forward_row(dim, table, vocab_begin, vocab_local, tokens[r], out + r * dim);
  }
}

void embedding_backward(int64_t positions, int64_t dim, const int64_t* tokens, const float* dout,
                        int64_t vocab_begin, int64_t vocab_local, float* dtable) {
  for (int64_t r = 0; r < positions; ++r) {
    kernels::embedding_backward_accumulate_row(dim, dout + r * dim, vocab_begin, vocab_local,
                                               tokens[r], dtable);
  }
}

void adamw_update(const kernels::AdamWStep& step, int64_t count, const float* grads, float* params,
                  float* first_moment, float* second_moment) {
  for (int64_t i = 0; i < count; ++i) {
    kernels::adamw_update(step, grads[i], &params[i], &first_moment[i], &second_moment[i]);
  }
}

void add_tensors(int64_t count, const float* a, const float* b, float* out) {
  for (int64_t i = 0; i < count; ++i) out[i] = a[i] + b[i];
}

void split_qkv(int64_t rows, int64_t q_width, int64_t kv_width, const float* qkv, float* q,
               float* k, float* v) {
  const int64_t width = q_width + 2 * kv_width;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = qkv + r * width;
    std::copy(row, row + q_width, q + r * q_width);
    std::copy(row + q_width, row + q_width + kv_width, k + r * kv_width);
    std::copy(row + q_width + kv_width, row + width, v + r * kv_width);
  }
}

void merge_qkv(int64_t rows, int64_t q_width, int64_t kv_width, const float* q, const float* k,
               const float* v, float* qkv) {
  const int64_t width = q_width + 2 * kv_width;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = qkv + r * width;
    std::copy(q + r * q_width, q + (r + 1) * q_width, row);
    std::copy(k + r * kv_width, k + (r + 1) * kv_width, row + q_width);
    std::copy(v + r * kv_width, v + (r + 1) * kv_width, row + q_width + kv_width);
  }
}

void vocab_parallel_stats(int64_t rows, int64_t vocab_local, int64_t vocab_begin,
                          const float* logits, const int64_t* targets, float* stats) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * vocab_local;
    float* out = stats + r * kVocabStatsPerRow;
    out[0] = kernels::row_max(vocab_local, z);
    out[1] = vocab_local == 0 ? 0.0f : kernels::row_sum_exp(vocab_local, z, out[0]);
    int64_t local = targets[r] - vocab_begin;
    out[2] = (targets[r] >= 0 && local >= 0 && local < vocab_local) ? z[local] : 0.0f;
  }
}

void vocab_parallel_combine(int64_t rows, int64_t shards, int64_t shard_width, const float* stats,
                            const int64_t* targets, float* lse, float* loss) {
  DHELIX_CHECK(shards >= 1 && shard_width >= 1);
  const int64_t block = rows * kVocabStatsPerRow;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = stats + r * kVocabStatsPerRow;
    float global_max = -INFINITY;
    for (int64_t s = 0; s < shards; ++s) global_max = std::max(global_max, row[s * block]);
    float sum = 0.0f;
    for (int64_t s = 0; s < shards; ++s) {
      // An empty shard (sum 0, max -inf) adds nothing; skipping it avoids inf - inf.
      if (row[s * block + 1] > 0.0f) sum += row[s * block + 1] * expf(row[s * block] - global_max);
    }
    lse[r] = global_max + logf(sum);
    if (targets[r] < 0) {
      loss[r] = 0.0f;
      continue;
    }
    const int64_t owner = targets[r] / shard_width;
    DHELIX_CHECK(owner < shards);
    loss[r] = lse[r] - row[owner * block + 2];
  }
}

void vocab_parallel_backward(int64_t rows, int64_t vocab_local, int64_t vocab_begin,
                             const float* logits, const int64_t* targets, const float* lse,
                             float dloss, float* dlogits) {
  for (int64_t r = 0; r < rows; ++r) {
    kernels::cross_entropy_backward_row(vocab_local, vocab_begin, logits + r * vocab_local,
                                        targets[r], lse[r], dloss, dlogits + r * vocab_local);
  }
}

}  // namespace dhelix::cpu
