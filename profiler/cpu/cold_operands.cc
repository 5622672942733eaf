#include "profiler/cpu/cold_operands.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace dhelix::cpu_profile {

namespace {

// One cache of cpu0 as sysfs describes it (/sys/devices/system/cpu/cpu0/cache/indexN).
struct SysfsCache {
  int level = 0;
  int64_t bytes = 0;
};

std::optional<SysfsCache> sysfs_cache(int index) {
  const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
  std::ifstream level_file(dir + "/level"), size_file(dir + "/size");
  SysfsCache cache;
  std::string size;  // "32768K"
  if (!(level_file >> cache.level) || !(size_file >> size) || size.empty()) return std::nullopt;
  const char unit = size.back();
  cache.bytes = std::atoll(size.c_str());
  if (unit == 'K') cache.bytes <<= 10;
  if (unit == 'M') cache.bytes <<= 20;
  return cache;
}

}  // namespace

int64_t host_last_level_cache_bytes() {
  // sysfs first: it gives the share this machine sees (a VM's 32 MiB), where glibc's
  // sysconf(_SC_LEVEL3_CACHE_SIZE) reads CPUID and can report the whole chip's (320 MiB).
  SysfsCache last;
  for (int index = 0; index < 16; ++index) {
    const std::optional<SysfsCache> cache = sysfs_cache(index);
    if (cache && cache->level >= last.level && cache->bytes > 0) last = *cache;
  }
  if (last.bytes > 0) return last.bytes;
#ifdef _SC_LEVEL3_CACHE_SIZE
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) return l3;
#endif
  return int64_t{32} << 20;
}

bool reads_parameters(OpKind kind) {
  switch (kind) {
    case OpKind::kGemm:
    case OpKind::kGroupedGemm:
    case OpKind::kRouter:
    case OpKind::kEmbedding:
    case OpKind::kHead:
      return true;
    default:
      return false;
  }
}

int64_t cold_copies(int64_t buffer_bytes, int64_t cold_bytes) {
  if (cold_bytes <= 0 || buffer_bytes <= 0) return 1;
  // The smallest count whose buffers together exceed cold_bytes.
  return std::min(kMaxColdCopies, cold_bytes / buffer_bytes + 1);
}

RunnableOp cycle_runnables(std::vector<RunnableOp> copies) {
  auto runs = std::make_shared<std::vector<std::function<void()>>>();
  int64_t bytes = 0;
  for (RunnableOp& copy : copies) {
    bytes += copy.buffer_bytes;
    runs->push_back(std::move(copy.run));
  }
  auto next = std::make_shared<size_t>(0);
  return {.run =
              [runs, next] {
                (*runs)[*next]();
                *next = (*next + 1) % runs->size();
              },
          .buffer_bytes = bytes};
}

RunnableOp make_cold_runnable_op(const Op& op, const CommBinding& comm, int64_t cold_bytes) {
  RunnableOp first = make_runnable_op(op, comm);
  if (!reads_parameters(op.kind)) return first;
  const int64_t copies = cold_copies(first.buffer_bytes, cold_bytes);
  if (copies == 1) return first;
  std::vector<RunnableOp> all;
  all.reserve(static_cast<size_t>(copies));
  all.push_back(std::move(first));
  while (static_cast<int64_t>(all.size()) < copies) all.push_back(make_runnable_op(op, comm));
  return cycle_runnables(std::move(all));
}

}  // namespace dhelix::cpu_profile
