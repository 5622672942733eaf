#include "lib/did_you_mean.h"

#include <gtest/gtest.h>

namespace dhelix {
namespace {

TEST(EditDistanceTest, CountsInsertionsDeletionsAndSubstitutions) {
  EXPECT_EQ(edit_distance("", ""), 0);
  EXPECT_EQ(edit_distance("tp", "tp"), 0);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3);
  EXPECT_EQ(edit_distance("", "abc"), 3);
  EXPECT_EQ(edit_distance("hidden_size", "hiden_size"), 1);
}

TEST(DidYouMeanTest, SuggestsTheClosestPlausibleCandidate) {
  const std::vector<std::string> keys = {"hidden_size", "ffn_hidden_size", "num_layers"};
  EXPECT_EQ(closest_match("hiden_size", keys), "hidden_size");
  EXPECT_EQ(did_you_mean("num_layer", keys), " (did you mean \"num_layers\"?)");
}

TEST(DidYouMeanTest, StaysQuietWhenNothingIsClose) {
  const std::vector<std::string> keys = {"hidden_size", "num_layers"};
  EXPECT_EQ(did_you_mean("vocabulary", keys), "");
  EXPECT_EQ(did_you_mean("x", {}), "");
}

}  // namespace
}  // namespace dhelix
