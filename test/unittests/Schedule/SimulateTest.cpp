//===- SimulateTest.cpp - Simulator and bubble formulas -------------------===//
//
// The bubble formulas are the zero-bubble paper's (arXiv 2401.10241) with
// T_F = T_B = T_W = 1 (a full backward is 2): 1F1B (p-1)/m, ZB-H1 (p-1)/3m.
// Those figures are idle time relative to the ideal compute time, which is
// exactly SimulationResult::bubbleFraction (see Simulate.h).
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/Simulate.h"
#include "hpr/Schedule/Generators.h"
#include "hpr/Schedule/Lowering.h"
#include "hpr/Schedule/ScheduleCsv.h"

#include "TestUtil.h"

using namespace mlir::hpr::sched;
using namespace mlir::hpr::sched::test;

namespace {

SimulationResult simulate(const Schedule &s, const SimulationCosts &c = {}) {
  auto r = simulateSchedule(s, c, "t");
  EXPECT_TRUE(static_cast<bool>(r)) << errorText(r);
  return r ? *r : SimulationResult();
}

Schedule generate(llvm::StringRef name, int p, int m, int v = 0) {
  auto s = generateSchedule(name, {p, m, v});
  EXPECT_TRUE(static_cast<bool>(s)) << errorText(s);
  if (!s)
    return Schedule();
  lowerCommunication(*s);
  return *s;
}

TEST(Simulate, HandComputedTimeline) {
  auto s =
      parseScheduleCsv("0F0,0F1,0I0,0W0,0I1,0W1\n1F0,1I0,1F1,1I1,1W0,1W1\n",
                       "t.csv", CsvDialect::Current);
  ASSERT_TRUE(static_cast<bool>(s));
  SimulationResult r = simulate(*s);
  // Rank 0: F0 [0,1] F1 [1,2]; rank 1: F0 [1,2] I0 [2,3] F1 [3,4] I1 [4,5]
  // W0 [5,6] W1 [6,7]; rank 0: I0 waits for 1I0 -> [3,4] W0 [4,5] I1 [5,6]
  // W1 [6,7].
  EXPECT_EQ(r.timelines[1][1].start, 2.0);
  EXPECT_EQ(r.timelines[0][2].start, 3.0);
  EXPECT_EQ(r.timelines[0][4].start, 5.0);
  EXPECT_EQ(r.makespan, 7.0);
  EXPECT_EQ(r.totalBusy, 12.0);
  EXPECT_DOUBLE_EQ(r.bubbleFraction, (2 * 7.0 - 12.0) / 12.0);
  // Slack: 0F1 could end at 3 (1F1 and 0I0 start there at the latest);
  // everything else lies on a path as long as the step.
  for (int rank : {0, 1})
    for (int k = 0; k < 6; ++k)
      EXPECT_EQ(r.timelines[rank][k].slack, rank == 0 && k == 1 ? 1.0 : 0.0)
          << "rank " << rank << ", action " << k;
}

TEST(Simulate, SlackIsHowMuchLongerAnActionMayTake) {
  // Lengthening an action by its slack leaves the step as it was; by more,
  // the step grows by the excess (checked on every action of a ZB-H1 and a
  // 1F1B schedule with uneven durations).
  for (llvm::StringRef name : {"zb-h1", "1f1b"}) {
    Schedule s = generate(name, 4, 8);
    for (auto &program : s.ranks)
      for (Action &action : program)
        action.durationUs = 1.0 + (action.stage * 7 + action.microbatch) % 5;
    SimulationResult base = simulate(s);
    for (size_t rank = 0; rank < s.ranks.size(); ++rank)
      for (size_t k = 0; k < s.ranks[rank].size(); ++k) {
        double slack = base.timelines[rank][k].slack;
        ASSERT_GE(slack, 0.0);
        Action &action = s.ranks[rank][k];
        double duration = *action.durationUs;
        action.durationUs = duration + slack;
        EXPECT_DOUBLE_EQ(simulate(s).makespan, base.makespan)
            << name.str() << " rank " << rank << " action " << k;
        action.durationUs = duration + slack + 0.5;
        EXPECT_DOUBLE_EQ(simulate(s).makespan, base.makespan + 0.5)
            << name.str() << " rank " << rank << " action " << k;
        action.durationUs = duration;
      }
  }
}

TEST(Simulate, ActionDurationsAndComposites) {
  auto s = parseScheduleCsv("0F0,(0F1;1B0)OVERLAP_F_B,1F0,1B1,0B0,0B1\n",
                            "t.csv", CsvDialect::Current);
  ASSERT_TRUE(static_cast<bool>(s));
  // Invalid order for a real pipeline would deadlock; use a valid one.
  s = parseScheduleCsv("0F0,1F0,(0F1;1B0)OVERLAP_F_B,0B0,1F1,1B1,0B1\n",
                       "t.csv", CsvDialect::Current);
  ASSERT_TRUE(static_cast<bool>(s)) << errorText(s);
  s->ranks[0][0].durationUs = 10.0;
  SimulationResult r = simulate(*s);
  EXPECT_EQ(r.timelines[0][1].start, 10.0);
  EXPECT_EQ(r.timelines[0][2].end, 11.0 + 1.0 + 2.0); // sum of the parts
  SimulationCosts noDurations;
  noDurations.useActionDurations = false;
  EXPECT_EQ(simulate(*s, noDurations).timelines[0][1].start, 1.0);
}

TEST(Simulate, GathersRunBesideTheCompute) {
  // One rank, two stages: stage 1's gather is issued before stage 0's
  // forward and overlaps it; stage 1's forward waits for it.
  auto s = parseScheduleCsv("1UNSHARD,0F0,1F0\n", "t.csv", CsvDialect::Current);
  ASSERT_TRUE(static_cast<bool>(s)) << errorText(s);
  s->ranks[0][0].durationUs = 3.0;
  s->ranks[0][1].durationUs = 2.0;
  SimulationResult r = simulate(*s);
  EXPECT_EQ(r.timelines[0][0].end, 3.0);   // the gather
  EXPECT_EQ(r.timelines[0][1].start, 0.0); // beside it
  EXPECT_EQ(r.timelines[0][2].start, 3.0); // waits for it
  EXPECT_EQ(r.makespan, 4.0);
  EXPECT_EQ(r.busy[0], 3.0); // a gather is no compute
  // 0F0 could end at 3; the gather is on the critical path.
  EXPECT_EQ(r.timelines[0][1].slack, 1.0);
  EXPECT_EQ(r.timelines[0][0].slack, 0.0);
  EXPECT_EQ(r.timelines[0][2].slack, 0.0);
}

TEST(Simulate, GathersOfARankQueue) {
  auto s = parseScheduleCsv("0UNSHARD,1UNSHARD,0F0,1F0\n", "t.csv",
                            CsvDialect::Current);
  ASSERT_TRUE(static_cast<bool>(s)) << errorText(s);
  s->ranks[0][0].durationUs = s->ranks[0][1].durationUs = 2.0;
  SimulationResult r = simulate(*s);
  EXPECT_EQ(r.timelines[0][1].end, 4.0); // after the first gather
  EXPECT_EQ(r.timelines[0][2].start, 2.0);
  EXPECT_EQ(r.timelines[0][3].start, 4.0);
  EXPECT_EQ(r.makespan, 5.0);
  // Both gathers and 1F0 are critical; 0F0 could end at 4.
  EXPECT_EQ(r.timelines[0][0].slack, 0.0);
  EXPECT_EQ(r.timelines[0][1].slack, 0.0);
  EXPECT_EQ(r.timelines[0][2].slack, 1.0);
}

TEST(Simulate, MissingProducer) {
  auto s = parseScheduleCsv("0F0\n1F0,1F1\n", "t.csv", CsvDialect::Current);
  ASSERT_TRUE(static_cast<bool>(s));
  auto r = simulateSchedule(*s, {}, "t.csv");
  std::string msg = errorText(r);
  EXPECT_NE(msg.find("t.csv: rank 1, action 1 (1F1): needs 0F1, which no "
                     "rank runs"),
            std::string::npos)
      << msg;
}

TEST(Simulate, SelfWaitIsADeadlock) {
  auto s = parseScheduleCsv("0I0,0F0,0W0\n", "t.csv", CsvDialect::Current);
  ASSERT_TRUE(static_cast<bool>(s));
  std::string msg = errorText(simulateSchedule(*s, {}, "t.csv"));
  EXPECT_NE(msg.find("deadlock: rank 0, action 0 (0I0) waits for 0F0 at rank "
                     "0, action 1 (0F0)"),
            std::string::npos)
      << msg;
}

TEST(Simulate, BubbleOneFOneBAndGPipe) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 32; ++m) {
      double expected = double(p - 1) / m;
      EXPECT_NEAR(simulate(generate("1f1b", p, m)).bubbleFraction, expected,
                  1e-12)
          << p << "x" << m;
      EXPECT_NEAR(simulate(generate("gpipe", p, m)).bubbleFraction, expected,
                  1e-12)
          << p << "x" << m;
    }
}

TEST(Simulate, BubbleZeroBubbleH1) {
  // The paper's ZB-H1 figure holds once the pipeline is full (m >= p).
  for (int p = 1; p <= 8; ++p)
    for (int m = p; m <= 32; ++m) {
      if (m % std::max(1, m / p) != 0)
        continue; // size refused by PyTorch's round rule
      SimulationResult r = simulate(generate("zb-h1", p, m));
      EXPECT_NEAR(r.bubbleFraction, double(p - 1) / (3.0 * m), 1e-12)
          << p << "x" << m;
    }
}

TEST(Simulate, BubbleZbvHasNoSteadyStateBubble) {
  // "Zero bubble in steady state": idle time comes only from filling and
  // draining the pipeline, so it does not grow with the number of
  // microbatches, and the fraction tends to 0.
  for (int p = 2; p <= 8; ++p) {
    auto idle = [&](int m) {
      SimulationResult r = simulate(generate("zbv", p, m));
      return p * r.makespan - r.totalBusy;
    };
    double base = idle(2 * p);
    for (int m = 2 * p + 1; m <= 4 * p; ++m)
      EXPECT_NEAR(idle(m), base, 1e-9) << p << "x" << m;
    SimulationResult large = simulate(generate("zbv", p, 64 * p));
    // 2 stages x 3 unit actions x m per rank: the fraction is base / (6pm).
    EXPECT_NEAR(large.bubbleFraction, base / (6.0 * p * 64 * p), 1e-12);
    EXPECT_LT(large.bubbleFraction, 0.01);
  }
}

} // namespace
