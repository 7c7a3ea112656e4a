//===- BoundWeightDeferral.cpp - Run dw earlier where memory is short -----===//
//
// A zero-bubble schedule defers each dw (hpr.backward_weight) to fill idle
// time; meanwhile its (stage, microbatch) keeps what its forward kept and,
// when checkpointed, what the dw reads of its replay. Where a rank's
// activation peak exceeds the budget, this pass bounds that deferral: it runs
// a pending dw before the peak, fuses it with its dx into one hpr.backward
// (which replays block by block inside itself, as 1F1B's does), or lets the
// dx drop the replay and the dw replay again for itself (`weight_replay`),
// choosing each time the change the simulated step suffers least from; then
// moves dws back into idle time, and again once the checkpoints are chosen
// (`after-choice`). The algorithm is in Passes.td and docs/planning.md
// ("Bounded dw deferral").
//
//===----------------------------------------------------------------------===//

#include "LeastCheckpointMemory.h"
#include "PlacementOnCopy.h"
#include "hpr/Analysis/ActivationModel.h"
#include "hpr/Analysis/Timeline.h"
#include "hpr/Schedule/ScheduleUtils.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"

#include <limits>
#include <optional>
#include <variant>

namespace mlir::hpr {
#define GEN_PASS_DEF_HPRBOUNDWEIGHTDEFERRAL
#include "hpr/Transforms/Passes.h.inc"
} // namespace mlir::hpr

using namespace mlir;
using namespace mlir::hpr;

namespace {

using Key = std::pair<int64_t, int64_t>; // (stage, microbatch)

/// How many dw deferrals into idle time are priced a round (steps 5 and 6).
constexpr size_t kPricedPerRound = 16;

/// One way to end a pending dw's lifetime before a rank's peak, written by
/// positions so that it applies to a copy of the module as to the module.
struct Change {
  /// In the order ties are broken.
  enum class Kind {
    Move,         ///< run the dw before the op at `before`
    Fuse,         ///< fuse dx and dw into one backward at the dx
    WeightReplay, ///< mark the dw `weight_replay`: the dx drops the replay
  };
  unsigned rank = 0;
  int64_t stage = 0;
  int64_t microbatch = 0;
  Kind kind = Kind::Move;
  unsigned before = 0;
  /// A move of a `weight_replay` dw: its replay for the dw moves with it and
  /// raises the position it lands on, so it is kept only where both that
  /// position and the peak op (then at `peakPos` + 1) end below the peak
  /// (step 4 of Passes.td: the loop still ends).
  bool landsReplay = false;
  unsigned peakPos = 0;
};

/// A change priced: the simulated step with it, and the rank's peak; with
/// `progresses` false it may not be made (Change::landsReplay).
struct Priced {
  double stepUs = 0;
  int64_t peak = 0;
  Change change;
  bool progresses = true;
};

/// The (stage, microbatch)'s dx and dw ops in `program`, by key.
struct SplitBackwards {
  llvm::DenseMap<Key, std::pair<unsigned, unsigned>> positions; // (I, W)
  std::vector<Operation *> ops;                                 // by position
};

SplitBackwards collectSplitBackwards(ProgramOp program) {
  SplitBackwards result;
  llvm::DenseMap<Key, unsigned> inputs;
  for (Operation &op : program.getBody().getOps()) {
    unsigned pos = result.ops.size();
    result.ops.push_back(&op);
    if (auto input = dyn_cast<BackwardInputOp>(op))
      inputs[{input.getStageIndex(), input.getMicrobatchIndex()}] = pos;
    else if (auto weight = dyn_cast<BackwardWeightOp>(op)) {
      Key key{weight.getStageIndex(), weight.getMicrobatchIndex()};
      auto it = inputs.find(key);
      if (it != inputs.end())
        result.positions[key] = {it->second, pos};
    }
  }
  return result;
}

/// Whether a dw may leave its place: half of an OVERLAP_F_B pair may not.
bool isMovable(Operation *op) {
  if (auto weight = dyn_cast<BackwardWeightOp>(op))
    return !weight.getOverlap();
  return !cast<BackwardInputOp>(op).getOverlap();
}

/// The position an op inserted before `pos` really goes before: not inside
/// an OVERLAP_F_B pair (after its forward) nor between batched transfers.
unsigned insertionPoint(const std::vector<Operation *> &ops, unsigned pos) {
  while (pos > 0) {
    Operation *previous = ops[pos - 1];
    auto forward = dyn_cast<ForwardOp>(previous);
    bool inPair = forward && forward.getOverlap();
    bool batched = previous->hasAttr("batched");
    if (!inPair && !batched)
      break;
    --pos;
  }
  return pos;
}

/// Whether a dw or a whole backward of `stage` lies in [begin, end): its
/// weight gradients are added there, so moving another dw of the stage
/// across it would change the order the microbatches' gradients are added.
bool stageGradientBetween(const std::vector<Operation *> &ops, int64_t stage,
                          unsigned begin, unsigned end) {
  for (unsigned pos = begin; pos < end; ++pos)
    if (isa<BackwardWeightOp, BackwardOp>(ops[pos]) &&
        cast<ActionOpInterface>(ops[pos]).getStageIndex() == stage)
      return true;
  return false;
}

/// Whether `stage`'s REDUCE_GRAD lies in [begin, end): it reduces the
/// stage's gradients once, after its last W and B
/// (hpr.schedule.reduce-grad), so a dw moved across it would add to
/// gradients already reduced.
bool stageReduceBetween(const std::vector<Operation *> &ops, int64_t stage,
                        unsigned begin, unsigned end) {
  for (unsigned pos = begin; pos < end && pos < ops.size(); ++pos)
    if (auto reduce = dyn_cast<ReduceGradOp>(ops[pos]);
        reduce && reduce.getStageIndex() == stage)
      return true;
  return false;
}

/// Rank `rank`'s program of `module`.
ProgramOp programOf(ModuleOp module, unsigned rank) {
  return *std::next(getSchedule(module).getBody().getOps<ProgramOp>().begin(),
                    rank);
}

/// This pass decides the schedule it changes: the program's compute-order
/// record is rewritten, and hpr-verify holds the later passes to it.
void recordOrder(ModuleOp module, unsigned rank) {
  ProgramOp program = programOf(module, rank);
  if (program.getComputeOrder())
    program.setComputeOrder(sched::computeOrderRecord(
        extractSchedule(module).schedule.ranks[rank]));
}

/// Puts the schedule of `from` (a clone of `module` taken earlier) in place
/// of `module`'s.
void restoreSchedule(ModuleOp module, ModuleOp from) {
  ScheduleOp saved = getSchedule(from);
  ScheduleOp current = getSchedule(module);
  saved->moveBefore(current);
  current->erase();
}

/// Replaces the dx `input` and the dw `weight` of one (stage, microbatch)
/// with one backward at the dx, marked `fused` with `markFused` (for the
/// after-choice run).
void fusePair(Operation *input, Operation *weight, bool markFused) {
  auto action = cast<ActionOpInterface>(input);
  OpBuilder builder(input);
  builder.create<BackwardOp>(input->getLoc(), action.getStageIndex(),
                             action.getMicrobatchIndex(), Value(),
                             /*retain_on_unpack=*/false,
                             /*overlap=*/false, /*frees_graph=*/false,
                             /*last_backward=*/false, /*waits=*/nullptr,
                             /*hands_to=*/nullptr, markFused);
  input->erase();
  weight->erase();
}

/// Applies `change` to `module` (or a copy of it); a fused pair is marked
/// `fused` with `markFused` (for the after-choice run).
void apply(ModuleOp module, const Change &change, bool markFused = false) {
  ProgramOp program = programOf(module, change.rank);
  SplitBackwards split = collectSplitBackwards(program);
  auto [inputPos, weightPos] =
      split.positions.lookup({change.stage, change.microbatch});
  Operation *input = split.ops[inputPos];
  Operation *weight = split.ops[weightPos];
  if (change.kind == Change::Kind::Move) {
    weight->moveBefore(split.ops[change.before]);
    return;
  }
  if (change.kind == Change::Kind::WeightReplay) {
    cast<BackwardWeightOp>(weight).setWeightReplay(true);
    return;
  }
  fusePair(input, weight, markFused);
}

/// Step 0 of Passes.td: fuses each dx with its dw in `program`, stage by
/// stage, where the stage's weight gradients are then added in the order
/// they are now (its dxs in its dws' order, no OVERLAP_F_B half among its
/// pairs); returns the pairs fused.
llvm::SmallVector<Key> fuseEveryPair(ProgramOp program, bool markFused) {
  SplitBackwards split = collectSplitBackwards(program);
  // Per stage, (position, microbatch) of each weight gradient as the program
  // stands and as it would with every pair fused at its dx.
  llvm::DenseMap<int64_t, std::vector<std::pair<unsigned, int64_t>>> now,
      fusedAt;
  llvm::DenseSet<int64_t> pinned;
  for (auto [pos, op] : llvm::enumerate(split.ops)) {
    if (!isa<BackwardOp, BackwardWeightOp>(op))
      continue;
    auto action = cast<ActionOpInterface>(op);
    Key key{action.getStageIndex(), action.getMicrobatchIndex()};
    unsigned at = pos;
    if (auto it = split.positions.find(key);
        isa<BackwardWeightOp>(op) && it != split.positions.end()) {
      at = it->second.first;
      if (!isMovable(split.ops[at]) || !isMovable(op))
        pinned.insert(key.first);
    }
    now[key.first].push_back({static_cast<unsigned>(pos), key.second});
    fusedAt[key.first].push_back({at, key.second});
  }
  auto microbatches = [](std::vector<std::pair<unsigned, int64_t>> order) {
    llvm::sort(order);
    return llvm::to_vector(llvm::make_second_range(order));
  };
  llvm::DenseSet<int64_t> keepsOrder;
  for (auto &[stage, order] : now)
    if (!pinned.contains(stage) &&
        microbatches(order) == microbatches(fusedAt[stage]))
      keepsOrder.insert(stage);
  llvm::SmallVector<Key> keys;
  for (auto &[key, positions] : split.positions)
    if (keepsOrder.contains(key.first))
      keys.push_back(key);
  llvm::sort(keys); // positions come from a hash map
  for (Key key : keys) {
    auto [inputPos, weightPos] = split.positions.lookup(key);
    fusePair(split.ops[inputPos], split.ops[weightPos], markFused);
  }
  return keys;
}

/// A dw moved into idle time: rank `rank`'s dw of `key` (with `split`, the
/// dw split off the backward that fused it with its dx) runs before the op
/// at `before`, or last where that is the program's length; with
/// `weightReplay` it replays for itself there (its dx drops the replay).
struct Deferral {
  unsigned rank = 0;
  Key key;
  bool split = false;
  unsigned before = 0;
  /// How long the rank waits before that op.
  double idleUs = 0;
  bool weightReplay = false;
  /// Right after the send of its own dx's gradient, with that dx (or the
  /// fused backward) on a critical path starting at `dxStartUs`.
  bool afterCriticalSend = false;
  double dxStartUs = 0;
  /// Past its stage's REDUCE_GRAD: never made. Such a move is still a
  /// candidate for the round's bounded list (so that the list, and the
  /// moves made, are those of the plans before the check), and dropped
  /// from it unpriced.
  bool pastReduce = false;
};

/// Applies `deferral` to `module` (or a copy of it).
void apply(ModuleOp module, const Deferral &deferral) {
  ProgramOp program = programOf(module, deferral.rank);
  std::vector<Operation *> ops;
  Operation *found = nullptr;
  for (Operation &op : program.getBody().getOps()) {
    ops.push_back(&op);
    auto action = dyn_cast<ActionOpInterface>(op);
    bool candidate =
        deferral.split ? isa<BackwardOp>(op) : isa<BackwardWeightOp>(op);
    if (candidate && action.getStageIndex() == deferral.key.first &&
        action.getMicrobatchIndex() == deferral.key.second)
      found = &op;
  }
  Block &block = program.getBody().front();
  if (!deferral.split) {
    if (deferral.before < ops.size())
      found->moveBefore(ops[deferral.before]);
    else
      found->moveBefore(&block, block.end());
    if (deferral.weightReplay)
      cast<BackwardWeightOp>(found).setWeightReplay(true);
    return;
  }
  OpBuilder builder(found);
  auto [stage, microbatch] = deferral.key;
  builder.create<BackwardInputOp>(
      found->getLoc(), stage, microbatch, Value(), /*retain_on_unpack=*/false,
      /*overlap=*/false, /*frees_graph=*/false, /*waits=*/nullptr,
      /*hands_to=*/nullptr);
  if (deferral.before < ops.size())
    builder.setInsertionPoint(ops[deferral.before]);
  else
    builder.setInsertionPointToEnd(&block);
  builder.create<BackwardWeightOp>(
      found->getLoc(), stage, microbatch, Value(), /*retain_on_unpack=*/false,
      /*overlap=*/false, /*frees_graph=*/false, /*last_backward=*/false,
      deferral.weightReplay);
  found->erase();
}

/// Prices `change` (a Change or a Deferral) on rank `rank`'s program:
/// applies it to `module`, returns what `price` says of the changed module,
/// and puts a copy of the program as it was back in its place. A copy of one
/// program per candidate, not of the module: candidates are priced by the
/// hundred a round on schedules of 10^5 actions. Nothing may keep an op of
/// that program across the call.
template <typename ChangeT, typename PriceFn>
auto priceChanged(ModuleOp module, unsigned rank, const ChangeT &change,
                  PriceFn price) {
  ProgramOp program = programOf(module, rank);
  Operation *unchanged = program->clone();
  apply(module, change);
  auto priced = price();
  OpBuilder(program).insert(unchanged);
  program->erase();
  return priced;
}

class BoundWeightDeferralPass
    : public mlir::hpr::impl::HPRBoundWeightDeferralBase<
          BoundWeightDeferralPass> {
public:
  using HPRBoundWeightDeferralBase::HPRBoundWeightDeferralBase;
  void runOnOperation() override;

private:
  /// The costs the peaks are priced with: every candidate region
  /// checkpointed (`leastMemory`), else as the model marks them.
  std::vector<StageCost> costs;

  int64_t peakOf(ProgramOp program) const;
  std::vector<int64_t> peaks(ModuleOp module) const;
  bool selectionFits(ModuleOp module);
  double stepUs(ModuleOp module) const;
  std::vector<Change> changesAtPeak(ModuleOp module, unsigned rank) const;
  /// The (stage, microbatch)s whose dx and dw step 2 fused.
  llvm::DenseSet<Key> fused;

  FailureOr<bool> bound(ModuleOp module);
  int64_t overshootAfterMove(ModuleOp module, unsigned rank);
  llvm::DenseSet<Key> replayableIn(ProgramOp program) const;
  std::vector<Deferral>
  deferrals(ModuleOp module, const llvm::DenseMap<Operation *, double> &waits,
            const llvm::DenseMap<Operation *, double> &criticalStarts) const;
  unsigned deferIntoIdleTime(ModuleOp module);
  void runAfterChoice(ModuleOp module);
  double placedStepUs(ModuleOp module, ModuleOp source);
};
} // namespace

int64_t BoundWeightDeferralPass::peakOf(ProgramOp program) const {
  return computeActivationProfile(collectActivationLifetimes(program), costs)
      .peak();
}

std::vector<int64_t> BoundWeightDeferralPass::peaks(ModuleOp module) const {
  std::vector<int64_t> result;
  for (ProgramOp program : getSchedule(module).getBody().getOps<ProgramOp>())
    result.push_back(peakOf(program));
  return result;
}

/// Whether hpr-select-checkpoints finds a choice within the budget on the
/// schedule as it stands: run on a copy nested in `module` for the time it
/// takes, its diagnostics dropped.
bool BoundWeightDeferralPass::selectionFits(ModuleOp module) {
  OpBuilder builder = OpBuilder::atBlockEnd(module.getBody());
  auto copy = cast<ModuleOp>(builder.clone(*module));
  HPRSelectCheckpointsOptions select;
  select.budget = budget;
  OpPassManager pm(ModuleOp::getOperationName());
  pm.addPass(createHPRSelectCheckpoints(select));
  LogicalResult result = [&] {
    ScopedDiagnosticHandler quiet(&getContext(),
                                  [](Diagnostic &) { return success(); });
    return runPipeline(pm, copy);
  }();
  copy.erase();
  return succeeded(result);
}

/// The simulated step with each checkpointed (stage, microbatch)'s replay
/// where jit places it (withJitRecomputes).
double BoundWeightDeferralPass::stepUs(ModuleOp module) const {
  std::vector<ProgramActivations> programs;
  for (ProgramOp program : getSchedule(module).getBody().getOps<ProgramOp>())
    programs.push_back(collectActivationLifetimes(program));
  sched::Schedule timeline =
      withJitRecomputes(extractSchedule(module, costs), programs);
  llvm::DenseSet<Key> checkpointed;
  for (const ProgramActivations &program : programs)
    for (const ActivationLifetime &lifetime : program.lifetimes)
      if (runsCheckpointed(lifetime.forward, costs))
        checkpointed.insert({lifetime.stage, lifetime.microbatch});
  for (std::vector<sched::Action> &cells : timeline.ranks)
    for (sched::Action &cell : cells)
      if (cell.kind == sched::ActionKind::Recompute)
        cell.durationUs = checkpointed.contains({cell.stage, cell.microbatch})
                              ? costs[cell.stage].recomputeUs
                              : 0.0;
  llvm::Expected<sched::SimulationResult> result = simulateTimeline(timeline);
  if (!result) {
    llvm::consumeError(result.takeError());
    return std::numeric_limits<double>::infinity();
  }
  return result->makespan;
}

/// Whether the dw of `lifetime` may replay for itself (`weight_replay`): its
/// forward runs checkpointed under `costs`, the dw reads some of the replay,
/// no region of the stage runs selective (its replay runs once), and it is
/// not marked yet.
static bool mayReplayForWeight(const ActivationLifetime &lifetime,
                               const std::vector<StageCost> &costs) {
  return runsCheckpointed(lifetime.forward, costs) &&
         costs[lifetime.stage].weightRecomputedBytes > 0 &&
         !costs[lifetime.stage].replaysOnce && !lifetime.weightReplay;
}

/// The changes that lower what `rank` holds at its (first) peak position:
/// each dw pending there run right before it, or fused with its dx when the
/// dx is at or before the peak, or marked `weight_replay` when the dx is
/// before the peak and the dw after it (its replay is dropped in between). A
/// change that would reorder a stage's dws is left out.
std::vector<Change>
BoundWeightDeferralPass::changesAtPeak(ModuleOp module, unsigned rank) const {
  ProgramOp program = programOf(module, rank);
  ProgramActivations activations = collectActivationLifetimes(program);
  ActivationProfile profile = computeActivationProfile(activations, costs);
  unsigned peakPos =
      std::max_element(profile.live.begin(), profile.live.end()) -
      profile.live.begin();
  llvm::DenseSet<Key> replayable;
  for (const ActivationLifetime &lifetime : activations.lifetimes)
    if (weightReplay && lifetime.releasedAfterDx &&
        mayReplayForWeight(lifetime, costs))
      replayable.insert({lifetime.stage, lifetime.microbatch});
  SplitBackwards split = collectSplitBackwards(program);
  std::vector<Change> changes;
  for (auto &[key, positions] : split.positions) {
    auto [inputPos, weightPos] = positions;
    if (inputPos > peakPos || weightPos < peakPos ||
        !isMovable(split.ops[inputPos]) || !isMovable(split.ops[weightPos]))
      continue;
    Change change{rank, key.first, key.second};
    change.peakPos = peakPos;
    unsigned before = insertionPoint(split.ops, peakPos);
    if (inputPos < before && before < weightPos &&
        !stageGradientBetween(split.ops, key.first, before, weightPos)) {
      change.before = before;
      change.landsReplay =
          cast<BackwardWeightOp>(split.ops[weightPos]).getWeightReplay();
      changes.push_back(change);
      change.landsReplay = false;
    }
    if (!stageGradientBetween(split.ops, key.first, inputPos + 1, weightPos)) {
      change.kind = Change::Kind::Fuse;
      changes.push_back(change);
    }
    // The dw stays where it is: no order changes.
    if (inputPos < peakPos && peakPos < weightPos && replayable.contains(key)) {
      change.kind = Change::Kind::WeightReplay;
      changes.push_back(change);
    }
  }
  // Positions come from a hash map: a stable order keeps ties reproducible.
  // Weight replays come last (BoundWeightDeferralPass::bound prices them
  // only where the others lengthen the step).
  llvm::sort(changes, [](const Change &a, const Change &b) {
    auto replays = [](const Change &change) {
      return change.kind == Change::Kind::WeightReplay;
    };
    return std::make_tuple(replays(a), a.stage, a.microbatch, a.kind) <
           std::make_tuple(replays(b), b.stage, b.microbatch, b.kind);
  });
  return changes;
}

void BoundWeightDeferralPass::runOnOperation() {
  ModuleOp module = getOperation();
  auto models = llvm::to_vector(module.getOps<ModelOp>());
  auto schedules = llvm::to_vector(module.getOps<ScheduleOp>());
  if (models.size() != 1 || schedules.size() != 1) {
    emitError(module.getLoc()) << "hpr-bound-weight-deferral: expected one "
                                  "hpr.model and one hpr.schedule";
    return signalPassFailure();
  }
  if (budget <= 0) {
    emitError(module.getLoc())
        << "hpr-bound-weight-deferral: budget must be > 0 bytes, got "
        << static_cast<int64_t>(budget);
    return signalPassFailure();
  }
  bool planned = false;
  module.walk([&](SessionOp) { planned = true; });
  if (planned) {
    emitError(module.getLoc()) << "hpr-bound-weight-deferral: runs before "
                                  "hpr-assign-sessions";
    return signalPassFailure();
  }
  if (afterChoice && leastMemory) {
    emitError(module.getLoc())
        << "hpr-bound-weight-deferral: after-choice prices the checkpoints "
           "the module marks; it does not take least-memory";
    return signalPassFailure();
  }
  costs = leastMemory ? computeStageCosts(models.front(),
                                          [](RegionOp region) {
                                            return isCheckpointCandidate(region)
                                                       ? RegionCheckpoint::Full
                                                       : RegionCheckpoint::None;
                                          })
                      : computeStageCosts(models.front());

  fused.clear();
  if (afterChoice)
    return runAfterChoice(module);
  if (fuseAll) {
    unsigned rank = 0;
    for (ProgramOp program :
         llvm::to_vector(getSchedule(module).getBody().getOps<ProgramOp>())) {
      llvm::SmallVector<Key> keys = fuseEveryPair(program, markFused);
      fused.insert(keys.begin(), keys.end());
      numFusedBackwards += keys.size();
      if (!keys.empty())
        recordOrder(module, rank);
      ++rank;
    }
  }
  // With least-memory the schedule is bounded only where no checkpoint
  // choice fits it as it stands.
  if (leastMemory && selectionFits(module))
    return;
  FailureOr<bool> bounded = bound(module);
  if (failed(bounded))
    return signalPassFailure();
  // Where the schedule was bounded, what the budget leaves goes back to
  // idle time; a schedule within it keeps its own dw placement.
  if (*bounded)
    deferIntoIdleTime(module);
}

/// Step 6 of Passes.td: where the least-memory run fused pairs (its `fused`
/// marks), step 5 again with the checkpoints the module marks; every mark
/// goes.
void BoundWeightDeferralPass::runAfterChoice(ModuleOp module) {
  module.walk([&](BackwardOp backward) {
    if (!backward.getFused())
      return;
    fused.insert({backward.getStageIndex(), backward.getMicrobatchIndex()});
    backward.setFused(false);
  });
  if (fused.empty())
    return;
  // With `bubble`, the schedule as it stands, to return to where the moves,
  // priced with jit replays, leave bubble placement a slower plan.
  OwningOpRef<ModuleOp> unchanged;
  if (bubble)
    unchanged = module.clone();
  uint64_t weightReplaysBefore = numWeightReplays;
  if (!deferIntoIdleTime(module) || !bubble)
    return;
  if (placedStepUs(module, *unchanged) < placedStepUs(module, module)) {
    restoreSchedule(module, *unchanged);
    numDeferredAfterChoice = 0;
    numWeightReplays = weightReplaysBefore;
  }
}

/// The simulated step of `source`'s schedule with its replays placed as the
/// pipeline will (sessions, jit, bubble within the budget, clears), on a
/// copy nested in `module` for the time it takes; infinity where that plan
/// exceeds the budget or a pass fails on the copy (its diagnostics dropped).
double BoundWeightDeferralPass::placedStepUs(ModuleOp module, ModuleOp source) {
  OpBuilder builder = OpBuilder::atBlockEnd(module.getBody());
  auto copy = cast<ModuleOp>(builder.clone(*source));
  OpPassManager pm(ModuleOp::getOperationName());
  buildPlacementOnCopyPasses(pm, budget);
  double step = std::numeric_limits<double>::infinity();
  LogicalResult placed = [&] {
    ScopedDiagnosticHandler quiet(&getContext(),
                                  [](Diagnostic &) { return success(); });
    return runPipeline(pm, copy);
  }();
  if (succeeded(placed)) {
    llvm::Expected<std::optional<double>> simulated =
        simulatePlacedCopy(copy, budget);
    if (!simulated)
      llvm::consumeError(simulated.takeError());
    else if (*simulated)
      step = **simulated;
  }
  copy.erase();
  return step;
}

/// Steps 2-4 of Passes.td: runs dws earlier, or fuses them with their dxs,
/// until every rank fits the budget; fails naming a rank that cannot, else
/// says whether it changed the schedule.
FailureOr<bool> BoundWeightDeferralPass::bound(ModuleOp module) {
  bool changed = false;
  // The step as the schedule stands: simulated when first asked, then the
  // step the last change was priced at.
  std::optional<double> currentUs;
  // Greedy, on the rank that peaks highest: every change lowers what that
  // rank holds at its peak and raises nothing anywhere (a lifetime only
  // ends earlier), so each round makes progress and dws only move up.
  for (;;) {
    // With least-memory: while the least hpr-select-checkpoints starts from
    // exceeds the budget, on that rank; then while its search still finds no
    // choice, on the rank that peaks highest with every candidate full.
    std::vector<int64_t> rankPeaks =
        leastMemory ? leastCheckpointPeaks(module) : peaks(module);
    auto worst = std::max_element(rankPeaks.begin(), rankPeaks.end());
    if (worst == rankPeaks.end())
      return changed;
    if (*worst <= budget) {
      if (!leastMemory || selectionFits(module))
        return changed;
      rankPeaks = peaks(module);
      worst = std::max_element(rankPeaks.begin(), rankPeaks.end());
    }
    unsigned rank = worst - rankPeaks.begin();
    int64_t rankPeak = peakOf(programOf(module, rank));
    std::optional<Priced> best;
    // A weight replay adds a replay and moves nothing, so its step is at
    // least the step as it stands: it is priced only where every move and
    // fusion lengthens the step (they come first).
    for (const Change &change : changesAtPeak(module, rank)) {
      if (change.kind == Change::Kind::WeightReplay && best) {
        if (!currentUs)
          currentUs = stepUs(module);
        if (best->stepUs <= *currentUs)
          continue;
      }
      Priced priced = priceChanged(module, rank, change, [&] {
        ActivationProfile profile = computeActivationProfile(
            collectActivationLifetimes(programOf(module, rank)), costs);
        bool progresses = !change.landsReplay ||
                          (profile.live[change.before] < rankPeak &&
                           profile.live[change.peakPos + 1] < rankPeak);
        return Priced{stepUs(module), profile.peak(), change, progresses};
      });
      if (!priced.progresses)
        continue;
      if (!best || std::tie(priced.stepUs, priced.peak) <
                       std::tie(best->stepUs, best->peak))
        best = priced;
    }
    if (!best) {
      // hpr-select-checkpoints, which follows with least-memory, may reach
      // less (microbatches made plain) or name the least it finds.
      if (leastMemory)
        return changed;
      emitError(module.getLoc())
          << "hpr-bound-weight-deferral: no dw placement fits budget "
          << static_cast<int64_t>(budget) << " bytes: rank " << rank
          << " holds " << *worst
          << " bytes of activations at a peak where no dw is pending, the "
             "least this schedule reaches by running dws earlier";
      return failure();
    }
    apply(module, best->change, markFused);
    currentUs = best->stepUs;
    changed = true;
    recordOrder(module, rank);
    Key key{best->change.stage, best->change.microbatch};
    switch (best->change.kind) {
    case Change::Kind::Move:
      ++numMovedWeights;
      break;
    case Change::Kind::Fuse:
      fused.insert(key);
      ++numFusedBackwards;
      break;
    case Change::Kind::WeightReplay:
      ++numWeightReplays;
      break;
    }
  }
}

/// By how much `rank` (the only one a move changes) exceeds the budget (<= 0:
/// it fits): its peak, with least-memory the least hpr-select-checkpoints
/// starts from.
int64_t BoundWeightDeferralPass::overshootAfterMove(ModuleOp module,
                                                    unsigned rank) {
  int64_t peak = leastMemory ? leastCheckpointPeaks(module)[rank]
                             : peakOf(programOf(module, rank));
  return peak - static_cast<int64_t>(budget);
}

/// The (stage, microbatch)s of `program` whose dw a move into idle time may
/// mark `weight_replay`: split after its dx, or a pair step 2 fused.
llvm::DenseSet<Key>
BoundWeightDeferralPass::replayableIn(ProgramOp program) const {
  llvm::DenseSet<Key> keys;
  for (const ActivationLifetime &lifetime :
       collectActivationLifetimes(program).lifetimes) {
    Key key{lifetime.stage, lifetime.microbatch};
    if ((lifetime.releasedAfterDx || fused.contains(key)) &&
        mayReplayForWeight(lifetime, costs))
      keys.insert(key);
  }
  return keys;
}

/// Every dw that may move before an op in `waits` (or last, where the
/// program is in `waits`) or right after a send: after its dx, across
/// no other weight gradients of its stage, never inside an OVERLAP_F_B pair
/// or between batched transfers. `criticalStarts` holds the ops on a
/// critical path, with their simulated start: a move right after the send
/// of its own dx's gradient, where that dx is one, says so.
std::vector<Deferral> BoundWeightDeferralPass::deferrals(
    ModuleOp module, const llvm::DenseMap<Operation *, double> &waits,
    const llvm::DenseMap<Operation *, double> &criticalStarts) const {
  std::vector<Deferral> result;
  unsigned rank = 0;
  for (ProgramOp program : getSchedule(module).getBody().getOps<ProgramOp>()) {
    std::vector<Operation *> ops;
    for (Operation &op : program.getBody().getOps())
      ops.push_back(&op);
    SplitBackwards split = collectSplitBackwards(program);
    for (unsigned at = 0; at < ops.size(); ++at) {
      // The dw at `at` after its dx at `after`, or a fused backward at both.
      auto action = dyn_cast<ActionOpInterface>(ops[at]);
      if (!action)
        continue;
      Key key{action.getStageIndex(), action.getMicrobatchIndex()};
      unsigned after = at;
      bool isSplit = isa<BackwardOp>(ops[at]);
      if (isSplit && !fused.contains(key))
        continue;
      if (!isSplit) {
        auto it = split.positions.find(key);
        if (!isa<BackwardWeightOp>(ops[at]) || it == split.positions.end() ||
            !isMovable(ops[it->second.first]) || !isMovable(ops[at]))
          continue;
        after = it->second.first;
      }
      for (unsigned pos = after + 1; pos <= ops.size(); ++pos) {
        Operation *waited = pos < ops.size() ? ops[pos] : program;
        bool sent = isa<SendFOp, SendBOp>(ops[pos - 1]);
        if (!(sent || waits.contains(waited)) || pos == at || pos == at + 1 ||
            insertionPoint(ops, pos) != pos)
          continue;
        if (pos > at ? stageGradientBetween(ops, key.first, at + 1, pos)
                     : stageGradientBetween(ops, key.first, pos, at))
          continue;
        Deferral deferral{rank, key, isSplit, pos, waits.lookup(waited)};
        deferral.pastReduce =
            pos > at && stageReduceBetween(ops, key.first, at + 1, pos);
        auto send = dyn_cast<SendBOp>(ops[pos - 1]);
        auto critical = criticalStarts.find(ops[after]);
        if (send && send.getStageIndex() == key.first &&
            send.getMicrobatchIndex() == key.second &&
            critical != criticalStarts.end()) {
          deferral.afterCriticalSend = true;
          deferral.dxStartUs = critical->second;
        }
        result.push_back(deferral);
      }
    }
    ++rank;
  }
  return result;
}

/// Step 5 of Passes.td: moves dws into idle time, one a round, the
/// candidate of any rank that shortens the simulated step most while its
/// rank fits the budget: a dw runs before an op its rank waits for (in the
/// timeline without replays), or a dx and dw that step 2 fused split again
/// with the dw there; where the move does not fit, the same move with the
/// dw replaying for itself (`weight_replay`), if that can take off what it
/// overshoots.
unsigned BoundWeightDeferralPass::deferIntoIdleTime(ModuleOp module) {
  // With least-memory, what step 4 left, to return to (below).
  OwningOpRef<ModuleOp> unchanged;
  if (leastMemory)
    unchanged = module.clone();
  double step = stepUs(module);
  unsigned rounds = 0, weightReplays = 0;
  // Each rank's dws a move may mark weight_replay, found when first asked
  // (a walk of the program) and again after a move on that rank.
  std::vector<std::optional<llvm::DenseSet<Key>>> replayable(
      getSchedule(module).getNumRanks());
  for (;; ++rounds) {
    ModuleSchedule cells = extractSchedule(module, costs);
    llvm::Expected<sched::SimulationResult> simulated =
        simulateTimeline(cells.schedule);
    if (!simulated) {
      llvm::consumeError(simulated.takeError());
      break;
    }
    // Keyed by the op waited for; a program's end by the program. And the
    // ops on a critical path, with their start.
    llvm::DenseMap<Operation *, double> waits, criticalStarts;
    for (auto [timeline, firstOps, program] :
         llvm::zip(simulated->timelines, cells.cellOps,
                   getSchedule(module).getBody().getOps<ProgramOp>())) {
      double end = 0.0;
      for (unsigned k = 0; k < timeline.size(); ++k) {
        if (timeline[k].start > end + 1e-9)
          waits[firstOps[k]] = timeline[k].start - end;
        end = timeline[k].end;
        if (timeline[k].slack <= sched::kCriticalSlackUs)
          criticalStarts[firstOps[k]] = timeline[k].start;
      }
      waits[program] = simulated->makespan - end;
    }
    // The longest waits first (right after a send counts as none); after
    // the choice (step 6) the moves right after a critical dx's send come
    // before them, earliest dx first. A bounded number priced a round, so
    // that a large schedule plans in about the time step 2 takes.
    std::vector<Deferral> candidates = deferrals(module, waits, criticalStarts);
    llvm::stable_sort(candidates, [&](const Deferral &a, const Deferral &b) {
      bool aSends = afterChoice && a.afterCriticalSend;
      bool bSends = afterChoice && b.afterCriticalSend;
      if (aSends != bSends)
        return aSends;
      return aSends ? a.dxStartUs < b.dxStartUs : a.idleUs > b.idleUs;
    });
    candidates.resize(std::min<size_t>(candidates.size(), kPricedPerRound));
    llvm::erase_if(candidates, [](const Deferral &deferral) {
      return deferral.pastReduce;
    });
    std::optional<std::pair<double, Deferral>> best;
    for (Deferral deferral : candidates) {
      // The step, or what the rank then exceeds the budget by.
      auto price = [&] {
        return priceChanged(module, deferral.rank, deferral,
                            [&]() -> std::variant<double, int64_t> {
                              if (int64_t over =
                                      overshootAfterMove(module, deferral.rank);
                                  over > 0)
                                return over;
                              return stepUs(module);
                            });
      };
      std::variant<double, int64_t> priced = price();
      // Dropping the replay after the dx takes off at most what the dw
      // reads of it.
      auto *over = std::get_if<int64_t>(&priced);
      if (over && weightReplay &&
          *over <= costs[deferral.key.first].weightRecomputedBytes) {
        std::optional<llvm::DenseSet<Key>> &keys = replayable[deferral.rank];
        if (!keys)
          keys = replayableIn(programOf(module, deferral.rank));
        if (keys->contains(deferral.key)) {
          deferral.weightReplay = true;
          priced = price();
        }
      }
      auto *candidate = std::get_if<double>(&priced);
      if (candidate && *candidate < (best ? best->first : step) * (1 - 1e-9))
        best = {*candidate, deferral};
    }
    if (!best)
      break;
    apply(module, best->second);
    recordOrder(module, best->second.rank);
    replayable[best->second.rank].reset();
    step = best->first;
    weightReplays += best->second.weightReplay;
  }
  // With least-memory, hpr-select-checkpoints must still find a choice.
  if (rounds && leastMemory && !selectionFits(module)) {
    restoreSchedule(module, *unchanged);
    return 0;
  }
  (afterChoice ? numDeferredAfterChoice : numDeferredWeights) += rounds;
  numWeightReplays += weightReplays;
  return rounds;
}
