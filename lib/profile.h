#pragma once
// A profile: the solo time of every operator signature of a job and the co-run result of
// every pair the planner may overlap (schemas/profile.schema.json). Written by
// dhelix-profile (model, cpu or cuda backend), read by dhelix-plan, which looks ops up by
// Op::signature() and reports missing signatures instead of guessing.
//
// A pair {a, b} means: a and b start together on different streams; finish_a_us and
// finish_b_us are when each ends, makespan_us the later of the two, and
// oef = (T_a + T_b - makespan) / min(T_a, T_b) with T the ops' median solo times (the
// DHelix paper's Overlap Effectiveness Factor, section 3.2).

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "lib/enum_names.h"
#include "lib/json_reader.h"
#include "lib/op_catalogue.h"

namespace dhelix {

/// Version of the profile file format this dhelix writes; readers accept major 1.
inline constexpr const char* kProfileSchemaVersion = "1.0.0";
inline constexpr int kProfileSchemaMajor = 1;

/// Largest time a profile may hold, microseconds (about 11.6 days; the reader refuses more):
/// no kernel of one training step takes that long, and sums of larger times could overflow
/// to infinity in the planner. The least times are physical (lib/profile_bounds.h).
inline constexpr double kMaxProfileTimeUs = 1e12;

/// Which profiler backend produced a profile.
enum class ProfileBackend { kModel, kCpu, kCuda };
inline constexpr EnumNames<ProfileBackend, 3> kProfileBackendNames{{"model", "cpu", "cuda"}};
/// "model", "cpu", "cuda".
constexpr const char* profile_backend_name(ProfileBackend backend) {
  return kProfileBackendNames.name(backend);
}
std::optional<ProfileBackend> parse_profile_backend(const std::string& name);

/// Statistics of an op's measured (or modelled) solo time, microseconds. min <= p10 <=
/// median <= p90 <= max, all >= 0.
/// A time or ratio at the precision profile files keep (4 decimals: 0.1 ns for times).
/// Backends round what they measure or model to it, so that a profile used in memory and
/// the same profile read back from its file give the same plan.
double quantize_profile_value(double value);

struct TimeStats {
  double median_us = 0, p10_us = 0, p90_us = 0, min_us = 0, max_us = 0;
  /// All five equal to `time_us` (the model backend's single value).
  static TimeStats exactly(double time_us);
  /// Every figure rounded as the profile file keeps it (quantize_profile_value), so that a
  /// measured profile in memory plans exactly like the same profile read back.
  TimeStats quantized() const;
};

/// Solo timing of one op signature.
struct ProfiledOp {
  std::string signature;  ///< Op::signature()
  OpKind kind = OpKind::kGemm;
  StreamClass stream = StreamClass::kCompute;
  std::string example_op_id;  ///< one op id with this signature, for people reading the file
  TimeStats time_us;
  int64_t samples = 1;  ///< timed runs behind time_us (1 for the model backend)
};

/// Co-run of two signatures started together (see the file comment).
struct ProfiledPair {
  std::string a, b;
  double finish_a_us = 0, finish_b_us = 0, makespan_us = 0, oef = 0;
};

/// The paper's OEF: (T_a + T_b - makespan) / min(T_a, T_b); 1 when an op takes no time.
double overlap_effectiveness(double time_a_us, double time_b_us, double makespan_us);

class Profile {
 public:
  OrderedJson meta = OrderedJson::object();  ///< provenance, opaque
  ProfileBackend backend = ProfileBackend::kModel;
  OrderedJson cluster = OrderedJson::object();  ///< the cluster it was made for, opaque
  std::string model_name;
  OrderedJson parallel = OrderedJson::object();  ///< the job's parallel settings, opaque

  /// Adds an op; DHELIX_CHECKs that its signature is new.
  void add_op(ProfiledOp op);
  /// Adds a pair, stored with a <= b; DHELIX_CHECKs that both ops exist and the pair is new.
  void add_pair(ProfiledPair pair);

  const std::vector<ProfiledOp>& ops() const { return ops_; }
  const std::vector<ProfiledPair>& pairs() const { return pairs_; }
  const ProfiledOp* find_op(const std::string& signature) const;
  /// The pair in the order asked for (finish times swapped when stored the other way).
  std::optional<ProfiledPair> find_pair(const std::string& a, const std::string& b) const;
  /// Distinct signatures of `ops` that have no solo time here, in first-seen order.
  std::vector<std::string> missing_signatures(const std::vector<Op>& ops) const;

 private:
  static std::string pair_key(const std::string& a, const std::string& b);

  std::vector<ProfiledOp> ops_;
  std::vector<ProfiledPair> pairs_;
  std::unordered_map<std::string, size_t> op_index_;
  std::unordered_map<std::string, size_t> pair_index_;
};

/// The profile as JSON: fixed key order, times rounded to 4 decimals (0.1 ns) so files diff
/// cleanly.
OrderedJson profile_to_json(const Profile& profile);
/// profile_to_json dumped with 2-space indentation and a final newline.
std::string profile_to_text(const Profile& profile);
/// Writes the profile atomically (write_file_atomically).
void write_profile(const std::string& path, const Profile& profile);

/// Strict reader: unknown keys, another major schema version, negative times or times above
/// kMaxProfileTimeUs, an OEF or
/// makespan that does not follow from the times, and pairs of unknown signatures are
/// errors. `file` names the input in messages. Throws Error listing every problem.
Profile profile_from_json(const Json& json, const std::string& file);
/// read_json_file + profile_from_json.
Profile read_profile(const std::string& path);

}  // namespace dhelix
