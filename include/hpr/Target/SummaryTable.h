//===- SummaryTable.h - The plan summary as a table -------------*- C++ -*-===//
//
// `hp-recompute-plan --summary`: one fixed-width row per rank plus a total,
// then the simulated step time and bubble fraction (docs/cli.md).
//
//===----------------------------------------------------------------------===//

#ifndef HPR_TARGET_SUMMARYTABLE_H
#define HPR_TARGET_SUMMARYTABLE_H

#include "hpr/Target/PlanJson.h"
#include "hpr/Target/PlanSummary.h"

#include "llvm/Support/raw_ostream.h"

namespace mlir::hpr {

void printSummaryTable(const PlanSummary &summary, llvm::raw_ostream &os);

/// `--schedule-gen auto`: one row per schedule planned, its simulated step
/// and its largest rank peak, or why it has none; then the one chosen.
void printScheduleCandidates(llvm::ArrayRef<ScheduleCandidate> candidates,
                             llvm::StringRef chosen, llvm::raw_ostream &os);

} // namespace mlir::hpr

#endif // HPR_TARGET_SUMMARYTABLE_H
