//===- TorchCsvTest.cpp - A torch CSV pair reads back as its plan ---------===//
//
// The oracle is the plan JSON the planner writes for the same module: read
// back, a torch CSV and its sidecar must give that plan's actions in the
// order the CSV holds them (each receive moved to where the plan posts it,
// posting itself there; no tags, which torch's point-to-point ops lack), and
// the admission check must accept it. Damaged pairs are refused with the
// cell or sidecar entry named.
//
//===----------------------------------------------------------------------===//

#include "hpr/Target/TorchCsv.h"
#include "hpr/Driver/Planner.h"
#include "hpr/InitAll.h"
#include "hpr/Target/PlanImport.h"
#include "hpr/Target/PlanJson.h"

#include "mlir/IR/MLIRContext.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>
#include <map>

using namespace mlir;
using namespace mlir::hpr;
using json = nlohmann::json;

namespace {

struct CsvCase {
  const char *generator;
  int ranks, microbatches;
  const char *prefetch;
  CheckpointPolicy checkpoint;
  /// With every block checkpointed, a budget on the bundled GPT (0: none).
  int64_t budget = 0;
};

/// A plan's three outputs: plan JSON, torch CSV, sidecar.
struct Written {
  std::string plan, csv, sidecar;
};

Written writePlan(MLIRContext &context, const CsvCase &c) {
  PlanRequest request;
  request.scheduleGen = c.generator;
  request.ranks = c.ranks;
  request.microbatches = c.microbatches;
  request.prefetch = c.prefetch;
  if (c.checkpoint == CheckpointPolicy::Auto) {
    request.checkpoint = c.checkpoint;
    // A budget at which --checkpoint auto runs some forwards plainly.
    request.modelFile = "examples/gpt/gpt.model.json";
    request.budget = MemoryBudget{4'000'000, std::nullopt};
  }
  if (c.budget) {
    request.modelFile = "examples/gpt/gpt.model.json";
    request.budget = MemoryBudget{c.budget, std::nullopt};
  }
  TimingScope timing;
  auto planned = runPlanner(context, request, timing, nullptr);
  EXPECT_TRUE(static_cast<bool>(planned)) << toString(planned.takeError());
  Written out;
  if (!planned)
    return out;
  llvm::raw_string_ostream plan(out.plan), csv(out.csv), sidecar(out.sidecar);
  writePlanJson(*planned->module, planned->summary, planned->options, plan);
  writeTorchCsv(*planned->module, "plan.csv", csv, sidecar);
  return out;
}

/// The actions of `rank` of plan JSON `plan` in the torch CSV's order: each
/// receive where the receive that posts it stands, posting itself; no idle
/// slots (torch's compute+comms rows have none); no tags; indices of
/// receives (`waits`) renumbered.
json inCsvOrder(const json &rank) {
  const json &actions = rank["actions"];
  json out = json::array();
  std::map<size_t, size_t> moved; // index in `actions` -> index in `out`
  for (size_t k = 0; k < actions.size(); ++k) {
    if (actions[k]["op"] == "idle")
      continue;
    if (!actions[k].contains("posts")) {
      moved[k] = out.size();
      out.push_back(actions[k]);
      continue;
    }
    for (const json &posted : actions[k]["posts"]) {
      moved[posted.get<size_t>()] = out.size();
      json receive = actions[posted.get<size_t>()];
      receive["posts"] = json::array({out.size()});
      out.push_back(std::move(receive));
    }
  }
  for (json &action : out) {
    action.erase("tag");
    if (action.contains("waits"))
      for (json &index : action["waits"])
        index = moved.at(index.get<size_t>());
  }
  return out;
}

class TorchCsvRoundTrip : public ::testing::TestWithParam<CsvCase> {};

TEST_P(TorchCsvRoundTrip, ReadsBackAsThePlanJsonInCsvOrderAndIsAdmitted) {
  DialectRegistry registry;
  registerAllDialects(registry);
  MLIRContext context(registry);
  std::vector<std::string> diagnostics;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
    diagnostics.push_back(diag.str());
    return success();
  });
  Written written = writePlan(context, GetParam());
  ASSERT_FALSE(written.plan.empty());
  auto read = readTorchCsv(context, written.csv, "dir/plan.csv",
                           written.sidecar, "dir/plan.hpr.json");
  ASSERT_TRUE(static_cast<bool>(read)) << toString(read.takeError());
  json want = json::parse(written.plan);
  json got = json::parse(read->plan);
  EXPECT_EQ(got["format"], "hp-recompute-plan");
  EXPECT_EQ(got["version"], 2);
  for (const char *member : {"schedule", "model", "sessions"})
    EXPECT_EQ(got[member], want[member]) << member;
  ASSERT_EQ(got["ranks"].size(), want["ranks"].size());
  bool plain = false, replayedForWeight = false;
  for (size_t rank = 0; rank < want["ranks"].size(); ++rank) {
    EXPECT_EQ(got["ranks"][rank]["rank"], rank);
    json wantActions = inCsvOrder(want["ranks"][rank]);
    const json &gotActions = got["ranks"][rank]["actions"];
    ASSERT_EQ(gotActions.size(), wantActions.size()) << "rank " << rank;
    for (size_t k = 0; k < wantActions.size(); ++k) {
      EXPECT_EQ(gotActions[k], wantActions[k])
          << "rank " << rank << " action " << k;
      plain |= gotActions[k].value("checkpoint", true) == false;
      replayedForWeight |= gotActions[k].value("weight_replay", false);
    }
    ASSERT_EQ(read->sources[rank].size(), gotActions.size());
  }
  EXPECT_EQ(plain, GetParam().checkpoint == CheckpointPolicy::Auto);
  EXPECT_EQ(replayedForWeight, GetParam().budget != 0);

  auto imported = importPlanJson(context, read->plan, "dir/plan.csv");
  ASSERT_TRUE(static_cast<bool>(imported)) << toString(imported.takeError());
  EXPECT_TRUE(succeeded(verifyImportedPlan(**imported)))
      << (diagnostics.empty() ? "" : diagnostics.front());
}

INSTANTIATE_TEST_SUITE_P(
    Generators, TorchCsvRoundTrip,
    ::testing::Values(
        CsvCase{"gpipe", 4, 8, "jit", CheckpointPolicy::All},
        CsvCase{"1f1b", 4, 8, "bubble", CheckpointPolicy::All},
        CsvCase{"interleaved-1f1b", 2, 4, "lookahead=2", CheckpointPolicy::All},
        // Rank 1 posts a receive before the one it waits for.
        CsvCase{"zbv", 2, 4, "jit", CheckpointPolicy::All},
        // OVERLAP_F_B cells.
        CsvCase{"dualpipev", 4, 8, "bubble", CheckpointPolicy::All},
        // plain_forwards.
        CsvCase{"1f1b", 2, 4, "jit", CheckpointPolicy::Auto},
        // a dw replayed again for (weight_replay), at 0.7 times the
        // checkpoint-all peak (ZBV: ZB-H1 on 2 ranks replays none for its
        // dws since the bundled model says what each dx keeps for its dw
        // and what the dw reads of a replay).
        CsvCase{"zbv", 2, 4, "jit", CheckpointPolicy::All, 3'080'907}),
    [](const ::testing::TestParamInfo<CsvCase> &info) {
      std::string name =
          std::string(info.param.generator) + "_" + info.param.prefetch + "_" +
          std::to_string(info.param.ranks) +
          (info.param.checkpoint == CheckpointPolicy::Auto ? "_auto" : "") +
          (info.param.budget ? "_budget" : "");
      for (char &ch : name)
        if (!isalnum(static_cast<unsigned char>(ch)))
          ch = '_';
      return name;
    });

//===----------------------------------------------------------------------===//
// Damaged pairs
//===----------------------------------------------------------------------===//

/// ZBV on 2 ranks with 2 microbatches, as --emit torch-csv writes it:
///   0F0,0SEND_F0,0F1,0SEND_F1,3RECV_F0,3F0,3I0,3SEND_B0,3W0,...
///   1RECV_F0,1F0,2F0,2SEND_F0,1RECV_F1,1F1,2F1,2SEND_F1,2RECV_B0,2I0,...
class TorchCsvDamaged : public ::testing::Test {
protected:
  static DialectRegistry registry() {
    DialectRegistry registry;
    registerAllDialects(registry);
    return registry;
  }

  void SetUp() override {
    Written written =
        writePlan(context, {"zbv", 2, 2, "jit", CheckpointPolicy::All});
    csv = written.csv;
    side = json::parse(written.sidecar);
  }

  /// readTorchCsv's error message, or "" when the pair reads.
  std::string refusal() {
    auto read = readTorchCsv(context, csv, "d/plan.csv", side.dump(),
                             "d/plan.hpr.json");
    return read ? "" : toString(read.takeError());
  }

  /// Replaces the first `from` in the CSV by `to`.
  void editCsv(const std::string &from, const std::string &to) {
    size_t at = csv.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    csv.replace(at, from.size(), to);
  }

  MLIRContext context{registry()};
  std::string csv;
  json side;
};

TEST_F(TorchCsvDamaged, TheUndamagedPairReads) { EXPECT_EQ(refusal(), ""); }

TEST_F(TorchCsvDamaged, ACellThatIsNotTorchsIsNamedByRowAndColumn) {
  editCsv("1F0", "1X0");
  EXPECT_EQ(refusal(),
            "d/plan.csv:2:2: invalid action '1X0': expected an action type "
            "(F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, "
            "REDUCE_GRAD, RECOMPUTE or CLEAR) after the stage number, got 'X'");
}

TEST_F(TorchCsvDamaged, AnEmptyCellIsRefused) {
  editCsv(",0SEND_F0,", ",,");
  EXPECT_EQ(refusal(), "d/plan.csv:1:2: empty cell; a compute+comms row has "
                       "none (an idle slot is no action)");
}

TEST_F(TorchCsvDamaged, ARecomputeCellIsRefused) {
  editCsv("0SEND_F0", "3RECOMPUTE0");
  EXPECT_EQ(refusal(), "d/plan.csv:1:2: '3RECOMPUTE0': torch's action set has "
                       "no RECOMPUTE or CLEAR; the sidecar's inserts place "
                       "them");
}

TEST_F(TorchCsvDamaged, ATransferWithoutANeighbourIsRefused) {
  editCsv("0SEND_F0", "3SEND_F0"); // stage 3 is the last
  EXPECT_EQ(refusal(), "d/plan.csv:1:2: '3SEND_F0' has no neighbour stage in "
                       "/schedule/stage_to_rank of d/plan.hpr.json");
}

TEST_F(TorchCsvDamaged, ARowOfAnotherLengthIsRefused) {
  editCsv("0F0,", "");
  EXPECT_EQ(refusal(),
            "d/plan.csv:1: 21 cells, but the sidecar d/plan.hpr.json was "
            "written for 22; write both again with --emit torch-csv");
}

TEST_F(TorchCsvDamaged, ARowMoreThanTheSidecarHasIsRefused) {
  csv += "0F0\n";
  EXPECT_EQ(refusal(), "d/plan.hpr.json: expected /schedule/stage_to_rank and "
                       "one /ranks entry per row of d/plan.csv (3 rows)");
}

TEST_F(TorchCsvDamaged, ASidecarForAnotherCsvIsRefused) {
  side["csv"] = "other.csv";
  EXPECT_EQ(
      refusal(),
      "d/plan.hpr.json: /csv: expected 'plan.csv', the CSV it sits "
      "beside (a sidecar written for another CSV does not describe this "
      "one; write both again with --emit torch-csv), got '\"other.csv\"'");
}

TEST_F(TorchCsvDamaged, ASidecarOfAnotherFormatIsRefused) {
  side["version"] = true;
  EXPECT_EQ(refusal(), "d/plan.hpr.json: expected a sidecar of format "
                       "'hp-recompute-torch-csv' version 1");
}

TEST_F(TorchCsvDamaged, MembersOfTheWrongTypeAreNamedByJsonPath) {
  struct Damage {
    std::function<void(json &)> edit;
    const char *message;
  };
  const Damage damages[] = {
      {[](json &s) { s["ranks"][0]["inserts"][0]["before"] = true; },
       "d/plan.hpr.json: /ranks/0/inserts/0/before: expected an integer in "
       "[0, 22], got 'true'"},
      {[](json &s) { s["ranks"][0]["inserts"][0].erase("before"); },
       "d/plan.hpr.json: /ranks/0/inserts/0: missing required key 'before'"},
      {[](json &s) { s["ranks"][1]["inserts"] = 5; },
       "d/plan.hpr.json: /ranks/1/inserts: expected an array, got '5'"},
      {[](json &s) { s["ranks"][1]["consumers"][0] = "I"; },
       "d/plan.hpr.json: /ranks/1/consumers/0: expected an object, got "
       "'\"I\"'"},
      {[](json &s) { s["ranks"][0]["consumers"][0]["op"] = "forward"; },
       "d/plan.hpr.json: /ranks/0/consumers/0/op: expected backward_input, "
       "backward_weight or backward, got '\"forward\"'"},
      {[](json &s) { s["ranks"][0]["consumers"][0]["stage"] = false; },
       "d/plan.hpr.json: /ranks/0/consumers/0/stage: expected an integer in "
       "[0, 65535], got 'false'"},
      {[](json &s) { s["ranks"][0]["cells"] = "22"; },
       "d/plan.hpr.json: /ranks/0/cells: expected an integer in [0, "
       "2147483647], got '\"22\"'"},
      {[](json &s) { s["ranks"][0] = 7; },
       "d/plan.hpr.json: /ranks/0: expected an object with cells, and "
       "inserts, consumers and plain_forwards as --emit torch-csv writes "
       "them, got '7'"},
      {[](json &s) {
         s["ranks"][0]["consumers"].push_back(s["ranks"][0]["consumers"][0]);
       },
       "d/plan.hpr.json: /ranks/0/consumers/6: expected one entry per "
       "backward (/ranks/0/consumers/0 is this one's), got '{...}'"},
      {[](json &s) { s["ranks"][1]["consumers"][1]["microbatch"] = 7; },
       "d/plan.hpr.json: /ranks/1/consumers/1: names no action of row 2 of "
       "d/plan.csv; write both again with --emit torch-csv"},
      {[](json &s) {
         s["ranks"][0]["plain_forwards"].push_back(
             {{"stage", 0}, {"microbatch", 9}});
       },
       "d/plan.hpr.json: /ranks/0/plain_forwards/0: names no action of row 1 "
       "of d/plan.csv; write both again with --emit torch-csv"},
  };
  json undamaged = side;
  for (const Damage &damage : damages) {
    side = undamaged;
    damage.edit(side);
    EXPECT_EQ(refusal(), damage.message);
  }
}

TEST_F(TorchCsvDamaged, BytesThatAreNotUtf8AreLocated) {
  editCsv("1F0", "1\xc3(F0");
  EXPECT_EQ(refusal(), "d/plan.csv:2:11: invalid UTF-8 (byte 0xc3); expected "
                       "UTF-8 text");
}

TEST_F(TorchCsvDamaged, PlanPathsAreLocatedAtCellsAndSidecarEntries) {
  auto read =
      readTorchCsv(context, csv, "d/plan.csv", side.dump(), "d/plan.hpr.json");
  ASSERT_TRUE(static_cast<bool>(read)) << toString(read.takeError());
  json plan = json::parse(read->plan);
  const json &rank0 = plan["ranks"][0]["actions"];
  // The sidecar's first insert is rank 0's first recompute, before cell 6.
  EXPECT_EQ(side["ranks"][0]["inserts"][0]["before"], 6);
  EXPECT_EQ(rank0[6]["op"], "recompute");
  EXPECT_EQ(read->locate("/ranks/0/actions/6"),
            "d/plan.hpr.json: /ranks/0/inserts/0");
  EXPECT_EQ(read->locate("/ranks/0/actions/6/session"),
            "d/plan.hpr.json: /ranks/0/inserts/0/session");
  // Cell 7 of row 1 (3I0) comes after that insert: action 7.
  EXPECT_EQ(rank0[7]["op"], "backward_input");
  EXPECT_EQ(read->locate("/ranks/0/actions/7"), "d/plan.csv:1:7 ('3I0')");
  EXPECT_EQ(read->locate("/ranks/0/actions/7/stage"),
            "d/plan.csv:1:7 ('3I0'): stage");
  EXPECT_EQ(read->locate("/ranks/0/actions/7/session"),
            "d/plan.hpr.json: /ranks/0/consumers/0/session");
  EXPECT_EQ(read->locate("/ranks/1/actions/0/posts/0"),
            "d/plan.csv:2:1 ('1RECV_F0'): posts/0");
  EXPECT_EQ(read->locate("/sessions/3/regions"),
            "d/plan.hpr.json: /sessions/3/regions");
  EXPECT_EQ(read->locate("/ranks/0/actions/999"),
            "d/plan.hpr.json: /ranks/0/actions/999");
}

TEST(TorchCsvFiles, AMissingSidecarIsNamed) {
  llvm::SmallString<128> dir;
  ASSERT_FALSE(llvm::sys::fs::createUniqueDirectory("torch-csv", dir));
  std::string csvPath = (dir + "/plan.csv").str();
  std::ofstream(csvPath) << "0F0\n";
  EXPECT_EQ(torchCsvSidecarPath(csvPath), (dir + "/plan.hpr.json").str());
  DialectRegistry registry;
  registerAllDialects(registry);
  MLIRContext context(registry);
  auto read = readTorchCsvFiles(context, csvPath);
  ASSERT_FALSE(static_cast<bool>(read));
  std::string message = toString(read.takeError());
  EXPECT_EQ(message.rfind(torchCsvSidecarPath(csvPath) +
                              ": cannot read torch CSV sidecar: ",
                          0),
            0u)
      << message;
  llvm::sys::fs::remove_directories(dir);
}

} // namespace
