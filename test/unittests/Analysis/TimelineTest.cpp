//===- TimelineTest.cpp - Recompute hidden in waiting time ----------------===//

#include "hpr/Analysis/Timeline.h"

#include <gtest/gtest.h>

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

} // namespace
