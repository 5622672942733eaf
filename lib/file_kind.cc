#include "lib/file_kind.h"

#include <fmt/format.h>

#include "lib/error.h"

namespace dhelix {
namespace {

// Where a file of the kind comes from, for the message.
const char* origin(FileKind kind) {
  switch (kind) {
    case FileKind::kPlan:
      return "a plan is what `dhelix-plan JOB -o plan.json` writes";
    case FileKind::kProfile:
      return "a profile is what `dhelix-profile JOB -o profile.json` writes";
    case FileKind::kCheckpointManifest:
      return "dhelix-run writes one in each checkpoint step folder";
    case FileKind::kJob:
      return "a job names a model, a cluster and parallel settings: examples/jobs/, "
             "schemas/job.schema.json";
    case FileKind::kHfConfig:
    case FileKind::kModel:
      return "a model is a dhelix model file (examples/models/) or a HuggingFace config.json";
    case FileKind::kCluster:
      return "a cluster is a preset name or a cluster file: examples/clusters/";
    case FileKind::kUnknown:
      break;
  }
  return "";
}

}  // namespace

FileKind detect_file_kind(const Json& json) {
  if (!json.is_object()) return FileKind::kUnknown;
  auto has = [&json](const char* key) { return json.contains(key); };
  if (has("pairings") && has("stages")) return FileKind::kPlan;
  if (has("ops") && has("pairs")) return FileKind::kProfile;
  if (has("plan_sha256") && has("shards")) return FileKind::kCheckpointManifest;
  if (has("parallel") && (has("model") || has("cluster"))) return FileKind::kJob;
  if (has("model_type") || has("architectures") || has("num_hidden_layers")) {
    return FileKind::kHfConfig;
  }
  if (has("hidden_size") && has("num_layers")) return FileKind::kModel;
  if (has("gpus_per_node") || (has("gpu") && has("intra_node"))) return FileKind::kCluster;
  return FileKind::kUnknown;
}

const char* file_kind_text(FileKind kind) {
  switch (kind) {
    case FileKind::kPlan:
      return "a plan";
    case FileKind::kProfile:
      return "a profile";
    case FileKind::kCheckpointManifest:
      return "a checkpoint manifest";
    case FileKind::kJob:
      return "a job file";
    case FileKind::kHfConfig:
      return "a HuggingFace model config";
    case FileKind::kModel:
      return "a model file";
    case FileKind::kCluster:
      return "a cluster file";
    case FileKind::kUnknown:
      break;
  }
  return "an unknown kind of file";
}

void require_file_kind(const Json& json, const std::string& file, FileKind expected) {
  const FileKind found = detect_file_kind(json);
  if (found == FileKind::kUnknown || found == expected) return;
  if (expected == FileKind::kModel && found == FileKind::kHfConfig) return;
  throw Error(ErrorCode::kInvalidInput,
              fmt::format("{}: this is {}, not {} ({})", file, file_kind_text(found),
                          file_kind_text(expected), origin(expected)));
}

}  // namespace dhelix
