//===- TraceJson.h - The simulated step as a Chrome trace -------*- C++ -*-===//

#ifndef HPR_TARGET_TRACEJSON_H
#define HPR_TARGET_TRACEJSON_H

#include "hpr/Target/PlanSummary.h"

#include "llvm/Support/raw_ostream.h"

namespace mlir::hpr {

/// Writes the summary's simulated timeline as a Chrome trace (trace event
/// JSON: one thread per rank, one complete event per action, times in
/// microseconds), for chrome://tracing or Perfetto.
void writeTraceJson(const PlanSummary &summary, llvm::raw_ostream &os);

} // namespace mlir::hpr

#endif // HPR_TARGET_TRACEJSON_H
