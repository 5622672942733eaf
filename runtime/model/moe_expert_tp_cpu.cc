// Expert tensor parallelism of the CPU MoE layer (lib/dag_builder_moe.cc's etp_allgather
// and etp_reduce_scatter, over the TP group; etp = tp > 1): every TP member holds 1/etp of
// each local expert's FFN columns (fc1's gate and up rows, fc2's columns), so each must see
// the rows of every TP member's tokens.
//
//   etp_allgather        every member sends its own rows (expert-major, one chunk per local
//                        expert) to every member: an all_to_all_v over TP whose blocks are
//                        copies of the same rows (the counts differ per member with the
//                        routing, which a fixed-size all_gather could not carry); the
//                        arrival is regrouped expert-major for the grouped GEMMs.
//   etp_reduce_scatter   fc2 leaves each gathered row's partial output (its 1/etp of the
//                        FFN) grouped by the member the row came from; an all_to_all_v over
//                        TP returns each member its rows' partials from everyone, summed in
//                        TP rank order (bitwise the same in every run, whatever arrives first).
//
// In backward the same two exchanges move the output gradient (gather) and the partial
// input gradients (reduce-scatter). Each reduce-scatter then hands its sum on: regrouped EP
// source-major for the combine (ep > 1), or read as is (ep = 1).

#include <fmt/format.h>

#include <algorithm>

#include "lib/error.h"
#include "runtime/model/moe_layers_cpu_internal.h"
#include "runtime/model/stage_model_internal.h"

namespace dhelix::rt {
namespace moe_detail {

void regroup(int64_t sources, int64_t local, const std::vector<int64_t>& rows, int64_t h,
             const float* from, float* to, bool to_expert) {
  // Row offsets of each (src, e) block in both orders.
  std::vector<int64_t> src_at(to_size(sources * local)), exp_at(to_size(sources * local));
  int64_t at = 0;
  for (int64_t i = 0; i < sources * local; ++i) {
    src_at[to_size(i)] = at;
    at += rows[to_size(i)];
  }
  at = 0;
  for (int64_t e = 0; e < local; ++e) {
    for (int64_t src = 0; src < sources; ++src) {
      exp_at[to_size(src * local + e)] = at;
      at += rows[to_size(src * local + e)];
    }
  }
  for (int64_t i = 0; i < sources * local; ++i) {
    const int64_t n = rows[to_size(i)] * h;
    const float* in = from + (to_expert ? src_at : exp_at)[to_size(i)] * h;
    std::copy(in, in + n, to + (to_expert ? exp_at : src_at)[to_size(i)] * h);
  }
}

std::vector<int64_t> rows_of(const std::vector<int64_t>& counts, int64_t h) {
  std::vector<int64_t> rows(counts.size());
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = counts[i] / h;
  return rows;
}

}  // namespace moe_detail

using moe_detail::rows_of;
using moe_detail::to_size;

std::optional<BoundOp> MoeLayersCpu::bind_expert_tp(const std::string& op, State& s) {
  if (etp_ == 1) {
    throw Error(
        ErrorCode::kInvalidInput,
        fmt::format("StageModel: op {} does not occur with expert tensor parallelism 1", op));
  }
  const int64_t h = shape_.hidden, etp = etp_, ep = ep_, local = local_;
  const int64_t gathered_capacity = etp * ep * shape_.tokens * shape_.top_k * h;
  auto exchange = [&](const float* in, const std::vector<int64_t>& send, float* out,
                      std::vector<int64_t>& recv) {
    BoundOp bound;
    CollectiveRequest request =
        model_detail::collective(CollectiveKind::kAllToAllV, in, out, gathered_capacity);
    request.send_counts = send.data();
    request.recv_counts = recv.data();
    request.chunks = local;
    bound.collective = request;
    return bound;
  };
  // Before a gather: `own` (the own rows, expert-major) copied once per TP member.
  auto replicate = [&s, h, etp, local](const float* own, const ArenaFloats& to) {
    int64_t n = 0;
    for (int64_t e = 0; e < local; ++e) n += s.local_rows[to_size(e)] * h;
    for (int64_t t = 0; t < etp; ++t) {
      std::copy(own, own + n, to.data() + t * n);
      for (int64_t e = 0; e < local; ++e) {
        s.tp_send_counts[to_size(t * local + e)] = s.local_rows[to_size(e)] * h;
      }
    }
  };
  // After a reduce-scatter: the members' partials of the own rows (member-major, each block
  // the own rows expert-major) summed in TP rank order into `sum`, then EP source-major
  // into `src` when the combine (or the backward dispatch) follows.
  auto reduce = [&s, h, etp, ep, local](const ArenaFloats& partials, float* sum, float* src) {
    int64_t n = 0;
    for (int64_t e = 0; e < local; ++e) n += s.local_rows[to_size(e)] * h;
    std::copy(partials.data(), partials.data() + n, sum);
    for (int64_t t = 1; t < etp; ++t) {
      const float* block = partials.data() + t * n;
      for (int64_t i = 0; i < n; ++i) sum[i] += block[i];
    }
    if (ep > 1) moe_detail::regroup(ep, local, rows_of(s.recv_counts, h), h, sum, src, false);
  };

  if (op == "fwd.etp_allgather") {
    BoundOp bound =
        exchange(s.tp_send.data(), s.tp_send_counts, s.tp_recv.data(), s.tp_recv_counts);
    bound.before_collective = [&s, replicate](const auto&) { replicate(s.own_in, s.tp_send); };
    bound.after_collective = [&s, h, etp, local](const auto&) {
      const std::vector<int64_t> rows = rows_of(s.tp_recv_counts, h);
      for (int64_t e = 0; e < local; ++e) {
        s.gemm_rows[to_size(e)] = 0;
        for (int64_t t = 0; t < etp; ++t) s.gemm_rows[to_size(e)] += rows[to_size(t * local + e)];
      }
      moe_detail::regroup(etp, local, rows, h, s.tp_recv.data(), s.gathered.data(), true);
    };
    return bound;
  }
  if (op == "fwd.etp_reduce_scatter") {  // grouped_fc2 left tp_send member-major
    BoundOp bound =
        exchange(s.tp_send.data(), s.tp_recv_counts, s.tp_recv.data(), s.tp_scratch_counts);
    bound.after_collective = [&s, reduce](const auto&) {
      reduce(s.tp_recv, s.expert_own.data(), s.expert_out_src.data());
    };
    return bound;
  }
  if (op == "bwd.etp_allgather") {
    BoundOp bound =
        exchange(s.d_tp_send.data(), s.tp_send_counts, s.d_tp_recv.data(), s.tp_scratch_counts);
    bound.before_collective = [&s, replicate](const auto&) { replicate(s.own_grad, s.d_tp_send); };
    bound.after_collective = [&s, h, etp, local](const auto&) {
      moe_detail::regroup(etp, local, rows_of(s.tp_recv_counts, h), h, s.d_tp_recv.data(),
                          s.d_gathered.data(), true);
    };
    return bound;
  }
  if (op == "bwd.etp_reduce_scatter") {  // grouped_fc1_dgrad left d_tp_send member-major
    BoundOp bound =
        exchange(s.d_tp_send.data(), s.tp_recv_counts, s.d_tp_recv.data(), s.tp_scratch_counts);
    bound.after_collective = [&s, reduce](const auto&) {
      reduce(s.d_tp_recv, s.d_expert_own.data(), s.d_expert_in_src.data());
    };
    return bound;
  }
  return std::nullopt;
}

}  // namespace dhelix::rt
