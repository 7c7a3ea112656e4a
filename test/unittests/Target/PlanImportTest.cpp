//===- PlanImportTest.cpp - Every plan the planner writes reads back ------===//
//
// For every generator and placement: the plan JSON, read back into IR by
// importPlanJson, is admitted by verifyImportedPlan, and written again it is
// the same text, byte for byte (summary included: the imported module keeps
// the model's costs, so the simulation reruns to the same numbers). The
// planner's output is the oracle for the importer, and the verifier judges
// both.
//
//===----------------------------------------------------------------------===//

#include "hpr/Target/PlanImport.h"
#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Driver/Planner.h"
#include "hpr/InitAll.h"

#include "mlir/IR/MLIRContext.h"

#include <gtest/gtest.h>

using namespace mlir;
using namespace mlir::hpr;

namespace {

struct ImportCase {
  const char *generator;
  int ranks, microbatches;
  const char *prefetch;
};

class PlanImport : public ::testing::TestWithParam<ImportCase> {};

std::string planJson(ModuleOp module, const PlanSummary &summary,
                     const PlannerOptions &options) {
  std::string text;
  llvm::raw_string_ostream os(text);
  writePlanJson(module, summary, options, os);
  return text;
}

TEST_P(PlanImport, WrittenPlansReadBackAdmittedAndIdentical) {
  const ImportCase &c = GetParam();
  DialectRegistry registry;
  registerAllDialects(registry);
  MLIRContext context(registry);
  std::vector<std::string> diagnostics;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
    diagnostics.push_back(diag.str());
    return success();
  });
  PlanRequest request;
  request.scheduleGen = c.generator;
  request.ranks = c.ranks;
  request.microbatches = c.microbatches;
  request.prefetch = c.prefetch;
  TimingScope timing;
  auto planned = runPlanner(context, request, timing, nullptr);
  ASSERT_TRUE(static_cast<bool>(planned)) << toString(planned.takeError());
  std::string written =
      planJson(*planned->module, planned->summary, planned->options);
  // The planner lowers one reduce_grad per stage into every plan, and a
  // posting for every receive (both checked by verifyImportedPlan below).
  auto count = [&](llvm::StringRef needle) {
    return llvm::StringRef(written).count(needle);
  };
  EXPECT_EQ(count("{\"op\":\"reduce_grad\""),
            getSchedule(*planned->module).getNumStages());
  EXPECT_EQ(count("\"posts\":"),
            count("{\"op\":\"recv_f\"") + count("{\"op\":\"recv_b\""));
  // And what a runtime would otherwise derive: one last_backward per stage,
  // one reader waiting for each receive, and a hands_to on the forward of
  // each stage whose next stage shares its rank and on the dx of that next
  // stage, per microbatch.
  ScheduleOp schedule = getSchedule(*planned->module);
  EXPECT_EQ(count("\"last_backward\":true"), schedule.getNumStages());
  EXPECT_EQ(count("\"waits\":["),
            count("{\"op\":\"recv_f\"") + count("{\"op\":\"recv_b\""));
  int64_t colocated = 0, numStages = schedule.getNumStages();
  for (int64_t stage = 0; stage + 1 < numStages; ++stage)
    colocated += schedule.getRankOf(stage) == schedule.getRankOf(stage + 1);
  EXPECT_EQ(count("\"hands_to\":"),
            static_cast<size_t>(colocated * 2 * schedule.getNumMicrobatches()));

  auto imported = importPlanJson(context, written, "plan.json");
  ASSERT_TRUE(static_cast<bool>(imported)) << toString(imported.takeError());
  ASSERT_TRUE(succeeded(verifyImportedPlan(**imported)))
      << (diagnostics.empty() ? "" : diagnostics.front());
  auto summary = summarizePlan(**imported);
  ASSERT_TRUE(static_cast<bool>(summary)) << toString(summary.takeError());
  EXPECT_EQ(planJson(**imported, *summary, planned->options), written);
}

INSTANTIATE_TEST_SUITE_P(
    Generators, PlanImport,
    ::testing::Values(ImportCase{"gpipe", 4, 8, "jit"},
                      ImportCase{"1f1b", 4, 8, "bubble"},
                      ImportCase{"interleaved-1f1b", 2, 4, "lookahead=2"},
                      ImportCase{"zb-h1", 4, 8, "bubble"},
                      ImportCase{"zbv", 4, 8, "jit"},
                      ImportCase{"zbv", 2, 4, "lookahead=1"},
                      ImportCase{"dualpipev", 4, 8, "bubble"}),
    [](const ::testing::TestParamInfo<ImportCase> &info) {
      std::string name = std::string(info.param.generator) + "_" +
                         info.param.prefetch + "_" +
                         std::to_string(info.param.ranks);
      for (char &ch : name)
        if (!isalnum(static_cast<unsigned char>(ch)))
          ch = '_';
      return name;
    });

} // namespace
