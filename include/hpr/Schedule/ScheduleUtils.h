//===- ScheduleUtils.h - Shape inference and action helpers -----*- C++ -*-===//
//
// Small helpers shared by the readers, the generators, the validator and the
// lowering: inferring a schedule's shape from its actions and naming kinds.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SCHEDULE_SCHEDULEUTILS_H
#define HPR_SCHEDULE_SCHEDULEUTILS_H

#include "hpr/Schedule/Schedule.h"

#include <cstdint>

#include "llvm/ADT/StringRef.h"

namespace hpr::sched {

/// Largest stage number the readers accept (keeps shape tables small).
constexpr int kMaxStage = 65535;
/// Largest microbatch number the readers accept.
constexpr int kMaxMicrobatch = (1 << 24) - 1;
/// Largest schedule a generator writes: 3 x 10^7 compute actions, about
/// 30x the planner's benchmark, before the memory of a 2-core machine runs
/// out.
constexpr int64_t kMaxGeneratedActions = 30'000'000;

/// Makes a primitive action.
Action makeAction(ActionKind kind, int stage, int microbatch = -1);

/// Sets numRanks, numStages (max stage + 1), numMicrobatches (max microbatch
/// + 1) and stageToRank (the first row a stage appears in; -1 for stages that
/// appear nowhere) from the actions. Composite parts count.
void inferScheduleShape(Schedule &schedule);

/// The JSON `op` name of a kind (`forward`, `backward_input`, ...).
llvm::StringRef kindJsonName(ActionKind kind);

/// Calls `fn(part)` for every primitive action in `action`: the action itself,
/// or each part of a composite. Idle actions are skipped.
template <typename Fn> void forEachPrimitive(const Action &action, Fn &&fn) {
  if (action.kind == ActionKind::Idle)
    return;
  if (action.kind == ActionKind::OverlapFB ||
      action.kind == ActionKind::BatchedComm) {
    for (const Action &part : action.parts)
      fn(part);
    return;
  }
  fn(action);
}

} // namespace hpr::sched

#endif // HPR_SCHEDULE_SCHEDULEUTILS_H
