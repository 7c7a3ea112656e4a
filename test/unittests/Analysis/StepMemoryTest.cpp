//===- StepMemoryTest.cpp - Gathered parameters in a rank's step ---------===//

#include "hpr/Analysis/StepMemory.h"
#include "hpr/Schedule/Generators.h"
#include "hpr/Schedule/Lowering.h"
#include "hpr/Target/BuildModule.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <iterator>

using namespace mlir;
using namespace mlir::hpr;

namespace {

/// The step peak of `module`'s program of `rank`.
int64_t programPeak(ModuleOp module, unsigned rank = 0) {
  ProgramOp program = *std::next((*module.getOps<ScheduleOp>().begin())
                                     .getBody()
                                     .getOps<ProgramOp>()
                                     .begin(),
                                 rank);
  std::vector<StageCost> costs =
      computeStageCosts(*module.getOps<ModelOp>().begin());
  ProgramActivations activations = collectActivationLifetimes(program);
  return computeStepPeakBytes(program, activations,
                              computeActivationProfile(activations, costs),
                              costs);
}

/// The step peak of one rank running F0 B0 REDUCE_GRAD of one stage with
/// 1000 parameter bytes and 200 saved bytes, FSDP-sharded over `shard`,
/// with hpr-insert-unshard's UNSHARD and RESHARD; its output (the model's)
/// has `outputBytes`.
int64_t stepPeak(int64_t shard, int64_t outputBytes = 0) {
  MLIRContext context;
  context.loadDialect<HPRDialect>();
  model::StagedModel staged;
  model::Region region;
  region.name = "layers.0";
  region.fwdTimeUs = 1;
  region.savedBytes = 200;
  region.paramBytes = 1000;
  region.outputBytes = outputBytes;
  staged.stages.push_back({0, {region}});
  staged.dataParallel.shard = shard;
  auto schedule = sched::generateSchedule("gpipe", {1, 1, 0});
  EXPECT_TRUE(static_cast<bool>(schedule));
  sched::lowerReduceGrad(*schedule);
  auto module = buildPlanModule(context, staged, *schedule, "test");
  EXPECT_TRUE(static_cast<bool>(module));
  PassManager pm(&context);
  nestOnPrograms(pm).addPass(createHPRInsertUnshard());
  EXPECT_TRUE(succeeded(pm.run(**module)));
  return programPeak(**module);
}

// Unsharded: the 200 activations, and the 1000 gradient bytes B allocates
// as it reaches the region, before it leaves it (frees what it kept).
TEST(StepMemory, WithoutShardingOnlyGradientsAdd) {
  EXPECT_EQ(stepPeak(1), 1200);
}

// Over 4: UNSHARD adds the full 1000 parameter bytes beside the rank's
// shard (FSDP2 copies the all-gather into full-size parameters; F: 200 +
// 1000), B its 1000 gradient bytes (2200), and REDUCE_GRAD's 250-byte shard
// meets the gathered parameters and the full gradients before these go
// (2250); RESHARD frees the 1000.
TEST(StepMemory, GatheredParametersAndTheReducedShardCount) {
  EXPECT_EQ(stepPeak(4), 2250);
}

// The model output (50 bytes), which the loss outside the model reads, lives
// from F to its backward, and B makes its gradient (the loss's backward) on
// top: 200 + 50 + 50 + the 1000 gradient bytes.
TEST(StepMemory, TheModelOutputAndItsGradientLiveToItsBackward) {
  EXPECT_EQ(stepPeak(1, 50), 1300);
}

/// The step peak of `rank` in schedule `name` over two ranks and
/// `microbatches`: stage 0 is one region saving 100 bytes a microbatch with
/// `firstParams` parameter bytes, stage 1 is `second` (its input_bytes are
/// stage 0's output).
int64_t twoStagePeak(llvm::StringRef name, int microbatches, unsigned rank,
                     int64_t firstParams, model::Region second) {
  MLIRContext context;
  context.loadDialect<HPRDialect>();
  model::StagedModel staged;
  model::Region first;
  first.name = "layers.0";
  first.fwdTimeUs = 1;
  first.savedBytes = 100;
  first.paramBytes = firstParams;
  staged.stages.push_back({0, {first}});
  staged.stages.push_back({1, {second}});
  auto schedule = sched::generateSchedule(name, {2, microbatches, 0});
  EXPECT_TRUE(static_cast<bool>(schedule));
  sched::lowerCommunication(*schedule);
  auto module = buildPlanModule(context, staged, *schedule, "test");
  EXPECT_TRUE(static_cast<bool>(module));
  return programPeak(**module, rank);
}

/// Stage 1 of these tests: 10-byte inputs, 50 saved bytes, 1000 parameter
/// bytes.
model::Region secondStage() {
  model::Region second;
  second.name = "layers.1";
  second.fwdTimeUs = 1;
  second.savedBytes = 50;
  second.inputBytes = 10;
  second.paramBytes = 1000;
  return second;
}

/// 1F1B over four microbatches: stage 0 has `firstParams` parameter bytes
/// and sends 10-byte outputs; stage 1 (1000 parameter bytes) sends 10-byte
/// input gradients back.
int64_t oneFOneBPeak(unsigned rank, int64_t firstParams) {
  return twoStagePeak("1f1b", 4, rank, firstParams, secondStage());
}

// Rank 0, stage 0 without parameters (F0 F1 B0 F2 B1 F3 B2 B3): each B
// frees its microbatch's 100 bytes and output gradient but not the sent
// output (the transport holds it to the end of the step), so B2 meets mb 2's
// and mb 3's 200 bytes, mb 2's 10-byte output gradient and all four sent
// outputs: 250 (230 if a sent output died at its last backward).
TEST(StepMemory, SentOutputsLiveToTheEndOfTheStep) {
  EXPECT_EQ(oneFOneBPeak(0, 0), 250);
}

// Rank 1 (F0 B0 F1 B1 ... B3): B0 allocates the 1000 gradient bytes, each B
// sends its microbatch's 10-byte input gradient (stage 0's output size),
// held to the end of the step; B3 meets its 50 bytes, the gradients and the
// three sent before it: 1080 (1050 if a sent gradient died when sent).
TEST(StepMemory, SentInputGradientsLiveToTheEndOfTheStep) {
  EXPECT_EQ(oneFOneBPeak(1, 0), 1080);
}

} // namespace

/// The step peak of rank 1 in ZB-H1 over one microbatch: stage 1's full
/// backward's transient is 5000 bytes, its I's and W's those given (0: not
/// measured).
int64_t splitPeak(int64_t inputWorkspace, int64_t weightWorkspace) {
  model::Region second = secondStage();
  second.bwdWorkspaceBytes = 5000;
  second.bwdInputWorkspaceBytes = inputWorkspace;
  second.bwdWeightWorkspaceBytes = weightWorkspace;
  return twoStagePeak("zb-h1", 1, 1, 0, second);
}

// I and W each add their own transient, measured alone; unmeasured, the
// full backward's. Rank 1: I meets the 50 activations, W the activations and
// the 10-byte input gradient I sent (held to the end of the step); then W's
// 1000 gradient bytes meet the sent gradient (1010).
TEST(StepMemory, EachBackwardKindAddsItsOwnWorkspace) {
  EXPECT_EQ(splitPeak(0, 0), 60 + 5000);
  EXPECT_EQ(splitPeak(3000, 300), 50 + 3000);
  EXPECT_EQ(splitPeak(200, 300), 1010);
  EXPECT_EQ(splitPeak(200, 0), 60 + 5000);
}

/// The step peak of one rank running both stages of interleaved 1F1B over
/// one microbatch (F0 F1 B1 B0): stage 0 keeps 100 bytes and hands its
/// 10-byte output to stage 1 in memory; stage 1 is one region saving 50
/// bytes, checkpointed or not.
int64_t handedOverPeak(bool checkpointed) {
  model::Region first;
  first.name = "layers.0";
  first.fwdTimeUs = 1;
  first.savedBytes = 100;
  model::Region second = secondStage();
  second.paramBytes = 0;
  second.checkpoint = checkpointed;
  MLIRContext context;
  context.loadDialect<HPRDialect>();
  model::StagedModel staged;
  staged.stages.push_back({0, {first}});
  staged.stages.push_back({1, {second}});
  auto schedule = sched::generateSchedule("interleaved-1f1b", {1, 1, 2});
  EXPECT_TRUE(static_cast<bool>(schedule));
  sched::lowerCommunication(*schedule);
  auto module = buildPlanModule(context, staged, *schedule, "test");
  EXPECT_TRUE(static_cast<bool>(module));
  return programPeak(**module);
}

// Checkpointed, stage 1 keeps its input: the tensor stage 0 handed over,
// already counted as stage 0's output, so B1 meets 100 + the 50 it replays
// + that output and the 10-byte gradient it hands back: 170 (180 if the
// handed tensor counted twice). Plain, stage 1 keeps its 50 saved bytes.
TEST(StepMemory, AHandedOverInputIsCountedOnce) {
  EXPECT_EQ(handedOverPeak(true), 170);
  EXPECT_EQ(handedOverPeak(false), 170);
}
