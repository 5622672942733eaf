#include "profiler/cpu/cpu_op_runner.h"

#include <algorithm>
#include <memory>
#include <string>

#include "lib/error.h"
#include "runtime/cpu/kernels_cpu.h"

namespace dhelix::cpu_profile {
namespace {

// Buffers one runnable owns; the closure holds them through a shared_ptr (std::function
// must be copyable).
struct Buffers {
  std::vector<std::vector<float>> floats;
  std::vector<std::vector<int64_t>> ints;
  int64_t bytes = 0;

  // A buffer of `count` floats with small values that keep every kernel finite: the
  // inputs are read over and over, and an overflow would time inf/NaN arithmetic.
  float* add(int64_t count, int salt = 0) {
    std::vector<float>& v = floats.emplace_back(static_cast<size_t>(std::max<int64_t>(count, 1)));
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = 0.01f *
             static_cast<float>(static_cast<int64_t>((i * 7 + static_cast<size_t>(salt)) % 13) - 6);
    }
    bytes += static_cast<int64_t>(v.size() * sizeof(float));
    return v.data();
  }
  float* add_zeros(int64_t count) {
    std::vector<float>& v = floats.emplace_back(static_cast<size_t>(std::max<int64_t>(count, 1)));
    bytes += static_cast<int64_t>(v.size() * sizeof(float));
    return v.data();
  }
  // Indices i mod `modulus` (tokens of an embedding, targets of a loss).
  const int64_t* add_indices(int64_t count, int64_t modulus) {
    std::vector<int64_t>& v = ints.emplace_back(static_cast<size_t>(count));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i) % modulus;
    bytes += static_cast<int64_t>(v.size() * sizeof(int64_t));
    return v.data();
  }
};

RunnableOp finish(const std::shared_ptr<Buffers>& buffers, std::function<void()> run) {
  return {.run = std::move(run), .buffer_bytes = buffers->bytes};
}

RunnableOp gemm_runner(const Op& op) {
  const OpShape& s = op.shape;
  auto buffers = std::make_shared<Buffers>();
  const int64_t batch = std::max<int64_t>(s.batch, 1);
  const float* a = buffers->add(batch * s.m * s.k, 1);
  const float* b = buffers->add(batch * s.k * s.n, 2);
  float* c = buffers->add_zeros(batch * s.m * s.n);
  return finish(buffers, [buffers, a, b, c, batch, m = s.m, n = s.n, k = s.k] {
    for (int64_t g = 0; g < batch; ++g) {
      cpu::gemm(false, false, m, n, k, 1.0f, a + g * m * k, k, b + g * k * n, n, 0.0f,
                c + g * m * n, n);
    }
  });
}

RunnableOp attention_runner(const Op& op) {
  const OpShape& s = op.shape;
  if (s.kv_heads < 1 || s.heads % s.kv_heads != 0) {
    throw Error(ErrorCode::kUnsupported, op.id + ": attention with " + std::to_string(s.heads) +
                                             " heads and " + std::to_string(s.kv_heads) +
                                             " kv heads: heads must be a multiple of kv_heads");
  }
  const kernels::AttentionShape shape{.batch = s.batch,
                                      .seq = s.q_len,
                                      .heads = s.heads,
                                      .kv_heads = s.kv_heads,
                                      .head_dim = s.head_dim};
  const int64_t q_count = s.batch * s.q_len * s.heads * s.head_dim;
  const int64_t kv_count = s.batch * s.q_len * s.kv_heads * s.head_dim;
  auto buffers = std::make_shared<Buffers>();
  const float* q = buffers->add(q_count, 1);
  const float* k = buffers->add(kv_count, 2);
  const float* v = buffers->add(kv_count, 3);
  float* out = buffers->add_zeros(q_count);
  float* lse = buffers->add_zeros(s.batch * s.heads * s.q_len);
  if (op.pass == Pass::kForward) {
    return finish(buffers, [buffers, shape, q, k, v, out, lse] {
      cpu::attention_forward(shape, q, k, v, kernels::kAttentionTileKeys, out, lse);
    });
  }
  // The backward reads the forward's output and lse: compute them once, as training would.
  cpu::attention_forward(shape, q, k, v, kernels::kAttentionTileKeys, out, lse);
  const float* dout = buffers->add(q_count, 4);
  float* dq = buffers->add_zeros(q_count);
  float* dk = buffers->add_zeros(kv_count);
  float* dv = buffers->add_zeros(kv_count);
  return finish(buffers, [buffers, shape, q, k, v, out, lse, dout, dq, dk, dv] {
    cpu::attention_backward(shape, q, k, v, out, lse, dout, dq, dk, dv);
  });
}

RunnableOp norm_runner(const Op& op) {
  const int64_t rows = op.shape.m, dim = op.shape.n;
  auto buffers = std::make_shared<Buffers>();
  const float* x = buffers->add(rows * dim, 1);
  float* gain = buffers->add(dim, 2);
  for (int64_t i = 0; i < dim; ++i) gain[i] += 1.0f;
  float* y = buffers->add_zeros(rows * dim);
  float* rstd = buffers->add_zeros(rows);
  constexpr float kEps = 1e-5f;
  if (op.pass == Pass::kForward) {
    return finish(buffers, [buffers, rows, dim, x, gain, y, rstd] {
      cpu::rmsnorm_forward(rows, dim, x, gain, kEps, y, rstd);
    });
  }
  cpu::rmsnorm_forward(rows, dim, x, gain, kEps, y, rstd);
  const float* dy = buffers->add(rows * dim, 3);
  float* dx = buffers->add_zeros(rows * dim);
  float* dgain = buffers->add_zeros(dim);
  return finish(buffers, [buffers, rows, dim, x, gain, rstd, dy, dx, dgain] {
    cpu::rmsnorm_backward(rows, dim, x, gain, rstd, dy, dx, dgain);
  });
}

RunnableOp swiglu_runner(const Op& op) {
  const int64_t rows = op.shape.m, ffn = op.shape.n;
  auto buffers = std::make_shared<Buffers>();
  const float* gate_up = buffers->add(rows * 2 * ffn, 1);
  if (op.pass == Pass::kForward) {
    float* out = buffers->add_zeros(rows * ffn);
    return finish(buffers, [buffers, rows, ffn, gate_up, out] {
      cpu::swiglu_forward(rows, ffn, gate_up, out);
    });
  }
  const float* dout = buffers->add(rows * ffn, 2);
  float* d_gate_up = buffers->add_zeros(rows * 2 * ffn);
  return finish(buffers, [buffers, rows, ffn, gate_up, dout, d_gate_up] {
    cpu::swiglu_backward(rows, ffn, gate_up, dout, d_gate_up);
  });
}

RunnableOp add_runner(const Op& op) {
  const int64_t count = op.shape.m * op.shape.n;
  auto buffers = std::make_shared<Buffers>();
  const float* a = buffers->add(count, 1);
  const float* b = buffers->add(count, 2);
  float* out = buffers->add_zeros(count);
  return finish(buffers, [buffers, count, a, b, out] { cpu::add_tensors(count, a, b, out); });
}

RunnableOp embedding_runner(const Op& op) {
  const int64_t positions = op.shape.m, dim = op.shape.n, vocab = std::max<int64_t>(op.shape.k, 1);
  auto buffers = std::make_shared<Buffers>();
  const int64_t* tokens = buffers->add_indices(positions, vocab);
  if (op.pass == Pass::kForward) {
    const float* table = buffers->add(vocab * dim, 1);
    float* out = buffers->add_zeros(positions * dim);
    return finish(buffers, [buffers, positions, dim, tokens, table, vocab, out] {
      cpu::embedding_forward(positions, dim, tokens, table, 0, vocab, out);
    });
  }
  const float* dout = buffers->add(positions * dim, 2);
  float* dtable = buffers->add_zeros(vocab * dim);
  return finish(buffers, [buffers, positions, dim, tokens, dout, vocab, dtable] {
    cpu::embedding_backward(positions, dim, tokens, dout, 0, vocab, dtable);
  });
}

RunnableOp loss_runner(const Op& op) {
  const int64_t rows = op.shape.m, vocab = std::max<int64_t>(op.shape.n, 1);
  auto buffers = std::make_shared<Buffers>();
  const float* logits = buffers->add(rows * vocab, 1);
  const int64_t* targets = buffers->add_indices(rows, vocab);
  float* loss = buffers->add_zeros(rows);
  float* lse = buffers->add_zeros(rows);
  if (op.pass == Pass::kForward) {
    return finish(buffers, [buffers, rows, vocab, logits, targets, loss, lse] {
      cpu::cross_entropy_forward(rows, vocab, logits, targets, loss, lse);
    });
  }
  cpu::cross_entropy_forward(rows, vocab, logits, targets, loss, lse);
  float* dlogits = buffers->add_zeros(rows * vocab);
  const float dloss = 1.0f / static_cast<float>(std::max<int64_t>(rows, 1));
  return finish(buffers, [buffers, rows, vocab, logits, targets, lse, dloss, dlogits] {
    cpu::cross_entropy_backward(rows, vocab, logits, targets, lse, dloss, dlogits);
  });
}

// A memory-bound kernel without a CPU kernel of its own: a copy moving as many bytes.
RunnableOp copy_runner(const Op& op) {
  const int64_t count = std::max<int64_t>((op.bytes_read + op.bytes_written) / 2 / 4, 1);
  auto buffers = std::make_shared<Buffers>();
  const float* in = buffers->add(count, 1);
  float* out = buffers->add_zeros(count);
  return finish(buffers, [buffers, count, in, out] { std::copy(in, in + count, out); });
}

RunnableOp comm_runner(const Op& op, const CommBinding& binding) {
  auto buffers = std::make_shared<Buffers>();
  rt::Communicator* comm = binding.comm;
  if (comm == nullptr) return finish(buffers, [] {});
  DHELIX_CHECK_MSG(comm->size() == op.group_size,
                   op.id + ": communicator of " + std::to_string(comm->size()) + " ranks");
  const int64_t n = comm->size();
  const int64_t total = comm_floats(op);
  const int64_t block = std::max<int64_t>(total / n, 1);
  switch (op.kind) {
    case OpKind::kAllGather: {
      const float* in = buffers->add_zeros(block);
      float* out = buffers->add_zeros(block * n);
      return finish(buffers, [buffers, comm, in, block, out] { comm->all_gather(in, block, out); });
    }
    case OpKind::kReduceScatter: {
      const float* in = buffers->add_zeros(block * n);
      float* out = buffers->add_zeros(block);
      return finish(buffers,
                    [buffers, comm, in, block, out] { comm->reduce_scatter_sum(in, block, out); });
    }
    case OpKind::kAllReduce: {
      // Zeros: the sum is written back in place, so any other value would grow run by run.
      float* inout = buffers->add_zeros(total);
      return finish(buffers, [buffers, comm, inout, total] { comm->all_reduce_sum(inout, total); });
    }
    case OpKind::kSendRecv: {
      // The runtime's own ring step (runtime/comm/communicator.h): to the next member, from
      // the previous one.
      const float* out = buffers->add_zeros(total);
      float* in = buffers->add_zeros(total);
      return finish(buffers,
                    [buffers, comm, out, in, total] { comm->ring_exchange(out, in, total); });
    }
    case OpKind::kAllToAll: {
      // The runtime's expert dispatch: counts first, then the blocks (all_to_all_v).
      const float* out = buffers->add_zeros(block * n);
      float* in = buffers->add_zeros(block * n);
      return finish(buffers, [buffers, comm, out, in, block, n] {
        const std::vector<int64_t> counts(static_cast<size_t>(n), block);
        std::vector<int64_t> received(static_cast<size_t>(n));
        comm->all_to_all_v(out, counts.data(), 1, in, received.data(), block * n);
      });
    }
    default:
      DHELIX_CHECK_MSG(false, std::string("not a communication op: ") + op_kind_name(op.kind));
  }
  return finish(buffers, [] {});
}

}  // namespace

int64_t comm_floats(const Op& op) { return std::max<int64_t>(op.comm_bytes / 4, 1); }

RunnableOp make_runnable_op(const Op& op, const CommBinding& comm) {
  if (is_communication(op.kind)) return comm_runner(op, comm);
  switch (op.kind) {
    case OpKind::kGemm:
    case OpKind::kGroupedGemm:
    case OpKind::kHead:
    case OpKind::kRouter:
      return gemm_runner(op);
    case OpKind::kAttention:
      return attention_runner(op);
    case OpKind::kNorm:
      return norm_runner(op);
    case OpKind::kActivation:
      return op.variant == "swiglu" ? swiglu_runner(op) : copy_runner(op);
    case OpKind::kBiasDropoutAdd:
      return add_runner(op);
    case OpKind::kEmbedding:
      return embedding_runner(op);
    case OpKind::kLoss:
      return loss_runner(op);
    default:
      return copy_runner(op);
  }
}

}  // namespace dhelix::cpu_profile
