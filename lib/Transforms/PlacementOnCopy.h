//===- PlacementOnCopy.h - Pricing a contender as it is placed -*- C++ -*-===//
//
// hpr-select-checkpoints and hpr-bound-weight-deferral price a contender by
// the step the pipeline's bubble placement gives it: each plans a copy of
// the module with these passes and simulates it.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_LIB_TRANSFORMS_PLACEMENTONCOPY_H
#define HPR_LIB_TRANSFORMS_PLACEMENTONCOPY_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <optional>

namespace mlir::hpr {

/// Adds the planning passes with bubble placement within `budget` (sessions,
/// jit, hpr-prefetch-into-bubbles, clears), without the schedule checks and
/// the runtime lowering: the copy they plan is only simulated.
void buildPlacementOnCopyPasses(OpPassManager &pm, int64_t budget);

/// The simulated step of `copy` once those passes planned it: none where a
/// rank's activation peak exceeds `budget`; an error where its schedule does
/// not simulate.
llvm::Expected<std::optional<double>> simulatePlacedCopy(ModuleOp copy,
                                                         int64_t budget);

} // namespace mlir::hpr

#endif // HPR_LIB_TRANSFORMS_PLACEMENTONCOPY_H
