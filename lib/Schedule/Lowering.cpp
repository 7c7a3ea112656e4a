//===- Lowering.cpp - Add send/recv and REDUCE_GRAD to schedules ----------===//
//
// Each rank's program is rewritten in one pass: receives are placed right
// before the compute that consumes them and sends right after the compute
// that produces them. Sends never block, so the lowered schedule is
// deadlock-free exactly when the compute-only one is. REDUCE_GRAD waits for
// nothing on another rank, so adding it keeps that property too.
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/Lowering.h"
#include "hpr/Schedule/ScheduleUtils.h"

#include <map>
#include <optional>
#include <set>

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
  // The transfer a primitive receives before it runs, and the one it sends
  // after it, if any.
  auto receiveOf = [&](const Action &p) -> std::optional<ActionKind> {
    if (p.kind == ActionKind::Forward && remote(p.stage, p.stage - 1))
      return ActionKind::RecvF;
    if ((p.kind == ActionKind::BackwardInput ||
         p.kind == ActionKind::Backward) &&
        remote(p.stage, p.stage + 1))
      return ActionKind::RecvB;
    return std::nullopt;
  };
  auto sendOf = [&](const Action &p) -> std::optional<ActionKind> {
    if (p.kind == ActionKind::Forward && remote(p.stage, p.stage + 1))
      return ActionKind::SendF;
    if ((p.kind == ActionKind::BackwardInput ||
         p.kind == ActionKind::Backward) &&
        remote(p.stage, p.stage - 1))
      return ActionKind::SendB;
    return std::nullopt;
  };
  for (auto &program : schedule.ranks) {
    // Reserved exactly: a program may hold a million actions, and
    // a vector grown by doubling would keep up to as many again unused.
    size_t size = program.size();
    for (const Action &action : program)
      forEachPrimitive(action, [&](const Action &p) {
        size += receiveOf(p).has_value() + sendOf(p).has_value();
      });
    std::vector<Action> lowered;
    lowered.reserve(size);
    for (Action &action : program) {
      // Transfers take the cell of the compute action they serve.
      auto transfer = [&action](ActionKind kind, const Action &p) {
        Action comm = makeAction(kind, p.stage, p.microbatch);
        comm.sourceCell = action.sourceCell;
        return comm;
      };
      forEachPrimitive(action, [&](const Action &p) {
        if (std::optional<ActionKind> kind = receiveOf(p))
          lowered.push_back(transfer(*kind, p));
      });
      std::vector<Action> sends;
      forEachPrimitive(action, [&](const Action &p) {
        if (std::optional<ActionKind> kind = sendOf(p))
          sends.push_back(transfer(*kind, p));
      });
      lowered.push_back(std::move(action));
      for (Action &send : sends)
        lowered.push_back(std::move(send));
    }
    program = std::move(lowered);
  }
}

void lowerReduceGrad(Schedule &schedule) {
  for (auto &program : schedule.ranks) {
    // The last action holding a W or B of each stage, and the stages that
    // already have their REDUCE_GRAD.
    std::map<int, size_t> lastGradient;
    std::set<int> reduced;
    for (size_t index = 0; index < program.size(); ++index)
      forEachPrimitive(program[index], [&](const Action &p) {
        if (p.kind == ActionKind::BackwardWeight ||
            p.kind == ActionKind::Backward)
          lastGradient[p.stage] = index;
        else if (p.kind == ActionKind::ReduceGrad)
          reduced.insert(p.stage);
      });
    // torch lowers REDUCE_GRAD before the transfers, so the sends of the
    // last W or B come first.
    auto isSend = [](const Action &a) {
      return a.kind == ActionKind::SendF || a.kind == ActionKind::SendB;
    };
    std::multimap<size_t, int> reduceAfter; // action index -> stage
    for (auto [stage, index] : lastGradient) {
      if (reduced.count(stage))
        continue;
      while (index + 1 < program.size() && isSend(program[index + 1]))
        ++index;
      reduceAfter.insert({index, stage});
    }
    if (reduceAfter.empty())
      continue;
    std::vector<Action> lowered;
    lowered.reserve(program.size() + reduceAfter.size());
    for (size_t index = 0; index < program.size(); ++index) {
      int cell = program[index].sourceCell;
      lowered.push_back(std::move(program[index]));
      auto [begin, end] = reduceAfter.equal_range(index);
      for (auto it = begin; it != end; ++it) {
        Action reduce = makeAction(ActionKind::ReduceGrad, it->second, -1);
        reduce.sourceCell = cell;
        lowered.push_back(std::move(reduce));
      }
    }
    program = std::move(lowered);
  }
}

} // namespace mlir::hpr::sched
