#pragma once
// Checkpoints: what a rank needs to continue training exactly where it stopped.
//
// Layout on disk, for a checkpoint directory <dir>:
//   <dir>/step-<N>/rank-<R>.bin   one binary shard per rank (parameters, AdamW m and v,
//                                 data position, RNG state), written by rank R
//   <dir>/step-<N>/manifest.json  written by rank 0: step, world size, plan hash, run id,
//                                 shards
//   <dir>/latest                  "step-<N>\n": the last complete checkpoint
//   <dir>/run.lock                held (flock) by rank 0 of the run writing the directory
//                                 (checkpoint_identity.h)
// N counts completed training steps, so step-<N> holds the state before step N runs.
//
// Commit protocol (every function here is single-process; the trainer orders them across
// ranks with barriers):
//   rank 0:     remove_stale_temporaries(dir)   -- once, at start-up, before latest_step
//   rank 0:     prepare_temporary_step_dir(dir, N)          -> <dir>/step-N.tmp/
//   barrier
//   every rank: write_rank_shard(tmp, shard)                -> rank-R.bin (atomic, fsync'd)
//   barrier
//   rank 0:     write_manifest(tmp, make_manifest(tmp, ...))
//   rank 0:     publish_step(dir, N): rename step-N.tmp -> step-N, then rewrite `latest`
// `latest` only ever names a directory whose shards and manifest are complete: until the
// rename the new checkpoint is a .tmp directory nobody reads, and `latest` is replaced by
// an atomic rename. A crash therefore leaves the previous checkpoint or the new one as
// `latest`, never half of one; remove_stale_temporaries() clears what a crash left behind.
//
// Shard format (version 2, all integers and floats little-endian):
//   magic "DHXCKPT\0" (8 bytes), u32 format version, u32 zero,
//   i64 rank, i64 step, u64 data_position, u64 rng_state,
//   identity: i64 world size, i64 pp, tp, cp, ep, dp coordinates, the plan hash (64 ASCII
//   hex digits), the run id (32 ASCII hex digits),
//   i64 tensor count,
//   per tensor: u32 name length, name bytes (UTF-8), i64 value count, f32 values,
//   u64 FNV-1a 64 of every byte before it.
// The checksum catches accidental corruption (a truncated copy, a flipped bit); it is not
// a defence against deliberate tampering. The identity catches a valid shard in the wrong
// place: another rank's, another step's, another run's or another plan's
// (check_shard_identity, checkpoint_identity.h). Version 1 had no identity and is refused.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lib/json_reader.h"
#include "lib/placement.h"

namespace dhelix::rt {

/// Version of the shard binary format this dhelix writes and reads.
inline constexpr uint32_t kShardFormatVersion = 2;
/// schema_version of manifest.json (schemas/checkpoint-manifest.schema.json).
inline constexpr const char* kManifestSchemaVersion = "2.0.0";
/// Hex digits of a run id (128 random bits).
inline constexpr size_t kRunIdDigits = 32;

/// A tensor to save, without copying it: `count` floats at `values`, which must stay valid
/// until write_rank_shard returns.
struct TensorView {
  std::string name;  ///< unique within a shard: "layers.0.w_qkv", "adam_m/layers.0.w_qkv"
  const float* values = nullptr;
  int64_t count = 0;
};

/// A tensor read back from a shard.
struct NamedTensor {
  std::string name;
  std::vector<float> values;
};

/// Which run, plan and position in the job a shard belongs to (besides its rank).
struct ShardIdentity {
  std::string plan_sha256;  ///< plan_training_sha256 of the plan (64 lowercase hex digits)
  std::string run_id;       ///< the run that wrote it (kRunIdDigits lowercase hex digits)
  int64_t world_size = 1;
  RankCoordinates coordinates;  ///< the rank's pp, tp, cp, ep and dp position
};

/// What one rank writes: its identity, where training continues, and its tensors.
struct RankShardView {
  int64_t rank = 0;
  int64_t step = 0;            ///< completed training steps
  uint64_t data_position = 0;  ///< the next step whose data the sampler reads
  uint64_t rng_state = 0;      ///< the rank's random generator state (dropout, sampling)
  ShardIdentity identity;      ///< must be complete (hex digits checked; a bug otherwise)
  std::vector<TensorView> tensors;
};

/// One rank's shard as read from disk.
struct RankShard {
  std::string file;  ///< the path it was read from, for messages
  int64_t rank = 0;
  int64_t step = 0;
  uint64_t data_position = 0;
  uint64_t rng_state = 0;
  ShardIdentity identity;
  std::vector<NamedTensor> tensors;  ///< in the order they were written

  /// The tensor of that name, or nullptr.
  const NamedTensor* find(const std::string& name) const;

  /// Copies tensor `name` into `values` (`count` floats). Throws Error(kInvalidInput)
  /// naming the file when the tensor is missing or has another number of values.
  void copy_into(const std::string& name, float* values, int64_t count) const;
};

/// "rank-3.bin".
std::string rank_shard_file_name(int64_t rank);

/// "<dir>/step-12".
std::string step_dir(const std::string& dir, int64_t step);

/// "<dir>/step-12.tmp": where a checkpoint is written before it is published.
std::string temporary_step_dir(const std::string& dir, int64_t step);

/// Creates `dir` if needed and an empty temporary_step_dir(dir, step) (removing one a
/// crashed attempt left). Returns its path. Error(kIo) naming the path on failure.
std::string prepare_temporary_step_dir(const std::string& dir, int64_t step);

/// Bytes write_rank_shard writes for `shard`.
int64_t rank_shard_bytes(const RankShardView& shard);

/// Writes <step_dir>/rank-<R>.bin in the shard format, atomically (temporary file, fsync,
/// rename). Returns the file's size in bytes. Error(kIo) naming the file on failure.
/// Tensor names must be unique and at most 65535 bytes long (checked; a bug otherwise).
int64_t write_rank_shard(const std::string& step_dir, const RankShardView& shard);

/// Reads and validates a shard: magic, format version, every size against the file's
/// length, the identity's form, unique names, and the checksum. Error(kIo) when the file
/// cannot be read or is not a regular file, Error(kInvalidInput) naming the file and the
/// fault (truncated, wrong magic, bad checksum, ...) otherwise; a corrupt file never
/// crashes the reader. Whether the shard belongs where it was found is
/// check_shard_identity's question (checkpoint_identity.h).
RankShard read_rank_shard(const std::string& path);

/// The bytes of a checkpoint file (`what`: "checkpoint shard", ...), opened without
/// blocking: a directory, FIFO or device there is Error(kIo) naming the path and what it
/// is, never a hang or a crash; so is a file that cannot be read.
std::string read_checkpoint_file(const std::string& path, const std::string& what);

/// Whether `text` is `digits` lowercase hexadecimal digits.
bool is_lower_hex(const std::string& text, size_t digits);

/// One rank's shard in the manifest.
struct ManifestShard {
  int64_t rank = 0;
  std::string file;   ///< rank_shard_file_name(rank), relative to the step directory
  int64_t bytes = 0;  ///< its size
};

/// manifest.json of one checkpoint.
struct CheckpointManifest {
  std::string schema_version = kManifestSchemaVersion;
  OrderedJson meta = OrderedJson::object();  ///< provenance (lib/provenance.h), opaque here
  std::string job;                           ///< job name
  int64_t step = 0;                          ///< completed training steps
  int64_t world_size = 0;                    ///< ranks, = shards.size()
  std::string plan_sha256;                   ///< plan_training_sha256 of the plan
  std::string run_id;                        ///< the run that wrote every shard
  int64_t shard_format_version = kShardFormatVersion;
  std::vector<ManifestShard> shards;  ///< one per rank, in rank order
};

/// The manifest of the shards already written in `step_dir` (their sizes are taken from
/// the files). Error(kIo) naming a shard file that is missing.
CheckpointManifest make_manifest(const std::string& step_dir, const std::string& job, int64_t step,
                                 int64_t world_size, const std::string& plan_sha256,
                                 const std::string& run_id);

/// The manifest as JSON, keys in schema order.
OrderedJson manifest_to_json(const CheckpointManifest& manifest);

/// Writes <step_dir>/manifest.json atomically.
void write_manifest(const std::string& step_dir, const CheckpointManifest& manifest);

/// Reads a manifest strictly: unknown keys (with "did you mean"), missing fields, wrong
/// types, hashes and run ids that are not hex digits, shards that do not list ranks
/// 0..world_size-1 in order under their standard names. Error(kIo), Error(kSchemaVersion) or
/// Error(kInvalidInput) listing every problem.
CheckpointManifest read_manifest(const std::string& path);

/// Checks that every shard the manifest lists exists in `step_dir` as a regular file with
/// the listed size. Error(kInvalidInput) listing every missing, resized or odd shard.
void check_manifest_shards(const std::string& step_dir, const CheckpointManifest& manifest);

/// Checks that a checkpoint fits the run that wants to resume from it: same world size,
/// plan and job. Error(kInvalidInput) naming `manifest_file` and every mismatch.
void check_resume_matches(const CheckpointManifest& manifest, const std::string& manifest_file,
                          const std::string& job, int64_t world_size,
                          const std::string& plan_sha256);

/// Publishes a complete temporary_step_dir(dir, step): renames it to step_dir(dir, step)
/// and then writes <dir>/latest naming it, atomically. A step directory already there (a
/// re-run) is first renamed to "step-N.old" and deleted once `latest` is written.
/// Error(kIo) naming the path when the temporary directory is missing or a rename fails.
void publish_step(const std::string& dir, int64_t step);

/// The step <dir>/latest names, or nothing when there is no `latest` (no checkpoint yet).
/// Error(kInvalidInput) when `latest` is malformed or names a step directory without a
/// manifest.json; Error(kIo) when it is not a regular file (read_checkpoint_file).
std::optional<int64_t> latest_step(const std::string& dir);

/// Cleans what a crash left in `dir`: deletes every step-*.tmp directory, and for every
/// step-N.old restores it as step-N when step-N is missing (a crash inside publish_step)
/// or deletes it otherwise. Returns the paths removed or restored, sorted. A missing
/// `dir` is not an error.
std::vector<std::string> remove_stale_temporaries(const std::string& dir);

}  // namespace dhelix::rt
