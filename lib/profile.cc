#include "lib/profile.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include <fmt/format.h>

#include "lib/atomic_file.h"
#include "lib/file_kind.h"

namespace dhelix {
namespace {

// How far a stored OEF or makespan may be from what the stored times give (they are
// rounded to 4 decimals when written).
constexpr double kConsistencyTolerance = 1e-3;

OrderedJson stats_to_json(const TimeStats& t) {
  OrderedJson json = OrderedJson::object();
  json["median"] = quantize_profile_value(t.median_us);
  json["p10"] = quantize_profile_value(t.p10_us);
  json["p90"] = quantize_profile_value(t.p90_us);
  json["min"] = quantize_profile_value(t.min_us);
  json["max"] = quantize_profile_value(t.max_us);
  return json;
}

const RealRange kTimeRange{.min = 0, .max = kMaxProfileTimeUs};

TimeStats read_stats(ObjectReader& reader) {
  const size_t before = reader.problems().problems().size();
  TimeStats t;
  t.median_us = reader.real("median", Need::kRequired, kTimeRange).value_or(0);
  t.p10_us = reader.real("p10", Need::kRequired, kTimeRange).value_or(0);
  t.p90_us = reader.real("p90", Need::kRequired, kTimeRange).value_or(0);
  t.min_us = reader.real("min", Need::kRequired, kTimeRange).value_or(0);
  t.max_us = reader.real("max", Need::kRequired, kTimeRange).value_or(0);
  reader.finish();
  const bool ordered = t.min_us <= t.p10_us && t.p10_us <= t.median_us && t.median_us <= t.p90_us &&
                       t.p90_us <= t.max_us;
  if (reader.problems().problems().size() == before && !ordered) {
    reader.problems().add(reader.file(), reader.pointer(), "",
                          "must satisfy min <= p10 <= median <= p90 <= max");
  }
  return t;
}

// Signatures of ops that were reported as bad: pairs naming them are not checked, as every
// such check would only repeat the op's own problem.
using BadSignatures = std::unordered_set<std::string>;

void read_op(const Json& value, const std::string& file, const std::string& pointer,
             ProblemList& problems, Profile& profile, BadSignatures& bad) {
  ObjectReader reader(value, file, pointer, problems);
  if (!reader.is_object()) return;
  const size_t before = problems.problems().size();
  ProfiledOp op;
  op.signature = reader.string("signature", Need::kRequired).value_or("");
  const auto kind = reader.string("kind", Need::kRequired, kOpKindNames.all());
  const auto stream = reader.string("stream", Need::kRequired, kStreamClassNames.all());
  op.example_op_id = reader.string("example_op_id", Need::kRequired).value_or("");
  std::optional<ObjectReader> time = reader.object("time_us", Need::kRequired);
  if (time) op.time_us = read_stats(*time);
  op.samples = reader.integer("samples", Need::kRequired, {.min = 1}).value_or(1);
  reader.finish();
  if (problems.problems().size() != before) {
    bad.insert(op.signature);
    return;
  }
  op.kind = *parse_op_kind(*kind);
  op.stream = *kStreamClassNames.parse(*stream);
  if (profile.find_op(op.signature) != nullptr) {
    reader.report("signature", json_value_text(Json(op.signature)), "appears twice in /ops");
    return;
  }
  profile.add_op(std::move(op));
}

void read_pair(const Json& value, const std::string& file, const std::string& pointer,
               ProblemList& problems, Profile& profile, const BadSignatures& bad) {
  ObjectReader reader(value, file, pointer, problems);
  if (!reader.is_object()) return;
  const size_t before = problems.problems().size();
  ProfiledPair pair;
  pair.a = reader.string("a", Need::kRequired).value_or("");
  pair.b = reader.string("b", Need::kRequired).value_or("");
  pair.finish_a_us = reader.real("finish_a_us", Need::kRequired, kTimeRange).value_or(0);
  pair.finish_b_us = reader.real("finish_b_us", Need::kRequired, kTimeRange).value_or(0);
  pair.makespan_us = reader.real("makespan_us", Need::kRequired, kTimeRange).value_or(0);
  pair.oef = reader.real("oef", Need::kRequired, {.min = -1, .max = 1}).value_or(0);
  reader.finish();
  if (problems.problems().size() != before) return;
  if (bad.contains(pair.a) || bad.contains(pair.b)) return;
  const ProfiledOp* op_a = profile.find_op(pair.a);
  const ProfiledOp* op_b = profile.find_op(pair.b);
  if (op_a == nullptr)
    reader.report("a", json_value_text(Json(pair.a)), "is not a signature in /ops");
  if (op_b == nullptr)
    reader.report("b", json_value_text(Json(pair.b)), "is not a signature in /ops");
  if (op_a == nullptr || op_b == nullptr) return;
  const double makespan = std::max(pair.finish_a_us, pair.finish_b_us);
  if (std::abs(makespan - pair.makespan_us) > kConsistencyTolerance) {
    reader.report("makespan_us", fmt::format("{:.6g}", pair.makespan_us),
                  fmt::format("must equal max(finish_a_us, finish_b_us) = {:.6g}", makespan));
    return;
  }
  const double oef =
      overlap_effectiveness(op_a->time_us.median_us, op_b->time_us.median_us, pair.makespan_us);
  if (std::abs(oef - pair.oef) > kConsistencyTolerance) {
    reader.report("oef", fmt::format("{:.6g}", pair.oef),
                  fmt::format("does not follow from the median times and makespan_us "
                              "((T_a + T_b - makespan) / min(T_a, T_b) = {:.6g})",
                              oef));
    return;
  }
  if (profile.find_pair(pair.a, pair.b)) {
    reader.report("a", json_value_text(Json(pair.a)), "this pair appears twice in /pairs");
    return;
  }
  profile.add_pair(std::move(pair));
}

// Reads an array field, calling `read_one(element, pointer)` for each element.
template <typename ReadOne>
void read_array(ObjectReader& root, const std::string& key, ReadOne read_one) {
  const Json* array = root.raw(key, Need::kRequired);
  if (array == nullptr) return;
  if (!array->is_array()) {
    root.report(key, json_value_text(*array), "must be an array");
    return;
  }
  for (size_t i = 0; i < array->size(); ++i) {
    read_one((*array)[i], fmt::format("{}/{}", root.pointer_of(key), i));
  }
}

// An opaque object field, converted to OrderedJson (keys keep the file's order as parsed).
OrderedJson read_opaque_object(ObjectReader& root, const std::string& key) {
  const Json* value = root.raw(key, Need::kRequired);
  if (value == nullptr) return OrderedJson::object();
  if (!value->is_object()) {
    root.report(key, json_value_text(*value), "must be an object");
    return OrderedJson::object();
  }
  return OrderedJson::parse(value->dump());
}

}  // namespace

std::optional<ProfileBackend> parse_profile_backend(const std::string& name) {
  return kProfileBackendNames.parse(name);
}

double quantize_profile_value(double value) { return std::round(value * 1e4) / 1e4; }

TimeStats TimeStats::exactly(double time_us) {
  return {time_us, time_us, time_us, time_us, time_us};
}

TimeStats TimeStats::quantized() const {
  return {quantize_profile_value(median_us), quantize_profile_value(p10_us),
          quantize_profile_value(p90_us), quantize_profile_value(min_us),
          quantize_profile_value(max_us)};
}

double overlap_effectiveness(double time_a_us, double time_b_us, double makespan_us) {
  // (T_a + T_b - P) / min written as 1 - (P - max) / min: exactly 1 when P == max.
  const double shorter = std::min(time_a_us, time_b_us);
  if (shorter <= 0) return 1.0;
  return 1.0 - (makespan_us - std::max(time_a_us, time_b_us)) / shorter;
}

void Profile::add_op(ProfiledOp op) {
  DHELIX_CHECK_MSG(!op_index_.contains(op.signature), op.signature);
  op_index_.emplace(op.signature, ops_.size());
  ops_.push_back(std::move(op));
}

std::string Profile::pair_key(const std::string& a, const std::string& b) {
  return a <= b ? a + '\n' + b : b + '\n' + a;
}

void Profile::add_pair(ProfiledPair pair) {
  DHELIX_CHECK_MSG(find_op(pair.a) != nullptr && find_op(pair.b) != nullptr,
                   pair.a + " x " + pair.b);
  const std::string key = pair_key(pair.a, pair.b);
  DHELIX_CHECK_MSG(!pair_index_.contains(key), key);
  if (pair.b < pair.a) {
    std::swap(pair.a, pair.b);
    std::swap(pair.finish_a_us, pair.finish_b_us);
  }
  pair_index_.emplace(key, pairs_.size());
  pairs_.push_back(std::move(pair));
}

const ProfiledOp* Profile::find_op(const std::string& signature) const {
  const auto it = op_index_.find(signature);
  return it == op_index_.end() ? nullptr : &ops_[it->second];
}

std::optional<ProfiledPair> Profile::find_pair(const std::string& a, const std::string& b) const {
  const auto it = pair_index_.find(pair_key(a, b));
  if (it == pair_index_.end()) return std::nullopt;
  ProfiledPair pair = pairs_[it->second];
  if (pair.a != a) {
    std::swap(pair.a, pair.b);
    std::swap(pair.finish_a_us, pair.finish_b_us);
  }
  return pair;
}

std::vector<std::string> Profile::missing_signatures(const std::vector<Op>& ops) const {
  std::vector<std::string> missing;
  std::unordered_set<std::string> seen;
  for (const Op& op : ops) {
    std::string signature = op.signature();
    if (find_op(signature) != nullptr || !seen.insert(signature).second) continue;
    missing.push_back(std::move(signature));
  }
  return missing;
}

OrderedJson profile_to_json(const Profile& profile) {
  OrderedJson root = OrderedJson::object();
  root["schema_version"] = kProfileSchemaVersion;
  root["meta"] = profile.meta;
  root["backend"] = profile_backend_name(profile.backend);
  root["cluster"] = profile.cluster;
  root["job"] = {{"model", profile.model_name}, {"parallel", profile.parallel}};
  OrderedJson ops = OrderedJson::array();
  for (const ProfiledOp& op : profile.ops()) {
    OrderedJson entry = OrderedJson::object();
    entry["signature"] = op.signature;
    entry["kind"] = op_kind_name(op.kind);
    entry["stream"] = stream_class_name(op.stream);
    entry["example_op_id"] = op.example_op_id;
    entry["time_us"] = stats_to_json(op.time_us);
    entry["samples"] = op.samples;
    ops.push_back(std::move(entry));
  }
  root["ops"] = std::move(ops);
  OrderedJson pairs = OrderedJson::array();
  for (const ProfiledPair& pair : profile.pairs()) {
    OrderedJson entry = OrderedJson::object();
    entry["a"] = pair.a;
    entry["b"] = pair.b;
    entry["finish_a_us"] = quantize_profile_value(pair.finish_a_us);
    entry["finish_b_us"] = quantize_profile_value(pair.finish_b_us);
    entry["makespan_us"] = quantize_profile_value(pair.makespan_us);
    entry["oef"] = quantize_profile_value(pair.oef);
    pairs.push_back(std::move(entry));
  }
  root["pairs"] = std::move(pairs);
  return root;
}

std::string profile_to_text(const Profile& profile) {
  return profile_to_json(profile).dump(2) + "\n";
}

void write_profile(const std::string& path, const Profile& profile) {
  write_file_atomically(path, profile_to_text(profile));
}

Profile profile_from_json(const Json& json, const std::string& file) {
  ProblemList problems;
  ObjectReader root(json, file, "", problems);
  if (!root.is_object()) problems.throw_if_any();
  check_schema_version(root, kProfileSchemaMajor);
  Profile profile;
  profile.meta = read_opaque_object(root, "meta");
  const auto backend = root.string("backend", Need::kRequired, {"model", "cpu", "cuda"});
  if (backend) profile.backend = *parse_profile_backend(*backend);
  profile.cluster = read_opaque_object(root, "cluster");
  if (std::optional<ObjectReader> job = root.object("job", Need::kRequired)) {
    profile.model_name = job->string("model", Need::kRequired).value_or("");
    profile.parallel = read_opaque_object(*job, "parallel");
    job->finish();
  }
  BadSignatures bad;
  read_array(root, "ops", [&](const Json& value, const std::string& pointer) {
    read_op(value, file, pointer, problems, profile, bad);
  });
  read_array(root, "pairs", [&](const Json& value, const std::string& pointer) {
    read_pair(value, file, pointer, problems, profile, bad);
  });
  root.finish();
  problems.throw_if_any();
  return profile;
}

Profile read_profile(const std::string& path) {
  const Json json = read_json_file(path);
  require_file_kind(json, path, FileKind::kProfile);
  return profile_from_json(json, path);
}

}  // namespace dhelix
