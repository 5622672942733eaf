// Gathering, printing and recording every rank's MemoryReport (memory_record.h).
#include "runtime/train/memory_record.h"

#include <mpi.h>

#include <fmt/format.h>

#include "lib/error.h"
#include "runtime/comm/mpi_environment.h"

namespace dhelix::rt {
namespace {

// stage, the seven sizes, three bytes per parameter, shards, the experts' optimizer bytes
// and shards, buffer count.
constexpr size_t kHeader = 15;
constexpr size_t kBufferFields = 4;  // offset, bytes, first and last instruction

double mib(int64_t bytes) { return static_cast<double>(bytes) / static_cast<double>(1 << 20); }

}  // namespace

std::vector<int64_t> flatten_memory(int64_t stage, const MemoryReport& r) {
  std::vector<int64_t> flat = {stage,
                               r.weight_bytes,
                               r.gradient_bytes,
                               r.optimizer_bytes,
                               r.activation_arena_bytes,
                               r.activation_live_peak_bytes,
                               r.activation_counted_peak_bytes,
                               r.activation_element_bytes,
                               r.weight_bytes_per_parameter,
                               r.gradient_bytes_per_parameter,
                               r.optimizer_bytes_per_parameter,
                               r.optimizer_shards,
                               r.expert_optimizer_bytes,
                               r.expert_optimizer_shards,
                               static_cast<int64_t>(r.buffers.size())};
  for (const ArenaBufferRecord& b : r.buffers) {
    flat.insert(flat.end(), {b.offset, b.bytes, b.first_instruction, b.last_instruction});
  }
  return flat;
}

RankMemory unflatten_memory(int64_t rank, const int64_t* flat, size_t size) {
  DHELIX_CHECK(size >= kHeader);
  RankMemory m;
  m.rank = rank;
  m.stage = flat[0];
  MemoryReport& r = m.report;
  r.weight_bytes = flat[1];
  r.gradient_bytes = flat[2];
  r.optimizer_bytes = flat[3];
  r.activation_arena_bytes = flat[4];
  r.activation_live_peak_bytes = flat[5];
  r.activation_counted_peak_bytes = flat[6];
  r.activation_element_bytes = flat[7];
  r.weight_bytes_per_parameter = flat[8];
  r.gradient_bytes_per_parameter = flat[9];
  r.optimizer_bytes_per_parameter = flat[10];
  r.optimizer_shards = flat[11];
  r.expert_optimizer_bytes = flat[12];
  r.expert_optimizer_shards = flat[13];
  const auto buffers = static_cast<size_t>(flat[14]);
  DHELIX_CHECK(size == kHeader + kBufferFields * buffers);
  r.buffers.resize(buffers);
  for (size_t i = 0; i < buffers; ++i) {
    const int64_t* b = flat + kHeader + kBufferFields * i;
    r.buffers[i] = {"", b[0], b[1], b[2], b[3]};
  }
  return m;
}

std::vector<RankMemory> gather_rank_memory(int64_t rank, int64_t stage,
                                           const MemoryReport& report) {
  int size = 1;
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  const std::vector<int64_t> flat = flatten_memory(stage, report);
  const int count = static_cast<int>(flat.size());
  std::vector<int> counts(static_cast<size_t>(size)), offsets(static_cast<size_t>(size));
  check_mpi(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD),
            "MPI_Gather");
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    offsets[r] = static_cast<int>(total);
    total += counts[r];
  }
  // Four integers per buffer: a rank would need half a billion buffers to pass the limit.
  DHELIX_CHECK(rank != 0 || total <= INT32_MAX);
  std::vector<int64_t> all(rank == 0 ? static_cast<size_t>(total) : 0);
  check_mpi(MPI_Gatherv(flat.data(), count, MPI_INT64_T, all.data(), counts.data(), offsets.data(),
                        MPI_INT64_T, 0, MPI_COMM_WORLD),
            "MPI_Gatherv");
  std::vector<RankMemory> ranks;
  if (rank != 0) return ranks;
  for (size_t r = 0; r < counts.size(); ++r) {
    ranks.push_back(unflatten_memory(static_cast<int64_t>(r), all.data() + offsets[r],
                                     static_cast<size_t>(counts[r])));
  }
  return ranks;
}

std::string memory_report_lines(const std::vector<RankMemory>& ranks) {
  std::string out;
  for (const RankMemory& m : ranks) {
    const MemoryReport& r = m.report;
    out += fmt::format(
        "memory rank {} (stage {}): weights {:.3f} MiB, gradients {:.3f} MiB, optimizer states "
        "{:.3f} MiB, activations {:.3f} MiB peak (live peak {:.3f} MiB, of which the plan "
        "counts {:.3f} MiB)\n",
        m.rank, m.stage, mib(r.weight_bytes), mib(r.gradient_bytes), mib(r.optimizer_bytes),
        mib(r.activation_arena_bytes), mib(r.activation_live_peak_bytes),
        mib(r.activation_counted_peak_bytes));
  }
  return out;
}

OrderedJson memory_record_json(const RankMemory& m) {
  const MemoryReport& r = m.report;
  return {{"rank", m.rank},
          {"stage", m.stage},
          {"weight_bytes", r.weight_bytes},
          {"gradient_bytes", r.gradient_bytes},
          {"optimizer_bytes", r.optimizer_bytes},
          {"activation_arena_bytes", r.activation_arena_bytes},
          {"activation_live_peak_bytes", r.activation_live_peak_bytes},
          {"activation_counted_peak_bytes", r.activation_counted_peak_bytes},
          {"activation_element_bytes", r.activation_element_bytes},
          {"weight_bytes_per_parameter", r.weight_bytes_per_parameter},
          {"gradient_bytes_per_parameter", r.gradient_bytes_per_parameter},
          {"optimizer_bytes_per_parameter", r.optimizer_bytes_per_parameter},
          {"optimizer_shards", r.optimizer_shards},
          {"expert_optimizer_bytes", r.expert_optimizer_bytes},
          {"expert_optimizer_shards", r.expert_optimizer_shards},
          {"buffers", static_cast<int64_t>(r.buffers.size())}};
}

}  // namespace dhelix::rt
