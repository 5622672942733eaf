#pragma once
// A small builder of SVG documents: shapes and text with attributes, groups, raw <defs>, and
// XML escaping. Numbers are written with at most 2 decimals so that output is deterministic
// and compact. The builder keeps tags balanced: every open_group has its close_group (checked
// when the document is finished).

#include <string>
#include <utility>
#include <vector>

namespace dhelix {

/// Strand colours shared by every picture, so that forward is blue and backward orange in
/// the pairing and the pipeline pictures alike.
inline constexpr const char* kForwardFill = "#4e79a7";
inline constexpr const char* kBackwardFill = "#f28e2b";

/// Attributes in the order written: {name, value}; values are escaped by the writer.
using SvgAttributes = std::vector<std::pair<std::string, std::string>>;

/// `text` with &, <, >, " and ' replaced by entities; control characters other than tab and
/// newline (not allowed in XML 1.0) dropped.
std::string escape_xml(const std::string& text);

/// `value` with at most 2 decimals and no trailing zeros ("12.5", "3", "-0.25").
std::string svg_number(double value);

/// A round step (1, 2 or 5 times a power of ten) that cuts `range` into about `target` parts.
double nice_tick_step(double range, int target);

/// A time for a picture: "850 us", "32.7 ms", "1.25 s" (3 significant figures or so).
std::string format_time_us(double time_us);

/// About how wide `text` is in a sans-serif font of `size` px (for deciding what fits).
double text_width_estimate(const std::string& text, double size);

/// An SVG document of a fixed size in user units (pixels).
class SvgWriter {
 public:
  /// A document `width` x `height`, with a white background and a sans-serif font.
  SvgWriter(double width, double height);

  /// <rect>; `title`, when not empty, becomes a tooltip (<title> child).
  void rect(double x, double y, double width, double height, const SvgAttributes& attributes,
            const std::string& title = "");
  /// <line> from (x1, y1) to (x2, y2).
  void line(double x1, double y1, double x2, double y2, const SvgAttributes& attributes);
  /// <text> at (x, y) (baseline), `size` px.
  void text(double x, double y, const std::string& content, double size,
            const SvgAttributes& attributes = {});
  /// <g> with attributes; close with close_group.
  void open_group(const SvgAttributes& attributes);
  void close_group();
  /// Adds markup to <defs> (patterns, markers); the caller writes well-formed markup.
  void add_defs(const std::string& markup);

  /// The whole document, with an XML declaration. Aborts when a group is left open.
  std::string finish() const;

 private:
  void element(const std::string& tag, const SvgAttributes& attributes, const std::string& content);

  double width_;
  double height_;
  std::string defs_;
  std::string body_;
  int open_groups_ = 0;
};

}  // namespace dhelix
