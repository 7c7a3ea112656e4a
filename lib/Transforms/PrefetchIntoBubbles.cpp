//===- PrefetchIntoBubbles.cpp - Recompute in simulated idle time --------===//
//
// Moves each placed recompute on a critical path (on a copy: each one) into
// the latest idle gap of its rank's simulated timeline that has room for the
// whole replay, or for a replay inside its backward that fits nowhere whole,
// for a piece of it, within a memory budget, so that the replay runs while the
// rank would wait anyway; the faster of the two plans stays.
//
//===----------------------------------------------------------------------===//

#include "hpr/Analysis/ActivationModel.h"
#include "hpr/Analysis/Timeline.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Threading.h"
#include "llvm/ADT/Sequence.h"
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
  /// The step time a placement reached and the recomputes it moved.
  struct Placement {
    double stepUs = 0;
    size_t moved = 0;
  };
  FailureOr<Placement> place(ModuleOp module,
                             const std::vector<StageCost> &costs,
                             llvm::ArrayRef<int64_t> limits, bool criticalOnly);
  bool placeInBubbles(ProgramOp program, llvm::ArrayRef<Operation *> cellOps,
                      llvm::ArrayRef<sched::ActionTiming> timeline,
                      const std::vector<StageCost> &costs, int64_t limit,
                      bool criticalOnly, llvm::DenseSet<Operation *> &movedOps);
};

/// Rounds: each moves recomputes into the gaps of the timeline the previous
/// round left (moving opens gaps elsewhere). Moving only critical ones takes
/// more (other paths become critical as they shorten); moving every one that
/// fits keeps its former bound, beyond which its rounds gain little.
constexpr unsigned kCriticalRounds = 256;
constexpr unsigned kEveryFitRounds = 8;
} // namespace

/// Whether `op` is a dx that computes nothing (the first stage's: the model
/// input needs no gradient): it sends nothing and only its own dw follows it.
static bool isComputeFreeInput(Operation *op) {
  auto input = dyn_cast<BackwardInputOp>(op);
  return input && !input.readsActivations() && !input.getOverlap();
}

LogicalResult PrefetchIntoBubblesPass::initialize(MLIRContext *context) {
  if (budget < 0)
    return emitError(UnknownLoc::get(context))
           << "hpr-prefetch-into-bubbles: budget must be >= 0, got "
           << static_cast<int64_t>(budget);
  return success();
}

/// One round on one rank (Passes.td): `cellOps` and `timeline` are the
/// rank's cells and their simulated times as the recomputes stand; the rank's
/// activation peak stays within `limit`. Returns whether any moved; adds the
/// recomputes moved (and the pieces made) to `movedOps`.
bool PrefetchIntoBubblesPass::placeInBubbles(
    ProgramOp program, llvm::ArrayRef<Operation *> cellOps,
    llvm::ArrayRef<sched::ActionTiming> timeline,
    const std::vector<StageCost> &costs, int64_t limit, bool criticalOnly,
    llvm::DenseSet<Operation *> &movedOps) {
  // Idle time before each cell, and the position of its first op in the
  // activation model's frame (positions before any recompute moves).
  size_t numCells = cellOps.size();
  std::vector<double> room(numCells);
  double free = 0; // When the rank is done with the cells before k.
  for (size_t k = 0; k < numCells; ++k) {
    room[k] = std::max(0.0, timeline[k].start - free);
    // An unshard's gather runs beside the rank's compute (Simulate.h).
    free = isa<UnshardOp>(cellOps[k]) ? timeline[k].start : timeline[k].end;
  }
  struct Replay {
    RecomputeOp op;
    size_t cell;      ///< its own cell
    size_t firstCell; ///< the earliest it may move before: after its session
                      ///< and its stage's unshard
    unsigned pos;
    double gatheredAt; ///< when its stage's gather ends (0: none)
  };
  std::vector<unsigned> cellPos(numCells);
  std::vector<Replay> replays;
  llvm::DenseMap<Operation *, size_t> sessionCell;
  llvm::DenseMap<int64_t, size_t> gatheredFrom; // stage -> its unshard's cell
  size_t cell = 0, next = 0;
  unsigned pos = 0;
  for (Operation &op : program.getBody().getOps()) {
    if (next < numCells && &op == cellOps[next]) {
      cell = next;
      cellPos[next++] = pos;
    }
    if (isa<SessionOp>(op))
      sessionCell[&op] = cell;
    else if (auto unshard = dyn_cast<UnshardOp>(op))
      gatheredFrom[unshard.getStageIndex()] = cell;
    else if (auto recompute = dyn_cast<RecomputeOp>(op);
             recompute && !recompute.getForWeight()) {
      // A replay for a dw stays where jit put it (right before the dw): its
      // dx drops the first replay, and moved earlier it would hold what the
      // dw reads over the time the drop freed.
      size_t first = sessionCell.lookup(recompute.getSessionOp()) + 1;
      // Within the window hpr-insert-unshard opened for the jit replay: a
      // replay moved before it would read sharded parameters.
      auto window = gatheredFrom.find(recompute.getStageIndex());
      double gatheredAt = 0;
      if (window != gatheredFrom.end()) {
        first = std::max(first, window->second + 1);
        gatheredAt = timeline[window->second].end;
      }
      replays.push_back({recompute, cell, first, pos, gatheredAt});
    }
    ++pos;
  }
  ProgramActivations activations = collectActivationLifetimes(program);
  ActivationProfile profile = computeActivationProfile(activations, costs);
  std::vector<int64_t> &live = profile.live;
  // What is live right after the op at each position: a replay moved into
  // the gap after it starts there (what ends at that op has gone).
  std::vector<int64_t> after(live.size());
  for (size_t p = 0; p < live.size(); ++p)
    after[p] = live[p] - profile.endingAt[p];
  llvm::DenseMap<std::pair<int64_t, int64_t>, const ActivationLifetime *>
      lifetimeOf;
  for (const ActivationLifetime &lifetime : activations.lifetimes)
    lifetimeOf[{lifetime.stage, lifetime.microbatch}] = &lifetime;

  // Latest consumer first; each takes the latest gap that fits: whole, or
  // for a replay inside its backward that fits nowhere whole, its last
  // regions (which that backward reads first) as a piece, the rest staying
  // inside the backward for a later round (an earlier gap) to split again.
  bool any = false;
  for (Replay &replay : llvm::reverse(replays)) {
    // Off every critical path, the replay delays nothing where it is: moved,
    // it would shorten no path as long as the step, and only hold its
    // tensors longer (docs/planning.md).
    if (criticalOnly && timeline[replay.cell].slack > sched::kCriticalSlackUs)
      continue;
    const ActivationLifetime &lifetime = *lifetimeOf.lookup(
        {replay.op.getStageIndex(), replay.op.getMicrobatchIndex()});
    const StageCost &cost = costs[lifetime.stage];
    bool inBackward = replay.op.getInBackward();
    unsigned reader = lifetime.firstConsumerPos;
    // The regions this op replays, and those its session's other pieces
    // prefetch (what the backward holds on entry).
    llvm::SmallVector<int64_t> own =
        replay.op.getRegions()
            ? llvm::SmallVector<int64_t>(*replay.op.getRegions())
            : llvm::to_vector(llvm::seq<int64_t>(
                  0, static_cast<int64_t>(cost.replayedRegions.size())));
    llvm::SmallVector<int64_t> prefetched = lifetime.prefetchedRegions();
    int64_t heldAtReader = backwardReplayBytesAfter(cost, prefetched);
    // Moves the regions `piece` (all of `own`: the op itself) into the
    // latest gap that has room; false when none has.
    auto place = [&](llvm::ArrayRef<int64_t> piece) {
      bool whole = piece.size() == own.size();
      double duration =
          whole ? timeline[replay.cell].end - timeline[replay.cell].start
                : replayUsOf(cost, piece);
      if (duration <= 0)
        return false;
      int64_t bytes = replayBytesOf(cost, piece);
      // Prefetched, the tensors are held from the gap up to where they were
      // replayed: inside a backward, up to that backward, which then holds
      // every region from its start to the clear (nothing left inside) or
      // what it still replays after the pieces.
      unsigned holdEnd = replay.pos;
      int64_t atReader = 0;
      if (inBackward) {
        holdEnd = reader;
        llvm::SmallVector<int64_t> withPiece(prefetched);
        withPiece.append(piece.begin(), piece.end());
        atReader = (whole ? cost.recomputedBytes
                          : backwardReplayBytesAfter(cost, withPiece)) -
                   heldAtReader;
        if (live[reader] + atReader > limit)
          return false;
      }
      int64_t highest = 0; // Peak over the positions the replay would add to.
      for (unsigned p = replay.pos; p < holdEnd; ++p)
        highest = std::max(highest, live[p]);
      unsigned end = replay.pos;
      // Whether only receives (and dxs that compute nothing: the first
      // stage's, which nobody waits for) lie between gap k and the replay:
      // moved there, the replay delays nobody else, so any idle time it
      // fills is won even when it outlasts the gap (docs/planning.md).
      bool onlyReceives = true;
      for (size_t k = replay.cell; k-- > replay.firstCell;) {
        onlyReceives = onlyReceives && !isBatched(cellOps[k]) &&
                       (isa<RecvFOp, RecvBOp>(cellOps[k]) ||
                        isComputeFreeInput(cellOps[k]));
        // The replay lands right after the op before the gap: what is live
        // there once that op is done, and at every position up to where it
        // was.
        unsigned begin = cellPos[k];
        for (unsigned p = begin; p < end; ++p)
          highest = std::max(highest, live[p]);
        if (begin > 0)
          highest = std::max(highest, after[begin - 1]);
        end = begin;
        if (highest + bytes > limit)
          return false; // Earlier gaps hold the replay longer still.
        // The replay starts once its stage's gather has ended too: a gap
        // that ends sooner has no room for it.
        double usable =
            std::min(room[k], timeline[k].start - replay.gatheredAt);
        if (usable < duration - sched::kCriticalSlackUs &&
            !(onlyReceives && usable > 0))
          continue;
        Operation *moved = replay.op;
        if (whole) {
          replay.op->moveBefore(cellOps[k]);
          replay.op.removeInBackwardAttr();
        } else {
          OpBuilder builder(cellOps[k]);
          moved = builder.create<RecomputeOp>(
              replay.op.getLoc(), replay.op.getSession(), /*in_backward=*/false,
              builder.getDenseI64ArrayAttr(piece));
          replay.op.setRegions(
              llvm::ArrayRef<int64_t>(own).drop_back(piece.size()));
        }
        room[k] = std::max(0.0, room[k] - duration);
        for (unsigned p = begin; p < holdEnd; ++p)
          live[p] += bytes;
        for (unsigned p = begin ? begin - 1 : 0; p < holdEnd; ++p)
          after[p] += bytes;
        if (inBackward)
          live[reader] += atReader;
        movedOps.insert(moved);
        LLVM_DEBUG(llvm::dbgs()
                   << "bubble: recompute " << replay.op.getSessionOp().getSid()
                   << (whole ? "" : " (a piece)") << " before "
                   << describeAction(cellOps[k]) << "\n");
        return true;
      }
      return false;
    };
    bool placed = place(own);
    // Pieces: the last |own| - 1, ..., 1 of its regions.
    for (size_t first = 1; inBackward && !placed && first < own.size(); ++first)
      placed = place(llvm::ArrayRef<int64_t>(own).drop_front(first));
    any |= placed;
  }
  return any;
}

/// Rounds of placeInBubbles on every rank of `module` until nothing moves,
/// each rank's activations within its `limits` entry.
FailureOr<PrefetchIntoBubblesPass::Placement> PrefetchIntoBubblesPass::place(
    ModuleOp module, const std::vector<StageCost> &costs,
    llvm::ArrayRef<int64_t> limits, bool criticalOnly) {
  auto programs =
      llvm::to_vector(getSchedule(module).getBody().getOps<ProgramOp>());
  // Ranks are independent within a round: each moves ops of its own block.
  size_t numRanks = limits.size();
  std::vector<llvm::DenseSet<Operation *>> moved(numRanks);
  for (unsigned round = 0;; ++round) {
    ModuleSchedule cells = extractSchedule(module, costs);
    llvm::Expected<sched::SimulationResult> simulation =
        simulateTimeline(cells.schedule);
    if (!simulation) {
      module.emitError()
          << "hpr-prefetch-into-bubbles: cannot simulate the programs: "
          << llvm::toString(simulation.takeError());
      return failure();
    }
    std::vector<char> any(numRanks, false);
    if (round < (criticalOnly ? kCriticalRounds : kEveryFitRounds))
      mlir::parallelFor(module.getContext(), 0, numRanks, [&](size_t rank) {
        any[rank] = placeInBubbles(programs[rank], cells.cellOps[rank],
                                   simulation->timelines[rank], costs,
                                   limits[rank], criticalOnly, moved[rank]);
      });
    if (llvm::none_of(any, [](char changed) { return changed; })) {
      Placement placement{simulation->makespan, 0};
      for (const auto &rankMoved : moved)
        placement.moved += rankMoved.size();
      return placement;
    }
  }
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
  // Without a budget, each rank keeps its activation peak as placed (jit).
  std::vector<int64_t> limits;
  for (ProgramOp program : schedules.front().getBody().getOps<ProgramOp>())
    limits.push_back(budget ? static_cast<int64_t>(budget)
                            : computeActivationProfile(
                                  collectActivationLifetimes(program), costs)
                                  .peak());
  if (placement != BubblePlacement::Faster) {
    FailureOr<Placement> alone =
        place(module, costs, limits, placement == BubblePlacement::Critical);
    if (failed(alone))
      return signalPassFailure();
    numInBubbles = alone->moved;
    return;
  }
  // Both greedy placements, on the module and on a copy: neither is always
  // ahead. The faster wins; on a tie the one that moves only critical replays
  // (docs/planning.md).
  OwningOpRef<ModuleOp> everyFit = module.clone();
  FailureOr<Placement> critical =
      place(module, costs, limits, /*criticalOnly=*/true);
  FailureOr<Placement> fit =
      place(*everyFit, costs, limits, /*criticalOnly=*/false);
  if (failed(critical) || failed(fit))
    return signalPassFailure();
  Placement chosen = *critical;
  if (fit->stepUs < critical->stepUs - sched::kCriticalSlackUs) {
    ScheduleOp placed = getSchedule(module);
    getSchedule(*everyFit)->moveBefore(placed);
    placed->erase();
    chosen = *fit;
  }
  numInBubbles = chosen.moved;
}

#undef DEBUG_TYPE
