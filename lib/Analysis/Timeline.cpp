//===- Timeline.cpp - A module's programs as a simulated schedule --------===//

#include "hpr/Analysis/Timeline.h"

#include "llvm/ADT/TypeSwitch.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::hpr;

double mlir::hpr::actionDurationUs(sched::ActionKind kind,
                                   const StageCost &cost,
                                   bool checkpointedForward) {
  using Kind = sched::ActionKind;
  switch (kind) {
  case Kind::Forward:
    return checkpointedForward ? cost.forwardUs : cost.plainForwardUs;
  case Kind::BackwardInput:
    return cost.backwardInputUs;
  case Kind::BackwardWeight:
    return cost.backwardWeightUs;
  case Kind::Backward:
    return cost.backwardUs;
  case Kind::Recompute:
    return cost.recomputeUs;
  case Kind::Unshard:
    return cost.unshardUs;
  case Kind::ReduceGrad:
    return cost.reduceGradUs;
  default:
    return 0;
  }
}

/// The schedule action of one op, with its duration under `costs`.
static sched::Action toAction(Operation *op,
                              const std::vector<StageCost> &costs) {
  using Kind = sched::ActionKind;
  sched::Action action;
  action.kind =
      llvm::TypeSwitch<Operation *, Kind>(op)
          .Case<ForwardOp>([](auto) { return Kind::Forward; })
          .Case<BackwardInputOp>([](auto) { return Kind::BackwardInput; })
          .Case<BackwardWeightOp>([](auto) { return Kind::BackwardWeight; })
          .Case<BackwardOp>([](auto) { return Kind::Backward; })
          .Case<SendFOp>([](auto) { return Kind::SendF; })
          .Case<RecvFOp>([](auto) { return Kind::RecvF; })
          .Case<SendBOp>([](auto) { return Kind::SendB; })
          .Case<RecvBOp>([](auto) { return Kind::RecvB; })
          .Case<UnshardOp>([](auto) { return Kind::Unshard; })
          .Case<ReshardOp>([](auto) { return Kind::Reshard; })
          .Case<ReduceGradOp>([](auto) { return Kind::ReduceGrad; })
          .Case<RecomputeOp>([](auto) { return Kind::Recompute; })
          .Case<ClearOp>([](auto) { return Kind::Clear; })
          .Default([](Operation *) { return Kind::Idle; });
  auto actionOp = cast<ActionOpInterface>(op);
  action.stage = static_cast<int>(actionOp.getStageIndex());
  action.microbatch = static_cast<int>(actionOp.getMicrobatchIndex());
  llvm::TypeSwitch<Operation *>(op).Case<SendFOp, RecvFOp, SendBOp, RecvBOp>(
      [&](auto comm) {
        if (std::optional<uint64_t> tag = comm.getTag())
          action.tag = static_cast<int64_t>(*tag);
      });
  llvm::TypeSwitch<Operation *>(op).Case<RecvFOp, RecvBOp>([&](auto recv) {
    if (std::optional<ArrayRef<int64_t>> posts = recv.getPosts())
      action.posts.emplace(posts->begin(), posts->end());
  });
  if (action.stage < 0)
    return action;
  auto forward = dyn_cast<ForwardOp>(op);
  action.durationUs =
      actionDurationUs(action.kind, costs[action.stage],
                       forward && runsCheckpointed(forward, costs));
  if (auto recompute = dyn_cast<RecomputeOp>(op))
    if (std::optional<ArrayRef<int64_t>> regions = recompute.getRegions())
      action.durationUs = replayUsOf(costs[action.stage], *regions);
  return action;
}

ModuleSchedule mlir::hpr::extractSchedule(ModuleOp module,
                                          const std::vector<StageCost> &costs) {
  ScheduleOp scheduleOp = getSchedule(module);
  ModuleSchedule result;
  sched::Schedule &schedule = result.schedule;
  schedule.name = scheduleOp.getName().str();
  schedule.numRanks = scheduleOp.getNumRanks();
  schedule.numStages = scheduleOp.getNumStages();
  schedule.numMicrobatches = scheduleOp.getNumMicrobatches();
  schedule.stageToRank.assign(scheduleOp.getStageToRank().begin(),
                              scheduleOp.getStageToRank().end());
  for (ProgramOp program : scheduleOp.getBody().getOps<ProgramOp>()) {
    std::vector<sched::Action> &actions = schedule.ranks.emplace_back();
    std::vector<Operation *> &cellOps = result.cellOps.emplace_back();
    // At most one cell per op, reserved: a plan's program holds up to a
    // million actions, and vectors grown by doubling keep up to as many again
    // unused, and the planner reaches its peak memory here.
    size_t ops = program.getBody().front().getOperations().size();
    actions.reserve(ops);
    cellOps.reserve(ops);
    // Overlapped pairs and batched transfers become one composite cell. A
    // pair is a forward marked overlap and the action after it; a batch runs
    // from a transfer marked batched to the first one that is not.
    constexpr size_t kNone = ~size_t(0);
    size_t open = kNone; // Index of the composite being filled.
    for (Operation &op : program.getBody().getOps()) {
      if (!isa<ActionOpInterface>(op))
        continue;
      sched::Action action = toAction(&op, costs);
      if (open != kNone) {
        sched::Action &group = actions[open];
        group.parts.push_back(std::move(action));
        bool more =
            group.kind == sched::ActionKind::BatchedComm && isBatched(&op);
        if (!more)
          open = kNone;
        continue;
      }
      cellOps.push_back(&op);
      bool pairStart = isOverlapped(&op) && isa<ForwardOp>(op);
      if (pairStart || isBatched(&op)) {
        sched::Action composite;
        composite.kind = pairStart ? sched::ActionKind::OverlapFB
                                   : sched::ActionKind::BatchedComm;
        composite.parts.push_back(std::move(action));
        actions.push_back(std::move(composite));
        open = actions.size() - 1;
        continue;
      }
      actions.push_back(std::move(action));
    }
  }
  return result;
}

sched::Schedule
mlir::hpr::withJitRecomputes(const ModuleSchedule &cells,
                             llvm::ArrayRef<ProgramActivations> programs) {
  sched::Schedule timeline = cells.schedule;
  for (auto [rank, program] : llvm::enumerate(programs)) {
    const std::vector<Operation *> &firsts = cells.cellOps[rank];
    if (firsts.empty())
      continue; // a rank without actions replays nothing
    // The cell of each op position.
    std::vector<size_t> cellAt;
    size_t cell = 0;
    for (Operation &each : *firsts.front()->getBlock()) {
      if (cell + 1 < firsts.size() && &each == firsts[cell + 1])
        ++cell;
      cellAt.push_back(cell);
    }
    std::vector<std::vector<sched::Action>> before(firsts.size());
    for (const ActivationLifetime &lifetime : program.lifetimes) {
      if (!lifetime.hasConsumers)
        continue;
      sched::Action recompute;
      recompute.kind = sched::ActionKind::Recompute;
      recompute.stage = static_cast<int>(lifetime.stage);
      recompute.microbatch = static_cast<int>(lifetime.microbatch);
      before[cellAt[lifetime.firstConsumerPos]].push_back(recompute);
      // The replay for a `weight_replay` dw, where hpr-insert-recompute
      // places it.
      if (lifetime.weightReplay && !lifetime.weightReplayPlaced)
        before[cellAt[lifetime.weightReplayPos]].push_back(recompute);
    }
    std::vector<sched::Action> withRecomputes;
    for (size_t k = 0; k < firsts.size(); ++k) {
      for (sched::Action &recompute : before[k])
        withRecomputes.push_back(std::move(recompute));
      withRecomputes.push_back(std::move(timeline.ranks[rank][k]));
    }
    timeline.ranks[rank] = std::move(withRecomputes);
  }
  return timeline;
}

ModuleSchedule mlir::hpr::extractSchedule(ModuleOp module) {
  return extractSchedule(module, computeStageCosts(getModel(module)));
}

llvm::Expected<sched::SimulationResult>
mlir::hpr::simulateTimeline(const sched::Schedule &schedule) {
  sched::SimulationCosts costs;
  costs.useActionDurations = true;
  return sched::simulateSchedule(schedule, costs, "<plan>");
}

std::vector<RecomputeExposure>
mlir::hpr::measureRecomputeExposure(const sched::Schedule &schedule,
                                    const sched::SimulationResult &simulation) {
  std::vector<RecomputeExposure> exposure(schedule.ranks.size());
  for (auto [rank, program] : llvm::enumerate(schedule.ranks)) {
    const auto &timeline = simulation.timelines[rank];
    for (size_t k = 0, n = program.size(); k < n;) {
      if (program[k].kind != sched::ActionKind::Recompute) {
        ++k;
        continue;
      }
      double t0 = timeline[k].start, duration = 0;
      for (; k < n && program[k].kind == sched::ActionKind::Recompute; ++k)
        duration += timeline[k].end - timeline[k].start;
      double waited = k < n ? std::max(0.0, timeline[k].ready - t0) : 0.0;
      double hidden = std::min(duration, waited);
      exposure[rank].hiddenUs += hidden;
      exposure[rank].exposedUs += duration - hidden;
    }
  }
  return exposure;
}
