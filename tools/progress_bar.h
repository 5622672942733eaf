#pragma once
// A progress bar on standard error, drawn only when standard error is a terminal (a pipe or
// a file gets nothing, so logs and tests stay clean):
//
//   checking plan.json [##########..........]  50 %
//
// It redraws in place ("\r") when the whole percentage changes and erases itself when done
// or destroyed, so the line that follows starts clean.

#include <cstdint>
#include <string>

namespace dhelix {

class ProgressBar {
 public:
  /// `label` precedes the bar. Draws nothing unless standard error is a terminal.
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  /// `done` of `total` steps; the bar is erased when done reaches total.
  void update(int64_t done, int64_t total);

 private:
  void erase();

  std::string label_;
  bool enabled_ = false;
  bool drawn_ = false;
  int64_t last_percent_ = -1;
};

}  // namespace dhelix
