#pragma once
// The run identity a checkpoint carries, so that a valid shard in the wrong place is refused
// instead of trained on (docs/data-and-checkpoints.md, "Run identity"):
//   - the plan's training hash: what determines the training (job, model, schedule, ops),
//     not the plan's provenance, so that re-planning an identical job resumes;
//   - the rank and its pp/tp/cp/ep/dp coordinates: a shard restored by another rank
//     (exchanged files) would scramble the model;
//   - the run id: 128 random bits drawn by rank 0 when it takes the directory's lock
//     (checkpoint_lock.h); every shard of a checkpoint carries its manifest's, so shards of
//     two runs, or of another step of the same run, never mix.

#include <cstdint>
#include <string>

#include "runtime/comm/communicator.h"
#include "runtime/train/checkpoint.h"

namespace dhelix::rt {

/// SHA-256 of the plan's training content: the plan file's JSON without its provenance
/// (`meta`: tool, argv, inputs' paths, host, date), keys sorted, no whitespace. Two plans
/// of the same job, model, options and schedule hash alike whatever their date or layout.
/// `plan_bytes` must be valid JSON (the plan was read already); `plan_file` names it.
std::string plan_training_sha256(const std::string& plan_bytes, const std::string& plan_file);

/// A fresh run id: kRunIdDigits lowercase hex digits from std::random_device.
std::string new_run_id();

/// Rank 0's new_run_id(), on every rank of `world`. Collective.
std::string share_run_id(Communicator& world);

/// "rank 1 (pp 0, tp 1, cp 0, ep 0, dp 0)".
std::string rank_position_text(int64_t rank, const RankCoordinates& coordinates);

/// Checks that `shard`, read as rank `rank`'s shard of the checkpoint `manifest` (file
/// `manifest_file`), belongs there: the shard's step, run id and plan hash are the
/// manifest's, and its rank, world size and coordinates are this rank's (`expected`; its
/// plan hash and run id are not used). Error(kInvalidInput) naming the shard and every
/// mismatch.
void check_shard_identity(const RankShard& shard, const CheckpointManifest& manifest,
                          const std::string& manifest_file, int64_t rank,
                          const ShardIdentity& expected);

}  // namespace dhelix::rt
