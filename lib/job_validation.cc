#include "lib/job_validation.h"

#include <fmt/format.h>

namespace dhelix {
namespace {

// Adds problems about one job, each placed at the origin of the field it concerns.
class Checker {
 public:
  Checker(const JobSpec& job, ProblemList& problems) : job_(job), problems_(problems) {}

  void report(const std::string& field, int64_t value, const std::string& rule) {
    report_text(field, std::to_string(value), rule);
  }
  void report_text(const std::string& field, const std::string& value, const std::string& rule) {
    const FieldOrigin origin = job_.origin_of(field);
    problems_.add(origin.file, origin.pointer, value, rule);
  }

 private:
  const JobSpec& job_;
  ProblemList& problems_;
};

// The multiples of `divisor` nearest to `value` from below and above, as "a or b" (or just
// the one above when below would be zero).
std::string nearest_multiples(int64_t value, int64_t divisor) {
  const int64_t below = value / divisor * divisor;
  const int64_t above = below + divisor;
  if (below == 0) return std::to_string(above);
  return fmt::format("{} or {}", below, above);
}

// Sizes must be positive before any divisibility rule means anything; flags can bypass the
// reader's range checks, so validation checks again.
bool check_positive(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const std::pair<const char*, int64_t> sizes[] = {{"dp", p.dp},
                                                   {"tp", p.tp},
                                                   {"cp", p.cp},
                                                   {"pp", p.pp},
                                                   {"ep", p.ep},
                                                   {"micro_batch_size", p.micro_batch_size},
                                                   {"global_batch_size", p.global_batch_size},
                                                   {"seq_length", p.seq_length}};
  bool all_positive = true;
  for (const auto& [name, value] : sizes) {
    if (value >= 1) continue;
    check.report(std::string("parallel.") + name, value, "must be at least 1");
    all_positive = false;
  }
  return all_positive;
}

void check_world_size(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const ClusterSpec& c = job.cluster;
  if (c.num_nodes <= 0) return;
  const int64_t gpus = c.num_nodes * c.gpus_per_node;
  if (p.world_size() <= gpus) return;
  // The world size is no one field's fault: the problem sits at the parallel object.
  check.report_text("parallel", "",
                    fmt::format("world size dp·tp·cp·pp = {}·{}·{}·{} = {} is more than cluster "
                                "{} has ({} node{} × {} GPUs = {})",
                                p.dp, p.tp, p.cp, p.pp, p.world_size(), c.name, c.num_nodes,
                                c.num_nodes == 1 ? "" : "s", c.gpus_per_node, gpus));
}

void check_tensor_parallel(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const ModelSpec& m = job.model;
  if (m.num_attention_heads > 0 && m.num_attention_heads % p.tp != 0) {
    check.report("parallel.tp", p.tp,
                 fmt::format("does not divide num_attention_heads = {}", m.num_attention_heads));
  }
  if (m.num_kv_heads > 0 && m.num_kv_heads % p.tp != 0) {
    check.report("parallel.tp", p.tp,
                 fmt::format("does not divide num_kv_heads = {}", m.num_kv_heads));
  }
  if (p.sp && p.tp == 1) {
    check.report_text("parallel.sp", "true",
                      "requires tp > 1 (sequence parallelism splits activations over the TP "
                      "group; tp = 1)");
  }
}

void check_expert_parallel(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const ModelSpec& m = job.model;
  if (p.ep == 1) return;
  if (!m.is_moe()) {
    check.report("parallel.ep", p.ep,
                 fmt::format("requires a mixture-of-experts model ({} is dense)", m.name));
    return;
  }
  if (m.moe->num_experts % p.ep != 0) {
    check.report("parallel.ep", p.ep,
                 fmt::format("does not divide num_experts = {}", m.moe->num_experts));
  }
  if ((p.dp * p.cp) % p.ep != 0) {
    check.report("parallel.ep", p.ep,
                 fmt::format("does not divide dp·cp = {}·{} = {} (EP groups are carved out of "
                             "the data- and context-parallel ranks)",
                             p.dp, p.cp, p.dp * p.cp));
  }
}

// CP's load balancing cuts each sequence into 2·cp chunks (rank i holds chunks i and
// 2·cp−1−i); SP then splits a rank's tokens over the tp ranks. So the sequence must divide
// by 2·cp when cp > 1, times tp when SP is on: 2·TP·CP with both.
void check_sequence(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const int64_t cp_factor = p.cp > 1 ? 2 * p.cp : 1;
  const int64_t sp_factor = p.sp ? p.tp : 1;
  const int64_t divisor = cp_factor * sp_factor;
  if (divisor == 1 || p.seq_length % divisor == 0) return;
  std::string formula;
  if (p.cp > 1 && p.sp) {
    formula = fmt::format("2·cp·tp = 2·{}·{}", p.cp, p.tp);
  } else if (p.cp > 1) {
    formula = fmt::format("2·cp = 2·{}", p.cp);
  } else {
    formula = fmt::format("tp (sequence parallel) = {}", p.tp);
  }
  if (p.cp > 1) formula += fmt::format(" = {}", divisor);
  check.report("parallel.seq_length", p.seq_length,
               fmt::format("is not divisible by {} (nearest valid: {})", formula,
                           nearest_multiples(p.seq_length, divisor)));
}

void check_batch(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const int64_t divisor = p.micro_batch_size * p.dp;
  if (p.global_batch_size % divisor == 0) return;
  check.report("parallel.global_batch_size", p.global_batch_size,
               fmt::format("is not divisible by micro_batch_size·dp = {}·{} = {} (nearest "
                           "valid: {})",
                           p.micro_batch_size, p.dp, divisor,
                           nearest_multiples(p.global_batch_size, divisor)));
}

// DHelix folds the model into a U: each of the pp stages holds two of 2·pp equal chunks of
// layers (one from each end), so num_layers must divide by 2·pp.
void check_folding(const JobSpec& job, Checker& check) {
  const ParallelSpec& p = job.parallel;
  const int64_t layers = job.model.num_layers;
  if (layers <= 0 || layers % (2 * p.pp) == 0) return;
  std::string valid_pp;
  for (int64_t pp = 1; 2 * pp <= layers; ++pp) {
    if (layers % (2 * pp) == 0) valid_pp += (valid_pp.empty() ? "" : ", ") + std::to_string(pp);
  }
  const std::string pp_hint =
      valid_pp.empty() ? "no pp works for odd num_layers" : "valid pp: " + valid_pp;
  check.report("parallel.pp", p.pp,
               fmt::format("does not split num_layers = {} into 2·pp = {} equal folded chunks "
                           "({}; nearest valid num_layers: {})",
                           layers, 2 * p.pp, pp_hint, nearest_multiples(layers, 2 * p.pp)));
}

}  // namespace

ProblemList validate_job(const JobSpec& job) {
  ProblemList problems;
  Checker check(job, problems);
  if (!check_positive(job, check)) return problems;
  check_world_size(job, check);
  check_tensor_parallel(job, check);
  check_expert_parallel(job, check);
  check_sequence(job, check);
  check_batch(job, check);
  check_folding(job, check);
  return problems;
}

std::vector<std::string> job_warnings(const JobSpec& job) {
  std::vector<std::string> warnings;
  const ParallelSpec& p = job.parallel;
  if (job.model.max_seq_length > 0 && p.seq_length > job.model.max_seq_length) {
    const FieldOrigin origin = job.origin_of("parallel.seq_length");
    warnings.push_back(fmt::format(
        "{}: {}: {} is longer than {}'s max_seq_length = {} (fine for planning; training "
        "needs position embeddings that reach that far)",
        origin.file, origin.pointer, p.seq_length, job.model.name, job.model.max_seq_length));
  }
  return warnings;
}

}  // namespace dhelix
