//===- PlannerModule.cpp - hp_recompute._planner: the planner in process -===//
//
// The Python extension through which Python reaches the C++ planner instead
// of restating its rules: `plan` runs the planner (mlir::hpr::runPlanner, the
// CLI's code) and returns the plan JSON; `verify_plan` reads a plan back into
// IR and runs the admission check (mlir::hpr::verifyImportedPlan), the same
// code as `hp-recompute-plan --verify`. Diagnostics come back as the lines
// the CLI prints, so every runtime names a broken rule in the same words.
//
//===----------------------------------------------------------------------===//

#include "hpr/Driver/Planner.h"
#include "hpr/InitAll.h"
#include "hpr/Plan/Diagnostics.h"
#include "hpr/Plan/PlanImport.h"
#include "hpr/Support/OutputFile.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/MLIRContext.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;
using namespace nb::literals;

namespace {
/// A context whose diagnostics are collected as the CLI prints them.
struct CollectingContext {
  static mlir::DialectRegistry registry() {
    mlir::DialectRegistry registry;
    mlir::hpr::registerAllDialects(registry);
    return registry;
  }

  CollectingContext()
      : context(registry()), handler(&context, [this](mlir::Diagnostic &diag) {
          std::string line;
          llvm::raw_string_ostream os(line);
          mlir::hpr::printDiagnostic(diag, os, "hp_recompute");
          problems.push_back(llvm::StringRef(line).rtrim().str());
          return mlir::success();
        }) {
    context.printOpOnDiagnostic(false);
  }

  mlir::MLIRContext context;
  mlir::ScopedDiagnosticHandler handler;
  std::vector<std::string> problems;
};
} // namespace

/// Every problem found in plan `text`, one line each (empty: admitted).
static std::vector<std::string> verifyPlanText(const std::string &text,
                                               const std::string &name) {
  CollectingContext collecting;
  auto module = mlir::hpr::importPlanJson(collecting.context, text, name);
  if (!module) {
    collecting.problems.push_back(llvm::toString(module.takeError()));
    return collecting.problems;
  }
  if (mlir::failed(mlir::hpr::verifyImportedPlan(**module)) &&
      collecting.problems.empty())
    collecting.problems.push_back(name + ": the plan failed verification");
  return collecting.problems;
}

/// The plan JSON of `request`, or the problems that stopped it; each
/// problem is a line as the CLI prints it, a usage error starts with
/// "usage: ".
static std::pair<std::string, std::vector<std::string>>
planText(const mlir::hpr::PlanRequest &request) {
  CollectingContext collecting;
  mlir::TimingScope timing;
  std::vector<std::string> warnings;
  auto planned =
      mlir::hpr::runPlanner(collecting.context, request, timing, &warnings);
  if (!planned) {
    bool usage = planned.errorIsA<mlir::hpr::UsageError>();
    std::string message = llvm::toString(planned.takeError());
    if (collecting.problems.empty() || usage)
      collecting.problems.push_back((usage ? "usage: " : "") + message);
    return {"", collecting.problems};
  }
  std::string json;
  llvm::raw_string_ostream os(json);
  mlir::hpr::writePlanJson(*planned->module, planned->summary, planned->options,
                           os);
  return {json, {}};
}

NB_MODULE(_planner, m) {
  m.doc() = "hp-recompute's C++ planner, in process (docs/python-api.md).";
  m.def(
      "verify_plan",
      [](const std::string &text, const std::string &name) {
        nb::gil_scoped_release release;
        return verifyPlanText(text, name);
      },
      "text"_a, "name"_a,
      "Reads plan JSON `text` (named `name` in messages) back into the "
      "planner's IR and runs its admission check; returns the problems "
      "found, one line each, as `hp-recompute-plan --verify` prints them "
      "(an empty list: the plan is admitted).");
  m.def(
      "plan",
      [](std::optional<std::string> schedule, std::optional<std::string> gen,
         std::optional<std::string> model, int ranks, int microbatches,
         int stagesPerRank, const std::string &checkpoint,
         const std::string &prefetch, std::optional<int64_t> budget,
         const std::string &stages) {
        mlir::hpr::PlanRequest request;
        request.scheduleFile = schedule.value_or("");
        request.scheduleGen = gen.value_or("");
        request.modelFile = model.value_or("");
        request.ranks = ranks;
        request.microbatches = microbatches;
        request.stagesPerRank = stagesPerRank;
        std::optional<mlir::hpr::CheckpointPolicy> policy =
            mlir::hpr::parseCheckpointPolicy(checkpoint);
        if (!policy)
          return std::pair<std::string, std::vector<std::string>>{
              "",
              {"usage: --checkpoint: expected all, model, none or auto, got '" +
               checkpoint + "'"}};
        request.checkpoint = *policy;
        request.prefetch = prefetch;
        request.budget = budget;
        request.stageSpec = stages;
        nb::gil_scoped_release release;
        return planText(request);
      },
      "schedule"_a.none(), "schedule_gen"_a.none(), "model"_a.none(), "ranks"_a,
      "microbatches"_a, "stages_per_rank"_a, "checkpoint"_a, "prefetch"_a,
      "memory_budget"_a.none(), "stages"_a,
      "Runs the planner as hp-recompute-plan does; returns (plan JSON text, "
      "[]) or (\"\", the problems, one line each; a request the CLI would "
      "refuse with exit 2 starts with \"usage: \").");
}
