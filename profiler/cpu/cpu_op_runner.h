#pragma once
// Turns an Op of a job's layer DAGs (kind + per-rank shape) into a closure that runs the
// CPU backend's kernel for it (runtime/cpu/kernels_cpu.h) on fp32 buffers allocated and
// filled once, so that timing the closure times the kernel alone.
//
// Kind -> kernel (shapes as lib/dag_builder_ops.cc fills them):
//   gemm, head, router        cpu::gemm, C[m, n] = A[m, k] B[k, n]
//   grouped_gemm              batch such GEMMs
//   attention fwd / bwd       attention_forward / attention_backward, seq = q_len
//   norm fwd / bwd            rmsnorm_forward / rmsnorm_backward over m rows of n
//   activation (swiglu)       swiglu_forward / swiglu_backward, m rows, n = ffn width
//   bias_dropout_add          add_tensors over m * n elements
//   embedding fwd / bwd       embedding_forward / embedding_backward: m positions, n wide,
//                             k vocabulary rows
//   loss fwd / bwd            cross_entropy_forward / cross_entropy_backward: m rows, n vocab
//   anything else compute     a copy of (bytes_read + bytes_written) / 2 bytes (memory bound)
//   all_gather                comm_bytes / 4 floats gathered (each member sends 1/n)
//   reduce_scatter            comm_bytes / 4 floats reduced, 1/n received
//   all_reduce                comm_bytes / 4 floats
//   send_recv                 comm_bytes / 4 floats sent to the next member of the group and
//                             received from the previous one (a ring step)
//   all_to_all                comm_bytes / 4 floats split into n blocks, exchanged by
//                             Communicator::all_to_all_v (counts first), as the run does
// Every kernel runs in fp32 whatever the op's dtype (the CPU backend's only type); a
// communication op moves its byte count as fp32 values.

#include <cstdint>
#include <functional>
#include <vector>

#include "lib/op_catalogue.h"
#include "runtime/comm/communicator.h"

namespace dhelix::cpu_profile {

/// The communicator a communication op runs on, and the world rank of each member (by
/// group rank) for point-to-point peers. comm null: this rank is outside the measured
/// group, and the op does nothing here.
struct CommBinding {
  rt::Communicator* comm = nullptr;
  std::vector<int64_t> world_ranks;
};

/// A runnable op: `run` executes the kernel or collective once on buffers it owns.
struct RunnableOp {
  std::function<void()> run;
  int64_t buffer_bytes = 0;  ///< bytes of the buffers allocated for it
};

/// The runnable for `op` (see the file comment). Communication ops run on `comm`
/// (DHELIX_CHECKs that a bound communicator's size equals op.group_size); compute ops
/// ignore it. Throws Error(kUnsupported) for attention whose heads are not a multiple of
/// its kv_heads (the kernels' GQA layout).
RunnableOp make_runnable_op(const Op& op, const CommBinding& comm);

/// Elements moved by communication op `op` as fp32 values: comm_bytes / 4.
int64_t comm_floats(const Op& op);

}  // namespace dhelix::cpu_profile
