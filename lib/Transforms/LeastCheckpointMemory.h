//===- LeastCheckpointMemory.h - The least memory of a choice --*- C++ -*-===//
//
// The least activation memory hpr-select-checkpoints finds for a module, so
// that hpr-bound-weight-deferral, which runs before it, changes the schedule
// only where no checkpoint choice would fit the budget.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_LIB_TRANSFORMS_LEASTCHECKPOINTMEMORY_H
#define HPR_LIB_TRANSFORMS_LEASTCHECKPOINTMEMORY_H

#include "mlir/IR/BuiltinOps.h"

#include <cstdint>
#include <vector>

namespace mlir::hpr {

/// Each rank's activation peak under the least-memory choice
/// hpr-select-checkpoints starts its search from: every candidate region
/// checkpointed, then microbatches made plain where that lowers the rank's
/// peak (Passes.td, hpr-select-checkpoints step 2).
std::vector<int64_t> leastCheckpointPeaks(ModuleOp module);

} // namespace mlir::hpr

#endif // HPR_LIB_TRANSFORMS_LEASTCHECKPOINTMEMORY_H
