//===- HPROps.h - hpr dialect operations ------------------------*- C++ -*-===//

#ifndef HPR_DIALECT_HPR_HPROPS_H
#define HPR_DIALECT_HPR_HPROPS_H

#include "hpr/Dialect/HPR/HPRDialect.h"
#include "hpr/Dialect/HPR/HPRTypes.h"
#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include <optional>
#include <string>

#include "hpr/Dialect/HPR/HPRInterfaces.h.inc"

namespace mlir::hpr {
/// The id of the session of (stage, microbatch): `s{stage}.mb{microbatch}`.
std::string getSessionId(int64_t stage, int64_t microbatch);
/// True for a forward or backward action marked `overlap` (half of an
/// OVERLAP_F_B pair).
bool isOverlapped(Operation *op);
/// True for a transfer marked `batched` (issued with the next transfer).
bool isBatched(Operation *op);
/// The members hpr-lower-runtime writes for the runtimes, read off whichever
/// op declares them (HPROps.td); none (false) on the others: `waits` (a
/// forward, backward_input or backward), `hands_to` (the same),
/// `last_backward` (a backward_weight or backward), `frees_graph` (a
/// backward_input, backward_weight or backward).
std::optional<ArrayRef<int64_t>> getWaits(Operation *op);
std::optional<int64_t> getHandsTo(Operation *op);
bool isLastBackward(Operation *op);
bool freesGraph(Operation *op);
/// "rank 1, action 7 (backward_weight stage 3 mb 0)": where an action stands
/// in its program, counting actions as the plan JSON lists them. How every
/// pass names an op in a diagnostic.
std::string describeAction(Operation *op);
} // namespace mlir::hpr

#define GET_OP_CLASSES
#include "hpr/Dialect/HPR/HPROps.h.inc"

namespace mlir::hpr {
/// The module's hpr.model and hpr.schedule (the first of each), or null when
/// there is none. A planned module has exactly one of each: the importer
/// builds it so, and hpr-verify-comm refuses IR from elsewhere without them.
ModelOp getModel(ModuleOp module);
ScheduleOp getSchedule(ModuleOp module);
} // namespace mlir::hpr

#endif // HPR_DIALECT_HPR_HPROPS_H
