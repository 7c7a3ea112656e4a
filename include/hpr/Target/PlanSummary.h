//===- PlanSummary.h - What a planned module does and costs -----*- C++ -*-===//
//
// Counts, memory and the simulated step of a planned module, per rank: what
// the plan JSON's `summary`, the summary table, the trace and the SVG report.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_TARGET_PLANSUMMARY_H
#define HPR_TARGET_PLANSUMMARY_H

#include "hpr/Analysis/Timeline.h"
#include "hpr/Schedule/Simulate.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <vector>

namespace mlir::hpr {

/// What one rank's program does and costs.
struct RankSummary {
  int64_t actions = 0;
  int64_t sessions = 0;
  /// Replays the plan runs: one per session (a replay in pieces counts
  /// once), and one more per session replayed again for its dw.
  int64_t recomputes = 0;
  /// Of those, the replays for a dw (hpr.recompute {for_weight}).
  int64_t weightReplays = 0;
  int64_t clears = 0;
  /// Recomputes that per-backward checkpointing would run: one per backward
  /// call reading a session (2 for a dx/dw-split session, 1 for B).
  int64_t perBackwardRecomputes = 0;
  /// Most sessions recomputed and not yet cleared at one time.
  int64_t maxLiveSessions = 0;
  /// Peak activation bytes under the cost model (see ActivationModel.h).
  int64_t peakBytes = 0;
  /// Peak of everything the step allocates under the cost model
  /// (StepMemory.h: what the runner measures at the allocator).
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
  sched::SimulationResult simulation;

  RankSummary total() const;
};

/// Counts, memory and a simulation of the planned module.
llvm::Expected<PlanSummary> summarizePlan(ModuleOp module);

} // namespace mlir::hpr

#endif // HPR_TARGET_PLANSUMMARY_H
