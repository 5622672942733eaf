#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "emitter/plan_pictures.h"
#include "emitter/svg_pairing.h"
#include "emitter/svg_pipeline.h"
#include "emitter/svg_writer.h"
#include "lib/error.h"
#include "lib/plan/plan_reader.h"
#include "tests/emitter/picture_fixture.h"

namespace dhelix {
namespace {

using testing::fixture_plan;

// ----- a minimal XML well-formedness check ----------------------------------------------
//
// Enough for what the SVG writer emits: an optional declaration, elements with quoted
// attributes, text and entity references. Returns "" when well-formed, else the first fault.

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ':' ||
         c == '.';
}

std::string check_entity(const std::string& xml, size_t& i) {
  const size_t end = xml.find(';', i);
  if (end == std::string::npos || end - i > 8) return "bare & at " + std::to_string(i);
  const std::string entity = xml.substr(i + 1, end - i - 1);
  static const std::set<std::string> kEntities = {"amp", "lt", "gt", "quot", "apos"};
  if (!kEntities.count(entity) && (entity.empty() || entity[0] != '#')) {
    return "unknown entity &" + entity + "; at " + std::to_string(i);
  }
  i = end + 1;
  return "";
}

std::string xml_fault(const std::string& xml) {
  std::vector<std::string> open;
  size_t i = 0;
  bool root_seen = false;
  if (xml.rfind("<?xml", 0) == 0) i = xml.find("?>") + 2;
  while (i < xml.size()) {
    if (xml[i] == '&') {
      if (std::string e = check_entity(xml, i); !e.empty()) return e;
      continue;
    }
    if (xml[i] == '>') return "bare > in text at " + std::to_string(i);
    if (xml[i] != '<') {
      if (open.empty() && !std::isspace(static_cast<unsigned char>(xml[i]))) {
        return "text outside the root at " + std::to_string(i);
      }
      ++i;
      continue;
    }
    const bool closing = i + 1 < xml.size() && xml[i + 1] == '/';
    size_t j = i + (closing ? 2 : 1);
    const size_t name_start = j;
    while (j < xml.size() && is_name_char(xml[j])) ++j;
    const std::string name = xml.substr(name_start, j - name_start);
    if (name.empty()) return "tag without a name at " + std::to_string(i);
    std::set<std::string> attributes;
    while (true) {
      while (j < xml.size() && std::isspace(static_cast<unsigned char>(xml[j]))) ++j;
      if (j >= xml.size()) return "unterminated tag <" + name;
      if (xml[j] == '>' || (xml[j] == '/' && j + 1 < xml.size() && xml[j + 1] == '>')) break;
      if (closing) return "attribute in closing tag </" + name;
      const size_t a = j;
      while (j < xml.size() && is_name_char(xml[j])) ++j;
      const std::string attribute = xml.substr(a, j - a);
      if (attribute.empty() || j >= xml.size() || xml[j] != '=') {
        return "malformed attribute in <" + name + " at " + std::to_string(a);
      }
      if (!attributes.insert(attribute).second) return "duplicate attribute " + attribute;
      ++j;
      if (j >= xml.size() || (xml[j] != '"' && xml[j] != '\'')) {
        return "unquoted attribute " + attribute + " in <" + name;
      }
      const char quote = xml[j++];
      while (j < xml.size() && xml[j] != quote) {
        if (xml[j] == '<') return "< in attribute " + attribute;
        if (xml[j] == '&') {
          if (std::string e = check_entity(xml, j); !e.empty()) return e;
          continue;
        }
        ++j;
      }
      if (j >= xml.size()) return "unterminated attribute " + attribute;
      ++j;
    }
    const bool self_closing = xml[j] == '/';
    i = j + (self_closing ? 2 : 1);
    if (closing) {
      if (open.empty() || open.back() != name) return "unbalanced </" + name + ">";
      open.pop_back();
    } else if (!self_closing) {
      if (open.empty()) {
        if (root_seen) return "second root <" + name + ">";
        root_seen = true;
      }
      open.push_back(name);
    } else if (open.empty()) {
      return "empty root";
    }
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  return root_seen ? "" : "no root element";
}

TEST(XmlCheck, FindsTheFaultsItLooksFor) {
  EXPECT_EQ(xml_fault("<svg><g a=\"1\"/><text>a &amp; b</text></svg>"), "");
  EXPECT_EQ(xml_fault("<svg><g></svg>"), "unbalanced </svg>");
  EXPECT_EQ(xml_fault("<svg><g a=1/></svg>"), "unquoted attribute a in <g");
  EXPECT_EQ(xml_fault("<svg><text>a & b</text></svg>"), "bare & at 13");
  EXPECT_EQ(xml_fault("<svg><text>a < b</text></svg>"), "tag without a name at 13");
  EXPECT_EQ(xml_fault("<svg>"), "unclosed <svg>");
  EXPECT_EQ(xml_fault("<svg a=\"1\" a=\"2\"/>"), "duplicate attribute a");
}

// ----- the writer -----------------------------------------------------------------------

TEST(SvgWriter, EscapesAndFormats) {
  EXPECT_EQ(escape_xml("F3d+B1u <a & 'b'> \"c\"\x01"),
            "F3d+B1u &lt;a &amp; &apos;b&apos;&gt; &quot;c&quot;");
  EXPECT_EQ(svg_number(12.5), "12.5");
  EXPECT_EQ(svg_number(3.0), "3");
  EXPECT_EQ(svg_number(-0.001), "0");
  EXPECT_EQ(svg_number(0.125), "0.13");
  EXPECT_EQ(svg_number(-2.25), "-2.25");
  EXPECT_DOUBLE_EQ(nice_tick_step(220805, 12), 20000);
  EXPECT_DOUBLE_EQ(nice_tick_step(374.8e6, 10), 50e6);
  EXPECT_DOUBLE_EQ(nice_tick_step(9, 10), 1);
  EXPECT_EQ(format_time_us(850), "850 us");
  EXPECT_EQ(format_time_us(32672.981), "32.7 ms");
  EXPECT_EQ(format_time_us(1.25e6), "1.25 s");
}

TEST(SvgWriter, WritesADocument) {
  SvgWriter svg(100, 50);
  svg.open_group({{"id", "g<1>"}});
  svg.rect(1, 2, 3.333, 4, {{"fill", "red"}}, "a & b");
  svg.line(0, 0, 10, 10, {{"stroke", "#000"}});
  svg.text(5, 6, "x<y", 10);
  svg.close_group();
  const std::string doc = svg.finish();
  EXPECT_EQ(xml_fault(doc), "");
  EXPECT_NE(doc.find("<g id=\"g&lt;1&gt;\">\n<rect x=\"1\" y=\"2\" width=\"3.33\" height=\"4\" "
                     "fill=\"red\"><title>a &amp; b</title></rect>\n"),
            std::string::npos)
      << doc;
  EXPECT_NE(doc.find("<text x=\"5\" y=\"6\" font-size=\"10\">x&lt;y</text>"), std::string::npos);
  EXPECT_NE(doc.find("viewBox=\"0 0 100 50\""), std::string::npos);
}

// ----- the pictures ---------------------------------------------------------------------

TEST(SvgPairing, CommOverlapsOfTheFixture) {
  const PlanPairing pairing = testing::fixture_pairing();
  const std::vector<CommOverlap> o = comm_overlaps(pairing, pairing.layer_blocks);
  ASSERT_EQ(o.size(), 3u);
  EXPECT_EQ(o[0].op, "f.ag");
  EXPECT_EQ(o[0].block, 0);
  EXPECT_DOUBLE_EQ(o[0].time_us, 4);
  EXPECT_DOUBLE_EQ(o[0].exposed_us, 0);
  EXPECT_EQ(o[0].hidden_under, std::vector<std::string>{"b.x"});
  EXPECT_EQ(o[1].op, "b.rs");
  EXPECT_DOUBLE_EQ(o[1].exposed_us, 2);
  EXPECT_EQ(o[1].hidden_under, std::vector<std::string>{"f.b"});
  EXPECT_EQ(o[2].op, "b.kv");
  EXPECT_EQ(o[2].strand, Pass::kBackward);
  EXPECT_DOUBLE_EQ(o[2].exposed_us, 2);
}

TEST(SvgPairing, FixturePictureShowsBlocksAndExposedComm) {
  const std::string svg = pairing_svg(fixture_plan(), 0);
  EXPECT_EQ(xml_fault(svg), "");
  EXPECT_NE(svg.find("fixture: strand interleaving of one layer pair (pairing 0, stages 0, 1)"),
            std::string::npos);
  EXPECT_NE(svg.find("2 blocks: 22 us + 16 us = 38 us; strands one after the other: 48 us (saves "
                     "20.8 %)"),
            std::string::npos);
  EXPECT_NE(svg.find("communication 12 us: hidden 8 us, exposed 4 us"), std::string::npos);
  EXPECT_NE(svg.find("B rs (b1, 5 us): under b"), std::string::npos);  // from 0, as the report
  EXPECT_NE(svg.find("exposed 2 us"), std::string::npos);
  EXPECT_NE(svg.find("fill=\"url(#hidden-fwd)\""), std::string::npos);
  EXPECT_NE(svg.find("<title>b.rs exposed for 2 us</title>"), std::string::npos);
  // One barrier per block edge: 3.
  size_t barriers = 0;
  for (size_t at = svg.find("stroke-dasharray=\"4,3\""); at != std::string::npos;
       at = svg.find("stroke-dasharray=\"4,3\"", at + 1)) {
    ++barriers;
  }
  EXPECT_EQ(barriers, 3u + 1u);  // + the legend's sample
}

TEST(SvgPairing, EveryOpHasAHoverTitleAndBlocksCountFromZero) {
  const Plan plan = fixture_plan();
  const std::string svg = pairing_svg(plan, 0);
  for (const PlanBlock& block : plan.pairings[0].layer_blocks) {
    for (const PlanOpTiming& t : block.timings) {
      EXPECT_NE(svg.find("<title>" + t.op + " ("), std::string::npos) << t.op;
    }
  }
  EXPECT_NE(svg.find(">b0</text>"), std::string::npos);
  EXPECT_NE(svg.find(">b1</text>"), std::string::npos);
  EXPECT_EQ(svg.find(">b2</text>"), std::string::npos);
}

TEST(SvgPairing, SliverBlocksAreLabelledAsOneGroup) {
  Plan plan = fixture_plan();
  std::vector<PlanBlock>& blocks = plan.pairings[0].layer_blocks;
  // Three 0.05 us blocks between the two real ones: a few hundredths of a pixel each.
  const auto sliver = [](Pass strand, const char* op) {
    return PlanBlock{
        .time_us = 0.05, .forward_ops = {}, .backward_ops = {}, .timings = {{strand, op, 0, 0.05}}};
  };
  blocks.insert(blocks.begin() + 1, {sliver(Pass::kForward, "f.b"), sliver(Pass::kBackward, "b.y"),
                                     sliver(Pass::kForward, "f.a")});
  const std::string svg = pairing_svg(plan, 0);
  EXPECT_EQ(xml_fault(svg), "");
  EXPECT_NE(svg.find(">b1-b3</text>"), std::string::npos) << svg;
  EXPECT_NE(svg.find("<title>b1-b3: 3 blocks narrower than the picture can show apart\nb1 ("),
            std::string::npos);
  EXPECT_NE(svg.find(">b4</text>"), std::string::npos);
  // Barriers at the group's edges only: b0 | b1-b3 | b4 |, and the legend's sample.
  size_t barriers = 0;
  for (size_t at = svg.find("stroke-dasharray=\"4,3\""); at != std::string::npos;
       at = svg.find("stroke-dasharray=\"4,3\"", at + 1)) {
    ++barriers;
  }
  EXPECT_EQ(barriers, 4u + 1u);
}

TEST(SvgPairing, RefusesAMissingPairing) {
  try {
    pairing_svg(fixture_plan(), 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "plan: pairing 1 does not exist (1 pairings)");
  }
}

TEST(SvgPipeline, FixtureHasOneRowPerStageAndEveryTask) {
  const std::string svg = pipeline_svg(fixture_plan());
  EXPECT_EQ(xml_fault(svg), "");
  EXPECT_NE(svg.find(">stage 0</text>"), std::string::npos);
  EXPECT_NE(svg.find(">stage 1</text>"), std::string::npos);
  EXPECT_EQ(svg.find("zoomed"), std::string::npos);  // 6 tasks: one panel
  size_t boxes = 0;
  for (size_t at = svg.find("<title>"); at != std::string::npos; at = svg.find("<title>", at + 1)) {
    ++boxes;
  }
  EXPECT_EQ(boxes, 10u);
  EXPECT_NE(svg.find("<title>F2d+B0u (si_block): 250 us to 326 us, 76 us</title>"),
            std::string::npos);
  EXPECT_NE(svg.find(">F2d+B0u</text>"), std::string::npos);  // wide enough for its label
  EXPECT_NE(svg.find("predicted iteration 470 us, 1.11x Megatron 1F1B"), std::string::npos);
}

std::string example_path(const std::string& name) {
  return std::string(DHELIX_SOURCE_DIR) + "/examples/plans/" + name + ".json";
}

TEST(SvgPipeline, ExamplePlansZoomIntoStartAndEnd) {
  const Plan plan = read_plan(example_path("llama-39b-a40-dp2-tp8-cp2-pp2-seq16k"));
  const std::string svg = pipeline_svg(plan);
  EXPECT_EQ(xml_fault(svg), "");
  EXPECT_NE(svg.find("start: warm-up into steady state (zoomed)"), std::string::npos);
  EXPECT_NE(svg.find("end: steady state into cool-down (zoomed)"), std::string::npos);
  EXPECT_NE(svg.find(">F3d+B1u</text>"), std::string::npos);
  EXPECT_NE(svg.find(">I255d</text>"), std::string::npos);  // the split drain's last I
  const std::string pairing = pairing_svg(plan, 0);
  EXPECT_EQ(xml_fault(pairing), "");
  EXPECT_NE(pairing.find("cross-layer window of 2 layers (this scope used by the stages)"),
            std::string::npos);
}

// Writes both pictures of every example plan, and of the fixture, into $DHELIX_SVG_OUT
// (tests/emitter/render_svg_test.sh renders them) or a temporary folder.
TEST(SvgFiles, WritesBothPicturesOfEveryExamplePlan) {
  const char* out = std::getenv("DHELIX_SVG_OUT");
  const std::filesystem::path dir =
      out != nullptr ? std::filesystem::path(out)
                     : std::filesystem::temp_directory_path() / "dhelix-svg-test";
  std::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, Plan>> plans = {{"fixture", fixture_plan()}};
  for (const char* name : {"llama-25b-a40-dp8-tp8", "llama-39b-a40-dp2-tp8-cp2-pp2-seq16k"}) {
    plans.push_back({name, read_plan(example_path(name))});
  }
  for (const auto& [name, plan] : plans) {
    const std::string prefix = (dir / name).string();
    write_svg_files(plan, prefix);
    for (const char* suffix : {"-pipeline.svg", "-pairing.svg"}) {
      std::ifstream in(prefix + suffix);
      ASSERT_TRUE(in.good()) << prefix << suffix;
      std::stringstream text;
      text << in.rdbuf();
      EXPECT_EQ(xml_fault(text.str()), "") << prefix << suffix;
    }
  }
  if (out == nullptr) std::filesystem::remove_all(dir);
}

TEST(SvgFiles, UnwritablePathIsAnIoError) {
  try {
    write_svg_files(fixture_plan(), "/nonexistent-dir/x");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIo);
  }
}

}  // namespace
}  // namespace dhelix
