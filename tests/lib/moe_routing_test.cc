#include "lib/moe_routing.h"

#include <gtest/gtest.h>

namespace dhelix {
namespace {

ModelSpec moe_model(double capacity_factor) {
  ModelSpec model;
  MoeSpec moe;
  moe.num_experts = 16;
  moe.top_k = 2;
  moe.capacity_factor = capacity_factor;
  model.moe = moe;
  return model;
}

TEST(MoeRouting, DefaultIsTheAuxiliaryLossMeasurement) {
  EXPECT_DOUBLE_EQ(moe_load_imbalance(moe_model(0), ParallelSpec{}), 1.72);
  EXPECT_DOUBLE_EQ(moe_load_imbalance(moe_model(6), ParallelSpec{}), 1.72);  // cap 6 > 1.72
}

TEST(MoeRouting, CapacityFactorCapsTheBusiestExpert) {
  EXPECT_DOUBLE_EQ(moe_load_imbalance(moe_model(1.25), ParallelSpec{}), 1.25);
  EXPECT_DOUBLE_EQ(moe_load_imbalance(moe_model(0.5), ParallelSpec{}), 1.0);  // never below 1
}

TEST(MoeRouting, TheJobsFigureWinsAndDenseModelsAreBalanced) {
  ParallelSpec parallel;
  parallel.moe_load_imbalance = 3.0;
  EXPECT_DOUBLE_EQ(moe_load_imbalance(moe_model(0), parallel), 3.0);
  EXPECT_DOUBLE_EQ(moe_load_imbalance(moe_model(2), parallel), 2.0);
  EXPECT_DOUBLE_EQ(moe_load_imbalance(ModelSpec{}, parallel), 1.0);
}

}  // namespace
}  // namespace dhelix
