//===- ActivationModelTest.cpp - Activation lifetimes and profiles --------===//

#include "hpr/Analysis/ActivationModel.h"
#include "hpr/Schedule/Generators.h"
#include "hpr/Target/BuildModule.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <map>

using namespace mlir;
using namespace mlir::hpr;

namespace {

/// One checkpointed stage that keeps 64 bytes under checkpoint, replays
/// 1000, on one rank running F0 F1 B0 B1 (GPipe, two microbatches).
struct OneRank {
  MLIRContext context;
  OwningOpRef<ModuleOp> module;

  OneRank() {
    context.loadDialect<HPRDialect>();
    model::StagedModel staged;
    model::Region region;
    region.name = "layers.0";
    region.checkpoint = true;
    region.fwdTimeUs = 1;
    region.savedBytes = 1000;
    region.inputBytes = 64;
    staged.stages.push_back({0, {region}});
    auto schedule = sched::generateSchedule("gpipe", {1, 2, 0});
    EXPECT_TRUE(static_cast<bool>(schedule));
    auto built = buildPlanModule(context, staged, *schedule, "test");
    EXPECT_TRUE(static_cast<bool>(built));
    module = std::move(*built);
  }
  ProgramOp program() {
    return *(*module->getOps<ScheduleOp>().begin())
                .getBody()
                .getOps<ProgramOp>()
                .begin();
  }
  std::vector<StageCost> costs() {
    return computeStageCosts(*module->getOps<ModelOp>().begin());
  }
};

TEST(ActivationModel, JitSpansBeforePlanning) {
  OneRank fixture;
  ProgramActivations activations =
      collectActivationLifetimes(fixture.program());
  ASSERT_EQ(activations.numPositions, 4u); // F0 F1 B0 B1
  ActivationProfile profile =
      computeActivationProfile(activations, fixture.costs());
  // mb0 keeps 64 over F0..B0 and replays 1000 at B0; mb1 likewise one later.
  EXPECT_EQ(profile.live, (std::vector<int64_t>{64, 128, 1128, 1064}));
  EXPECT_EQ(profile.endingAt, (std::vector<int64_t>{0, 0, 1064, 1064}));
  EXPECT_EQ(profile.peak(), 1128);
}

TEST(ActivationModel, PlainMicrobatchKeepsEverything) {
  OneRank fixture;
  ProgramActivations activations =
      collectActivationLifetimes(fixture.program());
  ActivationProfile profile = computeActivationProfile(
      activations, fixture.costs(), [](const ActivationLifetime &lifetime) {
        return lifetime.microbatch != 1;
      });
  EXPECT_EQ(profile.live, (std::vector<int64_t>{64, 1064, 2064, 1000}));
}

TEST(ActivationModel, PlannedSpansFollowRecomputeAndClear) {
  OneRank fixture;
  PassManager pm(&fixture.context);
  RecomputePipelineOptions options;
  buildRecomputePipeline(pm, options);
  ASSERT_TRUE(succeeded(pm.run(*fixture.module)));
  // F0 s0 F1 s1 R0 B0 C0 R1 B1 C1; each B is its session's one reader, so
  // the jit replay runs inside it (in_backward) and lives at B only.
  ProgramActivations activations =
      collectActivationLifetimes(fixture.program());
  ASSERT_EQ(activations.numPositions, 10u);
  ASSERT_EQ(activations.lifetimes.size(), 2u);
  EXPECT_TRUE(activations.lifetimes[0].replayInBackward);
  EXPECT_EQ(activations.lifetimes[0].replayBeginPos, 5u);
  EXPECT_EQ(activations.lifetimes[0].replayEndPos, 5u);
  ActivationProfile profile =
      computeActivationProfile(activations, fixture.costs());
  EXPECT_EQ(profile.live, (std::vector<int64_t>{64, 64, 128, 128, 128, 1128, 64,
                                                64, 1064, 0}));
  // One replay at a time: mb 0's is cleared before mb 1's recompute.
  EXPECT_EQ(countMaxLiveReplays(activations), 1u);
}

/// Two checkpointed regions in each stage (replays of 1000 and 600 bytes),
/// one stage per rank, two microbatches of `schedule`.
static OwningOpRef<ModuleOp> twoRegions(MLIRContext &context,
                                        llvm::StringRef schedule, int ranks = 1,
                                        bool measuredWeightBytes = false) {
  context.loadDialect<HPRDialect>();
  model::StagedModel staged;
  for (int stage = 0; stage < ranks; ++stage) {
    staged.stages.push_back({stage, {}});
    for (int64_t saved : {1000, 600}) {
      model::Region region;
      region.name = "layers." + std::to_string(2 * stage + (saved == 600));
      region.checkpoint = true;
      region.fwdTimeUs = 1;
      region.savedBytes = saved;
      region.inputBytes = 64;
      // What a dw reads of the replay: 300 of the 1000, 200 of the 600.
      if (measuredWeightBytes)
        region.replayWeightBytes = saved == 1000 ? 300 : 200;
      staged.stages.back().regions.push_back(region);
    }
  }
  auto generated = sched::generateSchedule(schedule, {ranks, 2, 0});
  EXPECT_TRUE(static_cast<bool>(generated));
  auto built = buildPlanModule(context, staged, *generated, "test");
  EXPECT_TRUE(static_cast<bool>(built));
  PassManager pm(&context);
  buildRecomputePipeline(pm, RecomputePipelineOptions());
  EXPECT_TRUE(succeeded(pm.run(**built)));
  return std::move(*built);
}

/// The activations of rank `rank`'s program.
static ProgramActivations programOf(ModuleOp module, size_t rank = 0) {
  auto programs =
      (*module.getOps<ScheduleOp>().begin()).getBody().getOps<ProgramOp>();
  return collectActivationLifetimes(*std::next(programs.begin(), rank));
}

TEST(ActivationModel, ReplayInsideOneBackwardHoldsOneRegionAtATime) {
  MLIRContext context;
  OwningOpRef<ModuleOp> module = twoRegions(context, "gpipe");
  std::vector<StageCost> costs =
      computeStageCosts(*module->getOps<ModelOp>().begin());
  ASSERT_EQ(costs[0].recomputedBytes, 1600);
  // The backward replays layers.1 (600) next to both inputs, then layers.0
  // (1000) once layers.1's input is freed: 64 + 1000 at worst, 936 on top
  // of the 128 the forward keeps.
  ASSERT_EQ(costs[0].backwardReplayBytes, 64 + 1000 - 128);
  // F0 F1 B0 B1: at B0, microbatch 1's inputs and microbatch 0's worst.
  ActivationProfile profile =
      computeActivationProfile(programOf(*module), costs);
  EXPECT_EQ(profile.peak(), 2 * 64 + 64 + 1000);
}

TEST(ActivationModel, BackwardAfterAPieceMeetsThePiecesBelowEachRegion) {
  MLIRContext context;
  OwningOpRef<ModuleOp> module = twoRegions(context, "gpipe");
  StageCost cost = computeStageCosts(*module->getOps<ModelOp>().begin())[0];
  ASSERT_EQ(cost.replayedRegions.size(), 2u);
  EXPECT_EQ(replayBytesOf(cost, {1}), 600);
  // The last region prefetched: the backward reads it first and drops it
  // before layers.0 replays, so it holds what it held without the piece.
  EXPECT_EQ(backwardReplayBytesAfter(cost, {1}), cost.backwardReplayBytes);
  // The first one prefetched stays beside layers.1's replay: 128 kept, 600
  // replayed, 1000 prefetched.
  EXPECT_EQ(backwardReplayBytesAfter(cost, {0}), 128 + 600 + 1000 - 128);
  EXPECT_EQ(backwardReplayBytesAfter(cost, {0, 1}), 1600);
}

/// Rank 0's program of `module` with its first replay split: the piece
/// `piece` right before it, the rest (`rest`) left inside its backward.
static ProgramOp splitFirstReplay(ModuleOp module, ArrayRef<int64_t> piece,
                                  ArrayRef<int64_t> rest) {
  ProgramOp program = *(*module.getOps<ScheduleOp>().begin())
                           .getBody()
                           .getOps<ProgramOp>()
                           .begin();
  RecomputeOp inside = *program.getBody().getOps<RecomputeOp>().begin();
  OpBuilder builder(inside);
  builder.create<RecomputeOp>(inside.getLoc(), inside.getSession(), false,
                              builder.getDenseI64ArrayAttr(piece));
  inside.setRegions(rest);
  return program;
}

TEST(ActivationModel, PieceHoldsItsRegionsUpToTheBackward) {
  MLIRContext context;
  OwningOpRef<ModuleOp> module = twoRegions(context, "gpipe");
  std::vector<StageCost> costs =
      computeStageCosts(*module->getOps<ModelOp>().begin());
  // mb 0's jit replay becomes a piece of layers.1 after F1, the rest inside
  // B0.
  ProgramActivations activations =
      collectActivationLifetimes(splitFirstReplay(*module, {1}, {0}));
  ASSERT_EQ(activations.lifetimes[0].prefetchedPieces.size(), 1u);
  ActivationProfile profile = computeActivationProfile(activations, costs);
  // Where the piece runs: both microbatches' inputs and its 600.
  unsigned piecePos = activations.lifetimes[0].prefetchedPieces[0].pos;
  EXPECT_EQ(profile.live[piecePos], 2 * 128 + 600);
  // B0 reads layers.1 first and drops it before layers.0 replays: jit's
  // peak, 2 * 64 + 64 + 1000.
  EXPECT_EQ(profile.peak(), 2 * 64 + 64 + 1000);
}

TEST(ActivationModel, PieceOfTheFirstRegionMeetsTheSecondsReplay) {
  MLIRContext context;
  OwningOpRef<ModuleOp> module = twoRegions(context, "gpipe");
  std::vector<StageCost> costs =
      computeStageCosts(*module->getOps<ModelOp>().begin());
  ProgramOp program = splitFirstReplay(*module, {0}, {1});
  // At B0: mb 1's 128, mb 0's 128 and layers.0's 1000 still held while
  // layers.1 replays its 600.
  EXPECT_EQ(computeActivationProfile(collectActivationLifetimes(program), costs)
                .peak(),
            128 + 128 + 1000 + 600);
}

/// One stage of two regions, the first checkpointed (input 64, replay 1000)
/// and the second plain (saves 800), or the other way round.
static StageCost mixedStage(bool checkpointFirst) {
  MLIRContext context;
  context.loadDialect<HPRDialect>();
  model::StagedModel staged;
  staged.stages.push_back({0, {}});
  for (bool checkpoint : {checkpointFirst, !checkpointFirst}) {
    model::Region region;
    region.name = "layers." + std::to_string(staged.stages[0].regions.size());
    region.checkpoint = checkpoint;
    region.fwdTimeUs = 1;
    region.savedBytes = checkpoint ? 1000 : 800;
    region.inputBytes = 64;
    staged.stages[0].regions.push_back(region);
  }
  auto generated = sched::generateSchedule("gpipe", {1, 1, 0});
  EXPECT_TRUE(static_cast<bool>(generated));
  auto built = buildPlanModule(context, staged, *generated, "test");
  EXPECT_TRUE(static_cast<bool>(built));
  return computeStageCosts(*(*built)->getOps<ModelOp>().begin())[0];
}

TEST(ActivationModel, PlainRegionAfterTheReplayIsFreedBeforeIt) {
  // The backward runs the plain region first and frees its 800 before the
  // checkpointed one replays: 64 + 1000 at worst, against the 864 kept.
  StageCost cost = mixedStage(/*checkpointFirst=*/true);
  ASSERT_EQ(cost.keptBytes, 64 + 800);
  EXPECT_EQ(cost.backwardReplayBytes, 64 + 1000 - (64 + 800));
  // Plain first: its 800 are still kept when the replay runs.
  cost = mixedStage(/*checkpointFirst=*/false);
  ASSERT_EQ(cost.keptBytes, 800 + 64);
  EXPECT_EQ(cost.backwardReplayBytes, 1000);
}

TEST(ActivationModel, ReplayReadByIAndWIsWhole) {
  MLIRContext context;
  OwningOpRef<ModuleOp> module = twoRegions(context, "zb-h1", 2);
  // Rank 1 runs stage 1, whose I computes the input's gradient.
  ProgramActivations activations = programOf(*module, 1);
  ASSERT_FALSE(activations.lifetimes.empty());
  for (const ActivationLifetime &lifetime : activations.lifetimes)
    EXPECT_FALSE(lifetime.replayInBackward);
  std::vector<StageCost> costs =
      computeStageCosts(*module->getOps<ModelOp>().begin());
  EXPECT_GE(computeActivationProfile(activations, costs).peak(), 2 * 64 + 1600);
}

TEST(ActivationModel, DxReleasesWhatNoDwReads) {
  // The same plan with and without replay_weight_bytes: from the op after
  // each session's I to its clear it holds 500 (300 + 200) instead of 1600,
  // and up to its I the whole replay.
  MLIRContext context;
  OwningOpRef<ModuleOp> whole = twoRegions(context, "zb-h1", 2);
  OwningOpRef<ModuleOp> released = twoRegions(context, "zb-h1", 2, true);
  ProgramActivations activations = programOf(*released, 1);
  ASSERT_EQ(activations.lifetimes.size(), 2u);
  auto profileOf = [&](ModuleOp module) {
    return computeActivationProfile(
        activations, computeStageCosts(*module.getOps<ModelOp>().begin()));
  };
  ActivationProfile before = profileOf(*whole), after = profileOf(*released);
  bool someReleased = false;
  for (unsigned pos = 0; pos < activations.numPositions; ++pos) {
    int64_t releasedSessions = 0;
    for (const ActivationLifetime &lifetime : activations.lifetimes) {
      ASSERT_TRUE(lifetime.releasedAfterDx);
      releasedSessions +=
          lifetime.firstConsumerPos < pos && pos <= lifetime.replayEndPos;
    }
    someReleased |= releasedSessions > 0;
    EXPECT_EQ(before.live[pos] - after.live[pos], releasedSessions * 1100)
        << "position " << pos;
  }
  EXPECT_TRUE(someReleased);
  // Stage 0's W is its one reader: nothing to release there.
  for (const ActivationLifetime &lifetime : programOf(*released, 0).lifetimes)
    EXPECT_FALSE(lifetime.releasedAfterDx);
}

TEST(ActivationModel, WhatIKeepsForWLivesFromIToW) {
  // ZB-H1 on 2 ranks: rank 1's I of each microbatch keeps 77 bytes of
  // gradients for its W; the profile holds them at exactly the positions
  // from that I to that W, inclusive, so a budget sees a deferred W.
  MLIRContext context;
  OwningOpRef<ModuleOp> module = twoRegions(context, "zb-h1", 2);
  auto programs =
      (*module->getOps<ScheduleOp>().begin()).getBody().getOps<ProgramOp>();
  ProgramOp program = *std::next(programs.begin(), 1);
  ProgramActivations activations = collectActivationLifetimes(program);
  std::vector<StageCost> costs =
      computeStageCosts(*module->getOps<ModelOp>().begin());
  ActivationProfile without = computeActivationProfile(activations, costs);
  costs[1].weightStateBytes = 77;
  ActivationProfile with = computeActivationProfile(activations, costs);
  std::map<int64_t, unsigned> inputAt, weightAt;
  unsigned pos = 0;
  for (Operation &op : program.getBody().getOps()) {
    if (auto i = dyn_cast<BackwardInputOp>(op))
      inputAt[i.getMicrobatchIndex()] = pos;
    if (auto w = dyn_cast<BackwardWeightOp>(op))
      weightAt[w.getMicrobatchIndex()] = pos;
    ++pos;
  }
  ASSERT_EQ(inputAt.size(), 2u);
  ASSERT_EQ(weightAt.size(), 2u);
  for (pos = 0; pos < activations.numPositions; ++pos) {
    int64_t pending = 0;
    for (auto [mb, at] : inputAt)
      pending += at <= pos && pos <= weightAt[mb];
    EXPECT_EQ(with.live[pos] - without.live[pos], 77 * pending)
        << "position " << pos;
  }
  EXPECT_EQ(with.peak() - without.peak(), 77 * 2);
}

/// Rank 1's program of a ZB-H1 plan on two ranks (twoRegions, with
/// replay_weight_bytes: a dw reads 500 of the 1600 replayed), and the
/// positions of each microbatch's dx and dw.
struct SplitRank {
  MLIRContext context;
  OwningOpRef<ModuleOp> module = twoRegions(context, "zb-h1", 2, true);
  ProgramOp program;
  std::map<int64_t, BackwardInputOp> inputs;
  std::map<int64_t, BackwardWeightOp> weights;

  SplitRank() {
    auto programs =
        (*module->getOps<ScheduleOp>().begin()).getBody().getOps<ProgramOp>();
    program = *std::next(programs.begin(), 1);
    for (auto input : program.getBody().getOps<BackwardInputOp>())
      inputs[input.getMicrobatchIndex()] = input;
    for (auto weight : program.getBody().getOps<BackwardWeightOp>())
      weights[weight.getMicrobatchIndex()] = weight;
  }
  std::vector<StageCost> costs() {
    return computeStageCosts(*module->getOps<ModelOp>().begin());
  }
  unsigned positionOf(Operation *op) {
    unsigned pos = 0;
    for (Operation &each : program.getBody().getOps()) {
      if (&each == op)
        return pos;
      ++pos;
    }
    return pos;
  }
};

TEST(ActivationModel, WeightReplayHoldsNothingFromDxToItsReplay) {
  // Both dws replay again for themselves, jit (before any hpr.recompute
  // {for_weight} is placed): from the op after each dx to the op before its
  // dw the session holds nothing of its replay, 500 less than the dw reads
  // when the dx keeps it; up to the dx and from the dw on, the same bytes.
  SplitRank rank;
  ASSERT_EQ(rank.weights.size(), 2u);
  std::vector<StageCost> costs = rank.costs();
  ASSERT_EQ(costs[1].weightRecomputedBytes, 500);
  // What the dx keeps for the dw lives from dx to dw either way.
  costs[1].weightStateBytes = 77;
  ActivationProfile kept =
      computeActivationProfile(collectActivationLifetimes(rank.program), costs);
  for (auto &[mb, weight] : rank.weights)
    weight.setWeightReplay(true);
  ProgramActivations activations = collectActivationLifetimes(rank.program);
  for (const ActivationLifetime &lifetime : activations.lifetimes) {
    EXPECT_TRUE(lifetime.weightReplay);
    EXPECT_FALSE(lifetime.weightReplayPlaced);
    EXPECT_EQ(lifetime.weightReplayPos, lifetime.lastConsumerPos);
  }
  ActivationProfile dropped = computeActivationProfile(activations, costs);
  bool someDropped = false;
  for (unsigned pos = 0; pos < activations.numPositions; ++pos) {
    int64_t droppedSessions = 0;
    for (auto &[mb, input] : rank.inputs)
      droppedSessions += rank.positionOf(input) < pos &&
                         pos < rank.positionOf(rank.weights[mb]);
    someDropped |= droppedSessions > 0;
    EXPECT_EQ(kept.live[pos] - dropped.live[pos], 500 * droppedSessions)
        << "position " << pos;
  }
  EXPECT_TRUE(someDropped);
  // A microbatch that runs plainly replays nothing: the mark changes nothing.
  auto plain = [](const ActivationLifetime &) { return false; };
  EXPECT_EQ(computeActivationProfile(activations, costs, plain).live,
            computeActivationProfile(collectActivationLifetimes(rank.program),
                                     costs, plain)
                .live);
}

TEST(ActivationModel, PlacedReplayForWeightLivesFromItsRecompute) {
  // mb 0's replay for its dw placed two ops after its dx: it holds nothing
  // of the replay at the op between them, and from there on what the dw
  // reads, as when the dx keeps it.
  SplitRank rank;
  Operation *between = rank.inputs[0]->getNextNode();
  Operation *at = between->getNextNode();
  ASSERT_TRUE(at->isBeforeInBlock(rank.weights[0]));
  OpBuilder builder(at);
  Value session = rank.inputs[0].getSession();
  builder.create<RecomputeOp>(session.getLoc(), session, false,
                              DenseI64ArrayAttr(), /*for_weight=*/true);
  std::vector<StageCost> costs = rank.costs();
  ActivationProfile kept =
      computeActivationProfile(collectActivationLifetimes(rank.program), costs);
  rank.weights[0].setWeightReplay(true);
  ProgramActivations activations = collectActivationLifetimes(rank.program);
  const ActivationLifetime &first = activations.lifetimes[0];
  ASSERT_EQ(first.microbatch, 0);
  EXPECT_TRUE(first.weightReplayPlaced);
  EXPECT_EQ(first.weightReplayPos, rank.positionOf(between) + 1);
  ActivationProfile dropped = computeActivationProfile(activations, costs);
  for (unsigned pos = 0; pos < activations.numPositions; ++pos)
    EXPECT_EQ(kept.live[pos] - dropped.live[pos],
              pos == rank.positionOf(between) ? 500 : 0)
        << "position " << pos;
}

TEST(ActivationModel, FirstStageReplaysInsideItsWeightBackward) {
  MLIRContext context;
  OwningOpRef<ModuleOp> module = twoRegions(context, "zb-h1", 2);
  // Stage 0's I reads nothing (the model input needs no gradient): its W is
  // the one reader, and holds one region at a time.
  ProgramActivations activations = programOf(*module, 0);
  ASSERT_FALSE(activations.lifetimes.empty());
  for (const ActivationLifetime &lifetime : activations.lifetimes) {
    EXPECT_TRUE(lifetime.replayInBackward);
    EXPECT_EQ(lifetime.firstConsumerPos, lifetime.lastConsumerPos);
  }
  std::vector<StageCost> costs =
      computeStageCosts(*module->getOps<ModelOp>().begin());
  int64_t peak = computeActivationProfile(activations, costs).peak();
  EXPECT_LT(peak, 2 * 64 + 1600);
  EXPECT_GE(peak, 1000);
}

TEST(ActivationModel, ReplaysPlacedEarlyOverlap) {
  OneRank fixture;
  PassManager pm(&fixture.context);
  RecomputePipelineOptions options;
  options.policy = RecomputePolicy::Lookahead;
  options.distance = 9;
  buildRecomputePipeline(pm, options);
  ASSERT_TRUE(succeeded(pm.run(*fixture.module)));
  // Both recomputes right after their sessions: live together from mb 1's.
  EXPECT_EQ(countMaxLiveReplays(collectActivationLifetimes(fixture.program())),
            2u);
  // Before planning nothing is placed.
  OneRank unplanned;
  EXPECT_EQ(
      countMaxLiveReplays(collectActivationLifetimes(unplanned.program())), 0u);
}

} // namespace
