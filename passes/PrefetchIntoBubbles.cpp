//===- PrefetchIntoBubbles.cpp - Recompute in simulated idle time --------===//
//
// Moves each placed recompute into the latest idle gap of its rank's
// simulated timeline that has room for the whole replay, within a memory
// budget, so that the replay runs while the rank would wait anyway.
//
//===----------------------------------------------------------------------===//

#include "hpr/Analysis/ActivationModel.h"
#include "hpr/Analysis/Timeline.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/Threading.h"
#include "llvm/Support/Debug.h"

#define DEBUG_TYPE "hpr-prefetch-into-bubbles"

namespace mlir::hpr {
#define GEN_PASS_DEF_HPRPREFETCHINTOBUBBLES
#include "hpr/Transforms/Passes.h.inc"
} // namespace mlir::hpr

using namespace mlir;
using namespace mlir::hpr;

namespace {
struct PrefetchIntoBubblesPass
    : public mlir::hpr::impl::HPRPrefetchIntoBubblesBase<
          PrefetchIntoBubblesPass> {
  using HPRPrefetchIntoBubblesBase::HPRPrefetchIntoBubblesBase;
  LogicalResult initialize(MLIRContext *context) override;
  void runOnOperation() override;
  bool placeInBubbles(ProgramOp program, llvm::ArrayRef<Operation *> cellOps,
                      llvm::ArrayRef<sched::ActionTiming> timeline,
                      const std::vector<StageCost> &costs, int64_t limit,
                      llvm::DenseSet<Operation *> &moved);
};

/// Rounds: each moves recomputes into the gaps of the timeline the previous
/// round left (moving opens gaps elsewhere).
constexpr unsigned kBubbleRounds = 8;
} // namespace

LogicalResult PrefetchIntoBubblesPass::initialize(MLIRContext *context) {
  if (budget < 0)
    return emitError(UnknownLoc::get(context))
           << "hpr-prefetch-into-bubbles: budget must be >= 0, got "
           << static_cast<int64_t>(budget);
  return success();
}

/// One round on one rank (Passes.td): `cellOps` and `timeline` are the
/// rank's cells and their simulated times as the recomputes stand; the rank's
/// activation peak stays within `limit`. Returns whether any moved; adds them
/// to `moved`.
bool PrefetchIntoBubblesPass::placeInBubbles(
    ProgramOp program, llvm::ArrayRef<Operation *> cellOps,
    llvm::ArrayRef<sched::ActionTiming> timeline,
    const std::vector<StageCost> &costs, int64_t limit,
    llvm::DenseSet<Operation *> &moved) {
  // Idle time before each cell, and the position of its first op in the
  // activation model's frame (positions before any recompute moves).
  size_t numCells = cellOps.size();
  std::vector<double> room(numCells);
  for (size_t k = 0; k < numCells; ++k)
    room[k] = timeline[k].start - (k ? timeline[k - 1].end : 0.0);
  struct Replay {
    RecomputeOp op;
    size_t cell;      ///< its own cell
    size_t firstCell; ///< the earliest it may move before: after its session
    unsigned pos;
  };
  std::vector<unsigned> cellPos(numCells);
  std::vector<Replay> replays;
  llvm::DenseMap<Operation *, size_t> sessionCell;
  size_t cell = 0, next = 0;
  unsigned pos = 0;
  for (Operation &op : program.getBody().getOps()) {
    if (next < numCells && &op == cellOps[next]) {
      cell = next;
      cellPos[next++] = pos;
    }
    if (isa<SessionOp>(op))
      sessionCell[&op] = cell;
    else if (auto recompute = dyn_cast<RecomputeOp>(op))
      replays.push_back({recompute, cell,
                         sessionCell.lookup(recompute.getSessionOp()) + 1,
                         pos});
    ++pos;
  }
  ProgramActivations activations = collectActivationLifetimes(program);
  std::vector<int64_t> live = computeActivationProfile(activations, costs).live;
  llvm::DenseMap<std::pair<int64_t, int64_t>, const ActivationLifetime *>
      lifetimeOf;
  for (const ActivationLifetime &lifetime : activations.lifetimes)
    lifetimeOf[{lifetime.stage, lifetime.microbatch}] = &lifetime;

  // Latest consumer first; each takes the latest gap that fits.
  bool any = false;
  for (Replay &replay : llvm::reverse(replays)) {
    double duration = timeline[replay.cell].end - timeline[replay.cell].start;
    if (duration <= 0)
      continue;
    const ActivationLifetime &lifetime = *lifetimeOf.lookup(
        {replay.op.getStageIndex(), replay.op.getMicrobatchIndex()});
    const StageCost &cost = costs[lifetime.stage];
    int64_t bytes = cost.recomputedBytes;
    unsigned end = replay.pos;
    int64_t highest = 0; // Peak over the positions the replay would add to.
    // Moved, a replay inside its backward becomes a whole one: it adds
    // `bytes` up to its reader too, and there, where it held
    // backwardReplayBytes, the rest.
    unsigned reader = lifetime.firstConsumerPos;
    if (lifetime.replayInBackward) {
      for (unsigned p = replay.pos; p < reader; ++p)
        highest = std::max(highest, live[p]);
      highest = std::max(highest, live[reader] - cost.backwardReplayBytes);
    }
    for (size_t k = replay.cell; k-- > replay.firstCell;) {
      // Conservative: also the op before the gap, where the replay now sits.
      unsigned begin = cellPos[k] ? cellPos[k] - 1 : 0;
      for (unsigned p = begin; p < end; ++p)
        highest = std::max(highest, live[p]);
      end = begin;
      if (highest + bytes > limit)
        break; // Earlier gaps hold the replay longer still.
      if (room[k] < duration)
        continue;
      replay.op->moveBefore(cellOps[k]);
      room[k] -= duration;
      for (unsigned p = begin; p < replay.pos; ++p)
        live[p] += bytes;
      if (lifetime.replayInBackward) {
        for (unsigned p = replay.pos; p < reader; ++p)
          live[p] += bytes;
        live[reader] += bytes - cost.backwardReplayBytes;
        replay.op.removeInBackwardAttr();
      }
      moved.insert(replay.op);
      any = true;
      LLVM_DEBUG(llvm::dbgs()
                 << "bubble: recompute " << replay.op.getSessionOp().getSid()
                 << " before " << describeAction(cellOps[k]) << "\n");
      break;
    }
  }
  return any;
}

void PrefetchIntoBubblesPass::runOnOperation() {
  ModuleOp module = getOperation();
  auto models = llvm::to_vector(module.getOps<ModelOp>());
  auto schedules = llvm::to_vector(module.getOps<ScheduleOp>());
  if (models.size() != 1 || schedules.size() != 1) {
    module.emitError("hpr-prefetch-into-bubbles: expected one hpr.model and "
                     "one hpr.schedule");
    return signalPassFailure();
  }
  std::vector<StageCost> costs = computeStageCosts(models.front());
  auto programs = schedules.front().getBody().getOps<ProgramOp>();
  // Without a budget, each rank keeps its activation peak as placed.
  std::vector<int64_t> limits;
  for (ProgramOp program : programs)
    limits.push_back(budget ? static_cast<int64_t>(budget)
                            : computeActivationProfile(
                                  collectActivationLifetimes(program), costs)
                                  .peak());
  // Ranks are independent within a round: each moves ops of its own block.
  size_t numRanks = limits.size();
  std::vector<llvm::DenseSet<Operation *>> moved(numRanks);
  auto programList = llvm::to_vector(programs);
  for (unsigned round = 0; round < kBubbleRounds; ++round) {
    ModuleSchedule cells = extractSchedule(module, costs);
    llvm::Expected<sched::SimulationResult> simulation =
        simulateTimeline(cells.schedule);
    if (!simulation) {
      module.emitError()
          << "hpr-prefetch-into-bubbles: cannot simulate the programs: "
          << llvm::toString(simulation.takeError());
      return signalPassFailure();
    }
    std::vector<char> any(numRanks, false);
    mlir::parallelFor(module.getContext(), 0, numRanks, [&](size_t rank) {
      any[rank] = placeInBubbles(programList[rank], cells.cellOps[rank],
                                 simulation->timelines[rank], costs,
                                 limits[rank], moved[rank]);
    });
    if (llvm::none_of(any, [](char changed) { return changed; }))
      break;
  }
  size_t total = 0;
  for (const auto &rankMoved : moved)
    total += rankMoved.size();
  numInBubbles = total;
}
