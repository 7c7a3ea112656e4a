//===- LoweringTest.cpp - Communication lowering tests --------------------===//

#include "hpr/Schedule/Lowering.h"
#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Schedule/Validate.h"

#include "TestUtil.h"

using namespace mlir::hpr::sched;
using namespace mlir::hpr::sched::test;

namespace {

TEST(Lowering, TwoRanksSplitBackward) {
  Schedule s = csv("0F0,0I0,0W0\n1F0,1I0,1W0\n");
  EXPECT_FALSE(hasCommunication(s));
  lowerCommunication(s);
  EXPECT_TRUE(hasCommunication(s));
  // Expected by the rules in Lowering.h, written out by hand.
  EXPECT_EQ(printScheduleCsv(s, CsvDialect::Current),
            "0F0,0SEND_F0,0RECV_B0,0I0,0W0\n"
            "1RECV_F0,1F0,1I0,1SEND_B0,1W0\n");
}

TEST(Lowering, FullBackwardAndIdleCellsKept) {
  Schedule s = csv(",0F0,0B0\n1F0,,1B0\n");
  lowerCommunication(s);
  EXPECT_EQ(printScheduleCsv(s, CsvDialect::Current),
            ",0F0,0SEND_F0,0RECV_B0,0B0\n"
            "1RECV_F0,1F0,,1B0,1SEND_B0\n");
}

TEST(Lowering, VShapeNeedsNoTransferBetweenColocatedStages) {
  // Rank 0 holds stages 0 and 3, rank 1 holds 1 and 2.
  Schedule s = csv("0F0,3F0,3I0,3W0,0I0,0W0\n1F0,2F0,2I0,2W0,1I0,1W0\n");
  s.stageToRank = {0, 1, 1, 0};
  lowerCommunication(s);
  EXPECT_EQ(printScheduleCsv(s, CsvDialect::Current),
            "0F0,0SEND_F0,3RECV_F0,3F0,3I0,3SEND_B0,3W0,0RECV_B0,0I0,0W0\n"
            "1RECV_F0,1F0,2F0,2SEND_F0,2RECV_B0,2I0,2W0,1I0,1SEND_B0,1W0\n");
  EXPECT_EQ(errorText(validateSchedule(s, "t.csv")), "");
}

TEST(Lowering, OverlapPartsGetTheirTransfers) {
  // Rank 0 holds stages 0 and 3; the composite forwards stage 3 mb 1 while
  // running the full backward of stage 0 mb 0.
  Schedule s = csv("0F0,0F1,3F0,3B0,(3F1;0B0)OVERLAP_F_B,3B1,0B1\n"
                   "1F0,2F0,1F1,2F1,2B0,1B0,2B1,1B1\n");
  lowerCommunication(s);
  // Stage 3 is the last stage: its backward receives nothing.
  EXPECT_EQ(formatAction(s.ranks[0][8]), "3RECV_F1");
  EXPECT_EQ(formatAction(s.ranks[0][9]), "0RECV_B0");
  EXPECT_EQ(formatAction(s.ranks[0][10]), "(3F1;0B0)OVERLAP_F_B");
  EXPECT_EQ(formatAction(s.ranks[0][11]), "3B1");
  EXPECT_EQ(printScheduleCsv(s, CsvDialect::Current),
            "0F0,0SEND_F0,0F1,0SEND_F1,3RECV_F0,3F0,3B0,3SEND_B0,3RECV_F1,"
            "0RECV_B0,(3F1;0B0)OVERLAP_F_B,3B1,3SEND_B1,0RECV_B1,0B1\n"
            "1RECV_F0,1F0,2F0,2SEND_F0,1RECV_F1,1F1,2F1,"
            "2SEND_F1,2RECV_B0,2B0,1B0,1SEND_B0,2RECV_B1,2B1,1B1,1SEND_B1\n");
  EXPECT_EQ(errorText(validateSchedule(s, "t.csv")), "");
}

TEST(Lowering, ScheduleWithCommsIsLeftAlone) {
  Schedule s = csv("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  Schedule before = s;
  lowerCommunication(s);
  EXPECT_EQ(s.ranks, before.ranks);
}

TEST(Lowering, SingleRankNeedsNothing) {
  Schedule s = csv("0F0,1F0,1B0,0B0\n");
  lowerCommunication(s);
  EXPECT_FALSE(hasCommunication(s));
}

TEST(LoweringReduceGrad, AfterEachStagesLastWOrB) {
  // Rank 0 holds stages 0 and 3 (a V): each stage's REDUCE_GRAD follows its
  // own last W or B and the sends right after it, where torch's
  // _add_reduce_grad and _add_send_recv put it.
  Schedule s = csv("0F0,3F0,3I0,3W0,0I0,0W0\n1F0,2F0,2B0,1B0\n");
  s.stageToRank = {0, 1, 1, 0};
  lowerCommunication(s);
  lowerReduceGrad(s);
  EXPECT_EQ(printScheduleCsv(s, CsvDialect::Current),
            "0F0,0SEND_F0,3RECV_F0,3F0,3I0,3SEND_B0,3W0,3REDUCE_GRAD,0RECV_B0,"
            "0I0,0W0,0REDUCE_GRAD\n"
            "1RECV_F0,1F0,2F0,2SEND_F0,2RECV_B0,2B0,2REDUCE_GRAD,1B0,1SEND_B0,"
            "1REDUCE_GRAD\n");
  EXPECT_EQ(errorText(validateSchedule(s, "t.csv")), "");
  // The same after the transfers are lowered (a schedule file that has
  // them).
  Schedule t = csv("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
  lowerReduceGrad(t);
  EXPECT_EQ(printScheduleCsv(t, CsvDialect::Current),
            "0F0,0SEND_F0,0RECV_B0,0B0,0REDUCE_GRAD\n"
            "1RECV_F0,1F0,1B0,1SEND_B0,1REDUCE_GRAD\n");
}

TEST(LoweringReduceGrad, AfterTheCompositeHoldingTheLastBackward) {
  Schedule s = csv("0F0,0F1,(0F2;0B0)OVERLAP_F_B,0B1,0B2\n");
  lowerReduceGrad(s);
  EXPECT_EQ(printScheduleCsv(s, CsvDialect::Current),
            "0F0,0F1,(0F2;0B0)OVERLAP_F_B,0B1,0B2,0REDUCE_GRAD\n");
  s = csv("0F0,0F1,0B0,(0F2;0B1)OVERLAP_F_B,0I2,0W2\n");
  lowerReduceGrad(s);
  EXPECT_EQ(formatAction(s.ranks[0].back()), "0REDUCE_GRAD");
  s = csv("0F0,0B0,0F1,(1F0;0B1)OVERLAP_F_B,1F1,1B0,1B1\n");
  lowerReduceGrad(s);
  EXPECT_EQ(printScheduleCsv(s, CsvDialect::Current),
            "0F0,0B0,0F1,(1F0;0B1)OVERLAP_F_B,0REDUCE_GRAD,1F1,1B0,1B1,"
            "1REDUCE_GRAD\n");
}

TEST(LoweringReduceGrad, OneTheScheduleHasKeepsItsPlace) {
  Schedule s = csv("0F0,0B0,0F1,0B1,,0REDUCE_GRAD,1F0,1B0\n");
  lowerReduceGrad(s);
  EXPECT_EQ(printScheduleCsv(s, CsvDialect::Current),
            "0F0,0B0,0F1,0B1,,0REDUCE_GRAD,1F0,1B0,1REDUCE_GRAD\n");
  // The added one takes the cell of the action it follows.
  EXPECT_EQ(s.ranks[0].back().sourceCell, 7);
}

TEST(LoweringReduceGrad, AStageWithoutBackwardsGetsNone) {
  Schedule s = csv("0F0,1F0,1I0\n");
  lowerReduceGrad(s);
  EXPECT_EQ(printScheduleCsv(s, CsvDialect::Current), "0F0,1F0,1I0\n");
}

} // namespace
