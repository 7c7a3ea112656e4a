//===- SelectCheckpoints.cpp - Choose what to checkpoint under a budget ---===//
//
// Decides, before sessions exist, how each region is checkpointed (none,
// full or selective; the same choice for every microbatch of a stage) and
// which microbatches of a checkpointed stage run plainly (`no_checkpoint`),
// so that every rank's activation peak under jit recompute
// (ActivationModel.h) stays within the budget and the simulated step time is
// as short as that allows; with `bubble`, as short as it runs once
// hpr-prefetch-into-bubbles has placed its replays (the contenders are
// planned on a copy of the module). The algorithm is in Passes.td and
// docs/planning.md.
//
//===----------------------------------------------------------------------===//

#include "LeastCheckpointMemory.h"
#include "PlacementOnCopy.h"
#include "hpr/Analysis/ActivationModel.h"
#include "hpr/Analysis/Timeline.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/DenseSet.h"

#include <limits>

namespace mlir::hpr {
#define GEN_PASS_DEF_HPRSELECTCHECKPOINTS
#include "hpr/Transforms/Passes.h.inc"
} // namespace mlir::hpr

using namespace mlir;
using namespace mlir::hpr;

namespace {

using Key = std::pair<int64_t, int64_t>; // (stage, microbatch)

/// Most choices priced exhaustively (2^10: ten regions with two policies
/// each), and the most simulated cells that may take in all.
constexpr uint64_t kExhaustiveChoices = uint64_t(1) << 10;
constexpr size_t kExhaustiveCellSimulations = size_t(1) << 26;
/// Rounds of the search for the least memory (each may lower a rank's peak).
constexpr unsigned kLeastMemoryRounds = 4;
/// Most contenders planned with bubble placement to price them, and the most
/// schedule cells those plans may hold in all.
constexpr size_t kBubbleContenders = 24;
constexpr size_t kBubbleContenderCells = size_t(1) << 20;

/// A choice being priced: how each candidate region is checkpointed, and
/// which (stage, microbatch)s of checkpointed stages run plainly.
struct Choice {
  llvm::SmallVector<RegionCheckpoint> regions;
  llvm::DenseSet<Key> plain;

  bool operator==(const Choice &other) const {
    return regions == other.regions && plain == other.plain;
  }
};

/// A choice that fits, and its simulated step under jit recompute (time,
/// recomputes).
struct PricedChoice {
  std::pair<double, int64_t> cost;
  Choice choice;

  bool operator<(const PricedChoice &other) const { return cost < other.cost; }
};

/// The policies each candidate may take, in candidate order.
using PolicySets = std::vector<llvm::SmallVector<RegionCheckpoint, 3>>;

/// How many choices `policies` make (saturating).
uint64_t countChoices(const PolicySets &policies) {
  uint64_t n = 1;
  for (const auto &each : policies)
    n = n > std::numeric_limits<uint64_t>::max() / each.size()
            ? std::numeric_limits<uint64_t>::max()
            : n * each.size();
  return n;
}

/// What the search needs of the module, gathered once.
class Problem {
public:
  Problem(ModelOp model, ScheduleOp schedule, ModuleSchedule cells)
      : model(model), cells(std::move(cells)) {
    // A stage whose sessions replay again for their dw (decided before this
    // pass, by hpr-bound-weight-deferral) cannot run selective: that replay
    // reads the policy's saved outputs once (hpr.verify.weight-replay).
    llvm::DenseSet<int64_t> replayedForWeight;
    for (ProgramOp program : schedule.getBody().getOps<ProgramOp>())
      for (BackwardWeightOp weight :
           program.getBody().getOps<BackwardWeightOp>())
        if (weight.getWeightReplay())
          replayedForWeight.insert(weight.getStageIndex());
    for (StageOp stage : model.getBody().getOps<StageOp>())
      for (RegionOp region : stage.getBody().getOps<RegionOp>()) {
        bool candidate = isCheckpointCandidate(region);
        candidateOfRegion.push_back(candidate ? candidates.size() : -1);
        if (candidate) {
          candidates.push_back(region);
          // Selective needs measured costs (RegionOp::verify).
          policies.push_back({RegionCheckpoint::Full, RegionCheckpoint::None});
          if (region.getSelectiveReplayTimeUs() &&
              !replayedForWeight.contains(stage.getIndex()))
            policies.back().insert(policies.back().begin() + 1,
                                   RegionCheckpoint::Selective);
        }
      }
    for (ProgramOp program : schedule.getBody().getOps<ProgramOp>())
      programs.push_back(collectActivationLifetimes(program));
    // One simulation of it prices any choice.
    timeline = withJitRecomputes(this->cells, programs);
  }

  llvm::SmallVector<RegionOp> candidates;
  /// For each region of the model, in order: its index in `candidates`, or
  /// -1 (so that a choice can be written into a copy of the module).
  std::vector<int64_t> candidateOfRegion;
  /// Each candidate's policies, from least memory to most: full, selective
  /// where measured, none.
  PolicySets policies;
  std::vector<ProgramActivations> programs;

  std::vector<StageCost> costsOf(const Choice &choice) const {
    return computeStageCosts(model, [&](RegionOp region) {
      auto it = llvm::find(candidates, region);
      return it == candidates.end() ? RegionCheckpoint::None
                                    : choice.regions[it - candidates.begin()];
    });
  }

  static bool runsCheckpointed(const ActivationLifetime &lifetime,
                               const std::vector<StageCost> &costs,
                               const Choice &choice) {
    return costs[lifetime.stage].checkpointed &&
           !choice.plain.contains({lifetime.stage, lifetime.microbatch});
  }

  /// Each rank's activation peak under `choice`.
  std::vector<int64_t> peaks(const Choice &choice) const {
    std::vector<StageCost> costs = costsOf(choice);
    std::vector<int64_t> result;
    for (const ProgramActivations &program : programs)
      result.push_back(computeActivationProfile(
                           program, costs,
                           [&](const ActivationLifetime &lifetime) {
                             return runsCheckpointed(lifetime, costs, choice);
                           })
                           .peak());
    return result;
  }

  /// Simulated step time under `choice` with jit recompute, and how many
  /// recomputes that runs.
  std::pair<double, int64_t> stepTime(const Choice &choice) {
    std::vector<StageCost> costs = costsOf(choice);
    int64_t recomputes = 0;
    auto isCheckpointed = [&](int stage, int mb) {
      return costs[stage].checkpointed && !choice.plain.contains({stage, mb});
    };
    for (std::vector<sched::Action> &program : timeline.ranks)
      for (sched::Action &cell : program) {
        auto price = [&](sched::Action &action) {
          if (action.stage < 0)
            return;
          bool checkpointed = isCheckpointed(action.stage, action.microbatch);
          if (action.kind == sched::ActionKind::Recompute) {
            action.durationUs =
                checkpointed ? costs[action.stage].recomputeUs : 0.0;
            recomputes += checkpointed;
          } else {
            action.durationUs = actionDurationUs(
                action.kind, costs[action.stage], checkpointed);
          }
        };
        price(cell);
        for (sched::Action &part : cell.parts)
          price(part);
      }
    llvm::Expected<sched::SimulationResult> result = simulateTimeline(timeline);
    if (!result) {
      llvm::consumeError(result.takeError());
      return {std::numeric_limits<double>::infinity(), recomputes};
    }
    return {result->makespan, recomputes};
  }

  size_t numCells() const {
    size_t n = 0;
    for (const auto &program : timeline.ranks)
      n += program.size();
    return n;
  }

private:
  ModelOp model;
  ModuleSchedule cells;
  sched::Schedule timeline;
};

static int64_t maxOf(const std::vector<int64_t> &values) {
  return values.empty() ? 0 : *std::max_element(values.begin(), values.end());
}

/// The bytes limit of a refinement: the budget, or each rank's own peak
/// (never raise it: the search for the least memory).
using Limit = std::optional<int64_t>;

/// What the replay of checkpointed `lifetime` (placed jit: no pieces) holds
/// at position `p`, as computeActivationProfile counts it: the replay from
/// its recompute to its clear, of which, for a session its dx releases, only
/// what the dw reads after the dx (`replay_weight_bytes`), or nothing up to
/// the replay for a `weight_replay` dw and that from there.
static int64_t replayHeldAt(const StageCost &cost,
                            const ActivationLifetime &lifetime, unsigned p) {
  int64_t held = 0;
  if (lifetime.weightReplay && p >= lifetime.weightReplayPos &&
      p <= lifetime.replayEndPos)
    held += cost.weightRecomputedBytes;
  if (p < lifetime.replayBeginPos || p > lifetime.replayEndPos)
    return held;
  if (!lifetime.releasedAfterDx ||
      lifetime.firstConsumerPos >= lifetime.replayEndPos ||
      p <= lifetime.firstConsumerPos)
    return held + replayedBytesOf(cost, lifetime);
  return held + (lifetime.weightReplay ? 0 : cost.weightRecomputedBytes);
}

/// Makes microbatches of checkpointed stages plain, per rank and
/// shortest-lived first (their kept activations occupy the least time),
/// where every position they touch stays within `limit`; when `forTime`,
/// only where that saves the rank time (a plain forward and no replay
/// against a checkpointed forward). Durations only shrink, so the simulated
/// step time never grows.
static Choice refine(const Problem &problem, Choice choice, Limit limit,
                     bool forTime) {
  std::vector<StageCost> costs = problem.costsOf(choice);
  for (const ProgramActivations &program : problem.programs) {
    std::vector<int64_t> live =
        computeActivationProfile(program, costs,
                                 [&](const ActivationLifetime &lifetime) {
                                   return Problem::runsCheckpointed(
                                       lifetime, costs, choice);
                                 })
            .live;
    int64_t rankLimit = limit ? *limit : maxOf(live);
    std::vector<const ActivationLifetime *> order;
    for (const ActivationLifetime &lifetime : program.lifetimes)
      if (Problem::runsCheckpointed(lifetime, costs, choice) &&
          lifetime.hasConsumers)
        order.push_back(&lifetime);
    llvm::stable_sort(
        order, [](const ActivationLifetime *a, const ActivationLifetime *b) {
          return a->lastConsumerPos - a->forwardPos <
                 b->lastConsumerPos - b->forwardPos;
        });
    for (const ActivationLifetime *lifetime : order) {
      const StageCost &cost = costs[lifetime->stage];
      if (forTime &&
          cost.recomputeUs + cost.forwardUs - cost.plainForwardUs <= 0)
        continue;
      int64_t extra = cost.plainKeptBytes - cost.keptBytes;
      auto delta = [&](unsigned p) {
        return extra - replayHeldAt(cost, *lifetime, p);
      };
      bool fits = true;
      for (unsigned p = lifetime->forwardPos;
           fits && p <= lifetime->lastConsumerPos; ++p)
        fits = live[p] + delta(p) <= rankLimit;
      if (!fits)
        continue;
      for (unsigned p = lifetime->forwardPos; p <= lifetime->lastConsumerPos;
           ++p)
        live[p] += delta(p);
      choice.plain.insert({lifetime->stage, lifetime->microbatch});
    }
  }
  return choice;
}

struct SelectCheckpointsPass
    : public mlir::hpr::impl::HPRSelectCheckpointsBase<SelectCheckpointsPass> {
  using HPRSelectCheckpointsBase::HPRSelectCheckpointsBase;
  void runOnOperation() override;

  bool fits(const Problem &problem, const Choice &choice) const {
    return maxOf(problem.peaks(choice)) <= budget;
  }
  /// What the search found: the fastest choice within the budget, if any,
  /// and the least memory it saw (per rank).
  struct Found {
    std::optional<Choice> best;
    Choice least;
    std::vector<int64_t> leastPeaks;
    /// With `contend`, other choices that fit, to plan with placement: the
    /// fastest of the exhaustive search, or the greedy sweeps' choice after
    /// each of their last moves (at most kBubbleContenders of each).
    std::vector<PricedChoice> ranked, swept;
  };
  Found search(Problem &problem, const Choice &everything, bool contend);
  FailureOr<Choice> placeAndPrice(ModuleOp module, const Problem &problem,
                                  const Choice &everything, size_t trials,
                                  Found found);
  FailureOr<std::optional<double>>
  bubbleStepTime(ModuleOp module, const Problem &problem, const Choice &choice);
};
} // namespace

/// The least memory refinement finds from `start`: microbatches whose replay
/// on top of their kept input is where the rank peaks made plain, in rounds
/// while the peak falls.
static std::pair<Choice, std::vector<int64_t>>
leastMemory(const Problem &problem, Choice start) {
  Choice least = refine(problem, std::move(start), std::nullopt, false);
  std::vector<int64_t> peaks = problem.peaks(least);
  for (unsigned round = 1; round < kLeastMemoryRounds; ++round) {
    Choice lower = refine(problem, least, std::nullopt, false);
    std::vector<int64_t> lowerPeaks = problem.peaks(lower);
    if (maxOf(lowerPeaks) >= maxOf(peaks))
      break;
    least = std::move(lower);
    peaks = std::move(lowerPeaks);
  }
  return {std::move(least), std::move(peaks)};
}

/// The fastest choice within the budget: every choice of policies, each
/// refined, when few; else greedy sweeps.
SelectCheckpointsPass::Found
SelectCheckpointsPass::search(Problem &problem, const Choice &everything,
                              bool contend) {
  Found found;
  // Keeps the least memory seen, and falls back to it when nothing faster
  // fits (the time-driven refinement skips drops that save no time).
  auto considerLeast = [&](const Choice &subset) {
    auto [least, peaks] = leastMemory(problem, subset);
    if (found.leastPeaks.empty() || maxOf(peaks) < maxOf(found.leastPeaks)) {
      found.least = std::move(least);
      found.leastPeaks = std::move(peaks);
    }
  };
  auto done = [&]() -> Found {
    if (!found.best && maxOf(found.leastPeaks) <= budget)
      found.best = found.least;
    return std::move(found);
  };
  size_t k = problem.candidates.size();
  // Every choice among `policies`, each refined and priced by simulation:
  // the fastest that fits, if any; nothing when there are too many to price.
  auto exhaustive =
      [&](const PolicySets &policies) -> std::optional<std::optional<Choice>> {
    uint64_t numChoices = countChoices(policies);
    if (numChoices > kExhaustiveChoices ||
        problem.numCells() * numChoices > kExhaustiveCellSimulations)
      return std::nullopt;
    std::optional<Choice> best;
    std::pair<double, int64_t> bestCost;
    Choice subset = everything;
    for (uint64_t index = 0; index < numChoices; ++index) {
      // `index` in the mixed radix of the candidates' policy counts.
      uint64_t rest = index;
      for (size_t i = 0; i < k; ++i) {
        subset.regions[i] = policies[i][rest % policies[i].size()];
        rest /= policies[i].size();
      }
      considerLeast(subset);
      Choice choice = refine(problem, subset, budget.getValue(), true);
      if (!fits(problem, choice))
        continue;
      std::pair<double, int64_t> cost = problem.stepTime(choice);
      if (contend) {
        // Bounded: a choice's plain set may hold every microbatch.
        found.ranked.push_back({cost, choice});
        llvm::stable_sort(found.ranked);
        if (found.ranked.size() > kBubbleContenders)
          found.ranked.pop_back();
      }
      if (!best || cost < bestCost) {
        best = std::move(choice);
        bestCost = cost;
      }
    }
    return best;
  };
  if (std::optional<std::optional<Choice>> best =
          exhaustive(problem.policies)) {
    found.best = std::move(*best);
    return done();
  }
  // Greedy: move candidates to a policy that keeps more (full to selective,
  // selective or full to none) in order of the time a step saves per byte
  // kept on top, as long as the budget holds.
  considerLeast(everything);
  struct Move {
    size_t candidate;
    RegionCheckpoint to;
    double gainPerByte;
  };
  std::vector<Move> moves;
  for (size_t i = 0; i < k; ++i) {
    RegionOp region = problem.candidates[i];
    // What a microbatch of the region costs under `checkpoint`: its forward
    // and replay time, and the bytes its forward keeps.
    auto timeUs = [&](RegionCheckpoint checkpoint) {
      switch (checkpoint) {
      case RegionCheckpoint::None:
        return regionTimeUs(region, RegionTime::Forward);
      case RegionCheckpoint::Full:
        return regionTimeUs(region, RegionTime::CheckpointForward) +
               regionTimeUs(region, RegionTime::Replay);
      case RegionCheckpoint::Selective:
        return regionTimeUs(region, RegionTime::SelectiveForward) +
               regionTimeUs(region, RegionTime::SelectiveReplay);
      }
      llvm_unreachable("unknown region checkpoint");
    };
    auto keptBytes = [&](RegionCheckpoint checkpoint) -> int64_t {
      if (checkpoint == RegionCheckpoint::None)
        return region.getSavedBytes();
      return region.getInputBytes() +
             (checkpoint == RegionCheckpoint::Selective
                  ? region.getSelectiveSavedBytes().value_or(0)
                  : 0);
    };
    for (RegionCheckpoint to : problem.policies[i]) {
      if (to == RegionCheckpoint::Full)
        continue;
      // From the policy before it (policies run from least memory to most).
      RegionCheckpoint from =
          to == RegionCheckpoint::None && problem.policies[i].size() == 3
              ? RegionCheckpoint::Selective
              : RegionCheckpoint::Full;
      double gain = timeUs(from) - timeUs(to);
      if (gain <= 0) // keeps more and saves no time
        continue;
      moves.push_back({i, to,
                       gain / static_cast<double>(std::max<int64_t>(
                                  keptBytes(to) - keptBytes(from), 1))});
    }
  }
  llvm::stable_sort(moves, [](const Move &a, const Move &b) {
    return a.gainPerByte > b.gainPerByte;
  });
  // A move applies to a candidate whose policy keeps less than its target.
  auto memoryOrder = [](RegionCheckpoint checkpoint) {
    return checkpoint == RegionCheckpoint::Full        ? 0
           : checkpoint == RegionCheckpoint::Selective ? 1
                                                       : 2;
  };
  // One sweep over the moves `allowed`; the fitting choice it ends with.
  auto sweep = [&](auto allowed) -> std::optional<Choice> {
    Choice regions = everything;
    for (const Move &move : moves) {
      RegionCheckpoint &current = regions.regions[move.candidate];
      if (!allowed(move) || memoryOrder(current) >= memoryOrder(move.to))
        continue;
      RegionCheckpoint before = current;
      current = move.to;
      Choice refined = refine(problem, regions, budget.getValue(), true);
      if (!fits(problem, refined)) {
        current = before;
        continue;
      }
      if (contend) {
        if (found.swept.size() == kBubbleContenders)
          found.swept.erase(found.swept.begin());
        found.swept.push_back({problem.stepTime(refined), std::move(refined)});
      }
    }
    Choice choice = refine(problem, regions, budget.getValue(), true);
    if (!fits(problem, choice))
      return std::nullopt;
    return choice;
  };
  found.best = sweep([](const Move &) { return true; });
  // With selective in play, what none and full alone give too (the search
  // the model without selective costs gets: exhaustive where that is small
  // enough), so that the third policy never makes the answer slower. Its
  // least memory too: a selective replay allocates less than a full one.
  PolicySets twoPolicies(k, {RegionCheckpoint::Full, RegionCheckpoint::None});
  if (twoPolicies != problem.policies) {
    Choice selective = everything;
    for (size_t i = 0; i < k; ++i)
      if (problem.policies[i].size() == 3)
        selective.regions[i] = RegionCheckpoint::Selective;
    considerLeast(selective);
    std::optional<std::optional<Choice>> exact = exhaustive(twoPolicies);
    std::optional<Choice> other =
        exact ? std::move(*exact) : sweep([](const Move &move) {
          return move.to != RegionCheckpoint::Selective;
        });
    if (other && (!found.best ||
                  problem.stepTime(*other) < problem.stepTime(*found.best)))
      found.best = std::move(other);
  }
  return done();
}

namespace {
/// What writeChoice marked.
struct WrittenChoice {
  unsigned checkpointed = 0, selective = 0, plain = 0;
};
} // namespace

/// Marks the regions of `module`'s model (the pass's module, or a copy of it:
/// regions are matched by position) and its plain forwards as `choice` says.
static WrittenChoice writeChoice(ModuleOp module, const Problem &problem,
                                 const Choice &choice) {
  WrittenChoice written;
  size_t index = 0;
  for (ModelOp model : module.getOps<ModelOp>())
    for (StageOp stage : model.getBody().getOps<StageOp>())
      for (RegionOp region : stage.getBody().getOps<RegionOp>()) {
        int64_t candidate = problem.candidateOfRegion[index++];
        RegionCheckpoint checkpoint =
            candidate < 0 ? RegionCheckpoint::None : choice.regions[candidate];
        region.setCheckpoint(checkpoint != RegionCheckpoint::None);
        region.setSelective(checkpoint == RegionCheckpoint::Selective);
        written.checkpointed += checkpoint != RegionCheckpoint::None;
        written.selective += checkpoint == RegionCheckpoint::Selective;
      }
  std::vector<StageCost> costs = problem.costsOf(choice);
  for (ScheduleOp schedule : module.getOps<ScheduleOp>())
    schedule.walk([&](ForwardOp forward) {
      Key key{forward.getStageIndex(), forward.getMicrobatchIndex()};
      if (costs[key.first].checkpointed && choice.plain.contains(key)) {
        forward.setNoCheckpoint(true);
        ++written.plain;
      }
    });
  return written;
}

/// The simulated step of `choice` with its replays placed as the pipeline
/// will (assign sessions, jit, bubble within the budget, clears, unshards),
/// on a copy of `module` nested in it for the time it takes: none when the
/// placed plan exceeds the budget; failure, with the passes' diagnostics,
/// when they fail on the copy (they would on the module too).
FailureOr<std::optional<double>>
SelectCheckpointsPass::bubbleStepTime(ModuleOp module, const Problem &problem,
                                      const Choice &choice) {
  OpBuilder builder = OpBuilder::atBlockEnd(module.getBody());
  auto copy = cast<ModuleOp>(builder.clone(*module));
  writeChoice(copy, problem, choice);
  OpPassManager pm(ModuleOp::getOperationName());
  buildPlacementOnCopyPasses(pm, budget);
  FailureOr<std::optional<double>> step = failure();
  if (succeeded(runPipeline(pm, copy))) {
    llvm::Expected<std::optional<double>> placed =
        simulatePlacedCopy(copy, budget);
    if (placed)
      step = *placed;
    else
      emitError(module.getLoc())
          << "hpr-select-checkpoints: cannot simulate a contender: "
          << llvm::toString(placed.takeError());
  }
  copy.erase();
  return step;
}

/// How many contenders step 5 plans with placement (Passes.td).
static size_t bubbleTrials(const Problem &problem) {
  return std::clamp<size_t>(kBubbleContenderCells /
                                std::max<size_t>(problem.numCells(), 1),
                            1, kBubbleContenders);
}

/// Step 5 (Passes.td): of the first `trials` contenders that fit, the one
/// whose placed plan is fastest; the jit-priced best on ties.
FailureOr<Choice> SelectCheckpointsPass::placeAndPrice(ModuleOp module,
                                                       const Problem &problem,
                                                       const Choice &everything,
                                                       size_t trials,
                                                       Found found) {
  // In order of preference: the best under jit, every region full (what
  // `--checkpoint all` places), then by step under jit, each followed by
  // itself without plain microbatches (which may or may not fit: a plain
  // microbatch replays nothing).
  std::vector<Choice> order{*found.best, everything};
  std::vector<PricedChoice> contenders = std::move(found.ranked);
  llvm::append_range(contenders, found.swept);
  llvm::stable_sort(contenders);
  for (PricedChoice &contender : contenders) {
    Choice bare{contender.choice.regions, {}};
    order.push_back(std::move(contender.choice));
    order.push_back(std::move(bare));
  }
  std::vector<const Choice *> tried;
  const Choice *best = &order.front();
  std::optional<double> bestStep;
  for (const Choice &choice : order) {
    if (tried.size() == trials)
      break;
    if (llvm::any_of(tried,
                     [&](const Choice *seen) { return *seen == choice; }) ||
        !fits(problem, choice))
      continue;
    tried.push_back(&choice);
    ++numBubbleContenders;
    FailureOr<std::optional<double>> step =
        bubbleStepTime(module, problem, choice);
    if (failed(step))
      return failure();
    if (*step && (!bestStep || **step < *bestStep)) {
      best = &choice;
      bestStep = *step;
    }
  }
  return *best;
}

std::vector<int64_t> mlir::hpr::leastCheckpointPeaks(ModuleOp module) {
  Problem problem(getModel(module), getSchedule(module),
                  extractSchedule(module));
  Choice everything;
  everything.regions.assign(problem.candidates.size(), RegionCheckpoint::Full);
  return leastMemory(problem, std::move(everything)).second;
}

void SelectCheckpointsPass::runOnOperation() {
  ModuleOp module = getOperation();
  auto models = llvm::to_vector(module.getOps<ModelOp>());
  auto schedules = llvm::to_vector(module.getOps<ScheduleOp>());
  if (models.size() != 1 || schedules.size() != 1) {
    emitError(module.getLoc())
        << "hpr-select-checkpoints: expected one hpr.model "
           "and one hpr.schedule";
    return signalPassFailure();
  }
  if (budget <= 0) {
    emitError(module.getLoc())
        << "hpr-select-checkpoints: budget must be > 0 bytes, "
           "got "
        << static_cast<int64_t>(budget);
    return signalPassFailure();
  }
  bool planned = false;
  module.walk([&](Operation *op) {
    planned |= isa<SessionOp>(op) ||
               (isa<ForwardOp>(op) && cast<ForwardOp>(op).getNoCheckpoint());
  });
  if (planned) {
    emitError(module.getLoc()) << "hpr-select-checkpoints: runs before "
                                  "hpr-assign-sessions, once";
    return signalPassFailure();
  }
  ModelOp model = models.front();
  Problem problem(model, schedules.front(), extractSchedule(module));

  Choice everything, nothing;
  everything.regions.assign(problem.candidates.size(), RegionCheckpoint::Full);
  nothing.regions.assign(problem.candidates.size(), RegionCheckpoint::None);
  Choice choice = nothing;
  if (!fits(problem, nothing)) {
    // Step 5 compares contenders only when it may plan two or more; the
    // search then keeps them.
    size_t trials = bubble ? bubbleTrials(problem) : 0;
    Found found = search(problem, everything, trials >= 2);
    if (!found.best) {
      const std::vector<int64_t> &peaks = found.leastPeaks;
      size_t rank =
          std::max_element(peaks.begin(), peaks.end()) - peaks.begin();
      emitError(module.getLoc())
          << "hpr-select-checkpoints: no checkpoint choice fits budget "
          << static_cast<int64_t>(budget)
          << " bytes; the smallest feasible budget found is " << maxOf(peaks)
          << " bytes (rank " << rank << ")";
      return signalPassFailure();
    }
    if (trials < 2) {
      choice = std::move(*found.best);
    } else {
      FailureOr<Choice> placed =
          placeAndPrice(module, problem, everything, trials, std::move(found));
      if (failed(placed))
        return signalPassFailure();
      choice = std::move(*placed);
    }
  }

  WrittenChoice written = writeChoice(module, problem, choice);
  numCheckpointedRegions += written.checkpointed;
  numSelectiveRegions += written.selective;
  numPlainMicrobatches += written.plain;
}
