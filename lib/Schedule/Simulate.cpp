//===- Simulate.cpp - Unit-time pipeline schedule simulator ---------------===//
//
// Event-driven list scheduling: each rank advances through its program until
// an action's dependency has not ended yet; it then parks on that producer
// and is woken when the producer's rank moves past it. A run in which every
// rank is parked is a deadlock; following "waits for" from rank to rank finds
// the cycle.
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/Simulate.h"
#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Schedule/ScheduleUtils.h"

#include "ActionTable.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/Twine.h"

#include <deque>

namespace mlir::hpr::sched {

using namespace detail;

char DeadlockError::ID = 0;

double actionDuration(const Action &action, const SimulationCosts &costs) {
  if (costs.useActionDurations && action.durationUs)
    return *action.durationUs;
  switch (action.kind) {
  case ActionKind::Idle:
    return 0.0;
  case ActionKind::Forward:
    return costs.forward;
  case ActionKind::BackwardInput:
    return costs.backwardInput;
  case ActionKind::BackwardWeight:
    return costs.backwardWeight;
  case ActionKind::Backward:
    return costs.backward;
  case ActionKind::Recompute:
    return costs.recompute;
  case ActionKind::SendF:
  case ActionKind::RecvF:
  case ActionKind::SendB:
  case ActionKind::RecvB:
    return costs.comm;
  case ActionKind::BatchedComm:
    return costs.comm;
  case ActionKind::Unshard:
  case ActionKind::Reshard:
  case ActionKind::ReduceGrad:
  case ActionKind::Clear:
    return costs.other;
  case ActionKind::OverlapFB: {
    double sum = 0.0;
    for (const Action &part : action.parts)
      sum += actionDuration(part, costs);
    return sum;
  }
  }
  return 0.0;
}

namespace {

/// Whether an action of this kind reads its stage's parameters (and so waits
/// for their all-gather).
bool readsParameters(ActionKind kind) {
  switch (kind) {
  case ActionKind::Forward:
  case ActionKind::BackwardInput:
  case ActionKind::BackwardWeight:
  case ActionKind::Backward:
  case ActionKind::Recompute:
    return true;
  default:
    return false;
  }
}

/// One dependency: the slot/stage/microbatch of the producer.
struct Dep {
  int slot;
  int stage;
  int mb;
};

/// Appends the dependencies of primitive `p` (see Simulate.h).
void collectDeps(const Action &p, int numStages,
                 llvm::SmallVectorImpl<Dep> &deps) {
  int s = p.stage, mb = p.microbatch;
  switch (p.kind) {
  case ActionKind::Forward:
    if (s > 0)
      deps.push_back({SlotF, s - 1, mb});
    break;
  case ActionKind::BackwardInput:
  case ActionKind::Backward:
    deps.push_back({SlotF, s, mb});
    if (s + 1 < numStages)
      deps.push_back({SlotDx, s + 1, mb});
    break;
  case ActionKind::BackwardWeight:
    deps.push_back({SlotDx, s, mb});
    break;
  case ActionKind::RecvF:
    deps.push_back({SlotSendF, s - 1, mb});
    break;
  case ActionKind::RecvB:
    deps.push_back({SlotSendB, s + 1, mb});
    break;
  case ActionKind::SendF:
  case ActionKind::Recompute:
    deps.push_back({SlotF, s, mb});
    break;
  case ActionKind::SendB:
    deps.push_back({SlotDx, s, mb});
    break;
  default:
    break;
  }
}

std::string describeDep(const Dep &dep) {
  static const ActionKind kindOfSlot[] = {
      ActionKind::Forward,        ActionKind::BackwardInput,
      ActionKind::BackwardWeight, ActionKind::SendF,
      ActionKind::SendB,          ActionKind::RecvF,
      ActionKind::RecvB,          ActionKind::Recompute,
      ActionKind::Clear};
  if (dep.slot == SlotDx)
    return "the dx (I or B) of stage " + std::to_string(dep.stage) +
           ", microbatch " + std::to_string(dep.mb);
  return formatAction(makeAction(kindOfSlot[dep.slot], dep.stage, dep.mb));
}

} // namespace

llvm::Expected<SimulationResult> simulateSchedule(const Schedule &schedule,
                                                  const SimulationCosts &costs,
                                                  llvm::StringRef fileName) {
  auto prefixed = [&](const llvm::Twine &message) {
    return fileName.empty() ? message.str() : (fileName + ": " + message).str();
  };
  auto fail = [&](const llvm::Twine &message) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   prefixed(message));
  };
  auto where = [&](int r, int k) {
    return "rank " + std::to_string(r) + ", action " + std::to_string(k) +
           " (" + formatAction(schedule.ranks[r][k]) + ")";
  };
  const int numRanks = static_cast<int>(schedule.ranks.size());
  ActionNumbering numbering(schedule);
  ActionTable table;
  table.reset(schedule.numStages, schedule.numMicrobatches);

  // Index producers; check ranges.
  for (int r = 0; r < numRanks; ++r) {
    const auto &program = schedule.ranks[r];
    for (int k = 0, n = static_cast<int>(program.size()); k < n; ++k) {
      int part = program[k].parts.empty() ? -1 : 0;
      llvm::Error err = llvm::Error::success();
      forEachPrimitive(program[k], [&](const Action &p) {
        int slot = slotOf(p.kind);
        if (slot >= 0 && !err) {
          if (!table.inRange(p.stage, p.microbatch))
            err = fail(where(r, k) + ": stage or microbatch out of range (" +
                       std::to_string(schedule.numStages) + " stages, " +
                       std::to_string(schedule.numMicrobatches) +
                       " microbatches)");
          else
            table.add(slot, p.stage, p.microbatch, numbering.id(r, k), part);
        }
        if (part >= 0)
          ++part;
      });
      if (err)
        return err;
    }
  }

  SimulationResult result;
  result.timelines.resize(numRanks);
  result.busy.assign(numRanks, 0.0);
  for (int r = 0; r < numRanks; ++r)
    result.timelines[r].resize(schedule.ranks[r].size());

  std::vector<int> pc(numRanks, 0);
  std::vector<double> rankFree(numRanks, 0.0);
  // Per rank, the latest all-gather (UNSHARD) of each stage (its action id),
  // and when the rank's gathers, one after another, are done.
  std::vector<llvm::DenseMap<int, int64_t>> gathers(numRanks);
  std::vector<double> gathersFree(numRanks, 0.0);
  std::vector<int64_t> lastGather(numRanks, -1);
  std::vector<int64_t> waitingFor(numRanks, -1);
  std::vector<Dep> waitingDep(numRanks);
  std::vector<char> queued(numRanks, 1);
  std::deque<int> queue;
  for (int r = 0; r < numRanks; ++r)
    queue.push_back(r);
  llvm::SmallVector<Dep, 8> deps;
  // For the slack: actions in the order they ended up simulated (a
  // topological order), and each one's producers.
  std::vector<int64_t> order;
  std::vector<int64_t> producers, producersEnd;

  while (!queue.empty()) {
    int r = queue.front();
    queue.pop_front();
    queued[r] = 0;
    const auto &program = schedule.ranks[r];
    const int n = static_cast<int>(program.size());
    int before = pc[r];
    while (pc[r] < n) {
      const Action &action = program[pc[r]];
      deps.clear();
      forEachPrimitive(action, [&](const Action &p) {
        collectDeps(p, schedule.numStages, deps);
      });
      double ready = 0.0;
      bool blocked = false;
      for (const Dep &dep : deps) {
        if (!table.inRange(dep.stage, dep.mb))
          return fail(where(r, pc[r]) + ": needs " + describeDep(dep) +
                      ", which no rank runs");
        int64_t producer = table.first[table.key(dep.slot, dep.stage, dep.mb)];
        if (producer < 0)
          return fail(where(r, pc[r]) + ": needs " + describeDep(dep) +
                      ", which no rank runs");
        int q = numbering.rankOf(producer);
        int idx = static_cast<int>(producer - numbering.offset[q]);
        if (idx >= pc[q]) {
          waitingFor[r] = producer;
          waitingDep[r] = dep;
          blocked = true;
          break;
        }
        ready = std::max(ready, result.timelines[q][idx].end);
        producers.push_back(producer);
      }
      if (blocked) {
        producers.resize(producersEnd.empty() ? 0 : producersEnd.back());
        break;
      }
      // A stage's compute waits for the gather of its parameters.
      forEachPrimitive(action, [&](const Action &p) {
        if (!readsParameters(p.kind))
          return;
        auto gather = gathers[r].find(p.stage);
        if (gather == gathers[r].end())
          return;
        int idx = static_cast<int>(gather->second - numbering.offset[r]);
        ready = std::max(ready, result.timelines[r][idx].end);
        producers.push_back(gather->second);
      });
      int64_t id = numbering.id(r, pc[r]);
      order.push_back(id);
      double start = std::max(rankFree[r], ready);
      double duration = actionDuration(action, costs);
      result.timelines[r][pc[r]] = {ready, start, start + duration};
      if (action.kind == ActionKind::Unshard) {
        // Beside the compute, after the rank's earlier gathers: the rank
        // goes on at once.
        if (gathersFree[r] > start)
          producers.push_back(lastGather[r]); // For the slack: queued.
        double end = std::max(start, gathersFree[r]) + duration;
        result.timelines[r][pc[r]].end = gathersFree[r] = end;
        gathers[r][action.stage] = lastGather[r] = id;
      } else {
        result.busy[r] += duration;
        rankFree[r] = start + duration;
      }
      producersEnd.push_back(static_cast<int64_t>(producers.size()));
      ++pc[r];
    }
    if (pc[r] == n)
      waitingFor[r] = -1;
    if (pc[r] == before)
      continue;
    // Wake the ranks parked on an action this rank has now finished.
    for (int w = 0; w < numRanks; ++w) {
      if (waitingFor[w] < 0 || queued[w])
        continue;
      int q = numbering.rankOf(waitingFor[w]);
      if (q == r && waitingFor[w] - numbering.offset[q] < pc[r]) {
        waitingFor[w] = -1;
        queued[w] = 1;
        queue.push_back(w);
      }
    }
  }

  // Anyone left is part of (or waits on) a cycle.
  int stuck = -1;
  for (int r = 0; r < numRanks; ++r)
    if (pc[r] < static_cast<int>(schedule.ranks[r].size())) {
      stuck = r;
      break;
    }
  if (stuck >= 0) {
    std::vector<int> seenAt(numRanks, -1);
    std::vector<int> path;
    int r = stuck;
    while (seenAt[r] < 0) {
      seenAt[r] = static_cast<int>(path.size());
      path.push_back(r);
      r = numbering.rankOf(waitingFor[r]);
    }
    std::string message = "deadlock: ";
    std::vector<std::pair<int, int>> cycle;
    for (size_t i = seenAt[r]; i < path.size(); ++i) {
      int w = path[i];
      int64_t producer = waitingFor[w];
      int q = numbering.rankOf(producer);
      int idx = static_cast<int>(producer - numbering.offset[q]);
      if (i != static_cast<size_t>(seenAt[r]))
        message += "; ";
      message += where(w, pc[w]) + " waits for " + describeDep(waitingDep[w]) +
                 " at " + where(q, idx);
      cycle.emplace_back(w, pc[w]);
    }
    return llvm::make_error<DeadlockError>(prefixed(message), std::move(cycle));
  }

  for (int r = 0; r < numRanks; ++r) {
    result.totalBusy += result.busy[r];
    for (const ActionTiming &t : result.timelines[r])
      result.makespan = std::max(result.makespan, t.end);
  }
  if (result.totalBusy > 0)
    result.bubbleFraction =
        (numRanks * result.makespan - result.totalBusy) / result.totalBusy;

  // Slack, backwards through the simulated order: every action that waits on
  // one comes later in it.
  std::vector<double> latestEnd(numbering.size(), result.makespan);
  for (size_t i = order.size(); i-- > 0;) {
    int r = numbering.rankOf(order[i]);
    int k = static_cast<int>(order[i] - numbering.offset[r]);
    ActionTiming &timing = result.timelines[r][k];
    double latest = latestEnd[order[i]];
    timing.slack = latest - timing.end;
    // A gather may have queued behind the rank's earlier ones (its producer
    // then): its own time is its duration.
    const Action &action = schedule.ranks[r][k];
    bool gather = action.kind == ActionKind::Unshard;
    double latestStart = latest - (gather ? actionDuration(action, costs)
                                          : timing.end - timing.start);
    if (k > 0) {
      // The rank issues an UNSHARD and goes on: the next action bounds when
      // the gather starts, not when it ends.
      const Action &prev = schedule.ranks[r][k - 1];
      double prevEnd = latestStart;
      if (prev.kind == ActionKind::Unshard)
        prevEnd += actionDuration(prev, costs);
      latestEnd[order[i] - 1] = std::min(latestEnd[order[i] - 1], prevEnd);
    }
    for (int64_t j = i ? producersEnd[i - 1] : 0; j < producersEnd[i]; ++j)
      latestEnd[producers[j]] = std::min(latestEnd[producers[j]], latestStart);
  }
  return result;
}

} // namespace mlir::hpr::sched
