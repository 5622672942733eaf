// The run identity of checkpoints (runtime/train/checkpoint_identity.h): the plan's training
// hash, shards refused in the wrong rank, step or run; the directory lock
// (checkpoint_lock.h); checkpoint files that are directories or FIFOs.

#include "runtime/train/checkpoint_identity.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "lib/error.h"
#include "runtime/comm/loopback_communicator.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/checkpoint_lock.h"
#include "tests/runtime/error_of.h"
#include "tests/runtime/scratch_dir.h"

namespace dhelix::rt {
namespace {

namespace fs = std::filesystem;

const std::string kPlanSha(64, 'a');
constexpr const char* kRunId = "0123456789abcdef0123456789abcdef";

using test::error_of;

class CheckpointIdentityTest : public ::testing::Test {
 protected:
  test::ScratchDir scratch_{"dhelix-ckpt-id-"};
  std::string dir_ = scratch_.path();

  // A published two-rank checkpoint of `step` (rank r at tp r) written by run `run_id`.
  void write_checkpoint(int64_t step, const std::string& run_id = kRunId) {
    const std::string temporary = prepare_temporary_step_dir(dir_, step);
    const float value = static_cast<float>(step);
    for (int64_t rank = 0; rank < 2; ++rank) {
      RankShardView view{.rank = rank,
                         .step = step,
                         .data_position = static_cast<uint64_t>(step),
                         .rng_state = 7,
                         .identity = identity_of(rank, run_id),
                         .tensors = {{"w", &value, 1}}};
      write_rank_shard(temporary, view);
    }
    write_manifest(temporary, make_manifest(temporary, "tiny", step, 2, kPlanSha, run_id));
    publish_step(dir_, step);
  }
  static ShardIdentity identity_of(int64_t rank, const std::string& run_id = kRunId) {
    return {
        .plan_sha256 = kPlanSha, .run_id = run_id, .world_size = 2, .coordinates = {.tp = rank}};
  }
  // What a resume of rank `rank` finds wrong with the latest checkpoint ("" when nothing).
  std::string resume_problem(int64_t rank) {
    try {
      const std::string at = step_dir(dir_, *latest_step(dir_));
      const CheckpointManifest manifest = read_manifest(at + "/manifest.json");
      check_manifest_shards(at, manifest);
      const RankShard shard = read_rank_shard(at + "/" + rank_shard_file_name(rank));
      check_shard_identity(shard, manifest, at + "/manifest.json", rank, identity_of(rank));
      return "";
    } catch (const Error& error) {
      return error.what();
    }
  }
};

TEST(PlanTrainingHash, IgnoresProvenanceAndLayoutNotTraining) {
  const std::string plan =
      R"({"schema_version": "1.2.0", "meta": {"tool": "dhelix-plan", "argv": ["a", "-o", "x"],
          "date_utc": "2026-01-01T00:00:00Z"}, "job": {"name": "tiny", "seq": 64},
          "stages": [{"stage": 0, "tasks": [1, 2]}]})";
  // Re-planned: another date, command line and output path; keys and spaces differ.
  const std::string replanned =
      R"({"stages":[{"tasks":[1,2],"stage":0}],"job":{"seq":64,"name":"tiny"},
          "meta":{"tool":"dhelix-plan","argv":["b","-o","y"],"date_utc":"2026-02-02T10:00:00Z"},
          "schema_version":"1.2.0"})";
  const std::string hash = plan_training_sha256(plan, "a.json");
  EXPECT_EQ(hash.size(), 64u);
  EXPECT_EQ(plan_training_sha256(replanned, "b.json"), hash);
  // What determines the training changes the hash: the job, the schedule.
  std::string other_job = plan;
  other_job.replace(other_job.find("64"), 2, "65");
  EXPECT_NE(plan_training_sha256(other_job, "c.json"), hash);
  std::string other_order = plan;
  other_order.replace(other_order.find("[1, 2]"), 6, "[2, 1]");
  EXPECT_NE(plan_training_sha256(other_order, "d.json"), hash);
}

TEST(RunId, IsFreshAndTheSameOnEveryRank) {
  const std::string id = new_run_id();
  EXPECT_TRUE(is_lower_hex(id, kRunIdDigits)) << id;
  EXPECT_NE(new_run_id(), id);
  constexpr int64_t kRanks = 3;
  LoopbackWorld world(kRanks);
  const std::vector<int64_t> members = {0, 1, 2};
  std::vector<std::string> ids(kRanks);
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm = world.communicator("world", members, r, "world");
      ids[static_cast<size_t>(r)] = share_run_id(*comm);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(is_lower_hex(ids[0], kRunIdDigits)) << ids[0];
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 1u);
}

TEST_F(CheckpointIdentityTest, EveryRankAcceptsItsOwnShard) {
  write_checkpoint(4);
  EXPECT_EQ(resume_problem(0), "");
  EXPECT_EQ(resume_problem(1), "");
}

// Issue 37: shards of rank 0 and rank 1 exchanged were restored, scrambling the model.
TEST_F(CheckpointIdentityTest, ExchangedShardsAreRefusedByEitherRank) {
  write_checkpoint(4);
  const std::string at = step_dir(dir_, 4);
  fs::rename(at + "/rank-0.bin", at + "/swap");
  fs::rename(at + "/rank-1.bin", at + "/rank-0.bin");
  fs::rename(at + "/swap", at + "/rank-1.bin");
  EXPECT_EQ(resume_problem(1),
            at + "/rank-1.bin: holds the shard of rank 0 (pp 0, tp 0, cp 0, ep 0, dp 0) of 2 "
                 "ranks but is read by rank 1 (pp 0, tp 1, cp 0, ep 0, dp 0) of 2: each rank "
                 "restores only the shard it wrote (the files were exchanged or copied)");
  EXPECT_NE(resume_problem(0).find("holds the shard of rank 1"), std::string::npos);
}

// Issue 37: step 4's shard replaced by the same rank's of step 2 (valid, same size) made the
// ranks train different steps and hang.
TEST_F(CheckpointIdentityTest, AShardOfAnotherStepIsRefused) {
  write_checkpoint(2);
  write_checkpoint(4);
  fs::copy_file(step_dir(dir_, 2) + "/rank-1.bin", step_dir(dir_, 4) + "/rank-1.bin",
                fs::copy_options::overwrite_existing);
  EXPECT_EQ(resume_problem(0), "");
  EXPECT_EQ(resume_problem(1), step_dir(dir_, 4) + "/rank-1.bin: holds step 2 but " +
                                   step_dir(dir_, 4) +
                                   "/manifest.json is the checkpoint of step 4: the shard was "
                                   "copied from another checkpoint");
}

// Issue 37: two runs sharing a directory left checkpoints mixing both runs' shards.
TEST_F(CheckpointIdentityTest, AShardOfAnotherRunOrPlanIsRefused) {
  const std::string other_run(32, 'f');
  write_checkpoint(4, other_run);
  const std::string kept = dir_ + "/other-rank-1.bin";
  fs::copy_file(step_dir(dir_, 4) + "/rank-1.bin", kept);
  write_checkpoint(4);  // the same step again, by another run
  fs::copy_file(kept, step_dir(dir_, 4) + "/rank-1.bin", fs::copy_options::overwrite_existing);
  EXPECT_EQ(resume_problem(1), step_dir(dir_, 4) + "/rank-1.bin: was written by run " + other_run +
                                   " but " + step_dir(dir_, 4) + "/manifest.json by run " + kRunId +
                                   ": the checkpoint mixes the shards of two runs");
  RankShard shard = read_rank_shard(step_dir(dir_, 4) + "/rank-0.bin");
  CheckpointManifest manifest = read_manifest(step_dir(dir_, 4) + "/manifest.json");
  manifest.plan_sha256 = std::string(64, 'b');
  EXPECT_NE(error_of([&] {
              check_shard_identity(shard, manifest, "m.json", 0, identity_of(0));
            }).second.find("was written under plan " + kPlanSha + " but m.json under plan bbbb"),
            std::string::npos);
}

// Issue 37: a `latest` that is a directory crashed the reader (basic_filebuf::underflow);
// a FIFO would have hung it. Every checkpoint file as a directory or a FIFO is an error
// naming it.
TEST_F(CheckpointIdentityTest, CheckpointFilesThatAreDirectoriesOrFifosAreRefused) {
  write_checkpoint(3);
  const std::string at = step_dir(dir_, 3);
  for (const std::string name : {"latest", "step-3/manifest.json", "step-3/rank-1.bin"}) {
    for (const bool fifo : {false, true}) {
      const std::string path = dir_ + "/" + name;
      const std::string saved = dir_ + "/saved";
      fs::rename(path, saved);
      if (fifo) {
        ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
      } else {
        fs::create_directory(path);
      }
      const std::string kind = fifo ? "a FIFO" : "a directory";
      const auto [code, message] = error_of([&] {
        if (name == "latest") latest_step(dir_);
        if (name == "step-3/manifest.json") read_manifest(path);
        if (name == "step-3/rank-1.bin") read_rank_shard(path);
      });
      EXPECT_EQ(code, ErrorCode::kIo) << name << " " << kind;
      EXPECT_EQ(message.rfind(path + ": is " + kind + ", not a file: a ", 0), 0u) << message;
      if (name == "step-3/rank-1.bin") {
        EXPECT_EQ(error_of([&] {
                    check_manifest_shards(at, read_manifest(at + "/manifest.json"));
                  }).second,
                  path + ": is not a regular file: a checkpoint shard must be one");
      }
      fs::remove(path);
      fs::rename(saved, path);
    }
  }
  EXPECT_EQ(resume_problem(1), "");
}

TEST_F(CheckpointIdentityTest, ASecondRunIsRefusedWhileTheFirstHoldsTheLock) {
  const std::string dir = dir_ + "/ckpt";
  {
    const std::unique_ptr<CheckpointLock> first = CheckpointLock::take(dir, kRunId);
    EXPECT_TRUE(fs::is_regular_file(dir + "/run.lock"));
    const auto [code, message] = error_of([&] { CheckpointLock::take(dir, std::string(32, 'e')); });
    EXPECT_EQ(code, ErrorCode::kInvalidInput);
    EXPECT_EQ(message.rfind(dir + "/run.lock: the checkpoint directory " + dir +
                                " is in use by another dhelix-run (run " + kRunId + ", pid " +
                                std::to_string(::getpid()) + " on host ",
                            0),
              0u)
        << message;
    EXPECT_NE(message.find("two runs must not write one --checkpoint-dir"), std::string::npos);
  }
  // Released: the lock file and the directory it made (still empty) are gone.
  EXPECT_FALSE(fs::exists(dir));
  const std::unique_ptr<CheckpointLock> again = CheckpointLock::take(dir, kRunId);
  fs::create_directory(dir + "/step-1");
  EXPECT_EQ(error_of([&] { CheckpointLock::take(dir, kRunId); }).first, ErrorCode::kInvalidInput);
}

TEST_F(CheckpointIdentityTest, AKilledRunReleasesTheLock) {
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Holds the lock until killed, never running a destructor.
    auto lock = CheckpointLock::take(dir_, std::string(32, 'c'));
    const char byte = 1;
    (void)!::write(ready[1], &byte, 1);
    ::pause();
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  EXPECT_NE(error_of([&] { CheckpointLock::take(dir_, kRunId); }).second.find(std::string(32, 'c')),
            std::string::npos);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_TRUE(fs::exists(dir_ + "/run.lock"));  // left behind, but no longer locked
  const std::unique_ptr<CheckpointLock> taken = CheckpointLock::take(dir_, kRunId);
  std::ifstream in(dir_ + "/run.lock");
  std::string first_line;
  std::getline(in, first_line);
  EXPECT_EQ(first_line, std::string("run ") + kRunId);
}

TEST_F(CheckpointIdentityTest, ALockFileThatIsADirectoryOrALinkIsAnIoError) {
  fs::create_directory(dir_ + "/run.lock");
  EXPECT_EQ(error_of([&] { CheckpointLock::take(dir_, kRunId); }).first, ErrorCode::kIo);
  fs::remove(dir_ + "/run.lock");
  fs::create_symlink(dir_ + "/elsewhere", dir_ + "/run.lock");
  EXPECT_EQ(error_of([&] { CheckpointLock::take(dir_, kRunId); }).first, ErrorCode::kIo);
  EXPECT_FALSE(fs::exists(dir_ + "/elsewhere"));
}

}  // namespace
}  // namespace dhelix::rt
