//===- GeneratorsTest.cpp - Built-in schedule generators ------------------===//
//
// How test/inputs/schedules/pytorch-zbv-5x11.csv was derived (by hand, not by
// running our generator): PyTorch's ScheduleZBVZeroBubble
// (torch/distributed/pipelining/schedules.py,
// _calculate_single_rank_operations) was executed on paper for pp = 5,
// n_microbatches = 11, so n_micro = max(2*5-1, 11) = 11 and nothing is blanked.
// Rank r holds chunk 0 = stage r and chunk 1 = stage 9-r, and its row is:
//   r empty cells (PyTorch starts rank_ops with `rank` Nones);
//   2(5-r)-1 x F0;  r x (F1, F0);  5-r x (F1, I1, W1);
//   steady: while f1 < f0 or f0 < 11: [F0 if f0 < 11], I0, W0, F1, I1, W1;
//   cooldown: r x (I0, I1); 5-r x (I0, W0 using the W0 counter);
//   then the remaining W1, then the remaining W0.
// Worked counts, rank 0: 9 F0, 5 (F1,I1,W1), 2 steady rounds with F0 and 4
// without, then 5 (I0,W0) = 66 cells. Rank 4: 4 empty cells, 1 F0, 4 (F1,F0),
// 1 (F1,I1,W1), 6 steady rounds with F0, 4 (I0,I1), 1 (I0,W0), W1 7..10, W0
// 7..10. Each row has 2 x 11 x 3 = 66 actions (checked below as well).
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/Generators.h"
#include "hpr/Schedule/Lowering.h"
#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Schedule/Validate.h"

#include "TestUtil.h"

#include "llvm/ADT/StringExtras.h"

using namespace mlir::hpr::sched;
using namespace mlir::hpr::sched::test;

namespace {

/// Compares two CSV texts cell by cell and reports the first difference.
void expectSameCells(const std::string &expected, const std::string &actual,
                     const std::string &what) {
  llvm::SmallVector<llvm::StringRef> expRows, actRows;
  llvm::StringRef(expected).trim().split(expRows, '\n');
  llvm::StringRef(actual).trim().split(actRows, '\n');
  ASSERT_EQ(expRows.size(), actRows.size()) << what;
  for (size_t r = 0; r < expRows.size(); ++r) {
    llvm::SmallVector<llvm::StringRef> e, a;
    expRows[r].split(e, ',');
    actRows[r].split(a, ',');
    for (size_t c = 0; c < std::max(e.size(), a.size()); ++c) {
      llvm::StringRef ec = c < e.size() ? e[c] : "<none>";
      llvm::StringRef ac = c < a.size() ? a[c] : "<none>";
      ASSERT_EQ(ec.str(), ac.str()) << what << ": rank " << r << ", cell " << c;
    }
  }
}

TEST(Generators, Names) {
  std::vector<std::string> names;
  for (llvm::StringRef n : generatorNames())
    names.push_back(n.str());
  EXPECT_EQ(names, (std::vector<std::string>{
                       "gpipe", "1f1b", "interleaved-1f1b", "zb-h1",
                       "interleaved-zb", "zbv", "dualpipev"}));
}

TEST(Generators, InterleavedZbIsZbH1OnTwoStagesPerRank) {
  // PyTorch's ScheduleInterleavedZeroBubble with its looped placement: the
  // zb-h1 programs with v = 2, under their own name.
  for (auto [p, m] : {std::pair{2, 4}, {4, 8}, {4, 12}}) {
    auto looped = generateSchedule("interleaved-zb", {p, m, 0});
    auto zbh1 = generateSchedule("zb-h1", {p, m, 2});
    ASSERT_TRUE(looped && zbh1);
    EXPECT_EQ(looped->name, "interleaved-zb");
    EXPECT_EQ(looped->numStages, 2 * p);
    EXPECT_EQ(looped->ranks, zbh1->ranks);
  }
}

TEST(Generators, ZbvMatchesHandDerivedPyTorchSchedule) {
  std::string reference = readInput("pytorch-zbv-5x11.csv");
  auto s = generateSchedule("zbv", {5, 11, 0});
  ASSERT_TRUE(static_cast<bool>(s)) << errorText(s);
  expectSameCells(reference, printScheduleCsv(*s, CsvDialect::Current),
                  "zbv 5x11");
  for (const auto &program : s->ranks) {
    int actions = 0;
    for (const Action &a : program)
      actions += a.kind != ActionKind::Idle;
    EXPECT_EQ(actions, 66);
  }
  EXPECT_EQ(s->stageToRank, (std::vector<int>{0, 1, 2, 3, 4, 4, 3, 2, 1, 0}));
}

TEST(Generators, OneFOneBByHand) {
  auto s = generateSchedule("1f1b", {3, 4, 0});
  ASSERT_TRUE(static_cast<bool>(s)) << errorText(s);
  EXPECT_EQ(printScheduleCsv(*s, CsvDialect::Current),
            "0F0,0F1,0F2,0B0,0F3,0B1,0B2,0B3\n"
            "1F0,1F1,1B0,1F2,1B1,1F3,1B2,1B3\n"
            "2F0,2B0,2F1,2B1,2F2,2B2,2F3,2B3\n");
}

TEST(Generators, GPipeByHand) {
  auto s = generateSchedule("gpipe", {2, 2, 0});
  ASSERT_TRUE(static_cast<bool>(s)) << errorText(s);
  EXPECT_EQ(printScheduleCsv(*s, CsvDialect::Current),
            "0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n");
}

TEST(Generators, RefusesUnsupportedSizes) {
  auto expectRefusal = [](llvm::StringRef name, GeneratorOptions o,
                          const std::string &text) {
    auto s = generateSchedule(name, o);
    std::string msg = errorText(s);
    EXPECT_NE(msg.find(text), std::string::npos) << name.str() << ": " << msg;
  };
  expectRefusal("dualpipev", {4, 7, 0},
                "dualpipev: needs microbatches >= 2 x ranks = 8, got 7");
  expectRefusal("zbv", {4, 8, 3},
                "zbv: runs exactly 2 stages per rank (a V), got 3");
  expectRefusal("1f1b", {4, 8, 2}, "1f1b: runs exactly 1 stage per rank");
  expectRefusal("interleaved-1f1b", {4, 9, 0},
                "9 microbatches is not a multiple of the number of rounds "
                "max(1, microbatches / ranks) = 2");
  expectRefusal("zb-h1", {0, 4, 0}, "expected at least 1 rank");
  expectRefusal("chimera", {2, 2, 0},
                "chimera: unknown schedule: expected one of gpipe, 1f1b, "
                "interleaved-1f1b, zb-h1, interleaved-zb, zbv, dualpipev");
}

/// Which sizes each generator is documented to support.
bool supported(llvm::StringRef name, int p, int m, int v) {
  if (name == "dualpipev")
    return m >= 2 * p;
  if (name == "interleaved-1f1b" || name == "zb-h1" || name == "interleaved-zb")
    return m % std::max(1, m / p) == 0;
  return true;
}

TEST(Generators, GridValidatesBeforeAndAfterLowering) {
  for (llvm::StringRef name : generatorNames()) {
    std::vector<int> vs = {0};
    if (name == "interleaved-1f1b" || name == "zb-h1" ||
        name == "interleaved-zb")
      vs = {0, 1, 2, 3, 4};
    int accepted = 0;
    for (int v : vs)
      for (int p = 1; p <= 8; ++p)
        for (int m = 1; m <= 32; ++m) {
          std::string what = name.str() + " p=" + std::to_string(p) +
                             " m=" + std::to_string(m) +
                             " v=" + std::to_string(v);
          auto s = generateSchedule(name, {p, m, v});
          if (!supported(name, p, m, v)) {
            EXPECT_FALSE(static_cast<bool>(s)) << what;
            EXPECT_NE(errorText(s), "") << what;
            continue;
          }
          ASSERT_TRUE(static_cast<bool>(s)) << what << ": " << errorText(s);
          ++accepted;
          int perRank =
              v ? v
              : (name == "zbv" || name == "dualpipev" ||
                 name == "interleaved-1f1b" || name == "interleaved-zb")
                  ? 2
                  : 1;
          EXPECT_EQ(s->numRanks, p) << what;
          EXPECT_EQ(s->numStages, p * perRank) << what;
          EXPECT_EQ(s->numMicrobatches, m) << what;
          EXPECT_FALSE(hasCommunication(*s)) << what;
          ASSERT_EQ(errorText(validateSchedule(*s, what)), "") << what;
          lowerCommunication(*s);
          EXPECT_EQ(hasCommunication(*s), p > 1) << what;
          ASSERT_EQ(errorText(validateSchedule(*s, what)), "") << what;
        }
    EXPECT_GT(accepted, 100) << name.str();
  }
}

} // namespace
