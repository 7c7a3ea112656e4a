//===- Timeline.h - A module's programs as a simulated schedule -*- C++ -*-===//
//
// The planner's view of time: the programs of a module (planned or not) as
// a schedule whose actions carry their durations under the cost model
// (CostModel.h), simulated with mlir::hpr::sched::simulateSchedule. The passes
// that place recompute by time, the summary, the trace and the SVG timeline
// all read this one timeline.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_ANALYSIS_TIMELINE_H
#define HPR_ANALYSIS_TIMELINE_H

#include "hpr/Analysis/ActivationModel.h"
#include "hpr/Analysis/CostModel.h"
#include "hpr/Schedule/Schedule.h"
#include "hpr/Schedule/Simulate.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/Error.h"

#include <vector>

namespace mlir::hpr {

/// A module's programs as a schedule, cell by cell. An overlapped F/B pair
/// and a batched run of transfers are one composite cell; session ops are
/// not cells.
struct ModuleSchedule {
  sched::Schedule schedule;
  /// cellOps[r][k]: the first op of rank r's cell k.
  std::vector<std::vector<Operation *>> cellOps;
};

/// How long an action of `kind` of a stage with `cost` runs; a forward
/// takes the checkpointed or the plain time as `checkpointedForward` says.
double actionDurationUs(sched::ActionKind kind, const StageCost &cost,
                        bool checkpointedForward);

/// The programs of `module` with every action's duration under `costs`.
ModuleSchedule extractSchedule(ModuleOp module,
                               const std::vector<StageCost> &costs);
/// The same under the costs of the module's own model.
ModuleSchedule extractSchedule(ModuleOp module);

/// `cells` (extractSchedule of a module whose programs have no hpr.recompute
/// yet) with a Recompute action, of its (stage, microbatch) and without a
/// duration, before the cell of each lifetime's first activation reader in
/// `programs` (collectActivationLifetimes of each rank): where jit places the
/// replay; and one more before a `weight_replay` dw, the replay for it. The
/// caller prices them (a stage's whole replay, `recomputeUs`, for either: the
/// replay for a dw runs each block's forward up to the last tensor the dw
/// reads, at most all of it); one such timeline prices any checkpoint
/// choice.
sched::Schedule withJitRecomputes(const ModuleSchedule &cells,
                                  llvm::ArrayRef<ProgramActivations> programs);

/// Simulates a schedule from extractSchedule with its actions' durations.
llvm::Expected<sched::SimulationResult>
simulateTimeline(const sched::Schedule &schedule);

/// One rank's recompute time, split by whether the rank would have waited
/// anyway.
struct RecomputeExposure {
  double hiddenUs = 0;  ///< in time the rank would otherwise sit idle
  double exposedUs = 0; ///< delaying the rank's next action
};

/// For every rank: each run of consecutive recomputes starting at t0 and
/// lasting D is hidden up to the time its rank's next action still waits
/// for its inputs after t0 (min(D, ready - t0)), exposed for the rest.
std::vector<RecomputeExposure>
measureRecomputeExposure(const sched::Schedule &schedule,
                         const sched::SimulationResult &simulation);

} // namespace mlir::hpr

#endif // HPR_ANALYSIS_TIMELINE_H
