//===- CostModelTest.cpp - Per-stage time and memory of a model ----------===//

#include "hpr/Analysis/CostModel.h"
#include "hpr/Schedule/Generators.h"
#include "hpr/Schedule/Lowering.h"
#include "hpr/Target/BuildModule.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

#include <algorithm>

using namespace mlir;
using namespace mlir::hpr;

namespace {

/// Builds the module of `staged` on a GPipe schedule (one stage per rank)
/// and returns the costs of its model.
std::vector<StageCost> costsOf(const model::StagedModel &staged) {
  MLIRContext context;
  auto schedule = sched::generateSchedule(
      "gpipe", {static_cast<int>(staged.stages.size()), 1, 0});
  if (!schedule) {
    ADD_FAILURE() << toString(schedule.takeError());
    return {};
  }
  sched::lowerCommunication(*schedule);
  auto module = buildPlanModule(context, staged, *schedule, "test");
  if (!module) {
    ADD_FAILURE() << toString(module.takeError());
    return {};
  }
  return computeStageCosts(*(*module)->getOps<ModelOp>().begin());
}

model::Region region(const char *name, bool checkpoint, double flops,
                     double timeUs, int64_t saved, int64_t input) {
  model::Region r;
  r.name = name;
  r.checkpoint = checkpoint;
  r.fwdFlops = flops;
  r.fwdTimeUs = timeUs;
  r.savedBytes = saved;
  r.inputBytes = input;
  return r;
}

TEST(CostModel, CheckpointedRegionsKeepTheirInputAndReplayTheirSaves) {
  model::StagedModel staged;
  staged.stages.push_back({0,
                           {region("embed", false, 0, 5, 100, 10),
                            region("layers.0", true, 0, 20, 1000, 64),
                            region("layers.1", true, 0, 30, 2000, 64)}});
  std::vector<StageCost> costs = costsOf(staged);
  ASSERT_EQ(costs.size(), 1u);
  EXPECT_TRUE(costs[0].checkpointed);
  EXPECT_DOUBLE_EQ(costs[0].forwardUs, 55);
  EXPECT_DOUBLE_EQ(costs[0].recomputeUs, 50);
  EXPECT_EQ(costs[0].keptBytes, 100 + 64 + 64);
  EXPECT_EQ(costs[0].recomputedBytes, 3000);
}

// A whole backward runs the regions last to first and frees what each kept
// as it leaves it. embed (plain, keeps 100, workspace 40), layers.0 (keeps
// its 64-byte input, replays 1000, workspace 300) and layers.1 (input 32,
// replays 2000, workspace 500): at layers.1, what all three keep (196), its
// replay and workspace, and no output gradient of its own (the stage's, with
// the stage output); at layers.0 what it and embed keep (164), its replay,
// workspace and the 32-byte gradient layers.1 made; at embed its 100, its
// workspace and the 64-byte gradient.
TEST(CostModel, AWholeBackwardMeetsEachRegionAfterTheLaterOnesFreed) {
  model::Region embed = region("embed", false, 0, 5, 100, 10);
  embed.bwdWorkspaceBytes = 40;
  model::Region first = region("layers.0", true, 0, 20, 1000, 64);
  first.bwdWorkspaceBytes = 300;
  model::Region second = region("layers.1", true, 0, 20, 2000, 32);
  second.bwdWorkspaceBytes = 500;
  model::StagedModel staged;
  staged.stages.push_back({0, {embed, first, second}});
  std::vector<StageCost> costs = costsOf(staged);
  ASSERT_EQ(costs.size(), 1u);
  const StageCost &cost = costs[0];
  int64_t kept = 100 + 64 + 32;
  ASSERT_EQ(cost.keptBytes, kept);
  int64_t atSecond = kept + 2000 + 500;
  int64_t atFirst = 164 + 1000 + 300 + 32;
  EXPECT_EQ(wholeBackwardPeakBytes(cost, true, {}),
            std::max(atSecond, atFirst) - kept);
  // layers.0 replayed before the backward: its 1000 bytes are held when
  // layers.1 runs, and only its own replay when it does.
  EXPECT_EQ(wholeBackwardPeakBytes(cost, true, {0}), atSecond + 1000 - kept);
  // layers.1 replayed before: held by layers.1 only (freed as it leaves).
  EXPECT_EQ(wholeBackwardPeakBytes(cost, true, {1}),
            std::max(atSecond, atFirst) - kept);
  // Plain: every region keeps its saved bytes (3100), none replays; at
  // layers.1 its workspace on top, at layers.0 what 0 and embed keep (1100)
  // with 300 + 32, at embed 100 + 40 + 64.
  EXPECT_EQ(wholeBackwardPeakBytes(cost, false, {}),
            std::max<int64_t>({3100 + 500, 1100 + 300 + 32, 100 + 40 + 64}) -
                3100);
}

TEST(CostModel, MeasuredCheckpointStateAndReplayBytesWin) {
  // A checkpoint holds the RNG states its replay restores, as long as the
  // input; a plainly run region holds no such state. A replay brings back
  // what was measured, else the region's saved bytes.
  model::StagedModel staged;
  model::Region kept = region("embed", false, 0, 5, 100, 10);
  kept.checkpointStateBytes = 7000;
  kept.replayBytes = 7;
  model::Region measured = region("layers.0", true, 0, 20, 1000, 64);
  measured.checkpointStateBytes = 5056;
  measured.replayBytes = 936;
  model::Region unmeasured = region("layers.1", true, 0, 20, 2000, 64);
  staged.stages.push_back({0, {kept, measured, unmeasured}});
  std::vector<StageCost> costs = costsOf(staged);
  ASSERT_EQ(costs.size(), 1u);
  EXPECT_EQ(costs[0].keptBytes, 100 + 64 + 5056 + 64);
  EXPECT_EQ(costs[0].plainKeptBytes, 100 + 1000 + 2000);
  EXPECT_EQ(costs[0].recomputedBytes, 936 + 2000);
}

TEST(CostModel, SelectiveRegionsKeepWhatTheirPolicySavesAndReplayTheRest) {
  // docs/models.md, "Policies": a selective checkpoint keeps the input,
  // the RNG states and its ops' outputs; its forward and replay take the
  // measured selective times; its backward is the region's.
  model::StagedModel staged;
  model::Region full = region("layers.0", true, 0, 20, 1000, 64);
  full.checkpointStateBytes = 5056;
  full.replayBytes = 936;
  full.checkpointFwdTimeUs = 22;
  full.replayTimeUs = 21;
  model::Region selective = full;
  selective.name = "layers.1";
  selective.selective = true;
  selective.selectiveFwdTimeUs = 25;
  selective.selectiveReplayTimeUs = 4;
  selective.selectiveSavedBytes = 300;
  selective.selectiveReplayBytes = 636;
  selective.bwdInputTimeUs = 30;
  staged.stages.push_back({0, {region("embed", false, 0, 5, 100, 10)}});
  staged.stages.push_back({1, {full, selective}});
  std::vector<StageCost> costs = costsOf(staged);
  ASSERT_EQ(costs.size(), 2u);
  EXPECT_DOUBLE_EQ(costs[1].forwardUs, 22 + 25);
  EXPECT_DOUBLE_EQ(costs[1].plainForwardUs, 20 + 20);
  EXPECT_DOUBLE_EQ(costs[1].recomputeUs, 21 + 4);
  EXPECT_DOUBLE_EQ(costs[1].backwardInputUs, kInputPerForward * 20 + 30);
  EXPECT_EQ(costs[1].keptBytes, (64 + 5056) + (64 + 5056 + 300));
  EXPECT_EQ(costs[1].recomputedBytes, 936 + 636);
  EXPECT_EQ(costs[1].plainKeptBytes, 1000 + 1000);

  // Priced as a choice: the selective region not checkpointed keeps
  // everything, and the full one priced selective takes its selective costs.
  MLIRContext context;
  auto schedule = sched::generateSchedule("gpipe", {2, 1, 0});
  ASSERT_TRUE(static_cast<bool>(schedule));
  sched::lowerCommunication(*schedule);
  auto module = buildPlanModule(context, staged, *schedule, "test");
  ASSERT_TRUE(static_cast<bool>(module));
  std::vector<StageCost> swapped = computeStageCosts(
      *(*module)->getOps<ModelOp>().begin(), [](RegionOp region) {
        return region.getSelective() ? RegionCheckpoint::None
                                     : RegionCheckpoint::Selective;
      });
  EXPECT_EQ(swapped[1].keptBytes, (64 + 5056 + 0) + 1000);
  EXPECT_DOUBLE_EQ(swapped[1].recomputeUs, 21);
}

TEST(CostModel, UnprofiledRegionsRunAtOneTeraflop) {
  model::StagedModel staged;
  staged.stages.push_back({0, {region("layers.0", true, 3e6, 0, 8, 8)}});
  std::vector<StageCost> costs = costsOf(staged);
  ASSERT_EQ(costs.size(), 1u);
  EXPECT_DOUBLE_EQ(costs[0].forwardUs, 3);
}

TEST(CostModel, ModelWithoutCostsFallsBackToUnitTime) {
  model::StagedModel staged;
  staged.stages.push_back({0, {region("a", true, 0, 0, 8, 8)}});
  staged.stages.push_back({1, {region("b", false, 0, 0, 8, 8)}});
  std::vector<StageCost> costs = costsOf(staged);
  ASSERT_EQ(costs.size(), 2u);
  EXPECT_DOUBLE_EQ(costs[0].forwardUs, 1);
  EXPECT_DOUBLE_EQ(costs[0].recomputeUs, 1);
  EXPECT_DOUBLE_EQ(costs[1].forwardUs, 1);
  EXPECT_DOUBLE_EQ(costs[1].recomputeUs, 0);
}

TEST(CostModel, MeasuredTimesWinOverRatios) {
  model::StagedModel staged;
  staged.stages.push_back({0, {region("embed", false, 0, 1, 8, 8)}});
  model::Region measured = region("layers.0", true, 0, 10, 8, 8);
  measured.bwdInputTimeUs = 17;
  measured.bwdWeightTimeUs = 4;
  measured.bwdTimeUs = 19;
  measured.checkpointFwdTimeUs = 12;
  measured.replayTimeUs = 13;
  staged.stages.push_back(
      {1, {measured, region("layers.1", false, 0, 20, 8, 8)}});
  std::vector<StageCost> costs = costsOf(staged);
  ASSERT_EQ(costs.size(), 2u);
  EXPECT_DOUBLE_EQ(costs[1].forwardUs, 12 + 20);
  EXPECT_DOUBLE_EQ(costs[1].recomputeUs, 13);
  EXPECT_DOUBLE_EQ(costs[1].backwardInputUs, 17 + kInputPerForward * 20);
  EXPECT_DOUBLE_EQ(costs[1].backwardWeightUs, 4 + kWeightPerForward * 20);
  EXPECT_DOUBLE_EQ(costs[1].backwardUs,
                   19 + (kInputPerForward + kWeightPerForward) * 20);
}

TEST(CostModel, FirstStageInputNeedsNoGradient) {
  model::StagedModel staged;
  model::Region embed = region("embed", false, 0, 2, 8, 8);
  embed.bwdInputTimeUs = 1;
  embed.bwdWeightTimeUs = 3;
  model::Region layer = region("layers.0", false, 0, 10, 8, 8);
  layer.bwdInputTimeUs = 11;
  layer.bwdWeightTimeUs = 7;
  staged.stages.push_back({0, {embed, layer}});
  staged.stages.push_back({1, {layer}});
  std::vector<StageCost> costs = costsOf(staged);
  ASSERT_EQ(costs.size(), 2u);
  EXPECT_DOUBLE_EQ(costs[0].backwardInputUs, 0);
  EXPECT_DOUBLE_EQ(costs[0].backwardWeightUs, 1 + 3 + 11 + 7);
  EXPECT_DOUBLE_EQ(costs[1].backwardInputUs, 11);
  EXPECT_DOUBLE_EQ(costs[1].backwardWeightUs, 7);
  EXPECT_DOUBLE_EQ(costs[1].backwardUs, 11 + 7);
}

TEST(CostModel, UnitTimeModelHasEqualForwardAndBackwardHalves) {
  model::StagedModel staged;
  staged.stages.push_back({0, {region("a", true, 0, 0, 8, 8)}});
  std::vector<StageCost> costs = costsOf(staged);
  ASSERT_EQ(costs.size(), 1u);
  EXPECT_DOUBLE_EQ(costs[0].backwardInputUs, 1);
  EXPECT_DOUBLE_EQ(costs[0].backwardWeightUs, 1);
  EXPECT_DOUBLE_EQ(costs[0].backwardUs, 2);
}

TEST(CostModel, PlainCostsIgnoreTheCheckpointChoice) {
  model::StagedModel staged;
  model::Region measured = region("layers.0", true, 0, 10, 1000, 64);
  measured.checkpointFwdTimeUs = 12;
  staged.stages.push_back(
      {0, {region("embed", false, 0, 5, 100, 10), measured}});
  std::vector<StageCost> costs = costsOf(staged);
  ASSERT_EQ(costs.size(), 1u);
  EXPECT_DOUBLE_EQ(costs[0].forwardUs, 5 + 12);
  EXPECT_DOUBLE_EQ(costs[0].plainForwardUs, 5 + 10);
  EXPECT_EQ(costs[0].keptBytes, 100 + 64);
  EXPECT_EQ(costs[0].plainKeptBytes, 100 + 1000);
}

TEST(CostModel, ChoiceCanBePricedBeforeItIsMade) {
  MLIRContext context;
  model::StagedModel staged;
  staged.stages.push_back({0,
                           {region("layers.0", true, 0, 10, 1000, 64),
                            region("layers.1", true, 0, 30, 2000, 64)}});
  auto schedule = sched::generateSchedule("gpipe", {1, 1, 0});
  ASSERT_TRUE(static_cast<bool>(schedule));
  auto module = buildPlanModule(context, staged, *schedule, "test");
  ASSERT_TRUE(static_cast<bool>(module));
  ModelOp modelOp = *(*module)->getOps<ModelOp>().begin();
  std::vector<StageCost> costs =
      computeStageCosts(modelOp, [](RegionOp region) {
        return region.getName() == "layers.1" ? RegionCheckpoint::Full
                                              : RegionCheckpoint::None;
      });
  EXPECT_EQ(costs[0].keptBytes, 1000 + 64);
  EXPECT_EQ(costs[0].recomputedBytes, 2000);
  EXPECT_DOUBLE_EQ(costs[0].recomputeUs, 30);
  EXPECT_FALSE(computeStageCosts(
                   modelOp, [](RegionOp) { return RegionCheckpoint::None; })[0]
                   .checkpointed);
}

// The rule written out as a table, independently of computeStageCosts (which
// sums by it) and of `hp_recompute.costs --from-run` (which scales by it
// through the bindings): which region field each action adds.
TEST(CostModel, RegionTimeRuleNamesTheFieldEachActionAdds) {
  using Kind = sched::ActionKind;
  auto field = [](Kind kind, bool first, bool ckptForward, bool ckptRegion,
                  bool selective = false) -> std::string {
    RegionCheckpoint checkpoint = !ckptRegion ? RegionCheckpoint::None
                                  : selective ? RegionCheckpoint::Selective
                                              : RegionCheckpoint::Full;
    std::optional<RegionTime> time =
        regionTimeOf(kind, first, ckptForward, checkpoint);
    return time ? regionTimeKey(*time).str() : "-";
  };
  EXPECT_EQ(field(Kind::Forward, false, true, true, true),
            "selective_fwd_time_us");
  EXPECT_EQ(field(Kind::Forward, false, false, true, true), "fwd_time_us");
  EXPECT_EQ(field(Kind::Recompute, false, true, true, true),
            "selective_replay_time_us");
  EXPECT_EQ(field(Kind::BackwardInput, false, true, true, true),
            "bwd_input_time_us");
  EXPECT_EQ(field(Kind::Forward, false, true, true), "checkpoint_fwd_time_us");
  EXPECT_EQ(field(Kind::Forward, false, false, true), "fwd_time_us");
  EXPECT_EQ(field(Kind::Forward, false, true, false), "fwd_time_us");
  EXPECT_EQ(field(Kind::Recompute, false, true, true), "replay_time_us");
  EXPECT_EQ(field(Kind::Recompute, false, true, false), "-");
  EXPECT_EQ(field(Kind::BackwardInput, false, true, true), "bwd_input_time_us");
  EXPECT_EQ(field(Kind::BackwardInput, true, true, true), "-");
  EXPECT_EQ(field(Kind::BackwardWeight, false, true, false),
            "bwd_weight_time_us");
  EXPECT_EQ(field(Kind::BackwardWeight, true, true, false), "bwd_time_us");
  EXPECT_EQ(field(Kind::Backward, true, true, false), "bwd_time_us");
  EXPECT_EQ(field(Kind::Backward, false, true, true), "bwd_time_us");
  EXPECT_EQ(field(Kind::Clear, false, true, true), "-");
  EXPECT_EQ(field(Kind::SendF, false, true, true), "-");
}

/// One stage whose regions hold `paramBytes` of parameters, under the
/// data-parallel layout `shard` x `replicate`.
std::vector<StageCost> dataParallelCosts(int64_t paramBytes, int64_t shard,
                                         int64_t replicate) {
  model::StagedModel staged;
  model::Region r = region("layers.0", true, 0, 100, 8, 8);
  r.paramBytes = paramBytes;
  staged.stages.push_back({0, {r}});
  staged.dataParallel = {shard, replicate};
  return costsOf(staged);
}

// docs/models.md, "Data parallelism", by hand at 25 GB/s (25000 bytes/us)
// and 10 us per collective, for 1 MB of parameters.
TEST(CostModel, CollectivesArePricedByTheDocumentedFormula) {
  // FSDP over 2: all-gather (1/2) * 1e6 / 25000 + 10 = 30 us; REDUCE_GRAD is
  // the reduce-scatter of the same bytes.
  std::vector<StageCost> two = dataParallelCosts(1000000, 2, 1);
  ASSERT_EQ(two.size(), 1u);
  EXPECT_DOUBLE_EQ(two[0].unshardUs, 30);
  EXPECT_DOUBLE_EQ(two[0].reduceGradUs, 30);
  EXPECT_EQ(two[0].shardedParamBytes(), 500000);
  // HSDP 3 x 4: all-gather (3/4) * 40 + 10 = 40 us; REDUCE_GRAD adds the
  // all-reduce of the 250000-byte shard over 3: 2 * (2/3) * 10 + 10.
  std::vector<StageCost> hsdp = dataParallelCosts(1000000, 4, 3);
  EXPECT_DOUBLE_EQ(hsdp[0].unshardUs, 40);
  EXPECT_DOUBLE_EQ(hsdp[0].reduceGradUs, 40 + 40.0 / 3 + 10);
  EXPECT_EQ(hsdp[0].shardedParamBytes(), 250000);
  // Without data parallelism nothing moves.
  std::vector<StageCost> one = dataParallelCosts(1000000, 1, 1);
  EXPECT_DOUBLE_EQ(one[0].unshardUs, 0);
  EXPECT_DOUBLE_EQ(one[0].reduceGradUs, 0);
  EXPECT_EQ(one[0].shardedParamBytes(), 1000000);
}

TEST(CostModel, CollectiveFormulaEdges) {
  EXPECT_DOUBLE_EQ(allGatherUs(1000000, 1), 0);
  EXPECT_DOUBLE_EQ(allGatherUs(0, 8), 0);
  EXPECT_DOUBLE_EQ(allGatherUs(800000, 8), 7.0 / 8 * 32 + 10);
  EXPECT_DOUBLE_EQ(allReduceUs(800000, 2), 32 + 10);
}
} // namespace
