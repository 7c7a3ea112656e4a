//===- PlanRoundTripTest.cpp - Import, plan, export, compare -------------===//
//
// For every generator: the planned programs, read back as a schedule, are
// the input schedule plus exactly one RECOMPUTE and one CLEAR per session,
// in the right places, and the summary's counts agree with the programs.
//
//===----------------------------------------------------------------------===//

#include "hpr/Analysis/Timeline.h"
#include "hpr/InitAll.h"
#include "hpr/Schedule/Generators.h"
#include "hpr/Schedule/Lowering.h"
#include "hpr/Target/BuildModule.h"
#include "hpr/Target/PlanSummary.h"

#include "mlir/IR/MLIRContext.h"
#include "mlir/Pass/PassManager.h"

#include <gtest/gtest.h>

#include <map>

using namespace mlir;
using namespace mlir::hpr;
using Kind = sched::ActionKind;

namespace {

struct RoundTripCase {
  const char *generator;
  int ranks, microbatches;
  RecomputePolicy policy;
};

class PlanRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

/// Flattens composites, so a program reads as a list of simple actions.
std::vector<sched::Action> flatten(const std::vector<sched::Action> &actions) {
  std::vector<sched::Action> flat;
  for (const sched::Action &action : actions) {
    if (action.parts.empty()) {
      flat.push_back(action);
      continue;
    }
    for (const sched::Action &part : action.parts)
      flat.push_back(part);
  }
  return flat;
}

bool sameAction(const sched::Action &a, const sched::Action &b) {
  return a.kind == b.kind && a.stage == b.stage && a.microbatch == b.microbatch;
}

TEST_P(PlanRoundTrip, PlannerOnlyAddsOneRecomputeAndOneClearPerSession) {
  const RoundTripCase &c = GetParam();
  auto schedule =
      sched::generateSchedule(c.generator, {c.ranks, c.microbatches, 0});
  ASSERT_TRUE(static_cast<bool>(schedule)) << toString(schedule.takeError());
  sched::lowerCommunication(*schedule);

  DialectRegistry registry;
  registerAllDialects(registry);
  MLIRContext context(registry);
  auto module = buildPlanModule(context, makeUniformModel(schedule->numStages),
                                *schedule, c.generator);
  ASSERT_TRUE(static_cast<bool>(module)) << toString(module.takeError());
  PassManager pm(&context);
  RecomputePipelineOptions options;
  options.policy = c.policy;
  if (c.policy == RecomputePolicy::Lookahead)
    options.distance = 2;
  buildRecomputePipeline(pm, options);
  ASSERT_TRUE(succeeded(pm.run(**module)));

  sched::Schedule planned = extractSchedule(**module).schedule;
  ASSERT_EQ(planned.ranks.size(), schedule->ranks.size());
  int64_t recomputes = 0;
  // How many recomputes do not sit right before their first reader: none
  // under jit, some under lookahead (every schedule here has transfers or
  // other work in front of its dx).
  int64_t hoisted = 0;
  for (size_t rank = 0; rank < planned.ranks.size(); ++rank) {
    std::vector<sched::Action> input = flatten(schedule->ranks[rank]);
    std::vector<sched::Action> output = flatten(planned.ranks[rank]);
    std::vector<sched::Action> kept;
    // Where each (stage, mb)'s recompute, consumers and clear stand.
    std::map<std::pair<int, int>, std::vector<std::pair<Kind, size_t>>> uses;
    for (size_t index = 0; index < output.size(); ++index) {
      const sched::Action &action = output[index];
      std::pair<int, int> key{action.stage, action.microbatch};
      // The first stage's I reads no session (HPROps.td).
      bool reader = action.kind == Kind::BackwardWeight ||
                    action.kind == Kind::Backward ||
                    (action.kind == Kind::BackwardInput && action.stage != 0);
      if (action.kind == Kind::Recompute || action.kind == Kind::Clear ||
          reader)
        uses[key].push_back({action.kind, index});
      if (action.kind != Kind::Recompute && action.kind != Kind::Clear)
        kept.push_back(action);
    }
    ASSERT_EQ(kept.size(), input.size()) << "rank " << rank;
    for (size_t index = 0; index < kept.size(); ++index)
      EXPECT_TRUE(sameAction(kept[index], input[index]))
          << "rank " << rank << " action " << index;
    for (auto &[key, list] : uses) {
      ASSERT_GE(list.size(), 3u);
      EXPECT_EQ(list.front().first, Kind::Recompute)
          << "stage " << key.first << " mb " << key.second;
      EXPECT_EQ(list.back().first, Kind::Clear)
          << "stage " << key.first << " mb " << key.second;
      for (size_t i = 1; i + 1 < list.size(); ++i)
        EXPECT_NE(list[i].first, Kind::Recompute);
      // The first reader may be the second half of an overlapped pair, one
      // slot after the pair's forward.
      size_t gap = list[1].second - list[0].second;
      hoisted += gap > 1 && !(gap == 2 &&
                              output[list[1].second - 1].kind == Kind::Forward);
      ++recomputes;
    }
  }

  if (c.policy == RecomputePolicy::Jit)
    EXPECT_EQ(hoisted, 0);
  else
    EXPECT_GT(hoisted, 0);

  auto summary = summarizePlan(**module);
  ASSERT_TRUE(static_cast<bool>(summary)) << toString(summary.takeError());
  RankSummary total = summary->total();
  EXPECT_EQ(total.recomputes, recomputes);
  EXPECT_EQ(total.clears, recomputes);
  EXPECT_EQ(total.sessions,
            int64_t(schedule->numStages) * schedule->numMicrobatches);
  EXPECT_GT(summary->simulation.makespan, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Generators, PlanRoundTrip,
    ::testing::Values(
        RoundTripCase{"gpipe", 4, 8, RecomputePolicy::Jit},
        RoundTripCase{"1f1b", 4, 8, RecomputePolicy::Jit},
        RoundTripCase{"1f1b", 4, 8, RecomputePolicy::Bubble},
        RoundTripCase{"interleaved-1f1b", 2, 4, RecomputePolicy::Lookahead},
        RoundTripCase{"zb-h1", 4, 8, RecomputePolicy::Jit},
        RoundTripCase{"zbv", 4, 8, RecomputePolicy::Jit},
        RoundTripCase{"zbv", 3, 9, RecomputePolicy::Lookahead},
        RoundTripCase{"dualpipev", 4, 8, RecomputePolicy::Lookahead},
        RoundTripCase{"dualpipev", 4, 8, RecomputePolicy::Bubble}));

} // namespace
