//===- Simulate.h - Unit-time pipeline schedule simulator -------*- C++ -*-===//
//
// Runs every rank's program in order against the data dependencies of a
// pipeline and reports when each action starts and ends, the step time
// (makespan) and the bubble fraction; a schedule whose programs cannot all
// finish is reported as a deadlock together with the cycle of waiting ranks.
//
// Model (see docs/schedules.md, "Simulator"):
//  - A rank runs its actions strictly in program order, one at a time.
//  - An action starts when the rank is free and all its dependencies have
//    ended: F(s,m) needs F(s-1,m); I(s,m) and B(s,m) need F(s,m) and the dx
//    (I or B) of (s+1,m); W(s,m) needs I(s,m); RECV_F(s,m) needs
//    SEND_F(s-1,m); RECV_B(s,m) needs SEND_B(s+1,m); SEND_F(s,m) needs
//    F(s,m); SEND_B(s,m) needs the dx of (s,m); RECOMPUTE(s,m) needs F(s,m).
//  - Sends never block (they are buffered), receives block until the send.
//  - An UNSHARD is issued and its all-gather runs beside the rank's compute,
//    as torch's runtime issues it (async_op=True), after the rank's earlier
//    gathers: the rank goes on at once, and its next forward, backward or
//    recompute of that stage starts no earlier than the gather's end (the
//    UNSHARD's timing ends there).
//  - Idle cells take no time (they are no-ops, as in PyTorch's runtime).
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SCHEDULE_SIMULATE_H
#define HPR_SCHEDULE_SIMULATE_H

#include "hpr/Schedule/Schedule.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <utility>
#include <vector>

namespace mlir::hpr::sched {

/// Durations, in arbitrary units (microseconds when the schedule carries
/// durations), of each action kind. Defaults are the zero-bubble paper's unit
/// model: F = I = W = 1, so a full backward B = I + W = 2.
struct SimulationCosts {
  double forward = 1.0;
  double backwardInput = 1.0;
  double backwardWeight = 1.0;
  double backward = 2.0;
  double recompute = 1.0;
  /// SEND/RECV, also a legacy batched comm.
  double comm = 0.0;
  /// UNSHARD, RESHARD, REDUCE_GRAD, CLEAR.
  double other = 0.0;
  /// Use Action::durationUs where an action has one. A composite without its
  /// own duration lasts the sum of its parts.
  bool useActionDurations = true;
};

/// When one action could start, started and ended.
struct ActionTiming {
  /// The latest end of its dependencies (0 with none): start - ready is the
  /// time the rank was still busy with earlier actions, ready - (end of the
  /// previous action) the time it waited.
  double ready = 0.0;
  double start = 0.0;
  double end = 0.0;
  /// How much later it could end without delaying the step (the critical
  /// path method on the simulated order: each action's latest end is the
  /// step time or the earliest latest start of what waits on it, the next
  /// action of its rank included). 0 on a critical path.
  double slack = 0.0;
};

/// Slack up to which an action counts as on a critical path: a nanosecond,
/// far below any duration and far above the rounding of the simulator's sums.
constexpr double kCriticalSlackUs = 1e-3;

/// What a simulation found.
struct SimulationResult {
  /// timelines[r][k] is rank r's action k (parallel to Schedule::ranks).
  std::vector<std::vector<ActionTiming>> timelines;
  /// Total duration of the actions of each rank.
  std::vector<double> busy;
  /// Step time: the latest end over all actions.
  double makespan = 0.0;
  /// Sum of busy over all ranks.
  double totalBusy = 0.0;
  /// Idle time relative to the ideal compute time:
  ///   (numRanks * makespan - totalBusy) / totalBusy,
  /// i.e. (makespan - ideal) / ideal with ideal = totalBusy / numRanks, the
  /// step time of a perfectly balanced pipeline without bubbles. For 1F1B with
  /// F = I = W = 1 this is (p-1)/m. 0 when totalBusy is 0.
  double bubbleFraction = 0.0;
};

/// Duration of one action under `costs`.
double actionDuration(const Action &action, const SimulationCosts &costs);

/// The error simulateSchedule fails with on a deadlock: the waiting cycle,
/// each member as (rank, action index) in the order the message names them.
class DeadlockError : public llvm::ErrorInfo<DeadlockError> {
public:
  static char ID;
  DeadlockError(std::string message, std::vector<std::pair<int, int>> cycle)
      : message(std::move(message)), cycle(std::move(cycle)) {}
  void log(llvm::raw_ostream &os) const override { os << message; }
  std::error_code convertToErrorCode() const override {
    return llvm::inconvertibleErrorCode();
  }
  /// `FILE: deadlock: rank R, action K (TEXT) waits for ...; ...`.
  std::string message;
  std::vector<std::pair<int, int>> cycle;
};

/// Simulates `schedule`. Fails with a DeadlockError, `FILE: deadlock: ...`
/// naming every rank in the waiting cycle, its stuck action (rank, 0-based
/// action index and text) and the action it waits for; or with `FILE: rank R,
/// action K (TEXT): needs X, which no rank runs` when a dependency is missing
/// altogether. Stage and microbatch numbers must be within numStages /
/// numMicrobatches. An empty `fileName` leaves out the `FILE: ` prefix.
llvm::Expected<SimulationResult>
simulateSchedule(const Schedule &schedule, const SimulationCosts &costs = {},
                 llvm::StringRef fileName = "<schedule>");

} // namespace mlir::hpr::sched

#endif // HPR_SCHEDULE_SIMULATE_H
