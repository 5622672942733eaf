#include "emitter/plan_pictures.h"

#include "emitter/svg_pairing.h"
#include "emitter/svg_pipeline.h"
#include "lib/atomic_file.h"

namespace dhelix {

void add_svg_files(const Plan& plan, const std::string& path_prefix, OutputFiles& files) {
  files.add(path_prefix + "-pipeline.svg", pipeline_svg(plan));
  files.add(path_prefix + "-pairing.svg", pairing_svg(plan, 0));
}

std::vector<std::string> svg_file_names(const std::string& path_prefix) {
  return {path_prefix + "-pipeline.svg", path_prefix + "-pairing.svg"};
}

void write_svg_files(const Plan& plan, const std::string& path_prefix) {
  // Both pictures are made before either is written: a bad plan leaves no half pair behind.
  OutputFiles files;
  add_svg_files(plan, path_prefix, files);
  files.commit();
}

}  // namespace dhelix
