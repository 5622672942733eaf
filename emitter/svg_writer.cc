#include "emitter/svg_writer.h"

#include <fmt/format.h>

#include <cmath>

#include "lib/error.h"

namespace dhelix {

std::string escape_xml(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;
    }
  }
  return out;
}

std::string svg_number(double value) {
  double rounded = std::round(value * 100.0) / 100.0;
  if (rounded == 0) rounded = 0;  // no "-0"
  std::string s = fmt::format("{:.2f}", rounded);
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

double nice_tick_step(double range, int target) {
  if (range <= 0 || target <= 0) return 1;
  const double raw = range / target;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double factor : {1.0, 2.0, 5.0}) {
    if (factor * power >= raw) return factor * power;
  }
  return 10 * power;
}

std::string format_time_us(double time_us) {
  const double magnitude = std::fabs(time_us);
  if (magnitude == 0) return "0";
  if (magnitude >= 1e6) return fmt::format("{:.3g} s", time_us * 1e-6);
  if (magnitude >= 1e3) return fmt::format("{:.3g} ms", time_us * 1e-3);
  return fmt::format("{:.3g} us", time_us);
}

double text_width_estimate(const std::string& text, double size) {
  return 0.6 * size * static_cast<double>(text.size());
}

SvgWriter::SvgWriter(double width, double height) : width_(width), height_(height) {}

void SvgWriter::element(const std::string& tag, const SvgAttributes& attributes,
                        const std::string& content) {
  body_ += "<" + tag;
  for (const auto& [name, value] : attributes)
    body_ += " " + name + "=\"" + escape_xml(value) + "\"";
  if (content.empty()) {
    body_ += "/>\n";
  } else {
    body_ += ">" + content + "</" + tag + ">\n";
  }
}

void SvgWriter::rect(double x, double y, double width, double height,
                     const SvgAttributes& attributes, const std::string& title) {
  SvgAttributes all = {{"x", svg_number(x)},
                       {"y", svg_number(y)},
                       {"width", svg_number(std::max(0.0, width))},
                       {"height", svg_number(std::max(0.0, height))}};
  all.insert(all.end(), attributes.begin(), attributes.end());
  element("rect", all, title.empty() ? "" : "<title>" + escape_xml(title) + "</title>");
}

void SvgWriter::line(double x1, double y1, double x2, double y2, const SvgAttributes& attributes) {
  SvgAttributes all = {{"x1", svg_number(x1)},
                       {"y1", svg_number(y1)},
                       {"x2", svg_number(x2)},
                       {"y2", svg_number(y2)}};
  all.insert(all.end(), attributes.begin(), attributes.end());
  element("line", all, "");
}

void SvgWriter::text(double x, double y, const std::string& content, double size,
                     const SvgAttributes& attributes) {
  SvgAttributes all = {{"x", svg_number(x)}, {"y", svg_number(y)}, {"font-size", svg_number(size)}};
  all.insert(all.end(), attributes.begin(), attributes.end());
  // An empty <text/> is fine XML; keep it explicit so that readers see nothing was lost.
  element("text", all, escape_xml(content));
}

void SvgWriter::open_group(const SvgAttributes& attributes) {
  body_ += "<g";
  for (const auto& [name, value] : attributes)
    body_ += " " + name + "=\"" + escape_xml(value) + "\"";
  body_ += ">\n";
  ++open_groups_;
}

void SvgWriter::close_group() {
  DHELIX_CHECK(open_groups_ > 0);
  body_ += "</g>\n";
  --open_groups_;
}

void SvgWriter::add_defs(const std::string& markup) { defs_ += markup + "\n"; }

std::string SvgWriter::finish() const {
  DHELIX_CHECK_MSG(open_groups_ == 0, "an SVG group was left open");
  std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  out += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" "
      "viewBox=\"0 0 {0} {1}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
      svg_number(width_), svg_number(height_));
  if (!defs_.empty()) out += "<defs>\n" + defs_ + "</defs>\n";
  out += fmt::format("<rect x=\"0\" y=\"0\" width=\"{}\" height=\"{}\" fill=\"white\"/>\n",
                     svg_number(width_), svg_number(height_));
  out += body_;
  out += "</svg>\n";
  return out;
}

}  // namespace dhelix
