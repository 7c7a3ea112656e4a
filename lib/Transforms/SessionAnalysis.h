//===- SessionAnalysis.h - Queries the planning passes share ---*- C++ -*-===//
//
// Read-only questions about programs and sessions that several passes ask:
// which stages are checkpointed, who consumes a session, where an overlapped
// pair starts and ends. hpr-verify uses none of them: it checks these passes.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_LIB_TRANSFORMS_SESSIONANALYSIS_H
#define HPR_LIB_TRANSFORMS_SESSIONANALYSIS_H

#include "hpr/Dialect/HPR/HPROps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"

#include <string>

namespace mlir::hpr {

/// The stages that have at least one region marked `checkpoint` in the
/// hpr.model of the module enclosing `program`, or failure (with a diagnostic
/// on `program`) when that module has no single hpr.model. A program pass may
/// read the model: no pass anchored on a program changes it.
FailureOr<llvm::DenseSet<int64_t>> getCheckpointedStages(ProgramOp program);

/// The consumers reading `session`, in program order.
llvm::SmallVector<ConsumerOpInterface> getConsumers(SessionOp session);

/// For an op in an overlapped F/B pair, the pair's first (forward) op;
/// otherwise `op` itself. Inserting before the result never splits a pair.
Operation *getPairStart(Operation *op);

/// For an op in an overlapped pair, the pair's last op; otherwise `op`.
Operation *getPairEnd(Operation *op);

/// True for forward, backward_input, backward_weight and backward.
bool isComputeAction(Operation *op);

} // namespace mlir::hpr

#endif // HPR_LIB_TRANSFORMS_SESSIONANALYSIS_H
