//===- SelectCheckpoints.cpp - Choose what to checkpoint under a budget ---===//
//
// Decides, before sessions exist, how each region is checkpointed (none,
// full or selective; the same choice for every microbatch of a stage) and
// which microbatches of a
// checkpointed stage run plainly (`no_checkpoint`), so that every rank's
// activation peak under jit recompute (ActivationModel.h) stays within the
// budget and the simulated step time is as short as that allows. The
// algorithm is in Passes.td and docs/planning.md.
//
//===----------------------------------------------------------------------===//

#include "hpr/Analysis/ActivationModel.h"
#include "hpr/Analysis/Timeline.h"
#include "hpr/Transforms/Passes.h"

#include "llvm/ADT/DenseSet.h"

#include <numeric>

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

/// A choice being priced: how each candidate region is checkpointed, and
/// which (stage, microbatch)s of checkpointed stages run plainly.
struct Choice {
  llvm::SmallVector<RegionCheckpoint> regions;
  llvm::DenseSet<Key> plain;
};

/// A region's replay time under `checkpoint` (Full or Selective).
double replayUs(RegionOp region, RegionCheckpoint checkpoint) {
  return regionTimeUs(region, checkpoint == RegionCheckpoint::Selective
                                  ? RegionTime::SelectiveReplay
                                  : RegionTime::Replay);
}

/// What the search needs of the module, gathered once.
class Problem {
public:
  Problem(ModelOp model, ScheduleOp schedule, ModuleSchedule cells)
      : model(model), cells(std::move(cells)) {
    for (StageOp stage : model.getBody().getOps<StageOp>())
      for (RegionOp region : stage.getBody().getOps<RegionOp>())
        if (!region.getNonCheckpointable() &&
            region.getSavedBytes() > region.getInputBytes()) {
          candidates.push_back(region);
          // Selective needs measured costs (RegionOp::verify).
          policies.push_back({RegionCheckpoint::Full, RegionCheckpoint::None});
          if (region.getSelectiveReplayTimeUs())
            policies.back().insert(policies.back().begin() + 1,
                                   RegionCheckpoint::Selective);
        }
    for (ProgramOp program : schedule.getBody().getOps<ProgramOp>())
      programs.push_back(collectActivationLifetimes(program));
    buildTimelineTemplate();
  }

  llvm::SmallVector<RegionOp> candidates;
  /// Each candidate's policies, from least memory to most: full, selective
  /// where measured, none.
  std::vector<llvm::SmallVector<RegionCheckpoint, 3>> policies;
  std::vector<ProgramActivations> programs;

  std::vector<StageCost> costsOf(const Choice &choice) const {
    return computeStageCosts(model, [&](RegionOp region) {
      auto it = llvm::find(candidates, region);
      return it == candidates.end() ? RegionCheckpoint::None
                                    : choice.regions[it - candidates.begin()];
    });
  }

  /// How many choices the candidates' policies make (saturating).
  uint64_t numChoices() const {
    uint64_t n = 1;
    for (const auto &each : policies)
      n = n > std::numeric_limits<uint64_t>::max() / each.size()
              ? std::numeric_limits<uint64_t>::max()
              : n * each.size();
    return n;
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
  /// The programs as cells with a recompute before each checkpointable
  /// (stage, microbatch)'s first consumer (where jit puts it), so that one
  /// simulation prices any choice.
  void buildTimelineTemplate() {
    timeline = cells.schedule;
    for (auto [rank, program] : llvm::enumerate(programs)) {
      // The cell of each op position.
      std::vector<size_t> cellAt;
      size_t cell = 0;
      const std::vector<Operation *> &firsts = cells.cellOps[rank];
      if (firsts.empty())
        continue; // a rank without actions holds nothing to price
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
      }
      std::vector<sched::Action> withRecomputes;
      for (size_t k = 0; k < firsts.size(); ++k) {
        for (sched::Action &recompute : before[k])
          withRecomputes.push_back(std::move(recompute));
        withRecomputes.push_back(std::move(timeline.ranks[rank][k]));
      }
      timeline.ranks[rank] = std::move(withRecomputes);
    }
  }

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
        bool replaying =
            p >= lifetime->replayBeginPos && p <= lifetime->replayEndPos;
        return extra - (replaying ? cost.recomputedBytes : 0);
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
  };
  Found search(Problem &problem, const Choice &everything);
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

/// The fastest choice within the budget: every subset of candidates, each
/// refined, when small; else a greedy sweep.
SelectCheckpointsPass::Found
SelectCheckpointsPass::search(Problem &problem, const Choice &everything) {
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
  uint64_t numChoices = problem.numChoices();
  if (numChoices <= kExhaustiveChoices &&
      problem.numCells() * numChoices <= kExhaustiveCellSimulations) {
    std::pair<double, int64_t> bestCost;
    Choice subset = everything;
    for (uint64_t index = 0; index < numChoices; ++index) {
      // `index` in the mixed radix of the candidates' policy counts.
      uint64_t rest = index;
      for (size_t i = 0; i < k; ++i) {
        subset.regions[i] =
            problem.policies[i][rest % problem.policies[i].size()];
        rest /= problem.policies[i].size();
      }
      considerLeast(subset);
      Choice choice = refine(problem, subset, budget.getValue(), true);
      if (!fits(problem, choice))
        continue;
      std::pair<double, int64_t> cost = problem.stepTime(choice);
      if (!found.best || cost < bestCost) {
        found.best = std::move(choice);
        bestCost = cost;
      }
    }
    return done();
  }
  // Greedy: move candidates to a policy that keeps more (full to selective,
  // selective or full to none) in order of replay time saved per byte kept
  // on top, as long as the budget holds.
  considerLeast(everything);
  struct Move {
    size_t candidate;
    RegionCheckpoint to;
    double gainPerByte;
  };
  std::vector<Move> moves;
  for (size_t i = 0; i < k; ++i) {
    RegionOp region = problem.candidates[i];
    int64_t input = region.getInputBytes();
    for (RegionCheckpoint to : problem.policies[i]) {
      if (to == RegionCheckpoint::Full)
        continue;
      // From the policy before it: what the replay no longer does, per byte
      // the forward keeps beyond it.
      RegionCheckpoint from =
          to == RegionCheckpoint::None && problem.policies[i].size() == 3
              ? RegionCheckpoint::Selective
              : RegionCheckpoint::Full;
      auto kept = [&](RegionCheckpoint checkpoint) -> int64_t {
        if (checkpoint == RegionCheckpoint::None)
          return region.getSavedBytes();
        if (checkpoint == RegionCheckpoint::Selective)
          return input + region.getSelectiveSavedBytes().value_or(0);
        return input;
      };
      double gain = replayUs(region, from) -
                    (to == RegionCheckpoint::None ? 0 : replayUs(region, to));
      moves.push_back({i, to,
                       gain / static_cast<double>(std::max<int64_t>(
                                  kept(to) - kept(from), 1))});
    }
  }
  llvm::stable_sort(moves, [](const Move &a, const Move &b) {
    return a.gainPerByte > b.gainPerByte;
  });
  // Policies in order of memory kept: a move applies to a candidate that
  // keeps less than its target.
  auto rank = [](RegionCheckpoint checkpoint) {
    return checkpoint == RegionCheckpoint::Full        ? 0
           : checkpoint == RegionCheckpoint::Selective ? 1
                                                       : 2;
  };
  // One sweep over the moves `allowed`; the fitting choice it ends with.
  auto sweep = [&](auto allowed) -> std::optional<Choice> {
    Choice regions = everything;
    for (const Move &move : moves) {
      RegionCheckpoint &current = regions.regions[move.candidate];
      if (!allowed(move) || rank(current) >= rank(move.to))
        continue;
      RegionCheckpoint before = current;
      current = move.to;
      if (!fits(problem, refine(problem, regions, budget.getValue(), true)))
        current = before;
    }
    Choice choice = refine(problem, regions, budget.getValue(), true);
    if (!fits(problem, choice))
      return std::nullopt;
    return choice;
  };
  // With selective in play, the sweep over none and full alone too, so that
  // the third policy never makes the heuristic's answer slower.
  found.best = sweep([](const Move &) { return true; });
  if (llvm::any_of(moves, [](const Move &move) {
        return move.to == RegionCheckpoint::Selective;
      }))
    if (std::optional<Choice> twoPolicies = sweep([](const Move &move) {
          return move.to != RegionCheckpoint::Selective;
        }))
      if (!found.best ||
          problem.stepTime(*twoPolicies) < problem.stepTime(*found.best))
        found.best = std::move(twoPolicies);
  return done();
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
    Found found = search(problem, everything);
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
    choice = std::move(*found.best);
  }

  // Write the choice down.
  for (StageOp stage : model.getBody().getOps<StageOp>())
    for (RegionOp region : stage.getBody().getOps<RegionOp>()) {
      auto it = llvm::find(problem.candidates, region);
      RegionCheckpoint checkpoint =
          it == problem.candidates.end()
              ? RegionCheckpoint::None
              : choice.regions[it - problem.candidates.begin()];
      region.setCheckpoint(checkpoint != RegionCheckpoint::None);
      region.setSelective(checkpoint == RegionCheckpoint::Selective);
      numCheckpointedRegions += checkpoint != RegionCheckpoint::None;
      numSelectiveRegions += checkpoint == RegionCheckpoint::Selective;
    }
  std::vector<StageCost> costs = problem.costsOf(choice);
  module.walk([&](ForwardOp forward) {
    Key key{forward.getStageIndex(), forward.getMicrobatchIndex()};
    if (costs[key.first].checkpointed && choice.plain.contains(key)) {
      forward.setNoCheckpoint(true);
      ++numPlainMicrobatches;
    }
  });
}
