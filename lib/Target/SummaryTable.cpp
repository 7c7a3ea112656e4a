//===- SummaryTable.cpp - The plan summary as a table --------------------===//

#include "hpr/Target/SummaryTable.h"

#include "llvm/Support/Format.h"

#include <algorithm>
#include <string>

using namespace mlir;
using namespace mlir::hpr;

void mlir::hpr::printSummaryTable(const PlanSummary &summary,
                                  llvm::raw_ostream &os) {
  auto row = [&os](llvm::StringRef label, const RankSummary &rank) {
    os << llvm::format(
        "%-6s %8lld %8lld %10lld %12lld %9lld %14lld %12.1f %12.1f\n",
        label.str().c_str(), (long long)rank.actions, (long long)rank.sessions,
        (long long)rank.recomputes, (long long)rank.perBackwardRecomputes,
        (long long)rank.maxLiveSessions, (long long)rank.peakBytes,
        rank.hiddenRecomputeUs, rank.exposedRecomputeUs);
  };
  os << "rank    actions sessions recomputes per-backward  max-live     "
        "peak-bytes    hidden-us   exposed-us\n";
  for (auto [index, rank] : llvm::enumerate(summary.ranks))
    row(std::to_string(index), rank);
  row("total", summary.total());
  os << llvm::format("step time %.1f us, bubble fraction %.3f\n",
                     summary.simulation.makespan,
                     summary.simulation.bubbleFraction);
}

void mlir::hpr::printScheduleCandidates(
    llvm::ArrayRef<ScheduleCandidate> candidates, llvm::StringRef chosen,
    llvm::raw_ostream &os) {
  os << "schedule              step-us     peak-bytes\n";
  for (const ScheduleCandidate &candidate : candidates) {
    if (!candidate.stepUs) {
      // The refusal's first line: the rest is notes.
      os << llvm::format("%-18s %10s  ", candidate.schedule.c_str(),
                         static_cast<const char *>("-"))
         << "refused: " << llvm::StringRef(candidate.refusal).split('\n').first
         << "\n";
      continue;
    }
    int64_t peak = 0;
    for (int64_t bytes : candidate.peakBytes)
      peak = std::max(peak, bytes);
    os << llvm::format("%-18s %10.1f %14lld\n", candidate.schedule.c_str(),
                       *candidate.stepUs, (long long)peak);
  }
  os << "chosen: " << chosen << " (the shortest simulated step)\n";
}
