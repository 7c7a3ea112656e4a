//===- BuildModule.h - Schedule + model -> hpr IR ---------------*- C++ -*-===//
//
// The importer: turns an in-memory schedule (already lowered, with its
// send/recv) and a staged model into an hpr module that the planning passes
// run on. It knows the formats' data model, not the passes.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_PLAN_BUILDMODULE_H
#define HPR_PLAN_BUILDMODULE_H

#include "hpr/Model/Model.h"
#include "hpr/Schedule/Schedule.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/Error.h"

namespace mlir::hpr {

/// Builds `module { hpr.model ...; hpr.schedule ... }`. Each action gets the
/// location `FILE:RANK+1:CELL+1`, so diagnostics of later passes point at the
/// schedule cell. Each program records its compute order digest. Fails when
/// the model's stage count differs from the schedule's or the schedule
/// already holds planner actions (RECOMPUTE, CLEAR).
llvm::Expected<OwningOpRef<ModuleOp>>
buildPlanModule(MLIRContext &context, const model::StagedModel &model,
                const sched::Schedule &schedule, llvm::StringRef scheduleFile);

/// A model whose every stage has one checkpointed region of unit cost: what
/// the planner assumes when only a schedule is given.
model::StagedModel makeUniformModel(int numStages);

} // namespace mlir::hpr

#endif // HPR_PLAN_BUILDMODULE_H
