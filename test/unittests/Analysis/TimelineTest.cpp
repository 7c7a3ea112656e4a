//===- TimelineTest.cpp - Recompute hidden in waiting time ----------------===//

#include "hpr/Analysis/Timeline.h"
#include "hpr/Schedule/Generators.h"
#include "hpr/Target/BuildModule.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::hpr;

namespace {

sched::Action act(sched::ActionKind kind, int stage, int mb, double us) {
  sched::Action action;
  action.kind = kind;
  action.stage = stage;
  action.microbatch = mb;
  action.durationUs = us;
  return action;
}

/// Two ranks, one stage each, one microbatch: rank 0 waits from t=1 to t=4
/// for the gradient of stage 1.
sched::Schedule twoStages(bool recomputeBeforeRecv) {
  using K = sched::ActionKind;
  sched::Schedule s;
  s.numRanks = s.numStages = 2;
  s.numMicrobatches = 1;
  s.stageToRank = {0, 1};
  sched::Action recompute = act(K::Recompute, 0, 0, 1);
  s.ranks.push_back({act(K::Forward, 0, 0, 1), act(K::SendF, 0, 0, 0)});
  if (recomputeBeforeRecv)
    s.ranks[0].push_back(recompute);
  s.ranks[0].push_back(act(K::RecvB, 0, 0, 0));
  if (!recomputeBeforeRecv)
    s.ranks[0].push_back(recompute);
  s.ranks[0].push_back(act(K::Backward, 0, 0, 2));
  s.ranks.push_back({act(K::RecvF, 1, 0, 0), act(K::Forward, 1, 0, 1),
                     act(K::Backward, 1, 0, 2), act(K::SendB, 1, 0, 0)});
  return s;
}

TEST(Timeline, RecomputeWhileWaitingIsHidden) {
  sched::Schedule s = twoStages(true);
  auto result = simulateTimeline(s);
  ASSERT_TRUE(static_cast<bool>(result)) << toString(result.takeError());
  EXPECT_DOUBLE_EQ(result->timelines[0][3].ready, 4);
  auto exposure = measureRecomputeExposure(s, *result);
  EXPECT_DOUBLE_EQ(exposure[0].hiddenUs, 1);
  EXPECT_DOUBLE_EQ(exposure[0].exposedUs, 0);
  EXPECT_DOUBLE_EQ(result->makespan, 6);
}

TEST(Timeline, RecomputeAfterTheWaitIsExposed) {
  sched::Schedule s = twoStages(false);
  auto result = simulateTimeline(s);
  ASSERT_TRUE(static_cast<bool>(result)) << toString(result.takeError());
  auto exposure = measureRecomputeExposure(s, *result);
  EXPECT_DOUBLE_EQ(exposure[0].hiddenUs, 0);
  EXPECT_DOUBLE_EQ(exposure[0].exposedUs, 1);
  EXPECT_DOUBLE_EQ(result->makespan, 7);
}

/// The Recompute cells of rank `rank` of ZB-H1 on two ranks, two
/// checkpointed microbatches, as withJitRecomputes places them, with rank
/// 1's dws marked `weight_replay` or not: (stage, microbatch, the kind of
/// the cell after it).
std::vector<std::tuple<int, int, sched::ActionKind>>
jitRecomputes(bool weightReplay, size_t rank = 1) {
  MLIRContext context;
  model::StagedModel staged;
  for (int stage = 0; stage < 2; ++stage) {
    model::Region region;
    region.name = "layers." + std::to_string(stage);
    region.checkpoint = true;
    region.fwdTimeUs = 1;
    region.savedBytes = 1000;
    region.inputBytes = 64;
    staged.stages.push_back({stage, {region}});
  }
  auto generated = sched::generateSchedule("zb-h1", {2, 2, 0});
  EXPECT_TRUE(static_cast<bool>(generated));
  auto module = buildPlanModule(context, staged, *generated, "test");
  EXPECT_TRUE(static_cast<bool>(module));
  std::vector<ProgramActivations> programs;
  for (ProgramOp program :
       getSchedule(**module).getBody().getOps<ProgramOp>()) {
    for (BackwardWeightOp weight : program.getBody().getOps<BackwardWeightOp>())
      weight.setWeightReplay(weightReplay);
    programs.push_back(collectActivationLifetimes(program));
  }
  sched::Schedule timeline =
      withJitRecomputes(extractSchedule(**module), programs);
  std::vector<std::tuple<int, int, sched::ActionKind>> cells;
  const std::vector<sched::Action> &actions = timeline.ranks[rank];
  for (size_t k = 0; k + 1 < actions.size(); ++k)
    if (actions[k].kind == sched::ActionKind::Recompute)
      cells.emplace_back(actions[k].stage, actions[k].microbatch,
                         actions[k + 1].kind);
  return cells;
}

TEST(Timeline, WeightReplayGetsAJitReplayBeforeItsDw) {
  using K = sched::ActionKind;
  // Each session's replay before its dx, and with `weight_replay` one more
  // before its dw.
  using Cells = std::vector<std::tuple<int, int, K>>;
  EXPECT_EQ(jitRecomputes(false),
            (Cells{{1, 0, K::BackwardInput}, {1, 1, K::BackwardInput}}));
  Cells replayed = jitRecomputes(true);
  llvm::sort(replayed);
  EXPECT_EQ(replayed, (Cells{{1, 0, K::BackwardInput},
                             {1, 0, K::BackwardWeight},
                             {1, 1, K::BackwardInput},
                             {1, 1, K::BackwardWeight}}));
  // The first stage's dx reads nothing: its W is the one reader, and the
  // mark adds no replay there.
  EXPECT_EQ(jitRecomputes(true, 0).size(), jitRecomputes(false, 0).size());
}

} // namespace
