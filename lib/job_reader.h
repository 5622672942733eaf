#pragma once
// Reading a job file (schemas/job.schema.json):
//
//   {
//     "schema_version": "1.0.0",
//     "name": "llama-8b-a40-dp16-tp4",
//     "model": "../models/llama-8b.json",      // path relative to this file, or an object
//     "cluster": "a40",                        // preset, path relative to this file, or an object
//     "parallel": {"dp": 16, "tp": 4, "sp": true, "micro_batch_size": 1,
//                  "global_batch_size": 1024, "seq_length": 8192}
//   }
//
// Reading checks the file's own shape only (types, ranges, unknown keys); the rules that
// tie the parallel settings to the model and the cluster live in job_validation.h.

#include <optional>
#include <string>
#include <vector>

#include "lib/job_spec.h"
#include "lib/json_reader.h"

namespace dhelix {

/// Major schema version of job files this dhelix reads.
inline constexpr int kJobSchemaMajor = 1;

/// Parts of a job the command line supplies (--model, --cluster): the job file may then
/// leave them out, and what it gives for them is not read, as the flags replace it.
struct JobSupplied {
  bool model = false;
  bool cluster = false;
};

/// Reads a job file and the model and cluster it names. Collects every problem of the file
/// (and of an inline or referenced model/cluster) and throws one Error: kIo when a file
/// cannot be read, kSchemaVersion for another major version, else kInvalidInput.
/// Does not validate the job (see validate_job()).
JobSpec read_job_file(const std::string& path, JobSupplied supplied = {});

/// Job from parsed JSON. `file` names it in messages; relative model and cluster paths are
/// resolved against `base_dir` ("" for the current directory). Problems go to `problems`;
/// the returned job is meaningful only when none were added.
JobSpec job_from_json(const Json& json, const std::string& file, const std::string& base_dir,
                      ProblemList& problems, JobSupplied supplied = {});

/// A cluster named by a preset ("a40") or a path to a cluster file (relative paths are
/// resolved against `base_dir`). A word that is neither is an Error(kInvalidInput) at
/// `file`: `pointer`, with a "did you mean" among the presets.
ClusterSpec cluster_from_reference(const std::string& preset_or_path, const std::string& base_dir,
                                   const std::string& file, const std::string& pointer);

/// Parses a rank order such as "tp-cp-ep-dp-pp" (fastest-varying first; each of tp, cp,
/// ep, dp, pp exactly once). Returns nothing and sets `why` to the reason otherwise.
std::optional<std::vector<ParallelDim>> parse_rank_order(const std::string& text, std::string& why);

/// The parallel section of a job as written in job files (every field written out).
OrderedJson parallel_to_json(const ParallelSpec& parallel);

}  // namespace dhelix
