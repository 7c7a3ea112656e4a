//===- PlanExport.h - Planned hpr IR -> plan formats ------------*- C++ -*-===//
//
// The exporters read nothing but the planned module: the plan JSON (DESIGN
// §4.3, schema in docs/schemas/plan.schema.json), the schedule CSV with
// RECOMPUTE/CLEAR actions, and the per-rank summary.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_PLAN_PLANEXPORT_H
#define HPR_PLAN_PLANEXPORT_H

#include "hpr/Analysis/Timeline.h"
#include "hpr/Schedule/Schedule.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mlir::hpr {

/// What one rank's program does and costs.
struct RankSummary {
  int64_t actions = 0;
  int64_t sessions = 0;
  int64_t recomputes = 0;
  int64_t clears = 0;
  /// Recomputes that per-backward checkpointing would run: one per backward
  /// call reading a session (2 for a dx/dw-split session, 1 for B).
  int64_t perBackwardRecomputes = 0;
  /// Most sessions recomputed and not yet cleared at one time.
  int64_t maxLiveSessions = 0;
  /// Peak activation bytes under the cost model (see ActivationModel.h).
  int64_t peakBytes = 0;
  /// Peak of everything the step allocates under the cost model: the
  /// activations plus stage outputs, output gradients, the state I keeps for
  /// W, and weight gradients (what the runner measures at the allocator).
  int64_t peakMemoryBytes = 0;
  /// Simulated recompute time in time the rank would wait anyway, and the
  /// rest (Timeline.h, measureRecomputeExposure).
  double hiddenRecomputeUs = 0;
  double exposedRecomputeUs = 0;
};

struct PlanSummary {
  std::vector<RankSummary> ranks;
  /// The planned programs as cells and their simulation (Timeline.h), which
  /// the trace and the SVG draw.
  ModuleSchedule timeline;
  ::hpr::sched::SimulationResult simulation;
  RankSummary total() const;
};

/// Counts, memory and a simulation of the planned module.
llvm::Expected<PlanSummary> summarizePlan(ModuleOp module);

/// The options a plan was made with, recorded as the plan JSON's `planner`.
struct PlannerOptions {
  std::string prefetch;                ///< jit, lookahead=K or bubble
  std::string checkpoint;              ///< all, model, none or auto
  std::optional<int64_t> memoryBudget; ///< bytes; none when not given
  std::string tool = "hp-recompute-plan";
};

/// Writes the plan JSON, version 2, to `os`, with `planner` as its
/// `planner` member. Actions and sessions are streamed one per line.
void writePlanJson(ModuleOp module, const PlanSummary &summary,
                   const PlannerOptions &planner, llvm::raw_ostream &os);

/// Writes the summary's simulated timeline as a Chrome trace (trace event
/// JSON: one thread per rank, one complete event per action, times in
/// microseconds), for chrome://tracing or Perfetto.
void writeTraceJson(const PlanSummary &summary, llvm::raw_ostream &os);

/// A fixed-width table, one row per rank plus a total.
void printSummaryTable(const PlanSummary &summary, llvm::raw_ostream &os);

} // namespace mlir::hpr

#endif // HPR_PLAN_PLANEXPORT_H
