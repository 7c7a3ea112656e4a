//===- VerifyComm.cpp - The schedule rules, checked on the IR -------------===//
//
// Reads each rank's program back from the IR as a schedule (the timeline
// extraction every exporter uses) and applies the schedule validator to it,
// so that IR from any driver gets the checks a schedule file gets. Each
// violation is reported at the op of the action it names.
//
//===----------------------------------------------------------------------===//

#include "hpr/Analysis/Timeline.h"
#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Schedule/Validate.h"
#include "hpr/Transforms/Passes.h"

namespace mlir::hpr {
#define GEN_PASS_DEF_HPRVERIFYCOMM
#include "hpr/Transforms/Passes.h.inc"
} // namespace mlir::hpr

using namespace mlir;
using namespace mlir::hpr;

namespace {
struct VerifyCommPass
    : public mlir::hpr::impl::HPRVerifyCommBase<VerifyCommPass> {
  using HPRVerifyCommBase::HPRVerifyCommBase;
  void runOnOperation() override;
};
} // namespace

void VerifyCommPass::runOnOperation() {
  ModuleOp module = getOperation();
  ScheduleOp scheduleOp = getSchedule(module);
  ModelOp model = getModel(module);
  if (!scheduleOp || !model) {
    module.emitError("expected an hpr.model and an hpr.schedule");
    return signalPassFailure();
  }
  // Every stage the schedule runs needs its costs and checkpoint marks.
  auto numModelStages = llvm::range_size(model.getBody().getOps<StageOp>());
  if (numModelStages != scheduleOp.getNumStages()) {
    scheduleOp.emitError() << "the schedule has " << scheduleOp.getNumStages()
                           << " stages and hpr.model \"" << model.getName()
                           << "\" has " << numModelStages
                           << "; they must agree";
    return signalPassFailure();
  }
  // A rank the schedule has runs something: an empty program is a lost or
  // misnumbered rank (the rules below look at actions, so they cannot see it).
  bool empty = false;
  for (ProgramOp program : scheduleOp.getBody().getOps<ProgramOp>()) {
    if (!program.getBody().empty() && !program.getBody().front().empty())
      continue;
    llvm::SmallVector<int64_t> stages;
    for (auto [stage, rank] : llvm::enumerate(scheduleOp.getStageToRank()))
      if (rank == static_cast<int64_t>(program.getRank()))
        stages.push_back(stage);
    InFlightDiagnostic diag = program.emitError()
                              << "rank " << program.getRank()
                              << " has no actions; ";
    if (stages.empty())
      diag << "stage_to_rank gives it no stage: use fewer ranks";
    else {
      diag << "it runs stage" << (stages.size() > 1 ? "s " : " ");
      llvm::interleaveComma(stages, diag);
      diag << ", whose actions must be in it";
    }
    empty = true;
  }
  if (empty)
    return signalPassFailure();
  ModuleSchedule extracted = extractSchedule(module);
  auto opAt = [&](int rank, int index) -> Operation * {
    if (rank < 0 || static_cast<size_t>(rank) >= extracted.cellOps.size())
      return scheduleOp;
    const auto &cells = extracted.cellOps[rank];
    return index >= 0 && static_cast<size_t>(index) < cells.size()
               ? cells[index]
               : scheduleOp.getOperation();
  };
  sched::ValidateOptions options;
  options.finishedPlan = finishedPlan;
  sched::Violations found = sched::findViolations(extracted.schedule, options);
  for (const sched::Violation &violation : found.list) {
    InFlightDiagnostic diag =
        opAt(violation.rank, violation.index)->emitError(violation.message);
    for (auto [rank, index] : violation.related)
      diag.attachNote(opAt(rank, index)->getLoc())
          << "rank " << rank << " waits here";
  }
  if (found.dropped)
    scheduleOp.emitError() << "... and " << found.dropped << " more violations";
  if (!found.list.empty())
    return signalPassFailure();
  markAllAnalysesPreserved();
}
