#include "tools/progress_bar.h"

#include <unistd.h>

#include <cstdio>
#include <string>

namespace dhelix {
namespace {

constexpr int64_t kWidth = 20;  // characters of the bar itself

}  // namespace

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), enabled_(isatty(fileno(stderr)) == 1) {}

ProgressBar::~ProgressBar() { erase(); }

void ProgressBar::update(int64_t done, int64_t total) {
  if (!enabled_ || total <= 0) return;
  if (done >= total) {
    erase();
    return;
  }
  const int64_t percent = 100 * done / total;
  if (percent == last_percent_) return;
  last_percent_ = percent;
  const int64_t filled = kWidth * done / total;
  const std::string bar = std::string(static_cast<size_t>(filled), '#') +
                          std::string(static_cast<size_t>(kWidth - filled), '.');
  std::fprintf(stderr, "\r%s [%s] %3lld %%", label_.c_str(), bar.c_str(),
               static_cast<long long>(percent));
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::erase() {
  if (!drawn_) return;
  // Blank the line, then return to its start.
  std::fprintf(stderr, "\r%s\r", std::string(label_.size() + kWidth + 10, ' ').c_str());
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace dhelix
