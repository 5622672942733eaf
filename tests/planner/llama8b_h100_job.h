#pragma once
// The job the dhelix shape tests plan (dhelix_shapes_test.cc, interleaved_shape_test.cc):
// llama-8b's shapes with 16 layers on H100s, TP 2 with SP, micro-batches of 1 x 4096
// tokens, `pp` stages and global batch `gbs`; validated (a failed rule fails the test).

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "lib/cluster_presets.h"
#include "lib/job_spec.h"
#include "lib/job_validation.h"
#include "lib/model_reader.h"

namespace dhelix::test_jobs {

inline JobSpec llama8b_h100_job(int64_t pp, int64_t gbs, const std::string& name) {
  JobSpec job;
  job.model = read_model_file(std::string(DHELIX_SOURCE_DIR) + "/examples/models/llama-8b.json");
  job.model.num_layers = 16;
  job.cluster = find_cluster_preset("h100").value();
  job.parallel.tp = 2;
  job.parallel.sp = true;
  job.parallel.pp = pp;
  job.parallel.micro_batch_size = 1;
  job.parallel.global_batch_size = gbs;
  job.parallel.seq_length = 4096;
  job.name = name;
  const ProblemList problems = validate_job(job);
  EXPECT_TRUE(problems.empty()) << problems.problems().front().rule;
  return job;
}

}  // namespace dhelix::test_jobs
