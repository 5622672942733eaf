// The ways a run stops early (a non-finite loss, gradient or state; a signal) and the
// checkpoints (protocol in runtime/train/checkpoint.h): Trainer members, trainer_impl.h.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "lib/atomic_file.h"
#include "lib/provenance.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/checkpoint_identity.h"
#include "runtime/train/run_guards.h"
#include "runtime/train/trainer_impl.h"

namespace dhelix::rt::detail {

// Every rank learns whether any rank saw a non-finite loss or gradient; those that did say
// which. True when training must stop.
bool Trainer::stop_if_not_finite(int64_t step) {
  std::optional<std::string> problem;
  if (head_ && coordinates_.tp == 0) {
    const std::vector<float> losses = engine_->micro_batch_losses();
    if (const std::optional<int64_t> mb = first_non_finite_loss(losses)) {
      problem =
          fmt::format("micro-batch {}: the loss is {}", *mb, losses[static_cast<size_t>(*mb)]);
    }
  }
  if (!problem && !engine_->gradients_finite()) {
    // Only now copy the gradients to the host, to name the first bad one.
    const IterationSnapshot snapshot = engine_->snapshot();
    if (const auto gradient = first_non_finite_gradient(snapshot.names, snapshot.gradients)) {
      problem = *gradient + fmt::format(" after micro-batches 0..{}", micro_batches() - 1);
    }
  }
  if (!any_rank(*world_, problem.has_value())) return false;
  if (problem) {
    std::cerr << fmt::format("dhelix-run: error: step {}: rank {}: {}\n", step + 1, rank_,
                             *problem);
  }
  if (rank_ == 0) {
    std::cerr << fmt::format(
        "dhelix-run: error: training diverged at step {} (a non-finite loss or gradient; try "
        "a smaller --lr); stopped before the update{}\n",
        step + 1, set_aside_diverged_checkpoint(step));
  }
  return true;
}

// Before a checkpoint: weights or optimizer moments an update made non-finite (--lr nan)
// are never written. Every rank learns whether any rank's state is bad.
bool Trainer::state_is_finite(int64_t completed_steps, const std::vector<NamedTensor>& state) {
  std::optional<std::string> problem;
  for (const NamedTensor& tensor : state) {
    for (size_t i = 0; i < tensor.values.size() && !problem; ++i) {
      if (!std::isfinite(tensor.values[i])) {
        problem = fmt::format("{} (element {}) is {}", tensor.name, i, tensor.values[i]);
      }
    }
  }
  if (!any_rank(*world_, problem.has_value())) return true;
  if (problem) {
    std::cerr << fmt::format("dhelix-run: error: after step {}: rank {}: {}\n", completed_steps,
                             rank_, *problem);
  }
  if (rank_ == 0) {
    std::cerr << fmt::format(
        "dhelix-run: error: training diverged: the update of step {} made the model "
        "non-finite (try a smaller --lr); its checkpoint was not written, {} keeps the last "
        "good one\n",
        completed_steps, options_.checkpoint_dir);
  }
  return false;
}

// Rank 0, when step `bad_step` + 1 diverged: the checkpoint of step `bad_step`, written just
// before, holds the weights that diverged (finite, but e.g. 1e30 after --lr 1e30). It moves
// to step-N.diverged and `latest` goes back to the newest earlier checkpoint. Returns the
// end of the divergence message, saying what the checkpoint folder now holds.
std::string Trainer::set_aside_diverged_checkpoint(int64_t bad_step) {
  const std::string& dir = options_.checkpoint_dir;
  if (dir.empty()) return "";
  const std::optional<int64_t> latest = latest_step(dir);
  if (!latest || *latest != bad_step) {
    return latest ? fmt::format("; the last good checkpoint is {}", step_dir(dir, *latest)) : "";
  }
  std::optional<int64_t> previous;
  for (int64_t step = bad_step - 1; step >= 1 && !previous; --step) {
    std::error_code error;
    if (std::filesystem::exists(step_dir(dir, step) + "/manifest.json", error)) previous = step;
  }
  const std::string aside = step_dir(dir, bad_step) + ".diverged";
  std::error_code error;
  std::filesystem::remove_all(aside, error);
  std::filesystem::rename(step_dir(dir, bad_step), aside, error);
  if (error) {
    return fmt::format("; {} holds the weights that diverged (moving it aside failed: {})",
                       step_dir(dir, bad_step), error.message());
  }
  if (previous) {
    write_file_atomically(dir + "/latest", fmt::format("step-{}\n", *previous));
  } else {
    std::filesystem::remove(dir + "/latest", error);
  }
  return fmt::format(
      "; the checkpoint of step {} holds the weights that diverged and was moved to {}; {}",
      bad_step, aside,
      previous ? fmt::format("the last good checkpoint is {}", step_dir(dir, *previous))
               : std::string("no earlier checkpoint exists"));
}

// After a completed step: whether any rank was sent SIGINT or SIGTERM. If so, every rank
// writes a checkpoint (unless one was just written) and the run ends with 128 + signal.
int Trainer::stop_for_signal(int64_t completed_steps, bool checkpointed) {
  const int any_signal = static_cast<int>(world_->all_reduce_max(StopSignals::received()));
  if (any_signal == 0) return 0;
  const bool saving = !options_.checkpoint_dir.empty();
  if (saving && !checkpointed) save_checkpoint(completed_steps, engine_->state());
  if (rank_ == 0) {
    std::cerr << fmt::format(
        "dhelix-run: stopped by {} after step {}: {}\n", signal_name(any_signal), completed_steps,
        saving ? fmt::format("checkpoint {} written; continue with --resume",
                             step_dir(options_.checkpoint_dir, completed_steps))
               : "no --checkpoint-dir, so the steps run are not saved");
  }
  return 128 + any_signal;
}

// ----- checkpoints (protocol in runtime/train/checkpoint.h) -------------------------------

// Every rank learns the run id; rank 0 locks the directory under it, or every rank stops
// (another run holds it). A --resume of a directory that does not exist stops here, before
// the lock would make it.
void Trainer::take_checkpoint_dir() {
  run_id_ = share_run_id(*world_);
  agreed([&] {
    const std::string& dir = options_.checkpoint_dir;
    std::error_code error;
    if (options_.resume && !std::filesystem::exists(dir, error)) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("--resume: {} holds no checkpoint (no 'latest' file)", dir));
    }
    if (rank_ == 0) lock_ = CheckpointLock::take(dir, run_id_);
  });
}

ShardIdentity Trainer::identity() const {
  return {.plan_sha256 = plan_hash_,
          .run_id = run_id_,
          .world_size = world_size_,
          .coordinates = coordinates_};
}

void Trainer::save_checkpoint(int64_t completed_steps, const std::vector<NamedTensor>& state) {
  const std::string& dir = options_.checkpoint_dir;
  // Each phase is local work, then an agreement (also the barrier the protocol needs): a
  // disk that fails on one rank stops every rank, with one message.
  agreed([&] {
    if (rank_ == 0) prepare_temporary_step_dir(dir, completed_steps);
  });
  RankShardView shard{.rank = rank_,
                      .step = completed_steps,
                      .data_position = static_cast<uint64_t>(completed_steps),
                      .rng_state = options_.seed,
                      .identity = identity(),
                      .tensors = {}};
  for (const NamedTensor& tensor : state) {
    shard.tensors.push_back(
        {tensor.name, tensor.values.data(), static_cast<int64_t>(tensor.values.size())});
  }
  const std::string tmp = temporary_step_dir(dir, completed_steps);
  agreed([&] { write_rank_shard(tmp, shard); });
  agreed([&] {
    if (rank_ != 0) return;
    write_manifest(
        tmp, make_manifest(tmp, job_.name, completed_steps, world_size_, plan_hash_, run_id_));
    publish_step(dir, completed_steps);
    out_ << fmt::format("checkpoint: {} (step {})\n", step_dir(dir, completed_steps),
                        completed_steps);
  });
}

// Three agreements, so that no rank trains unless every rank restored a shard that belongs
// to it: every rank validates the checkpoint and its own shard; every rank read the same
// step; every rank restores. A rank that failed alone would otherwise train on while the
// others stop, or train another step and wait in a collective for ever.
int64_t Trainer::restore_checkpoint() {
  const std::string& dir = options_.checkpoint_dir;
  agreed([&] {  // and a barrier: rank 0 cleans up before anyone reads
    if (dir.empty()) throw Error(ErrorCode::kInvalidInput, "--resume needs --checkpoint-dir");
    if (rank_ == 0) remove_stale_temporaries(dir);
  });
  int64_t step = -1;
  RankShard shard;
  agreed([&] {
    const std::optional<int64_t> latest = latest_step(dir);
    if (!latest) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("--resume: {} holds no checkpoint (no 'latest' file)", dir));
    }
    step = *latest;
    const std::string manifest_file = step_dir(dir, step) + "/manifest.json";
    const CheckpointManifest manifest = read_manifest(manifest_file);
    check_resume_matches(manifest, manifest_file, job_.name, world_size_, plan_hash_);
    check_manifest_shards(step_dir(dir, step), manifest);
    shard = read_rank_shard(step_dir(dir, step) + "/" + rank_shard_file_name(rank_));
    check_shard_identity(shard, manifest, manifest_file, rank_, identity());
  });
  // `latest` is read by every rank: under the lock nothing rewrites it, but a file system
  // that shows ranks different contents must not make them train different steps.
  const int64_t highest = world_->all_reduce_max(step);
  const int64_t lowest = -world_->all_reduce_max(-step);
  agreed([&] {
    if (rank_ == 0 && highest != lowest) {
      throw Error(ErrorCode::kInvalidInput,
                  fmt::format("{}/latest: the ranks read different steps ({} to {}); the "
                              "checkpoint directory changed while the run started",
                              dir, lowest, highest));
    }
  });
  agreed([&] { engine_->restore(shard); });
  if (rank_ == 0) out_ << fmt::format("resumed from {} (step {})\n", step_dir(dir, step), step);
  return step;
}

}  // namespace dhelix::rt::detail
