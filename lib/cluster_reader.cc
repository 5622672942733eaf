#include "lib/cluster_reader.h"

#include <filesystem>

#include <fmt/format.h>

#include "lib/cluster_presets.h"
#include "lib/file_kind.h"

// A cluster file either describes everything or starts from a preset ("base") and
// overrides single figures; with a base every field is optional. Unknown keys are errors.

namespace dhelix {
namespace {

constexpr int kClusterSchemaMajor = 1;
constexpr const char* kClusterSchemaVersion = "1.0.0";

const std::vector<std::string> kLinkKindNames = {"nvlink", "pcie", "infiniband", "ethernet"};

constexpr RealRange kPositiveReal = {.min = 0.0, .min_exclusive = true};
constexpr RealRange kFraction = {.min = 0.0, .max = 1.0, .min_exclusive = true};
// Node and GPU counts are multiplied together (world sizes): 2^20 each keeps every product
// far from int64 overflow, which a num_nodes near 2^63 reached (found while fuzzing).
constexpr IntRange kNodeCount = {.min = 0, .max = int64_t{1} << 20};
constexpr IntRange kPerNodeCount = {.min = 1, .max = int64_t{1} << 20};

LinkKind parse_link_kind(const std::string& name) {
  if (name == "nvlink") return LinkKind::kNvLink;
  if (name == "infiniband") return LinkKind::kInfiniBand;
  if (name == "ethernet") return LinkKind::kEthernet;
  return LinkKind::kPcie;
}

// Overwrites `target` with the field when present; Need follows from whether a base gave
// a value already.
void read_real(ObjectReader& reader, const std::string& key, Need need, RealRange range,
               double& target) {
  if (auto value = reader.real(key, need, range)) target = *value;
}

void read_integer(ObjectReader& reader, const std::string& key, Need need, IntRange range,
                  int64_t& target) {
  if (auto value = reader.integer(key, need, range)) target = *value;
}

void read_gpu(ObjectReader& root, Need need, GpuSpec& gpu) {
  std::optional<ObjectReader> reader = root.object("gpu", need);
  if (!reader) return;
  if (auto name = reader->string("name", need)) gpu.name = *name;
  read_real(*reader, "peak_bf16_tflops", need, kPositiveReal, gpu.peak_bf16_tflops);
  read_integer(*reader, "memory_bytes", need, {.min = 1}, gpu.memory_bytes);
  read_real(*reader, "memory_bandwidth_gbps", need, kPositiveReal, gpu.memory_bandwidth_gbps);
  read_integer(*reader, "sm_count", need, {.min = 1}, gpu.sm_count);
  read_real(*reader, "gemm_efficiency", Need::kOptional, kFraction, gpu.gemm_efficiency);
  read_real(*reader, "attention_efficiency", Need::kOptional, kFraction, gpu.attention_efficiency);
  read_real(*reader, "memory_efficiency", Need::kOptional, kFraction, gpu.memory_efficiency);
  if (auto source = reader->string("source", Need::kOptional)) gpu.source = *source;
  reader->finish();
}

void read_link(ObjectReader& root, const std::string& key, Need need, LinkSpec& link) {
  std::optional<ObjectReader> reader = root.object(key, need);
  if (!reader) return;
  if (auto kind = reader->string("kind", need, kLinkKindNames)) link.kind = parse_link_kind(*kind);
  read_real(*reader, "bandwidth_gbps", need, kPositiveReal, link.bandwidth_gbps);
  read_real(*reader, "bus_bandwidth_gbps", need, kPositiveReal, link.bus_bandwidth_gbps);
  read_real(*reader, "latency_us", Need::kOptional, {.min = 0.0}, link.latency_us);
  if (auto source = reader->string("source", Need::kOptional)) link.source = *source;
  reader->finish();
}

void check_nccl_sms(const ClusterSpec& cluster, const ObjectReader& root, ProblemList& problems) {
  if (cluster.gpu.sm_count <= 0) return;
  for (auto [key, sms] : {std::pair{"nccl_sms_intra_node", cluster.nccl_sms_intra_node},
                          std::pair{"nccl_sms_inter_node", cluster.nccl_sms_inter_node}}) {
    if (sms >= cluster.gpu.sm_count) {
      problems.add(root.file(), root.pointer_of(key), std::to_string(sms),
                   fmt::format("must be less than the GPU's sm_count = {}", cluster.gpu.sm_count));
    }
  }
}

OrderedJson link_to_json(const LinkSpec& link) {
  OrderedJson json;
  json["kind"] = link_kind_name(link.kind);
  json["bandwidth_gbps"] = link.bandwidth_gbps;
  json["bus_bandwidth_gbps"] = link.bus_bandwidth_gbps;
  json["latency_us"] = link.latency_us;
  json["source"] = link.source;
  return json;
}

}  // namespace

const char* link_kind_name(LinkKind kind) {
  switch (kind) {
    case LinkKind::kNvLink:
      return "nvlink";
    case LinkKind::kPcie:
      return "pcie";
    case LinkKind::kInfiniBand:
      return "infiniband";
    case LinkKind::kEthernet:
      return "ethernet";
  }
  return "?";
}

ClusterSpec cluster_from_json(const Json& json, const std::string& file, ProblemList& problems,
                              const std::string& pointer) {
  ClusterSpec cluster;
  ObjectReader root(json, file, pointer, problems);
  if (!root.is_object()) return cluster;
  check_schema_version(root, kClusterSchemaMajor);
  root.allow("$schema");
  root.string("description", Need::kOptional);
  std::optional<std::string> base = root.string("base", Need::kOptional, cluster_preset_names());
  if (base) cluster = cluster_preset(*base);
  // With a base every figure is already set; without one the hardware must be described.
  const Need need = base || root.has("base") ? Need::kOptional : Need::kRequired;
  if (auto name = root.string("name", Need::kRequired)) cluster.name = *name;
  cluster.source_file = file;
  read_gpu(root, need, cluster.gpu);
  read_integer(root, "gpus_per_node", Need::kOptional, kPerNodeCount, cluster.gpus_per_node);
  read_integer(root, "num_nodes", Need::kOptional, kNodeCount, cluster.num_nodes);
  read_link(root, "intra_node", need, cluster.intra_node);
  read_link(root, "inter_node", need, cluster.inter_node);
  read_integer(root, "nics_per_node", Need::kOptional, kPerNodeCount, cluster.nics_per_node);
  read_integer(root, "nccl_sms_intra_node", Need::kOptional, {.min = 0},
               cluster.nccl_sms_intra_node);
  read_integer(root, "nccl_sms_inter_node", Need::kOptional, {.min = 0},
               cluster.nccl_sms_inter_node);
  read_real(root, "nccl_memory_traffic_factor", Need::kOptional, {.min = 0.0},
            cluster.nccl_memory_traffic_factor);
  root.finish();
  check_nccl_sms(cluster, root, problems);
  return cluster;
}

ClusterSpec read_cluster(const std::string& preset_or_path) {
  if (std::optional<ClusterSpec> preset = find_cluster_preset(preset_or_path)) return *preset;
  // A bare word that is no file is a misspelt preset, not a missing file.
  const bool looks_like_name = preset_or_path.find('/') == std::string::npos &&
                               preset_or_path.find('.') == std::string::npos;
  std::error_code ignored;  // a name the file system refuses (too long) is no file
  if (looks_like_name && !std::filesystem::exists(preset_or_path, ignored)) {
    return cluster_preset(preset_or_path);  // throws with "did you mean"
  }
  const Json json = read_json_file(preset_or_path);
  require_file_kind(json, preset_or_path, FileKind::kCluster);
  ProblemList problems;
  ClusterSpec cluster = cluster_from_json(json, preset_or_path, problems);
  problems.throw_if_any();
  return cluster;
}

OrderedJson cluster_to_json(const ClusterSpec& cluster) {
  OrderedJson json;
  json["schema_version"] = kClusterSchemaVersion;
  json["name"] = cluster.name;
  OrderedJson gpu;
  gpu["name"] = cluster.gpu.name;
  gpu["peak_bf16_tflops"] = cluster.gpu.peak_bf16_tflops;
  gpu["memory_bytes"] = cluster.gpu.memory_bytes;
  gpu["memory_bandwidth_gbps"] = cluster.gpu.memory_bandwidth_gbps;
  gpu["sm_count"] = cluster.gpu.sm_count;
  gpu["gemm_efficiency"] = cluster.gpu.gemm_efficiency;
  gpu["attention_efficiency"] = cluster.gpu.attention_efficiency;
  gpu["memory_efficiency"] = cluster.gpu.memory_efficiency;
  gpu["source"] = cluster.gpu.source;
  json["gpu"] = std::move(gpu);
  json["gpus_per_node"] = cluster.gpus_per_node;
  json["num_nodes"] = cluster.num_nodes;
  json["intra_node"] = link_to_json(cluster.intra_node);
  json["inter_node"] = link_to_json(cluster.inter_node);
  json["nics_per_node"] = cluster.nics_per_node;
  json["nccl_sms_intra_node"] = cluster.nccl_sms_intra_node;
  json["nccl_sms_inter_node"] = cluster.nccl_sms_inter_node;
  json["nccl_memory_traffic_factor"] = cluster.nccl_memory_traffic_factor;
  return json;
}

}  // namespace dhelix
