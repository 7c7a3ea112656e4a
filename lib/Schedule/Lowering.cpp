//===- Lowering.cpp - Add send/recv to compute-only schedules -------------===//
//
// Each rank's program is rewritten in one pass: receives are placed right
// before the compute that consumes them and sends right after the compute
// that produces them. Sends never block, so the lowered schedule is
// deadlock-free exactly when the compute-only one is.
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/Lowering.h"
#include "hpr/Schedule/ScheduleUtils.h"

namespace mlir::hpr::sched {

bool hasCommunication(const Schedule &schedule) {
  for (const auto &program : schedule.ranks)
    for (const Action &action : program) {
      if (action.kind == ActionKind::BatchedComm || isComm(action.kind))
        return true;
      for (const Action &part : action.parts)
        if (isComm(part.kind))
          return true;
    }
  return false;
}

void lowerCommunication(Schedule &schedule) {
  if (hasCommunication(schedule))
    return;
  const std::vector<int> &owner = schedule.stageToRank;
  const int numStages = static_cast<int>(owner.size());
  auto remote = [&](int from, int to) {
    return to >= 0 && to < numStages && from >= 0 && from < numStages &&
           owner[from] != owner[to];
  };
  for (auto &program : schedule.ranks) {
    std::vector<Action> lowered;
    lowered.reserve(program.size() * 2);
    for (Action &action : program) {
      // Transfers take the cell of the compute action they serve.
      auto transfer = [&action](ActionKind kind, const Action &p) {
        Action comm = makeAction(kind, p.stage, p.microbatch);
        comm.sourceCell = action.sourceCell;
        return comm;
      };
      forEachPrimitive(action, [&](const Action &p) {
        if (p.kind == ActionKind::Forward && remote(p.stage, p.stage - 1))
          lowered.push_back(transfer(ActionKind::RecvF, p));
        else if ((p.kind == ActionKind::BackwardInput ||
                  p.kind == ActionKind::Backward) &&
                 remote(p.stage, p.stage + 1))
          lowered.push_back(transfer(ActionKind::RecvB, p));
      });
      std::vector<Action> sends;
      forEachPrimitive(action, [&](const Action &p) {
        if (p.kind == ActionKind::Forward && remote(p.stage, p.stage + 1))
          sends.push_back(transfer(ActionKind::SendF, p));
        else if ((p.kind == ActionKind::BackwardInput ||
                  p.kind == ActionKind::Backward) &&
                 remote(p.stage, p.stage - 1))
          sends.push_back(transfer(ActionKind::SendB, p));
      });
      lowered.push_back(std::move(action));
      for (Action &send : sends)
        lowered.push_back(std::move(send));
    }
    program = std::move(lowered);
  }
}

} // namespace mlir::hpr::sched
