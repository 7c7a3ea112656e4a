//===- Schedule.cpp - Schedule data model and shared helpers --------------===//
//
// Kind predicates, action equality and shape inference.
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/Schedule.h"
#include "hpr/Schedule/ScheduleUtils.h"

#include <algorithm>

namespace mlir::hpr::sched {

bool isCompute(ActionKind kind) {
  return kind == ActionKind::Forward || kind == ActionKind::BackwardInput ||
         kind == ActionKind::BackwardWeight || kind == ActionKind::Backward;
}

bool isComm(ActionKind kind) {
  return kind == ActionKind::SendF || kind == ActionKind::RecvF ||
         kind == ActionKind::SendB || kind == ActionKind::RecvB;
}

bool hasNoMicrobatch(ActionKind kind) {
  return kind == ActionKind::Unshard || kind == ActionKind::Reshard ||
         kind == ActionKind::ReduceGrad;
}

bool Action::operator==(const Action &other) const {
  return kind == other.kind && stage == other.stage &&
         microbatch == other.microbatch && parts == other.parts &&
         durationUs == other.durationUs;
}

Action makeAction(ActionKind kind, int stage, int microbatch) {
  Action action;
  action.kind = kind;
  action.stage = stage;
  action.microbatch = hasNoMicrobatch(kind) ? -1 : microbatch;
  return action;
}

void inferScheduleShape(Schedule &schedule) {
  int maxStage = -1, maxMb = -1;
  for (const auto &program : schedule.ranks)
    for (const Action &action : program)
      forEachPrimitive(action, [&](const Action &part) {
        maxStage = std::max(maxStage, part.stage);
        maxMb = std::max(maxMb, part.microbatch);
      });
  schedule.numRanks = static_cast<int>(schedule.ranks.size());
  schedule.numStages = maxStage + 1;
  schedule.numMicrobatches = maxMb + 1;
  schedule.stageToRank.assign(schedule.numStages, -1);
  for (int r = 0; r < schedule.numRanks; ++r)
    for (const Action &action : schedule.ranks[r])
      forEachPrimitive(action, [&](const Action &part) {
        if (part.stage >= 0 && schedule.stageToRank[part.stage] < 0)
          schedule.stageToRank[part.stage] = r;
      });
}

llvm::StringRef kindJsonName(ActionKind kind) {
  switch (kind) {
  case ActionKind::Idle:
    return "idle";
  case ActionKind::Forward:
    return "forward";
  case ActionKind::BackwardInput:
    return "backward_input";
  case ActionKind::BackwardWeight:
    return "backward_weight";
  case ActionKind::Backward:
    return "backward";
  case ActionKind::SendF:
    return "send_f";
  case ActionKind::RecvF:
    return "recv_f";
  case ActionKind::SendB:
    return "send_b";
  case ActionKind::RecvB:
    return "recv_b";
  case ActionKind::Unshard:
    return "unshard";
  case ActionKind::Reshard:
    return "reshard";
  case ActionKind::ReduceGrad:
    return "reduce_grad";
  case ActionKind::Recompute:
    return "recompute";
  case ActionKind::Clear:
    return "clear";
  case ActionKind::OverlapFB:
    return "overlap_f_b";
  case ActionKind::BatchedComm:
    return "batched_comm";
  }
  return "idle";
}

std::optional<ActionKind> kindFromJsonName(llvm::StringRef name) {
  for (ActionKind kind :
       {ActionKind::Idle, ActionKind::Forward, ActionKind::BackwardInput,
        ActionKind::BackwardWeight, ActionKind::Backward, ActionKind::SendF,
        ActionKind::RecvF, ActionKind::SendB, ActionKind::RecvB,
        ActionKind::Unshard, ActionKind::Reshard, ActionKind::ReduceGrad,
        ActionKind::Recompute, ActionKind::Clear, ActionKind::OverlapFB,
        ActionKind::BatchedComm})
    if (kindJsonName(kind) == name)
      return kind;
  return std::nullopt;
}

int neighbourStage(const Action &transfer) {
  bool towardsNext =
      transfer.kind == ActionKind::SendF || transfer.kind == ActionKind::RecvB;
  return transfer.stage + (towardsNext ? 1 : -1);
}

llvm::SmallVector<int64_t> computeOrderRecord(llvm::ArrayRef<Action> program) {
  llvm::SmallVector<int64_t> order;
  for (const Action &action : program)
    forEachPrimitive(action, [&](const Action &part) {
      int64_t kind = part.kind == ActionKind::Forward          ? 0
                     : part.kind == ActionKind::BackwardInput  ? 1
                     : part.kind == ActionKind::BackwardWeight ? 2
                     : part.kind == ActionKind::Backward       ? 3
                                                               : -1;
      if (kind >= 0)
        order.append({kind, part.stage, part.microbatch});
    });
  return order;
}

} // namespace mlir::hpr::sched
