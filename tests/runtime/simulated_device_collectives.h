#pragma once
// The device's collectives (runtime/cuda/nccl_communicator.h, as device_executor.cc calls
// them) applied by a test to the CollectiveRequests of a group's members in one process,
// for host checks of layers written for the device (tests/runtime/moe_layers_padded_test.cc):
//
//   all_to_all_v    padded: count is out's capacity, `size` equal blocks of count / size;
//                   block j of member i becomes block i of member j, and member i's counts
//                   send_counts[j chunks, +chunks) arrive at member j's recv_counts[i chunks,
//                   +chunks). Whole blocks travel, whatever the counts say.
//   all_gather      out[size count] = every member's in[count], member order
//   reduce_scatter  out[count] of member i = sum over members (member order) of in[i count, +count)
//   all_reduce      out[count] in place, summed in member order
//   ring_exchange   out of member i = in of member i - 1 (mod size)
//
// Any group size; every member's input is read before any output is written. fp32 only.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/model/stage_model.h"

namespace dhelix::test {

/// Runs one collective on `members` (group order) with the device's semantics above.
inline void simulate_collective(const std::vector<const rt::CollectiveRequest*>& members) {
  const rt::CollectiveRequest& first = *members.front();
  const auto size = static_cast<int64_t>(members.size());
  const int64_t count = first.count;
  for (const rt::CollectiveRequest* r : members) {
    ASSERT_EQ(r->kind, first.kind);
    ASSERT_EQ(r->count, count);
    ASSERT_EQ(r->chunks, first.chunks);
  }
  // Every member's input first (a collective reads all inputs before writing any output).
  const int64_t in_count = first.kind == rt::CollectiveKind::kAllGather       ? count
                           : first.kind == rt::CollectiveKind::kReduceScatter ? size * count
                                                                              : count;
  std::vector<std::vector<float>> in;
  for (const rt::CollectiveRequest* r : members) {
    const float* from = first.kind == rt::CollectiveKind::kAllReduce ? r->out_f32() : r->in_f32();
    in.emplace_back(from, from + in_count);
  }
  auto out = [&](int64_t member) { return members[static_cast<size_t>(member)]->out_f32(); };
  switch (first.kind) {
    case rt::CollectiveKind::kAllToAllV: {
      // count is out's capacity in `size` equal blocks; block j goes to member j, whose
      // block i it becomes, and the chunk counts travel the same way (device_executor.cc).
      ASSERT_EQ(count % size, 0) << "all_to_all_v: the capacity is not equal blocks";
      const int64_t block = count / size, chunks = first.chunks;
      std::vector<std::vector<int64_t>> sent;
      for (const rt::CollectiveRequest* r : members) {
        ASSERT_NE(r->in, r->out);
        sent.emplace_back(r->send_counts, r->send_counts + size * chunks);
      }
      for (int64_t i = 0; i < size; ++i) {
        for (int64_t j = 0; j < size; ++j) {
          std::copy_n(in[static_cast<size_t>(j)].begin() + i * block, block, out(i) + j * block);
          for (int64_t c = 0; c < chunks; ++c) {
            members[static_cast<size_t>(i)]->recv_counts[j * chunks + c] =
                sent[static_cast<size_t>(j)][static_cast<size_t>(i * chunks + c)];
          }
        }
      }
      return;
    }
    case rt::CollectiveKind::kAllGather:
      for (int64_t i = 0; i < size; ++i) {
        for (int64_t j = 0; j < size; ++j) {
          std::copy_n(in[static_cast<size_t>(j)].begin(), count, out(i) + j * count);
        }
      }
      return;
    case rt::CollectiveKind::kReduceScatter:
    case rt::CollectiveKind::kAllReduce: {
      const bool scatter = first.kind == rt::CollectiveKind::kReduceScatter;
      for (int64_t i = 0; i < size; ++i) {
        const int64_t offset = scatter ? i * count : 0;
        for (int64_t e = 0; e < count; ++e) {
          float sum = in[0][static_cast<size_t>(offset + e)];  // member order
          for (int64_t j = 1; j < size; ++j)
            sum += in[static_cast<size_t>(j)][static_cast<size_t>(offset + e)];
          out(i)[e] = sum;
        }
      }
      return;
    }
    case rt::CollectiveKind::kRingExchange:
      for (int64_t i = 0; i < size; ++i) {
        std::copy_n(in[static_cast<size_t>((i + size - 1) % size)].begin(), count, out(i));
      }
      return;
  }
}

}  // namespace dhelix::test
