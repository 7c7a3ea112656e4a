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
#include <optional>

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

namespace mlir::hpr::sched {

/// Largest stage number the readers accept (keeps shape tables small).
constexpr int kMaxStage = 65535;
/// Largest microbatch number the readers accept.
constexpr int kMaxMicrobatch = (1 << 24) - 1;
/// Largest schedule a generator writes: 3 x 10^6 compute actions (about 10^7
/// planned actions, 10x the planner's benchmark), checked before anything is
/// allocated, so a mistyped size is refused at once rather than planned for
/// minutes.
constexpr int64_t kMaxGeneratedActions = 3'000'000;
/// Most ranks a generator writes. PyTorch's generators pad every rank's
/// program with idle cells whose number grows with the rank count, so a
/// schedule's size grows with the square of it (512 ranks with one
/// microbatch: 8.5 s, 1 GB).
constexpr int kMaxGeneratedRanks = 512;

/// Makes a primitive action.
Action makeAction(ActionKind kind, int stage, int microbatch = -1);

/// Sets numRanks, numStages (max stage + 1), numMicrobatches (max microbatch
/// + 1) and stageToRank (the first row a stage appears in; -1 for stages that
/// appear nowhere) from the actions. Composite parts count.
void inferScheduleShape(Schedule &schedule);

/// The JSON `op` name of a kind (`forward`, `backward_input`, ...).
llvm::StringRef kindJsonName(ActionKind kind);
/// The kind whose JSON `op` name is `name`; none for an unknown name.
std::optional<ActionKind> kindFromJsonName(llvm::StringRef name);

/// The stage a transfer (SEND_F, RECV_F, SEND_B, RECV_B) exchanges with:
/// stage + 1 for SEND_F and RECV_B, stage - 1 for RECV_F and SEND_B. It may
/// lie outside the schedule; callers check.
int neighbourStage(const Action &transfer);

/// A program's `compute_order` record (hpr.program, HPROps.td): kind (0
/// forward, 1 dx, 2 dw, 3 full backward), stage and microbatch of each F, I,
/// W and B, composites' parts in order.
llvm::SmallVector<int64_t> computeOrderRecord(llvm::ArrayRef<Action> program);

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

} // namespace mlir::hpr::sched

#endif // HPR_SCHEDULE_SCHEDULEUTILS_H
