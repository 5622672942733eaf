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
// The host's all_to_all_v (runtime/comm/communicator.h: blocks packed at the offsets the
// counts give, what the CPU layers' exchanges follow) is the other AllToAll mode, for
// checking the harness itself on the CPU runtime's layers.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "runtime/model/stage_model.h"

namespace dhelix::test {

/// Which all_to_all_v: the device's padded blocks, or the host communicators' packed ones.
enum class AllToAll { kDevicePadded, kHostPacked };

namespace collectives_detail {

inline size_t at(int64_t i) { return static_cast<size_t>(i); }

// all_to_all_v in `mode`; every member's counts and input are read before any output.
inline void all_to_all(const std::vector<const rt::CollectiveRequest*>& members, AllToAll mode) {
  const auto size = static_cast<int64_t>(members.size());
  const int64_t count = members.front()->count, chunks = members.front()->chunks;
  std::vector<std::vector<int64_t>> sent;
  std::vector<std::vector<float>> in;
  for (const rt::CollectiveRequest* r : members) {
    ASSERT_NE(r->in, r->out);
    sent.emplace_back(r->send_counts, r->send_counts + size * chunks);
    int64_t total = 0;
    for (int64_t n : sent.back()) total += n;
    // Padded: the whole input of `size` blocks travels; packed: the counted elements.
    const int64_t length = mode == AllToAll::kDevicePadded ? count : total;
    in.emplace_back(r->in_f32(), r->in_f32() + length);
  }
  // Sender j's block for member i: where it starts in j's input, and its length.
  auto block = [&](int64_t j, int64_t i) -> std::pair<int64_t, int64_t> {
    if (mode == AllToAll::kDevicePadded) return {i * (count / size), count / size};
    int64_t start = 0, length = 0;
    for (int64_t m = 0; m <= i; ++m) {
      int64_t n = 0;
      for (int64_t c = 0; c < chunks; ++c) n += sent[at(j)][at(m * chunks + c)];
      if (m < i) start += n;
      length = n;
    }
    return {start, length};
  };
  if (mode == AllToAll::kDevicePadded) {
    ASSERT_EQ(count % size, 0) << "all_to_all_v: the capacity is not equal blocks";
  }
  for (int64_t i = 0; i < size; ++i) {
    float* out = members[at(i)]->out_f32();
    int64_t written = 0;
    for (int64_t j = 0; j < size; ++j) {
      const auto [start, length] = block(j, i);
      // Padded: block j of out is sender j's; packed: the senders' blocks back to back.
      const int64_t to = mode == AllToAll::kDevicePadded ? j * length : written;
      ASSERT_LE(to + length, count) << "all_to_all_v: more than out's capacity";
      std::copy_n(in[at(j)].begin() + start, length, out + to);
      written += length;
      for (int64_t c = 0; c < chunks; ++c) {
        members[at(i)]->recv_counts[j * chunks + c] = sent[at(j)][at(i * chunks + c)];
      }
    }
  }
}

}  // namespace collectives_detail

/// Runs one collective on `members` (group order) with the semantics above.
inline void simulate_collective(const std::vector<const rt::CollectiveRequest*>& members,
                                AllToAll all_to_all = AllToAll::kDevicePadded) {
  const rt::CollectiveRequest& first = *members.front();
  const auto size = static_cast<int64_t>(members.size());
  const int64_t count = first.count;
  for (const rt::CollectiveRequest* r : members) {
    ASSERT_EQ(r->kind, first.kind);
    ASSERT_EQ(r->count, count);
    ASSERT_EQ(r->chunks, first.chunks);
  }
  if (first.kind == rt::CollectiveKind::kAllToAllV) {
    collectives_detail::all_to_all(members, all_to_all);
    return;
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
    case rt::CollectiveKind::kAllToAllV:
      return;  // above
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
