// The run identity of checkpoints (see checkpoint_identity.h).

#include "runtime/train/checkpoint_identity.h"

#include <random>

#include <fmt/format.h>

#include "lib/error.h"
#include "lib/json_reader.h"
#include "lib/provenance.h"

namespace dhelix::rt {

std::string plan_training_sha256(const std::string& plan_bytes, const std::string& plan_file) {
  // Json (not OrderedJson) sorts keys, and dump() without indent drops the layout: the
  // hash sees the content only.
  Json plan = parse_json_text(plan_bytes, plan_file);
  if (plan.is_object()) plan.erase("meta");
  return sha256_hex(plan.dump());
}

std::string new_run_id() {
  std::random_device device;
  std::string id;
  for (size_t i = 0; i < kRunIdDigits / 8; ++i) id += fmt::format("{:08x}", uint32_t{device()});
  return id;
}

std::string share_run_id(Communicator& world) {
  const std::string mine = world.rank() == 0 ? new_run_id() : "";
  // all_reduce_max carries 63 bits: 8 hex digits (32 bits) at a time, -1 from the others.
  std::string id;
  for (size_t i = 0; i < kRunIdDigits; i += 8) {
    const int64_t part = world.rank() == 0 ? std::stoll(mine.substr(i, 8), nullptr, 16) : -1;
    id += fmt::format("{:08x}", world.all_reduce_max(part));
  }
  return id;
}

std::string rank_position_text(int64_t rank, const RankCoordinates& c) {
  return fmt::format("rank {} (pp {}, tp {}, cp {}, ep {}, dp {})", rank, c.pp, c.tp, c.cp, c.ep,
                     c.dp);
}

void check_shard_identity(const RankShard& shard, const CheckpointManifest& manifest,
                          const std::string& manifest_file, int64_t rank,
                          const ShardIdentity& expected) {
  const ShardIdentity& found = shard.identity;
  const RankCoordinates& a = found.coordinates;
  const RankCoordinates& b = expected.coordinates;
  const bool same_position = shard.rank == rank && a.pp == b.pp && a.tp == b.tp && a.cp == b.cp &&
                             a.ep == b.ep && a.dp == b.dp;
  ProblemList problems;
  if (!same_position || found.world_size != expected.world_size) {
    problems.add(shard.file, "",
                 fmt::format("holds the shard of {} of {} ranks", rank_position_text(shard.rank, a),
                             found.world_size),
                 fmt::format("but is read by {} of {}: each rank restores only the shard it "
                             "wrote (the files were exchanged or copied)",
                             rank_position_text(rank, b), expected.world_size));
  }
  if (shard.step != manifest.step) {
    problems.add(shard.file, "", fmt::format("holds step {}", shard.step),
                 fmt::format("but {} is the checkpoint of step {}: the shard was copied from "
                             "another checkpoint",
                             manifest_file, manifest.step));
  }
  if (found.run_id != manifest.run_id) {
    problems.add(shard.file, "", fmt::format("was written by run {}", found.run_id),
                 fmt::format("but {} by run {}: the checkpoint mixes the shards of two runs",
                             manifest_file, manifest.run_id));
  }
  if (found.plan_sha256 != manifest.plan_sha256) {
    problems.add(shard.file, "", fmt::format("was written under plan {}", found.plan_sha256),
                 fmt::format("but {} under plan {}", manifest_file, manifest.plan_sha256));
  }
  problems.throw_if_any();
}

}  // namespace dhelix::rt
