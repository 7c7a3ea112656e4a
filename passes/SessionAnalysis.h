//===- SessionAnalysis.h - Queries shared by the planning passes -*- C++
//-*-===//
//
// Read-only questions about programs and sessions that several passes ask:
// which stages are checkpointed, who consumes a session, where an overlapped
// pair starts and ends. hpr-verify uses none of them: it checks these passes.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_PASSES_SESSIONANALYSIS_H
#define HPR_PASSES_SESSIONANALYSIS_H

#include "hpr/Dialect/HPR/HPROps.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/SmallVector.h"

#include <string>

namespace mlir::hpr {

/// The stages that have at least one region marked `checkpoint`, or failure
/// (with a diagnostic on `module`) when the module has no single hpr.model.
FailureOr<llvm::DenseSet<int64_t>> getCheckpointedStages(ModuleOp module);

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

#endif // HPR_PASSES_SESSIONANALYSIS_H
