//===- Diagnostics.h - Diagnostics at schedule cells and plan paths -*- C++
//-*-===//
//
// The importers locate every op at the place a user can find it: a schedule
// cell (`FILE:RANK+1:CELL+1`) or a plan action's JSON path (a NameLoc
// `/ranks/R/actions/K` around that). One printer renders both, for the CLI
// and for the Python bindings alike.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_TARGET_DIAGNOSTICS_H
#define HPR_TARGET_DIAGNOSTICS_H

#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::hpr {

/// Prints `diag` and its notes, one line each: `FILE:ROW:COL: error: ...` at
/// a schedule cell, `FILE: /ranks/R/actions/K: error: ...` at a plan action,
/// `TOOL: error: ...` for the schedule as a whole (row 0) and elsewhere.
void printDiagnostic(Diagnostic &diag, llvm::raw_ostream &os,
                     llvm::StringRef tool);

} // namespace mlir::hpr

#endif // HPR_TARGET_DIAGNOSTICS_H
