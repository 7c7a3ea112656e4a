//===- ValidateTest.cpp - One test per validation rule --------------------===//
//
// Each test breaks exactly one rule of validateSchedule on an otherwise valid
// hand-written schedule and checks the located message.
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/Validate.h"
#include "hpr/Schedule/Lowering.h"
#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Schedule/ScheduleUtils.h"

#include "TestUtil.h"

using namespace mlir::hpr::sched;
using namespace mlir::hpr::sched::test;

namespace {

std::string validate(const Schedule &s) {
  return errorText(validateSchedule(s, "t.csv"));
}

// Two ranks, one stage each, two microbatches, zero-bubble style.
const char *kGood = "0F0,0F1,0I0,0W0,0I1,0W1\n"
                    "1F0,1I0,1W0,1F1,1I1,1W1\n";

TEST(Validate, AcceptsGoodSchedules) {
  EXPECT_EQ(validate(csv(kGood)), "");
  EXPECT_EQ(validate(csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")), "");
  Schedule lowered = csv(kGood);
  lowerCommunication(lowered);
  EXPECT_EQ(validate(lowered), "");
}

TEST(Validate, StageOnTwoRanks) {
  std::string msg = validate(csv("0F0,0I0,0W0\n0F1,0I1,0W1\n"));
  EXPECT_NE(msg.find("t.csv: rank 1, action 0 (0F1): stage 0 also runs on "
                     "rank 0 (rank 0, action 0 (0F0)); each stage runs on "
                     "exactly one rank"),
            std::string::npos)
      << msg;
}

TEST(Validate, StageToRankMismatch) {
  Schedule s = csv(kGood);
  s.stageToRank = {1, 0};
  std::string msg = validate(s);
  EXPECT_NE(msg.find("t.csv: stage 0: stageToRank says rank 1 but its "
                     "actions are on rank 0"),
            std::string::npos)
      << msg;
}

TEST(Validate, StageWithoutRank) {
  Schedule s = csv(kGood);
  s.numStages = 3;
  s.stageToRank.push_back(1);
  std::string msg = validate(s);
  EXPECT_NE(msg.find("t.csv: stage 2: no rank runs it"), std::string::npos)
      << msg;
}

TEST(Validate, NumRanksMismatch) {
  Schedule s = csv(kGood);
  s.numRanks = 3;
  EXPECT_NE(validate(s).find("numRanks is 3 but there are 2 rank programs"),
            std::string::npos);
}

TEST(Validate, ForwardedTwice) {
  std::string msg = validate(csv("0F0,0F1,0I0,0W0,0I1,0W1,0F1\n"
                                 "1F0,1I0,1W0,1F1,1I1,1W1\n"));
  EXPECT_NE(msg.find("t.csv: rank 0, action 6 (0F1): second forward of stage "
                     "0, microbatch 1 (first at rank 0, action 1 (0F1))"),
            std::string::npos)
      << msg;
}

TEST(Validate, NeverForwarded) {
  std::string msg = validate(csv("0F0,0I0,0W0,0I1,0W1\n"
                                 "1F0,1I0,1W0,1F1,1I1,1W1\n"));
  EXPECT_NE(msg.find("t.csv: stage 0, microbatch 1: never forwarded (stage 0 "
                     "runs on rank 0)"),
            std::string::npos)
      << msg;
}

TEST(Validate, DxBeforeForward) {
  std::string msg = validate(csv("0F0,0I1,0F1,0I0,0W0,0W1\n"
                                 "1F0,1I0,1W0,1F1,1I1,1W1\n"));
  EXPECT_NE(msg.find("t.csv: rank 0, action 1 (0I1): dx before its forward "
                     "(rank 0, action 2 (0F1))"),
            std::string::npos)
      << msg;
}

TEST(Validate, FullBackwardBeforeForward) {
  std::string msg = validate(csv("0B0,0F0\n"));
  EXPECT_NE(msg.find("rank 0, action 0 (0B0): backward before its forward"),
            std::string::npos)
      << msg;
}

TEST(Validate, DwBeforeDx) {
  std::string msg = validate(csv("0F0,0F1,0I0,0W0,0W1,0I1\n"
                                 "1F0,1I0,1W0,1F1,1I1,1W1\n"));
  EXPECT_NE(msg.find("t.csv: rank 0, action 4 (0W1): dw before its dx (rank "
                     "0, action 5 (0I1))"),
            std::string::npos)
      << msg;
}

TEST(Validate, DxWithoutDw) {
  std::string msg = validate(csv("0F0,0F1,0I0,0W0,0I1\n"
                                 "1F0,1I0,1W0,1F1,1I1,1W1\n"));
  EXPECT_NE(msg.find("t.csv: rank 0, action 4 (0I1): dx without dw: no W for "
                     "stage 0, microbatch 1"),
            std::string::npos)
      << msg;
}

TEST(Validate, DwWithoutDx) {
  std::string msg = validate(csv("0F0,0W0\n"));
  EXPECT_NE(msg.find("rank 0, action 1 (0W0): dw without its dx"),
            std::string::npos)
      << msg;
}

TEST(Validate, DwAfterFullBackward) {
  // B + (I + W) / 2 would count 1 + 0.5 here.
  std::string msg = validate(csv("0F0,0B0,0W0\n"));
  EXPECT_NE(msg.find("rank 0, action 2 (0W0): dw after a full backward"),
            std::string::npos)
      << msg;
}

TEST(Validate, BackwardTwice) {
  std::string msg = validate(csv("0F0,0B0,0I0,0W0\n"));
  EXPECT_NE(msg.find("rank 0, action 2 (0I0): second dx/backward of stage 0, "
                     "microbatch 0"),
            std::string::npos)
      << msg;
}

TEST(Validate, NeverBackpropagated) {
  std::string msg = validate(csv("0F0,0F1,0B0\n"));
  EXPECT_NE(msg.find("t.csv: stage 0, microbatch 1: never backpropagated"),
            std::string::npos)
      << msg;
}

TEST(Validate, RecomputeBeforeForward) {
  std::string msg = validate(csv("0RECOMPUTE0,0F0,0B0\n"));
  EXPECT_NE(msg.find("rank 0, action 0 (0RECOMPUTE0): recompute before its "
                     "forward"),
            std::string::npos)
      << msg;
  EXPECT_EQ(validate(csv("0F0,0RECOMPUTE0,0I0,0W0,0CLEAR0\n")), "");
}

TEST(Validate, OverlappedPartsMustBeIndependent) {
  std::string msg = validate(csv("(0F0;0B0)OVERLAP_F_B\n"));
  EXPECT_NE(msg.find("rank 0, action 0 part 1 (0B0): depends on rank 0, "
                     "action 0 part 0 (0F0) in the same OVERLAP_F_B"),
            std::string::npos)
      << msg;
}

TEST(Validate, MissingSend) {
  Schedule s = csv(kGood);
  lowerCommunication(s);
  // Drop rank 0's SEND_F of microbatch 1: rank 0 = 0F0,0SEND_F0,0F1,0SEND_F1.
  ASSERT_EQ(formatAction(s.ranks[0][3]), "0SEND_F1");
  s.ranks[0].erase(s.ranks[0].begin() + 3);
  std::string msg = validate(s);
  EXPECT_NE(msg.find("t.csv: rank 0, action 2 (0F1): no SEND_F after it "
                     "(stage 1 is on rank 1)"),
            std::string::npos)
      << msg;
}

TEST(Validate, MissingRecv) {
  Schedule s = csv(kGood);
  lowerCommunication(s);
  ASSERT_EQ(formatAction(s.ranks[1][0]), "1RECV_F0");
  s.ranks[1].erase(s.ranks[1].begin());
  std::string msg = validate(s);
  EXPECT_NE(msg.find("t.csv: rank 1, action 0 (1F0): no RECV_F before it "
                     "(stage 0 is on rank 0)"),
            std::string::npos)
      << msg;
}

TEST(Validate, RecvAfterConsumer) {
  Schedule s = csv(kGood);
  lowerCommunication(s);
  std::swap(s.ranks[1][0], s.ranks[1][1]); // 1F0 before 1RECV_F0
  std::string msg = validate(s);
  EXPECT_NE(msg.find("rank 1, action 1 (1RECV_F0): receive after the action "
                     "that needs it (rank 1, action 0 (1F0))"),
            std::string::npos)
      << msg;
}

TEST(Validate, SendBeforeProducer) {
  Schedule s = csv(kGood);
  lowerCommunication(s);
  std::swap(s.ranks[0][0], s.ranks[0][1]); // 0SEND_F0 before 0F0
  std::string msg = validate(s);
  EXPECT_NE(msg.find("rank 0, action 0 (0SEND_F0): send before the action "
                     "that produces it (rank 0, action 1 (0F0))"),
            std::string::npos)
      << msg;
}

TEST(Validate, UnneededTransfer) {
  // Stages 0 and 1 both on rank 0: a transfer between them is a mistake.
  std::string msg = validate(csv("0F0,0SEND_F0,1RECV_F0,1F0,1B0,0B0\n"));
  EXPECT_NE(msg.find("rank 0, action 1 (0SEND_F0): unneeded transfer: stages "
                     "0 and 1 are both on rank 0"),
            std::string::npos)
      << msg;
  std::string last = validate(csv("0F0,0SEND_F0,0B0\n"));
  EXPECT_NE(last.find("(0SEND_F0): no stage 1 to exchange with"),
            std::string::npos)
      << last;
}

TEST(Validate, DuplicateSend) {
  Schedule s = csv(kGood);
  lowerCommunication(s);
  s.ranks[0].insert(s.ranks[0].begin() + 2,
                    makeAction(ActionKind::SendF, 0, 0));
  std::string msg = validate(s);
  EXPECT_NE(msg.find("rank 0, action 2 (0SEND_F0): second SEND_F of stage 0, "
                     "microbatch 0"),
            std::string::npos)
      << msg;
}

TEST(Validate, DeadlockReportsTheCycle) {
  // Rank 1 runs microbatch 1 first, rank 0 needs microbatch 0's dx first.
  std::string msg = validate(csv("0F0,0I0,0W0,0F1,0I1,0W1\n"
                                 "1F1,1I1,1W1,1F0,1I0,1W0\n"));
  EXPECT_NE(msg.find("t.csv: deadlock: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0, action 1 (0I0) waits for the dx (I or B) of "
                     "stage 1, microbatch 0 at rank 1, action 4 (1I0)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("rank 1, action 0 (1F1) waits for 0F1 at rank 0, action "
                     "3 (0F1)"),
            std::string::npos)
      << msg;
}

TEST(Validate, DeadlockOnlyVisibleThroughComms) {
  // Compute order is fine but rank 1 receives microbatch 1 first.
  Schedule s = csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  lowerCommunication(s);
  Schedule bad = s;
  // Move rank 1's RECV_F1 to the front.
  auto &r1 = bad.ranks[1];
  auto it =
      std::find(r1.begin(), r1.end(), makeAction(ActionKind::RecvF, 1, 1));
  ASSERT_NE(it, r1.end());
  Action recv = *it;
  r1.erase(it);
  r1.insert(r1.begin(), recv);
  EXPECT_EQ(validate(bad), ""); // sends are buffered: still no deadlock
  // Now make rank 0 wait for a gradient before sending microbatch 1.
  auto &r0 = bad.ranks[0];
  auto send1 =
      std::find(r0.begin(), r0.end(), makeAction(ActionKind::SendF, 0, 1));
  auto f1 =
      std::find(r0.begin(), r0.end(), makeAction(ActionKind::Forward, 0, 1));
  r0.erase(send1);
  r0.erase(f1);
  r0.insert(r0.end() - 1, makeAction(ActionKind::Forward, 0, 1));
  r0.insert(r0.end() - 1, makeAction(ActionKind::SendF, 0, 1));
  // r0: 0F0,0SEND_F0,0RECV_B0,0B0,0F1,0SEND_F1,0RECV_B1,0B1 ... rank 1 first
  // receives F1 which now comes after rank 0 waits for 1B0 -> 1F0 after
  // 1RECV_F1: a cycle through the comms.
  std::string msg = validate(bad);
  EXPECT_NE(msg.find("deadlock: "), std::string::npos) << msg;
  EXPECT_NE(msg.find("(1RECV_F1) waits for 0SEND_F1"), std::string::npos)
      << msg;
}

/// The messages findViolations reports for `s` checked as a finished plan.
std::string validatePlan(const Schedule &s) {
  ValidateOptions options;
  options.finishedPlan = true;
  std::string joined;
  for (const Violation &v : findViolations(s, options).list)
    joined += v.message + "\n";
  return joined;
}

/// kGood lowered as the planner lowers it, with the posting a plan gives it:
/// rank 0 = 0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0I0,0W0,0RECV_B1,0I1,0W1,
/// 0REDUCE_GRAD; rank 1 = 1RECV_F0,1F0,1I0,1SEND_B0,1W0,1RECV_F1,1F1,1I1,
/// 1SEND_B1,1W1,1REDUCE_GRAD; every receive posts itself.
Schedule plannedGood() {
  Schedule s = csv(kGood);
  lowerCommunication(s);
  lowerReduceGrad(s);
  for (auto &program : s.ranks)
    for (int k = 0, n = static_cast<int>(program.size()); k < n; ++k)
      if (program[k].kind == ActionKind::RecvF ||
          program[k].kind == ActionKind::RecvB)
        program[k].posts = std::vector<int>{k};
  return s;
}

TEST(Validate, FinishedPlanNeedsReduceGradOncePerStage) {
  Schedule s = plannedGood();
  EXPECT_EQ(validatePlan(s), "");
  ASSERT_EQ(formatAction(s.ranks[0].back()), "0REDUCE_GRAD");
  s.ranks[0].pop_back();
  EXPECT_EQ(validatePlan(s),
            "rank 0, action 9 (0W1): no REDUCE_GRAD of stage 0 after this, its "
            "last W or B; a plan reduces each stage's gradients exactly once, "
            "after its last W and B [hpr.schedule.reduce-grad]\n");
  // A schedule to plan may leave it to the planner.
  EXPECT_EQ(validate(s), "");
}

TEST(Validate, PostsEachReceiveOnceInThePeersOrder) {
  Schedule s = plannedGood();
  ASSERT_EQ(formatAction(s.ranks[1][0]), "1RECV_F0");
  ASSERT_EQ(formatAction(s.ranks[1][5]), "1RECV_F1");
  // Posting both at the first is what a plan does when the second is waited
  // for later: admitted.
  s.ranks[1][0].posts = std::vector<int>{0, 5};
  s.ranks[1][5].posts = std::vector<int>{};
  EXPECT_EQ(validatePlan(s), "");
  // Out of rank 0's send order.
  s.ranks[1][0].posts = std::vector<int>{5, 0};
  EXPECT_EQ(validatePlan(s),
            "rank 1, action 0 (1RECV_F0): posts rank 1, action 0 (1RECV_F0) "
            "after rank 1, action 5 (1RECV_F1), but rank 0 sends its message "
            "first; receives from one peer are posted in the order it sends, "
            "since untagged messages match in posting order "
            "[hpr.schedule.posts]\n");
  // Twice, and later than its place.
  s.ranks[1][0].posts = std::vector<int>{0};
  s.ranks[1][5].posts = std::vector<int>{0, 5};
  EXPECT_EQ(validatePlan(s),
            "rank 1, action 5 (1RECV_F1): posts rank 1, action 0 (1RECV_F0) "
            "again (rank 1, action 0 (1RECV_F0) posts it first); each receive "
            "is posted once [hpr.schedule.posts]\n");
  s.ranks[1][0].posts = std::vector<int>{};
  EXPECT_EQ(validatePlan(s),
            "rank 1, action 5 (1RECV_F1): posts rank 1, action 0 (1RECV_F0), "
            "which comes before it; a receive is posted no later than its own "
            "place [hpr.schedule.posts]\n");
  // Never, and an index that is not a receive.
  s.ranks[1][5].posts = std::vector<int>{1, 5};
  EXPECT_EQ(validatePlan(s),
            "rank 1, action 5 (1RECV_F1): posts 1, which is not a receive of "
            "rank 1 (rank 1, action 1 (1F0)); posts lists the indices of "
            "receives [hpr.schedule.posts]\n"
            "rank 1, action 0 (1RECV_F0): never posted: no receive lists it in "
            "posts; a plan posts each receive once, no later than its own "
            "place [hpr.schedule.posts]\n");
  // A finished plan posts every receive; a schedule without posts is not
  // checked for them.
  s = plannedGood();
  s.ranks[0][4].posts.reset();
  EXPECT_NE(validatePlan(s).find("rank 0, action 4 (0RECV_B0): never posted"),
            std::string::npos);
  for (auto &program : s.ranks)
    for (Action &a : program)
      a.posts.reset();
  EXPECT_EQ(validate(s), "");
}

TEST(Validate, ReportsAllViolations) {
  std::string msg = validate(csv("0W0,0F0,0F0\n"));
  EXPECT_NE(msg.find("second forward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dw without its dx"), std::string::npos) << msg;
  EXPECT_NE(msg.find('\n'), std::string::npos) << msg;
}

TEST(Validate, TooManyPairsForTheActions) {
  std::string msg = validate(csv("0F0,0B0,0F9999\n"));
  EXPECT_NE(msg.find("need 10000 forwards but the schedule has only 3 actions"),
            std::string::npos)
      << msg;
}

} // namespace
