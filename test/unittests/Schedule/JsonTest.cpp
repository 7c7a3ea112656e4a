//===- JsonTest.cpp - JSON schedule reader/writer and file dispatch -------===//

#include "hpr/Schedule/Generators.h"
#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Schedule/ScheduleFile.h"
#include "hpr/Schedule/ScheduleJson.h"
#include "hpr/Schedule/ScheduleUtils.h"

#include "TestUtil.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir::hpr::sched;
using namespace mlir::hpr::sched::test;

namespace {

TEST(ScheduleJson, ParsesEveryOp) {
  const char *text = R"({
    "format": "hp-recompute-schedule", "version": 1, "name": "demo",
    "ranks": [
      {"rank": 0, "actions": [
        {"op": "forward", "stage": 0, "microbatch": 0, "duration_us": 12.5},
        {"op": "send_f", "stage": 0, "microbatch": 0},
        {"op": "idle"},
        {"op": "unshard", "stage": 0},
        {"op": "recompute", "stage": 0, "microbatch": 0},
        {"op": "overlap_f_b", "parts": [
          {"op": "forward", "stage": 0, "microbatch": 1},
          {"op": "backward", "stage": 1, "microbatch": 0}]},
        {"op": "batched_comm", "parts": [
          {"op": "send_f", "stage": 0, "microbatch": 1},
          {"op": "recv_b", "stage": 0, "microbatch": 0}]}
      ]},
      {"actions": [{"op": "backward_input", "stage": 1, "microbatch": 0},
                   {"op": "backward_weight", "stage": 1, "microbatch": 0}]}
    ]})";
  auto s = parseScheduleJson(text, "demo.json");
  ASSERT_TRUE(static_cast<bool>(s)) << errorText(s);
  EXPECT_EQ(s->name, "demo");
  EXPECT_EQ(s->numRanks, 2);
  EXPECT_EQ(s->numStages, 2);
  EXPECT_EQ(s->numMicrobatches, 2);
  EXPECT_EQ(s->stageToRank, (std::vector<int>{0, 0}));
  ASSERT_EQ(s->ranks[0].size(), 7u);
  EXPECT_EQ(s->ranks[0][0].durationUs, std::optional<double>(12.5));
  EXPECT_EQ(s->ranks[0][2].kind, ActionKind::Idle);
  EXPECT_EQ(s->ranks[0][3].microbatch, -1);
  EXPECT_EQ(s->ranks[0][5].kind, ActionKind::OverlapFB);
  EXPECT_EQ(s->ranks[0][6].kind, ActionKind::BatchedComm);
  EXPECT_EQ(s->ranks[1][0], makeAction(ActionKind::BackwardInput, 1, 0));
}

TEST(ScheduleJson, RoundTripThroughPrint) {
  auto generated = generateSchedule("dualpipev", {3, 6, 0});
  ASSERT_TRUE(static_cast<bool>(generated)) << errorText(generated);
  generated->ranks[1][2].durationUs = 3.25;
  std::string text = printScheduleJson(*generated);
  auto back = parseScheduleJson(text, "x.json");
  ASSERT_TRUE(static_cast<bool>(back)) << errorText(back);
  EXPECT_EQ(back->name, "dualpipev");
  EXPECT_EQ(back->ranks, generated->ranks);
  EXPECT_EQ(back->stageToRank, generated->stageToRank);
  EXPECT_EQ(back->numStages, generated->numStages);
  EXPECT_EQ(back->numMicrobatches, generated->numMicrobatches);
  // Same cells as the CSV form.
  EXPECT_EQ(printScheduleCsv(*back, CsvDialect::Current),
            printScheduleCsv(*generated, CsvDialect::Current));
}

std::string jsonError(const std::string &body) {
  auto s = parseScheduleJson(body, "t.json");
  return errorText(s);
}

TEST(ScheduleJson, ErrorsNameTheJsonPath) {
  const std::string head =
      R"({"format": "hp-recompute-schedule", "version": 1, )";
  EXPECT_NE(
      jsonError(
          head +
          R"("ranks": [{"actions": [{"op": "forward", "stage": 0, "microbatch": "1"}]}]})")
          .find("t.json: /ranks/0/actions/0/microbatch: expected a "
                "non-negative integer, got \"1\""),
      std::string::npos);
  EXPECT_NE(
      jsonError(
          head +
          R"("ranks": [{"actions": [{"op": "unshard", "stage": 0, "microbatch": 1}]}]})")
          .find("/ranks/0/actions/0/microbatch: unexpected key for op "
                "'unshard'"),
      std::string::npos);
  EXPECT_NE(
      jsonError(
          head +
          R"("ranks": [{"actions": [{"op": "overlap_f_b", "parts": [{"op": "forward", "stage": 0, "microbatch": 0}, {"op": "send_f", "stage": 0, "microbatch": 0}]}]}]})")
          .find("/ranks/0/actions/0/parts/1/op: expected a compute "
                "action"),
      std::string::npos);
  EXPECT_NE(
      jsonError(
          head +
          R"("ranks": [{"actions": [{"op": "idle", "duration_us": -1}]}]})")
          .find("/ranks/0/actions/0/duration_us: expected a "
                "non-negative number"),
      std::string::npos);
  EXPECT_NE(jsonError(head + R"("num_ranks": 3, "ranks": [{"actions": []}]})")
                .find("/num_ranks: expected 1"),
            std::string::npos);
  EXPECT_NE(
      jsonError(
          head +
          R"("num_stages": 1, "ranks": [{"actions": [{"op": "forward", "stage": 4, "microbatch": 0}]}]})")
          .find("/num_stages: expected at least 5"),
      std::string::npos);
  EXPECT_NE(jsonError(head + R"("ranks": [{"rank": 1, "actions": []}]})")
                .find("/ranks/0/rank: expected 0"),
            std::string::npos);
  EXPECT_NE(jsonError(head + R"("rankz": []})").find("/rankz: unexpected key"),
            std::string::npos);
  EXPECT_NE(
      jsonError("{\n  \"format\": ,\n}").find("t.json:2:13: invalid JSON"),
      std::string::npos)
      << jsonError("{\n  \"format\": ,\n}");
}

TEST(ScheduleFile, DispatchesOnExtension) {
  auto csv =
      readScheduleFile(inputPath("pytorch-zbv-5x11.csv"), CsvDialect::Current);
  ASSERT_TRUE(static_cast<bool>(csv)) << errorText(csv);
  EXPECT_EQ(csv->numRanks, 5);
  EXPECT_EQ(csv->name, "pytorch-zbv-5x11");

  llvm::SmallString<128> path;
  ASSERT_FALSE(llvm::sys::fs::createTemporaryFile("sched", "JSON", path));
  {
    std::error_code ec;
    llvm::raw_fd_ostream os(path, ec);
    ASSERT_FALSE(ec);
    os << printScheduleJson(*csv);
  }
  auto json = readScheduleFile(path, CsvDialect::Legacy);
  llvm::sys::fs::remove(path);
  ASSERT_TRUE(static_cast<bool>(json)) << errorText(json);
  EXPECT_EQ(json->ranks, csv->ranks);
}

TEST(ScheduleFile, ClearErrors) {
  auto txt = readScheduleFile("sched.txt", CsvDialect::Current);
  EXPECT_NE(errorText(txt).find("sched.txt: unknown schedule file extension "
                                "'.txt': expected .csv or .json"),
            std::string::npos);
  auto missing =
      readScheduleFile(inputPath("no-such-file.csv"), CsvDialect::Current);
  std::string msg = errorText(missing);
  EXPECT_NE(msg.find("no-such-file.csv: cannot read schedule file: "),
            std::string::npos)
      << msg;
}

} // namespace
