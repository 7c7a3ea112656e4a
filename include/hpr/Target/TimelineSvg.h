//===- TimelineSvg.h - The simulated timeline as a picture ------*- C++ -*-===//
//
// `hp-recompute-plan --emit svg`: one lane per rank with its actions laid
// out in simulated time (Timeline.h), coloured by kind and labelled with
// stage and microbatch, idle time as the lane's background, and under each
// lane the rank's activation bytes over time (ActivationModel.h). Layout
// and colours are in docs/cli.md.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_TARGET_TIMELINESVG_H
#define HPR_TARGET_TIMELINESVG_H

#include "hpr/Target/PlanSummary.h"

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::hpr {

/// Writes the SVG picture of the planned module's simulated step (the
/// summary's timeline) to `os`.
void writeTimelineSvg(ModuleOp module, const PlanSummary &summary,
                      llvm::raw_ostream &os);

} // namespace mlir::hpr

#endif // HPR_TARGET_TIMELINESVG_H
