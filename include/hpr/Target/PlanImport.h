//===- PlanImport.h - Plan JSON -> hpr IR, for the admission check -*- C++
//-*-===//
//
// Reads a finished plan (plan JSON version 2, docs/plan-format.md) back into
// an hpr module, so that every runtime admits a plan through the verifier
// the planner itself runs (mlir::hpr::verifyPlan): one set of rules, checked
// on the IR, whoever wrote the file.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_TARGET_PLANIMPORT_H
#define HPR_TARGET_PLANIMPORT_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "llvm/Support/Error.h"

namespace mlir::hpr {

/// Builds the module a plan JSON describes: its model, its schedule, and per
/// rank the actions in order with their sessions bound (hpr.session after the
/// forward it replays), recompute and clear, `retain_on_unpack`, plain
/// forwards and message tags. Each op is located at its action's JSON path
/// (`FILE: /ranks/R/actions/K`). Refuses, with that path, what the IR cannot
/// hold: malformed fields, a session named before its forward has run on
/// the rank, and a peer other than the neighbouring stage's rank. Everything
/// else (the contract of docs/runner.md) is verifyImportedPlan's.
llvm::Expected<OwningOpRef<ModuleOp>> importPlanJson(MLIRContext &context,
                                                     llvm::StringRef text,
                                                     llvm::StringRef fileName);

/// The admission check of an imported plan: verifyPlan, then (on a plan it
/// admits) that the members hpr-lower-runtime writes into a planned module
/// (`frees_graph`, `last_backward`, `waits`, `hands_to`), which the importer
/// set from the file, are what its rules (hpr/Analysis/RuntimeLowering.h)
/// give.
LogicalResult verifyImportedPlan(ModuleOp module);

} // namespace mlir::hpr

#endif // HPR_TARGET_PLANIMPORT_H
