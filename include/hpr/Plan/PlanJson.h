//===- PlanJson.h - The planned module as the plan JSON ---------*- C++ -*-===//
//
// The plan JSON (DESIGN §4.3, schema docs/schemas/plan.schema.json): what the
// runtimes execute. Written from the planned module and its summary only.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_PLAN_PLANJSON_H
#define HPR_PLAN_PLANJSON_H

#include "hpr/Plan/PlanSummary.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <optional>
#include <string>

namespace mlir::hpr {

/// The options a plan was made with, recorded as the plan JSON's `planner`.
struct PlannerOptions {
  std::string prefetch;                ///< jit, lookahead=K or bubble
  std::string checkpoint;              ///< all, model, none, auto or selective
  std::optional<int64_t> memoryBudget; ///< bytes; none when not given
  std::string tool = "hp-recompute-plan";
};

/// Writes the plan JSON, version 2, to `os`, with `planner` as its
/// `planner` member. Actions and sessions are streamed one per line.
void writePlanJson(ModuleOp module, const PlanSummary &summary,
                   const PlannerOptions &planner, llvm::raw_ostream &os);

} // namespace mlir::hpr

#endif // HPR_PLAN_PLANJSON_H
