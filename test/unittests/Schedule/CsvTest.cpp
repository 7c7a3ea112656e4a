//===- CsvTest.cpp - CSV schedule reader/writer tests ---------------------===//

#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Schedule/ScheduleUtils.h"

#include "TestUtil.h"

using namespace mlir::hpr::sched;
using namespace mlir::hpr::sched::test;

namespace {

Action parseOk(llvm::StringRef cell, CsvDialect d = CsvDialect::Current) {
  auto a = parseAction(cell, d);
  EXPECT_TRUE(static_cast<bool>(a)) << cell.str() << ": " << errorText(a);
  return a ? *a : Action();
}

std::string parseErr(llvm::StringRef cell, CsvDialect d = CsvDialect::Current) {
  auto a = parseAction(cell, d);
  EXPECT_FALSE(static_cast<bool>(a)) << cell.str() << " parsed";
  return errorText(a);
}

TEST(ScheduleCsv, CurrentDialectComputeKinds) {
  EXPECT_EQ(parseOk("0F1"), makeAction(ActionKind::Forward, 0, 1));
  EXPECT_EQ(parseOk("7I10"), makeAction(ActionKind::BackwardInput, 7, 10));
  EXPECT_EQ(parseOk("3W2"), makeAction(ActionKind::BackwardWeight, 3, 2));
  EXPECT_EQ(parseOk("12B0"), makeAction(ActionKind::Backward, 12, 0));
}

TEST(ScheduleCsv, CommAndNoMicrobatchKinds) {
  EXPECT_EQ(parseOk("3SEND_F1"), makeAction(ActionKind::SendF, 3, 1));
  EXPECT_EQ(parseOk("3RECV_F1"), makeAction(ActionKind::RecvF, 3, 1));
  EXPECT_EQ(parseOk("2SEND_B4"), makeAction(ActionKind::SendB, 2, 4));
  EXPECT_EQ(parseOk("2RECV_B4"), makeAction(ActionKind::RecvB, 2, 4));
  Action unshard = parseOk("1UNSHARD");
  EXPECT_EQ(unshard.kind, ActionKind::Unshard);
  EXPECT_EQ(unshard.stage, 1);
  EXPECT_EQ(unshard.microbatch, -1);
  EXPECT_EQ(parseOk("1RESHARD").kind, ActionKind::Reshard);
  EXPECT_EQ(parseOk("2REDUCE_GRAD").kind, ActionKind::ReduceGrad);
}

TEST(ScheduleCsv, PlannerKinds) {
  EXPECT_EQ(parseOk("3RECOMPUTE0"), makeAction(ActionKind::Recompute, 3, 0));
  EXPECT_EQ(parseOk("3CLEAR0"), makeAction(ActionKind::Clear, 3, 0));
}

TEST(ScheduleCsv, Composite) {
  Action a = parseOk("(0F7;7B3)OVERLAP_F_B");
  ASSERT_EQ(a.kind, ActionKind::OverlapFB);
  ASSERT_EQ(a.parts.size(), 2u);
  EXPECT_EQ(a.parts[0], makeAction(ActionKind::Forward, 0, 7));
  EXPECT_EQ(a.parts[1], makeAction(ActionKind::Backward, 7, 3));
  EXPECT_EQ(a.stage, -1);
  EXPECT_EQ(a.microbatch, -1);
  // Legacy spelling of the backward part.
  Action legacy = parseOk("(0F7;7BW3)OVERLAP_F_B", CsvDialect::Legacy);
  EXPECT_EQ(legacy.parts[1], makeAction(ActionKind::Backward, 7, 3));
}

TEST(ScheduleCsv, LegacyDialect) {
  auto L = CsvDialect::Legacy;
  EXPECT_EQ(parseOk("2B0", L), makeAction(ActionKind::BackwardInput, 2, 0));
  EXPECT_EQ(parseOk("2W0", L), makeAction(ActionKind::BackwardWeight, 2, 0));
  EXPECT_EQ(parseOk("2BW0", L), makeAction(ActionKind::Backward, 2, 0));
  EXPECT_EQ(parseOk("0SEND_F0", L), makeAction(ActionKind::SendF, 0, 0));
  Action c = parseOk("0SEND_F0_1RECV_B0", L);
  ASSERT_EQ(c.kind, ActionKind::BatchedComm);
  ASSERT_EQ(c.parts.size(), 2u);
  EXPECT_EQ(c.parts[0], makeAction(ActionKind::SendF, 0, 0));
  EXPECT_EQ(c.parts[1], makeAction(ActionKind::RecvB, 1, 0));
  Action three = parseOk("0SEND_F0_1RECV_B0_2RECV_F3", L);
  EXPECT_EQ(three.parts.size(), 3u);
}

TEST(ScheduleCsv, RejectsWhatAPrefixMatchWouldAccept) {
  EXPECT_NE(parseErr("2BW0").find("invalid action '2BW0': expected an action "
                                  "type"),
            std::string::npos);
  EXPECT_NE(parseErr("2BW0").find("got 'BW'"), std::string::npos);
  EXPECT_NE(parseErr("0F").find("expected a microbatch number after 'F'"),
            std::string::npos);
  EXPECT_NE(parseErr("F0").find("starting with a stage number"),
            std::string::npos);
  EXPECT_NE(parseErr("0X1").find("got 'X'"), std::string::npos);
  EXPECT_NE(parseErr("0F1 2").find("expected the cell to end after '0F1'"),
            std::string::npos);
  EXPECT_NE(parseErr("0F1;").find("got ';'"), std::string::npos);
  EXPECT_NE(parseErr("0F0x").find("got 'x'"), std::string::npos);
  EXPECT_NE(parseErr("1UNSHARD0").find("after '1UNSHARD'"), std::string::npos);
  EXPECT_NE(parseErr("(0F7;7B3").find("expected ')'"), std::string::npos);
  EXPECT_NE(parseErr("0F7;7B3)OVERLAP_F_B").find("expected the cell to end"),
            std::string::npos);
  EXPECT_NE(parseErr("(0F7;7B3)").find("expected 'OVERLAP_F_B'"),
            std::string::npos);
  EXPECT_NE(parseErr("(0F7;;7B3)OVERLAP_F_B").find("starting with a stage"),
            std::string::npos);
  EXPECT_NE(parseErr("(0F7;7B3)OVERLAP_F_Bx").find("got 'OVERLAP_F_Bx'"),
            std::string::npos);
  EXPECT_NE(parseErr("0SEND_F0_1RECV_B0").find("only in the legacy dialect"),
            std::string::npos);
  EXPECT_NE(parseErr("0I0", CsvDialect::Legacy).find("got 'I'"),
            std::string::npos);
  EXPECT_NE(parseErr("0SEND_F0_", CsvDialect::Legacy).find("got '_'"),
            std::string::npos);
  EXPECT_NE(parseErr("99999999999F0").find("at most 65535"), std::string::npos);
  EXPECT_NE(parseErr("0F99999999999").find("microbatch number of at most"),
            std::string::npos);
}

TEST(ScheduleCsv, ParsesRowsAndInfersShape) {
  auto s = parseScheduleCsv("0F0,,1F0\n2F0, 3F0 \n", "dir/sched.csv",
                            CsvDialect::Current);
  ASSERT_TRUE(static_cast<bool>(s)) << errorText(s);
  EXPECT_EQ(s->name, "sched");
  EXPECT_EQ(s->numRanks, 2);
  EXPECT_EQ(s->numStages, 4);
  EXPECT_EQ(s->numMicrobatches, 1);
  EXPECT_EQ(s->stageToRank, (std::vector<int>{0, 0, 1, 1}));
  ASSERT_EQ(s->ranks[0].size(), 3u);
  EXPECT_EQ(s->ranks[0][1].kind, ActionKind::Idle);
  EXPECT_EQ(s->ranks[1][1], makeAction(ActionKind::Forward, 3, 0));
}

TEST(ScheduleCsv, StageToRankFromComposites) {
  auto s = parseScheduleCsv("0F0\n(1F0;2B0)OVERLAP_F_B\n", "x.csv",
                            CsvDialect::Current);
  ASSERT_TRUE(static_cast<bool>(s)) << errorText(s);
  EXPECT_EQ(s->stageToRank, (std::vector<int>{0, 1, 1}));
}

TEST(ScheduleCsv, ErrorLocationIsRowAndColumn) {
  auto s = parseScheduleCsv("0F0,0I0,0W0\n1F0,1I0,2BW0,1W0\n", "f.csv",
                            CsvDialect::Current);
  std::string msg = errorText(s);
  EXPECT_EQ(msg.rfind("f.csv:2:3: invalid action '2BW0': expected ", 0), 0u)
      << msg;
}

TEST(ScheduleCsv, CrLfAndTrailingNewlines) {
  auto s = parseScheduleCsv("0F0,0B0\r\n1F0,1B0\r\n\r\n", "x.csv",
                            CsvDialect::Current);
  ASSERT_TRUE(static_cast<bool>(s)) << errorText(s);
  EXPECT_EQ(s->numRanks, 2);
  EXPECT_EQ(s->ranks[1][1], makeAction(ActionKind::Backward, 1, 0));
}

TEST(ScheduleCsv, RoundTripCurrent) {
  std::string text =
      "0F0,0SEND_F0,,1UNSHARD,3RECOMPUTE0,(0F7;7B3)OVERLAP_F_B,0I0,0W0,0B1,"
      "3CLEAR0\n"
      ",1RECV_F0,1F0,2REDUCE_GRAD,1RESHARD,1RECV_B0,1SEND_B0\n";
  auto s = parseScheduleCsv(text, "x.csv", CsvDialect::Current);
  ASSERT_TRUE(static_cast<bool>(s)) << errorText(s);
  EXPECT_EQ(printScheduleCsv(*s, CsvDialect::Current), text);
}

TEST(ScheduleCsv, RoundTripLegacy) {
  std::string text = "0F0,0SEND_F0_1RECV_B0,,0B0,0W0,0BW1\n";
  auto s = parseScheduleCsv(text, "x.csv", CsvDialect::Legacy);
  ASSERT_TRUE(static_cast<bool>(s)) << errorText(s);
  EXPECT_EQ(printScheduleCsv(*s, CsvDialect::Legacy), text);
  // Converting to the current dialect renames and splits the combined comm.
  EXPECT_EQ(printScheduleCsv(*s, CsvDialect::Current),
            "0F0,0SEND_F0,1RECV_B0,,0I0,0W0,0B1\n");
}

TEST(ScheduleCsv, RoundTripPyTorchArtifacts) {
  struct Case {
    const char *file;
    CsvDialect dialect;
  } cases[] = {{"pytorch-dualpipev-4rank-10mb.csv", CsvDialect::Current},
               {"pytorch-zb1p-2rank-2stagep-compute.csv", CsvDialect::Legacy},
               {"pytorch-zb1p-2rank-2stagep-comms.csv", CsvDialect::Legacy},
               {"pytorch-zbv-5x11.csv", CsvDialect::Current}};
  for (const Case &c : cases) {
    std::string text = readInput(c.file);
    auto s = parseScheduleCsv(text, c.file, c.dialect);
    ASSERT_TRUE(static_cast<bool>(s)) << errorText(s);
    EXPECT_EQ(printScheduleCsv(*s, c.dialect), text) << c.file;
  }
}

TEST(ScheduleCsv, EmptyInputIsAnError) {
  auto s = parseScheduleCsv("\n", "e.csv", CsvDialect::Current);
  EXPECT_NE(errorText(s).find("e.csv: empty schedule"), std::string::npos);
}

} // namespace
