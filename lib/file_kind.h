#pragma once
// Which of dhelix's file formats a JSON document is, told by the keys only that format has,
// so that a reader given the wrong kind of file says so first:
//
//   dhelix-plan --check job.json
//   dhelix-plan: error: job.json: this is a job file, not a plan (a plan is what
//                `dhelix-plan JOB -o plan.json` writes)
//
// instead of fourteen lines of missing and unknown keys. Files need no field naming their
// kind (files written before this check, and hand-written jobs, read as before): the
// signature keys below are required by each format's own reader.
//
//   | kind                 | told by                                      |
//   |----------------------|----------------------------------------------|
//   | plan                 | "pairings" and "stages"                      |
//   | profile              | "ops" and "pairs"                            |
//   | checkpoint manifest  | "plan_sha256" and "shards"                   |
//   | job                  | "parallel" and "model" or "cluster"          |
//   | HuggingFace config   | "model_type", "architectures" or             |
//   |                      | "num_hidden_layers"                          |
//   | model                | "hidden_size" and "num_layers"               |
//   | cluster              | "gpus_per_node", or "gpu" and "intra_node"   |
//
// A document with none of them (a broken file of the right kind, say) is not refused here:
// its reader then names every missing key as usual.

#include <string>

#include "lib/json_reader.h"

namespace dhelix {

enum class FileKind {
  kPlan,
  kProfile,
  kCheckpointManifest,
  kJob,
  kHfConfig,
  kModel,
  kCluster,
  kUnknown
};

/// The kind the table above gives `json`; kUnknown when none (or not an object).
FileKind detect_file_kind(const Json& json);

/// "a plan", "a job file", ...: the kind as a message names it.
const char* file_kind_text(FileKind kind);

/// Throws Error(kInvalidInput) "<file>: this is <detected>, not <expected> (<what writes an
/// expected file>)" when `json` is recognisably another kind than `expected`. A model file
/// may be a dhelix model or a HuggingFace config.
void require_file_kind(const Json& json, const std::string& file, FileKind expected);

}  // namespace dhelix
