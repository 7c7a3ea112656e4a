//===- PlanJson.h - The planned module as the plan JSON ---------*- C++ -*-===//
//
// The plan JSON (DESIGN §4.3, schema docs/schemas/plan.schema.json): what the
// runtimes execute. Written from the planned module and its summary only.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_TARGET_PLANJSON_H
#define HPR_TARGET_PLANJSON_H

#include "hpr/Target/PlanSummary.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mlir::hpr {

/// A schedule `--schedule-gen auto` planned (docs/cli.md): its plan's
/// simulated step and per-rank activation peaks, or why it has none.
struct ScheduleCandidate {
  std::string schedule;
  std::optional<double> stepUs; ///< none: no plan
  std::vector<int64_t> peakBytes;
  std::string refusal; ///< the first error, when no plan
};

/// The options a plan was made with, recorded as the plan JSON's `planner`.
struct PlannerOptions {
  std::string prefetch;                ///< jit, lookahead=K or bubble
  std::string checkpoint;              ///< all, model, none, auto or selective
  std::optional<int64_t> memoryBudget; ///< bytes; none when not given
  std::string tool = "hp-recompute-plan";
  /// With `--schedule-gen auto`: every schedule planned, in the order ties
  /// go (`schedule_candidates`); empty otherwise.
  std::vector<ScheduleCandidate> scheduleCandidates;
};

/// Writes the plan JSON, version 2, to `os`, with `planner` as its
/// `planner` member. Actions and sessions are streamed one per line. Prints
/// what the ops carry: `module` is lowered (hpr-lower-runtime, the planning
/// pipeline's last pass) or read back from a plan.
void writePlanJson(ModuleOp module, const PlanSummary &summary,
                   const PlannerOptions &planner, llvm::raw_ostream &os);

} // namespace mlir::hpr

#endif // HPR_TARGET_PLANJSON_H
