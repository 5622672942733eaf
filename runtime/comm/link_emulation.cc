#include "runtime/comm/link_emulation.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <string_view>
#include <utility>

#include "lib/error.h"

namespace dhelix::rt {
namespace {

struct Unit {
  std::string_view suffix;
  double scale;
};

// A non-negative finite number followed by one of `units` (the longest suffix that fits
// wins: "mbit" before "bit"); nullopt otherwise.
std::optional<double> number_with_unit(std::string_view text, std::initializer_list<Unit> units) {
  for (const Unit& unit : units) {
    if (text.size() <= unit.suffix.size() || !text.ends_with(unit.suffix)) continue;
    const std::string_view digits = text.substr(0, text.size() - unit.suffix.size());
    double value = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
    if (!std::isfinite(value) || value < 0) return std::nullopt;
    return value * unit.scale;
  }
  return std::nullopt;
}

[[noreturn]] void refuse(const std::string& flag, std::string_view value, const std::string& rule) {
  throw Error(ErrorCode::kInvalidInput, fmt::format("{}: '{}' {}", flag, value, rule));
}

// "[KIND=]RATE[@LATENCY]" -> (kind or nullopt, figures).
std::pair<std::optional<ParallelDim>, LinkRate> parse_one(const std::string& flag,
                                                          std::string_view value) {
  std::string_view rest = value;
  std::optional<ParallelDim> kind;
  if (const size_t equals = rest.find('='); equals != std::string_view::npos) {
    const std::string_view name = rest.substr(0, equals);
    kind = kParallelDimNames.parse(name);
    if (!kind) {
      refuse(flag, value,
             fmt::format("names the group kind '{}': use one of tp, cp, ep, dp, pp, or leave "
                         "KIND= out for every kind",
                         name));
    }
    rest = rest.substr(equals + 1);
  }
  std::string_view rate_text = rest, latency_text = "0us";
  if (const size_t at = rest.find('@'); at != std::string_view::npos) {
    rate_text = rest.substr(0, at);
    latency_text = rest.substr(at + 1);
  }
  // tc's units: bits per second, 1000-based.
  const std::optional<double> bits_per_s = number_with_unit(
      rate_text, {{"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}, {"tbit", 1e12}, {"bit", 1}});
  if (!bits_per_s || *bits_per_s <= 0) {
    refuse(flag, value,
           fmt::format("has rate '{}': write a positive number of bits per second as tc does: "
                       "500mbit, 2gbit, 100kbit",
                       rate_text));
  }
  const std::optional<double> latency_us = number_with_unit(latency_text, {{"us", 1}, {"ms", 1e3}});
  if (!latency_us) {
    refuse(flag, value,
           fmt::format("has latency '{}': write a number of microseconds or milliseconds "
                       "after the @: 20us, 0.5ms",
                       latency_text));
  }
  LinkRate rate{.bus_bandwidth_gbps = *bits_per_s / 8 / 1e9,
                .latency_us = *latency_us,
                .text = fmt::format("{}@{}us", rate_text, *latency_us)};
  return {kind, std::move(rate)};
}

}  // namespace

LinkEmulation LinkEmulation::parse(const std::vector<std::string>& values,
                                   const std::string& flag) {
  LinkEmulation emulation;
  std::optional<LinkRate> every_kind;
  std::array<bool, kParallelDimNames.names.size()> given{};
  for (const std::string& value : values) {
    auto [kind, rate] = parse_one(flag, value);
    if (!kind) {
      if (every_kind)
        refuse(flag, value, "is a second setting for every kind: give KIND= once each");
      every_kind = std::move(rate);
      continue;
    }
    const auto index = static_cast<size_t>(*kind);
    if (given[index]) {
      refuse(
          flag, value,
          fmt::format("is a second setting for {}: give each kind once", parallel_dim_name(*kind)));
    }
    given[index] = true;
    emulation.rates_[index] = std::move(rate);
  }
  if (every_kind) {
    for (auto& rate : emulation.rates_) {
      if (!rate) rate = every_kind;
    }
  }
  return emulation;
}

const LinkRate* LinkEmulation::rate(ParallelDim kind) const {
  const auto& rate = rates_[static_cast<size_t>(kind)];
  return rate ? &*rate : nullptr;
}

bool LinkEmulation::enabled() const {
  for (const auto& rate : rates_) {
    if (rate) return true;
  }
  return false;
}

std::string LinkEmulation::describe() const {
  std::string text;
  for (const ParallelDim kind : kParallelDimNames.values()) {
    const LinkRate* link = rate(kind);
    if (link == nullptr) continue;
    text += fmt::format("{}{} {}", text.empty() ? "" : ", ", parallel_dim_name(kind), link->text);
  }
  return text;
}

OrderedJson LinkEmulation::to_json() const {
  OrderedJson json = OrderedJson::object();
  for (const ParallelDim kind : kParallelDimNames.values()) {
    const LinkRate* link = rate(kind);
    if (link == nullptr) continue;
    json[parallel_dim_name(kind)] = {{"link", link->text},
                                     {"bus_bandwidth_gbps", link->bus_bandwidth_gbps},
                                     {"latency_us", link->latency_us}};
  }
  json["note"] =
      "emulated link (runtime/comm/emulated_link.h): the bytes moved through shared memory and "
      "each transfer completed when the modelled link would have finished it; this shows the "
      "runtime's schedule on a modelled link, not a network";
  return json;
}

}  // namespace dhelix::rt
