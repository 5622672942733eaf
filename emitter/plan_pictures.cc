#include "emitter/plan_pictures.h"

#include "emitter/svg_pairing.h"
#include "emitter/svg_pipeline.h"
#include "lib/atomic_file.h"

namespace dhelix {

void write_svg_files(const Plan& plan, const std::string& path_prefix) {
  // Both pictures are made before either is written: a bad plan leaves no half pair behind.
  const std::string pipeline = pipeline_svg(plan);
  const std::string pairing = pairing_svg(plan, 0);
  write_file_atomically(path_prefix + "-pipeline.svg", pipeline);
  write_file_atomically(path_prefix + "-pairing.svg", pairing);
}

}  // namespace dhelix
