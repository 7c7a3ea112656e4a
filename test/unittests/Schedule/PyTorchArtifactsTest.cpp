//===- PyTorchArtifactsTest.cpp - PyTorch's own schedule CSVs -------------===//
//
// The CSVs under test/inputs/schedules/pytorch-* (except the hand-derived ZBV
// one) are PyTorch's test artifacts, produced by PyTorch, not by us: our
// generators must reproduce them cell for cell, and our validator must accept
// them.
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/Generators.h"
#include "hpr/Schedule/Lowering.h"
#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Schedule/Validate.h"

#include "TestUtil.h"

using namespace mlir::hpr::sched;
using namespace mlir::hpr::sched::test;

namespace {

Schedule load(const std::string &file, CsvDialect dialect) {
  auto s = parseScheduleCsv(readInput(file), file, dialect);
  EXPECT_TRUE(static_cast<bool>(s)) << errorText(s);
  return s ? *s : Schedule();
}

TEST(PyTorchArtifacts, DualPipeVMatchesGenerator) {
  Schedule ref = load("pytorch-dualpipev-4rank-10mb.csv", CsvDialect::Current);
  EXPECT_EQ(ref.numStages, 8);
  EXPECT_EQ(ref.numMicrobatches, 10);
  EXPECT_EQ(ref.stageToRank, (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0}));
  auto gen = generateSchedule("dualpipev", {4, 10, 0});
  ASSERT_TRUE(static_cast<bool>(gen)) << errorText(gen);
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(gen->ranks[r].size(), ref.ranks[r].size()) << "rank " << r;
    for (size_t k = 0; k < ref.ranks[r].size(); ++k)
      EXPECT_EQ(formatAction(gen->ranks[r][k]), formatAction(ref.ranks[r][k]))
          << "rank " << r << ", cell " << k;
  }
}

TEST(PyTorchArtifacts, DualPipeVValidatesAfterLowering) {
  Schedule ref = load("pytorch-dualpipev-4rank-10mb.csv", CsvDialect::Current);
  EXPECT_EQ(errorText(validateSchedule(ref, "dualpipev")), "");
  lowerCommunication(ref);
  EXPECT_EQ(errorText(validateSchedule(ref, "dualpipev")), "");
}

TEST(PyTorchArtifacts, ZeroBubbleComputeMatchesGenerator) {
  // Legacy dialect: B is dx. 2 ranks, 2 stages per rank, 8 microbatches.
  Schedule ref =
      load("pytorch-zb1p-2rank-2stagep-compute.csv", CsvDialect::Legacy);
  EXPECT_EQ(ref.ranks[0][3].kind, ActionKind::Idle);
  EXPECT_EQ(ref.ranks[1][0].kind, ActionKind::Idle);
  auto gen = generateSchedule("zb-h1", {2, 8, 2});
  ASSERT_TRUE(static_cast<bool>(gen)) << errorText(gen);
  EXPECT_EQ(printScheduleCsv(*gen, CsvDialect::Legacy),
            printScheduleCsv(ref, CsvDialect::Legacy));
  EXPECT_EQ(errorText(validateSchedule(ref, "zb1p")), "");
  lowerCommunication(ref);
  EXPECT_EQ(errorText(validateSchedule(ref, "zb1p")), "");
}

TEST(PyTorchArtifacts, ZeroBubbleCommsValidatesAsIs) {
  Schedule ref =
      load("pytorch-zb1p-2rank-2stagep-comms.csv", CsvDialect::Legacy);
  EXPECT_EQ(errorText(validateSchedule(ref, "zb1p-comms")), "");
}

} // namespace
