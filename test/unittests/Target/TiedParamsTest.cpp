//===- TiedParamsTest.cpp - A tied weight is held once per stage ----------===//
//
// A model whose first and last regions read one weight (an embedding tied to
// the head, listed in both regions' tied_params), planned against the same
// model without the member, which counts the weight in both regions: on one
// stage the tied plan holds the weight once, so its parameter bytes are lower
// by exactly the weight's bytes, and so is its step peak (the peak holds the
// stage's gradients, which its first backward allocates; a later one adds
// its fresh copy in region by region, docs/models.md, "Cost model"); on two
// stages, separate modules, each holds
// its own copy and the plans agree.
//
//===----------------------------------------------------------------------===//

#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Driver/Planner.h"
#include "hpr/InitAll.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <algorithm>

using namespace mlir;
using namespace mlir::hpr;

namespace {

constexpr int64_t kTiedBytes = 65536;

/// The model JSON, with or without the embedding's tied_params.
std::string modelJson(bool tied) {
  std::string weight =
      tied ? R"(, "tied_params": [{"name": "embed.weight", "bytes": 65536}])"
           : "";
  return R"({"name": "tied", "regions": [
    {"name": "embed", "checkpointable": false, "fwd_flops": 10,
     "saved_bytes": 4096, "input_bytes": 512, "param_bytes": 65536)" +
         weight + R"(},
    {"name": "layers.0", "fwd_flops": 1000, "saved_bytes": 8192,
     "input_bytes": 4096, "param_bytes": 16384},
    {"name": "head", "checkpointable": false, "fwd_flops": 100,
     "saved_bytes": 4096, "input_bytes": 4096, "param_bytes": 69632)" +
         weight + "}]}";
}

struct TiedPlan {
  int64_t paramBytes = 0;
  int64_t peakMemoryBytes = 0;
};

/// Plans the model on gpipe with `ranks` stages (the last region alone on
/// the second); its regions' parameter bytes and the largest step peak.
TiedPlan plan(bool tied, int ranks) {
  DialectRegistry registry;
  registerAllDialects(registry);
  MLIRContext context(registry);
  PlanRequest request;
  request.modelJsonText = modelJson(tied);
  request.modelJsonName = "tied.json";
  request.scheduleGen = "gpipe";
  request.ranks = ranks;
  request.microbatches = 2;
  if (ranks == 2)
    request.stageSpec = "0:0-1,1:2";
  TimingScope timing;
  auto planned = runPlanner(context, request, timing, nullptr);
  EXPECT_TRUE(static_cast<bool>(planned)) << toString(planned.takeError());
  TiedPlan out;
  if (!planned)
    return out;
  planned->module->walk(
      [&](RegionOp region) { out.paramBytes += region.getParamBytes(); });
  for (const RankSummary &rank : planned->summary.ranks)
    out.peakMemoryBytes = std::max(out.peakMemoryBytes, rank.peakMemoryBytes);
  return out;
}

TEST(TiedParams, OneStageHoldsTheWeightOnce) {
  TiedPlan tied = plan(true, 1), counted = plan(false, 1);
  EXPECT_EQ(counted.paramBytes - tied.paramBytes, kTiedBytes);
  EXPECT_EQ(counted.peakMemoryBytes - tied.peakMemoryBytes, kTiedBytes);
}

TEST(TiedParams, TwoStagesHoldACopyEach) {
  TiedPlan tied = plan(true, 2), counted = plan(false, 2);
  EXPECT_EQ(tied.paramBytes, counted.paramBytes);
  EXPECT_EQ(tied.peakMemoryBytes, counted.peakMemoryBytes);
}

} // namespace
