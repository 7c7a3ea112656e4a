//===- PlacementOnCopy.h - Pricing a contender as it is placed -*- C++ -*-===//
//
// hpr-select-checkpoints and hpr-bound-weight-deferral price a contender by
// the step the pipeline's bubble placement gives it: each plans a copy of
// the module with these passes and simulates it.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_LIB_TRANSFORMS_PLACEMENTONCOPY_H
#define HPR_LIB_TRANSFORMS_PLACEMENTONCOPY_H

#include "mlir/Pass/PassManager.h"

#include <cstdint>

namespace mlir::hpr {

/// Adds the planning passes with bubble placement within `budget` (sessions,
/// jit, hpr-prefetch-into-bubbles, clears), without the schedule checks and
/// the runtime lowering: the copy they plan is only simulated.
void buildPlacementOnCopyPasses(OpPassManager &pm, int64_t budget);

} // namespace mlir::hpr

#endif // HPR_LIB_TRANSFORMS_PLACEMENTONCOPY_H
