//===- TraceJson.cpp - The simulated step as a Chrome trace --------------===//

#include "hpr/Target/TraceJson.h"

#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Support/Json.h"

#include <string>

using namespace mlir;
using namespace mlir::hpr;
using ordered_json = nlohmann::ordered_json;

void mlir::hpr::writeTraceJson(const PlanSummary &summary,
                               llvm::raw_ostream &os) {
  const sched::Schedule &schedule = summary.timeline.schedule;
  // Chrome's trace event format: one complete ("X") event per action, one
  // thread per rank; chrome://tracing and Perfetto open it.
  os << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [";
  bool first = true;
  for (auto [rank, program] : llvm::enumerate(schedule.ranks)) {
    os << (first ? "\n" : ",\n")
       << dumpJson(ordered_json{
              {"name", "thread_name"},
              {"ph", "M"},
              {"pid", 0},
              {"tid", rank},
              {"args", {{"name", "rank " + std::to_string(rank)}}}});
    first = false;
    for (auto [index, action] : llvm::enumerate(program)) {
      const sched::ActionTiming &timing =
          summary.simulation.timelines[rank][index];
      if (action.kind == sched::ActionKind::Idle || timing.end <= timing.start)
        continue;
      os << ",\n"
         << dumpJson(ordered_json{{"name", sched::formatAction(action)},
                                  {"ph", "X"},
                                  {"pid", 0},
                                  {"tid", rank},
                                  {"ts", timing.start},
                                  {"dur", timing.end - timing.start}});
    }
  }
  os << "\n]}\n";
}
