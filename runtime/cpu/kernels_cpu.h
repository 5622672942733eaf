#pragma once
// The CPU backend's whole-tensor kernels: loops over the row, element and tile functions of
// runtime/kernels/, plus GEMM through OpenBLAS. All tensors are fp32, row-major and
// contiguous; "rows" is batch * seq flattened. Outputs never alias inputs unless a function
// says so.
//
// Determinism: every loop visits rows in ascending order and each row function has a
// fixed reduction order, so a call repeated on the same input gives the same bits. The
// loops are single-threaded; running rows in parallel later would not change any bit,
// because no two rows share an output except the documented accumulations (gain, table
// and weight gradients), whose order is fixed by the row index.
//
// GEMM: OpenBLAS sgemm gives the same bits for the same shapes and the same thread count
// on the same CPU. dhelix fixes the count with set_blas_threads() once at start-up (the
// tests use 1); changing it between the two runs of dhelix-run --verify is not allowed.

#include <cstdint>
#include <vector>

#include "runtime/kernels/adamw.h"
#include "runtime/kernels/attention.h"

namespace dhelix::cpu {

// ---- GEMM ---------------------------------------------------------------------------

/// Sets OpenBLAS's thread count (>= 1) for every later GEMM of this process.
void set_blas_threads(int threads);

/// C[m, n] = alpha * op(A) * op(B) + beta * C, row-major, through cblas_sgemm. op(A) is
/// [m, k] (A is [k, m] when transpose_a); op(B) is [k, n] (B is [n, k] when transpose_b).
/// Leading dimensions are those of the matrices as stored.
void gemm(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
          int64_t ldc);

/// The same contract as gemm, computed naively with double accumulation (test reference).
void gemm_reference(bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k,
                    float alpha, const float* a, int64_t lda, const float* b, int64_t ldb,
                    float beta, float* c, int64_t ldc);

/// Linear layer forward, PyTorch's weight layout: y[rows, out] = x[rows, in] W^T with
/// W[out, in].
void linear_forward(int64_t rows, int64_t in, int64_t out, const float* x, const float* w,
                    float* y);
/// Input gradient: dx[rows, in] = dy[rows, out] W[out, in].
void linear_dgrad(int64_t rows, int64_t in, int64_t out, const float* dy, const float* w,
                  float* dx);
/// Weight gradient, accumulated (beta = 1): dw[out, in] += dy^T[out, rows] x[rows, in].
void linear_wgrad_accumulate(int64_t rows, int64_t in, int64_t out, const float* dy, const float* x,
                             float* dw);

// ---- Normalisation, position, activation ----------------------------------------------

/// y[rows, dim] = RMSNorm(x) * gain; rstd[rows] saved for the backward.
void rmsnorm_forward(int64_t rows, int64_t dim, const float* x, const float* gain, float eps,
                     float* y, float* rstd);
/// dx[rows, dim]; dgain[dim] accumulates (+=) over rows in ascending order.
void rmsnorm_backward(int64_t rows, int64_t dim, const float* x, const float* gain,
                      const float* rstd, const float* dy, float* dx, float* dgain);

/// cos and sin tables of RoPE for positions [0, positions), each [positions, head_dim / 2].
struct RopeTable {
  int64_t positions = 0;   ///< rows of the tables
  int64_t head_dim = 0;    ///< even
  std::vector<float> cos;  ///< [positions, head_dim / 2]
  std::vector<float> sin;  ///< [positions, head_dim / 2]
};
/// Builds the table for rotary base `base` (Llama: 10000; Llama 3: 500000).
RopeTable make_rope_table(int64_t positions, int64_t head_dim, double base);

/// Rotates x[batch, seq, heads, head_dim] in place; token t of a sequence is at position
/// position_offset + t (the offset is the sequence shard's start under context
/// parallelism), which must be inside the table.
void rope_forward(const RopeTable& table, int64_t batch, int64_t seq, int64_t heads,
                  int64_t position_offset, float* x);
/// Inverse rotation of dy (same layout and positions) in place.
void rope_backward(const RopeTable& table, int64_t batch, int64_t seq, int64_t heads,
                   int64_t position_offset, float* dy);

/// out[rows, ffn] = silu(gate) * up from gate_up[rows, 2 * ffn] (gate columns first).
void swiglu_forward(int64_t rows, int64_t ffn, const float* gate_up, float* out);
/// d_gate_up[rows, 2 * ffn] from gate_up and dout[rows, ffn].
void swiglu_backward(int64_t rows, int64_t ffn, const float* gate_up, const float* dout,
                     float* d_gate_up);

// ---- Attention ------------------------------------------------------------------------

/// Causal GQA flash attention forward (layouts in runtime/kernels/attention.h): writes
/// out and lse. tile_keys >= 1 is the key tile width.
void attention_forward(const kernels::AttentionShape& shape, const float* q, const float* k,
                       const float* v, int64_t tile_keys, float* out, float* lse);
/// Backward: dq, dk, dv (overwritten) from the forward's inputs, out, lse and dout.
void attention_backward(const kernels::AttentionShape& shape, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const float* dout,
                        float* dq, float* dk, float* dv);

// ---- Loss, embedding, optimizer -------------------------------------------------------

/// Per-row loss[rows] and lse[rows] of logits[rows, vocab] against targets[rows] (a
/// negative target is ignored: loss 0).
void cross_entropy_forward(int64_t rows, int64_t vocab, const float* logits, const int64_t* targets,
                           float* loss, float* lse);
/// dlogits[rows, vocab] = dloss * (softmax - one_hot); dloss is the same for every row
/// (1 / valid tokens for a mean loss).
void cross_entropy_backward(int64_t rows, int64_t vocab, const float* logits,
                            const int64_t* targets, const float* lse, float dloss, float* dlogits);

/// out[positions, dim] gathered from table[vocab_local, dim] (rows vocab_begin onwards).
void embedding_forward(int64_t positions, int64_t dim, const int64_t* tokens, const float* table,
                       int64_t vocab_begin, int64_t vocab_local, float* out);
/// dtable[vocab_local, dim] += scatter of dout[positions, dim], positions ascending.
void embedding_backward(int64_t positions, int64_t dim, const int64_t* tokens, const float* dout,
                        int64_t vocab_begin, int64_t vocab_local, float* dtable);

/// One AdamW step over `count` elements of params, with their grads and moments.
void adamw_update(const kernels::AdamWStep& step, int64_t count, const float* grads, float* params,
                  float* first_moment, float* second_moment);

// ---- Tensor plumbing and vocabulary-parallel cross-entropy (runtime/model's pieces) ----

/// out[count] = a + b elementwise; out may alias a or b.
void add_tensors(int64_t count, const float* a, const float* b, float* out);

/// Splits qkv[rows, q_width + 2 * kv_width] (the q columns, then k, then v, as the fused
/// QKV GEMM writes them) into q[rows, q_width], k[rows, kv_width] and v[rows, kv_width].
void split_qkv(int64_t rows, int64_t q_width, int64_t kv_width, const float* qkv, float* q,
               float* k, float* v);
/// The inverse of split_qkv: qkv from q, k and v (the attention backward's dq, dk, dv).
void merge_qkv(int64_t rows, int64_t q_width, int64_t kv_width, const float* q, const float* k,
               const float* v, float* qkv);

/// Floats per token of the vocabulary-parallel cross-entropy statistics: the shard's max
/// logit, its sum of exp(z - max), and the target's logit (0 when another shard owns it).
inline constexpr int64_t kVocabStatsPerRow = 3;

/// stats[rows, 3] of logits[rows, vocab_local], whose columns are vocabulary entries
/// [vocab_begin, vocab_begin + vocab_local). An empty shard gives (-inf, 0, 0).
void vocab_parallel_stats(int64_t rows, int64_t vocab_local, int64_t vocab_begin,
                          const float* logits, const int64_t* targets, float* stats);
/// Combines the statistics of `shards` vocabulary shards of `shard_width` columns each
/// (shard r holds entries [r * shard_width, ...)), laid out [shards][rows, 3] as an
/// all_gather leaves them, into each row's global lse[rows] and loss[rows] = lse - z_target.
/// The shards are folded in order 0, 1, ...: global max M, then sum_r s_r exp(m_r - M).
/// A negative target gives loss 0. With one shard the result equals cross_entropy_forward's.
void vocab_parallel_combine(int64_t rows, int64_t shards, int64_t shard_width, const float* stats,
                            const int64_t* targets, float* lse, float* loss);
/// dlogits[rows, vocab_local] = dloss * (softmax - one_hot) for a vocabulary shard, from
/// each row's global lse (rows with a negative target get zeros).
void vocab_parallel_backward(int64_t rows, int64_t vocab_local, int64_t vocab_begin,
                             const float* logits, const int64_t* targets, const float* lse,
                             float dloss, float* dlogits);

}  // namespace dhelix::cpu
