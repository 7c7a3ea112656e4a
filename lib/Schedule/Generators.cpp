//===- Generators.cpp - Built-in pipeline schedules -----------------------===//
//
// Each generator writes the per-rank phase structure of its schedule (see
// docs/schedules.md and /work/shared/reference/schedules.md). Where
// torch.distributed.pipelining has the schedule, the phases and the idle
// cells follow its published algorithm, so that its CSVs compare cell for
// cell.
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/Generators.h"
#include "hpr/Schedule/ScheduleUtils.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/Twine.h"

#include <algorithm>
#include <deque>

namespace mlir::hpr::sched {
namespace {

constexpr llvm::StringLiteral kNames[] = {
    "gpipe",          "1f1b", "interleaved-1f1b", "zb-h1",
    "interleaved-zb", "zbv",  "dualpipev"};

llvm::Error refuse(llvm::StringRef name, const llvm::Twine &why) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                 name + ": " + why);
}

Action idle() { return Action(); }
Action act(ActionKind kind, int stage, int mb) {
  return makeAction(kind, stage, mb);
}

/// A schedule with `ranks` ranks and the given stage placement.
Schedule emptySchedule(llvm::StringRef name, int ranks, int microbatches,
                       std::vector<int> stageToRank) {
  Schedule s;
  s.name = name.str();
  s.numRanks = ranks;
  s.numStages = static_cast<int>(stageToRank.size());
  s.numMicrobatches = microbatches;
  s.stageToRank = std::move(stageToRank);
  s.ranks.resize(ranks);
  return s;
}

/// Stage local*p + r on rank r (PyTorch's "loop" placement).
std::vector<int> loopPlacement(int p, int v) {
  std::vector<int> owner(p * v);
  for (int s = 0; s < p * v; ++s)
    owner[s] = s % p;
  return owner;
}

/// Stages r and 2p-1-r on rank r (the "V" placement).
std::vector<int> vPlacement(int p) {
  std::vector<int> owner(2 * p);
  for (int r = 0; r < p; ++r) {
    owner[r] = r;
    owner[2 * p - 1 - r] = r;
  }
  return owner;
}

// GPipe: all forwards, then all full backwards.
Schedule gpipe(int p, int m) {
  Schedule s = emptySchedule("gpipe", p, m, loopPlacement(p, 1));
  for (int r = 0; r < p; ++r) {
    for (int mb = 0; mb < m; ++mb)
      s.ranks[r].push_back(act(ActionKind::Forward, r, mb));
    for (int mb = 0; mb < m; ++mb)
      s.ranks[r].push_back(act(ActionKind::Backward, r, mb));
  }
  return s;
}

// 1F1B: min(p-1-r, m) warmup forwards, then F/B pairs, then the backwards.
Schedule oneFOneB(int p, int m) {
  Schedule s = emptySchedule("1f1b", p, m, loopPlacement(p, 1));
  for (int r = 0; r < p; ++r) {
    auto &ops = s.ranks[r];
    int warmup = std::min(p - 1 - r, m);
    int f = 0, b = 0;
    while (f < warmup)
      ops.push_back(act(ActionKind::Forward, r, f++));
    while (f < m) {
      ops.push_back(act(ActionKind::Forward, r, f++));
      ops.push_back(act(ActionKind::Backward, r, b++));
    }
    while (b < m)
      ops.push_back(act(ActionKind::Backward, r, b++));
  }
  return s;
}

// PyTorch's interleaved 1F1B / interleaved zero bubble rank programs.
llvm::Expected<Schedule> interleaved(llvm::StringRef name, int p, int m, int v,
                                     bool zeroBubble) {
  int rounds = std::max(1, m / p);
  if (m % rounds != 0)
    return refuse(name, llvm::Twine(m) +
                            " microbatches is not a multiple of the number "
                            "of rounds max(1, microbatches / ranks) = " +
                            llvm::Twine(rounds));
  int perRound = m / rounds;
  Schedule s = emptySchedule(name, p, m, loopPlacement(p, v));
  for (int r = 0; r < p; ++r) {
    auto &ops = s.ranks[r];
    int factor = zeroBubble ? 1 : 2;
    int warmup = std::min((v - 1) * perRound + factor * (p - 1 - r), m * v);
    int fwdBwd = v * m - warmup;
    int cooldown = v * m - fwdBwd;
    int total = warmup + fwdBwd + cooldown;
    auto fwdStage = [&](int step) { return ((step / perRound) % v) * p + r; };
    auto bwdStage = [&](int step) {
      return (v - 1 - ((step - warmup) / perRound) % v) * p + r;
    };
    int postWarmup =
        zeroBubble ? p - r - 1 : (v * p + 2 * (p - 1 - r)) - (warmup + r);
    ActionKind dx =
        zeroBubble ? ActionKind::BackwardInput : ActionKind::Backward;
    std::vector<int> fwdCount(p * v, 0), bwdCount(p * v, 0), wCount(p * v, 0);
    std::vector<int> backwardSteps;
    size_t weightsDone = 0;
    auto weight = [&]() {
      int stage = bwdStage(backwardSteps[weightsDone++]);
      ops.push_back(act(ActionKind::BackwardWeight, stage, wCount[stage]++));
    };
    for (int i = 0; i < r; ++i)
      ops.push_back(idle());
    for (int op = 0; op < total; ++op) {
      if (op < warmup) {
        int stage = fwdStage(op);
        ops.push_back(act(ActionKind::Forward, stage, fwdCount[stage]++));
        if (op == warmup - 1)
          for (int i = 0; i < postWarmup; ++i)
            ops.push_back(idle());
        continue;
      }
      if (op < warmup + fwdBwd) {
        int stage = fwdStage(op);
        ops.push_back(act(ActionKind::Forward, stage, fwdCount[stage]++));
      } else if (!zeroBubble) {
        ops.push_back(idle());
      }
      int stage = bwdStage(op);
      ops.push_back(act(dx, stage, bwdCount[stage]++));
      backwardSteps.push_back(op);
      if (zeroBubble && op - warmup >= r)
        weight();
    }
    while (zeroBubble && weightsDone < backwardSteps.size())
      weight();
  }
  if (!zeroBubble)
    return s;

  // PyTorch's bubble pass: advance all ranks in lock step and hold a forward
  // (emitting an idle cell) until the previous stage's forward of the same
  // microbatch ran in an earlier step.
  std::vector<char> seen(static_cast<size_t>(p) * v * m, 0);
  std::vector<std::vector<Action>> out(p);
  std::vector<size_t> next(p, 0);
  std::vector<size_t> newlySeen;
  while (true) {
    bool anyLeft = false, progressed = false;
    newlySeen.clear();
    for (int r = 0; r < p; ++r) {
      auto &ops = s.ranks[r];
      if (next[r] >= ops.size())
        continue;
      anyLeft = true;
      Action &a = ops[next[r]];
      bool hold = a.kind == ActionKind::Forward && a.stage != 0 &&
                  !seen[static_cast<size_t>(a.stage - 1) * m + a.microbatch];
      if (hold) {
        out[r].push_back(idle());
        continue;
      }
      if (a.kind == ActionKind::Forward)
        newlySeen.push_back(static_cast<size_t>(a.stage) * m + a.microbatch);
      out[r].push_back(std::move(a));
      ++next[r];
      progressed = true;
    }
    for (size_t k : newlySeen)
      seen[k] = 1;
    if (!anyLeft)
      break;
    if (!progressed)
      return refuse(name, "the forwards of " + llvm::Twine(p) + " ranks x " +
                              llvm::Twine(m) +
                              " microbatches wait on each other");
  }
  s.ranks = std::move(out);
  return s;
}

// PyTorch's ScheduleZBVZeroBubble rank programs.
Schedule zbv(int p, int m) {
  Schedule s = emptySchedule("zbv", p, m, vPlacement(p));
  int nMicro = std::max(2 * p - 1, m);
  for (int r = 0; r < p; ++r) {
    auto &ops = s.ranks[r];
    int s0 = r, s1 = 2 * p - 1 - r;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    auto add = [&](ActionKind kind, int stage, int mb) {
      ops.push_back(mb < m ? act(kind, stage, mb) : idle());
    };
    for (int i = 0; i < r; ++i)
      ops.push_back(idle());
    for (int i = 0; i < 2 * (p - r) - 1; ++i)
      add(ActionKind::Forward, s0, f0++);
    for (int i = 0; i < r; ++i) {
      add(ActionKind::Forward, s1, f1++);
      add(ActionKind::Forward, s0, f0++);
    }
    for (int i = 0; i < p - r; ++i) {
      add(ActionKind::Forward, s1, f1++);
      add(ActionKind::BackwardInput, s1, b1);
      add(ActionKind::BackwardWeight, s1, b1++);
    }
    while (f1 < f0 || f0 < nMicro) {
      if (f0 < nMicro)
        add(ActionKind::Forward, s0, f0++);
      add(ActionKind::BackwardInput, s0, b0);
      add(ActionKind::BackwardWeight, s0, b0++);
      add(ActionKind::Forward, s1, f1++);
      add(ActionKind::BackwardInput, s1, b1);
      add(ActionKind::BackwardWeight, s1, b1++);
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < r; ++i) {
      add(ActionKind::BackwardInput, s0, b0++);
      add(ActionKind::BackwardInput, s1, b1++);
    }
    for (int i = 0; i < p - r; ++i) {
      add(ActionKind::BackwardInput, s0, b0++);
      add(ActionKind::BackwardWeight, s0, w0++);
    }
    while (w1 < b1)
      add(ActionKind::BackwardWeight, s1, w1++);
    while (w0 < b0)
      add(ActionKind::BackwardWeight, s0, w0++);
  }
  return s;
}

// PyTorch's ScheduleDualPipeV rank programs (after DeepSeek's DualPipeV).
Schedule dualPipeV(int p, int m) {
  Schedule s = emptySchedule("dualpipev", p, m, vPlacement(p));
  for (int r = 0; r < p; ++r) {
    auto &ops = s.ranks[r];
    const int s0 = r, s1 = 2 * p - 1 - r;
    // Next microbatch per (local stage, F/I/W); a full backward advances
    // both the I and the W counters.
    int next[2][3] = {{0, 0, 0}, {0, 0, 0}};
    enum { F = 0, I = 1, W = 2 };
    auto local = [&](int stage) { return stage == s0 ? 0 : 1; };
    std::deque<std::pair<int, int>> pendingWeights;
    auto add = [&](int stage, ActionKind kind) {
      int l = local(stage);
      if (kind == ActionKind::Forward) {
        ops.push_back(act(kind, stage, next[l][F]++));
      } else if (kind == ActionKind::Backward) {
        ops.push_back(act(kind, stage, next[l][I]));
        ++next[l][I];
        ++next[l][W];
      } else { // BackwardInput
        int mb = next[l][I]++;
        ops.push_back(act(kind, stage, mb));
        pendingWeights.push_back({stage, mb});
      }
    };
    auto overlap = [&](int fwdStage, int bwdStage) {
      Action both;
      both.kind = ActionKind::OverlapFB;
      int lf = local(fwdStage), lb = local(bwdStage);
      both.parts.push_back(act(ActionKind::Forward, fwdStage, next[lf][F]++));
      both.parts.push_back(act(ActionKind::Backward, bwdStage, next[lb][I]));
      ++next[lb][I];
      ++next[lb][W];
      ops.push_back(std::move(both));
    };
    auto weightIfPending = [&]() {
      if (pendingWeights.empty())
        return;
      auto [stage, mb] = pendingWeights.front();
      pendingWeights.pop_front();
      ops.push_back(act(ActionKind::BackwardWeight, stage, mb));
      ++next[local(stage)][W];
    };
    for (int i = 0; i < 2 * (p - r - 1); ++i)
      add(s0, ActionKind::Forward);
    for (int i = 0; i < r + 1; ++i) {
      add(s0, ActionKind::Forward);
      add(s1, ActionKind::Forward);
    }
    for (int i = 0; i < p - r - 1; ++i) {
      add(s1, ActionKind::BackwardInput);
      weightIfPending();
      add(s1, ActionKind::Forward);
    }
    for (int i = 0, n = m - 2 * p + r + 1; i < n; ++i) {
      if (i == 0 && r == p - 1) {
        // Not overlapped, to shorten the bubble.
        add(s0, ActionKind::Forward);
        add(s1, ActionKind::Backward);
      } else {
        overlap(s0, s1);
      }
      overlap(s1, s0);
    }
    for (int i = 0; i < p - r - 1; ++i) {
      add(s1, ActionKind::Backward);
      overlap(s1, s0);
    }
    bool zeroBubble = false;
    int half = (r + 1) / 2;
    for (int i = 0; i < r + 1; ++i) {
      if (i == half && r % 2 == 1)
        zeroBubble = true;
      add(s1, zeroBubble ? ActionKind::BackwardInput : ActionKind::Backward);
      if (i == half && r % 2 == 0)
        zeroBubble = true;
      add(s0, zeroBubble ? ActionKind::BackwardInput : ActionKind::Backward);
    }
    for (int i = 0; i < p - r - 1; ++i) {
      weightIfPending();
      add(s0, zeroBubble ? ActionKind::BackwardInput : ActionKind::Backward);
    }
    for (int i = 0; i < r + 1; ++i)
      weightIfPending();
  }
  return s;
}

} // namespace

llvm::ArrayRef<llvm::StringLiteral> generatorNames() { return kNames; }

llvm::Expected<Schedule> generateSchedule(llvm::StringRef name,
                                          const GeneratorOptions &options) {
  if (llvm::find(kNames, name) == std::end(kNames))
    return refuse(name,
                  "unknown schedule: expected one of " +
                      llvm::join(std::begin(kNames), std::end(kNames), ", "));
  const int p = options.ranks, m = options.microbatches;
  if (p < 1 || m < 1)
    return refuse(name, "expected at least 1 rank and 1 microbatch, got " +
                            llvm::Twine(p) + " ranks and " + llvm::Twine(m) +
                            " microbatches");
  bool twoPerRank = name == "zbv" || name == "dualpipev";
  bool looped = name == "interleaved-1f1b" || name == "interleaved-zb";
  int defaultV = (twoPerRank || looped) ? 2 : 1;
  int v = options.stagesPerRank == 0 ? defaultV : options.stagesPerRank;
  if (v < 1)
    return refuse(name, "expected a positive number of stages per rank, got " +
                            llvm::Twine(v));
  if ((name == "gpipe" || name == "1f1b") && v != 1)
    return refuse(name, "runs exactly 1 stage per rank, got " + llvm::Twine(v) +
                            " (use interleaved-1f1b for more)");
  if (twoPerRank && v != 2)
    return refuse(name, "runs exactly 2 stages per rank (a V), got " +
                            llvm::Twine(v));
  if (p > kMaxGeneratedRanks)
    return refuse(name, "at most " + llvm::Twine(kMaxGeneratedRanks) +
                            " ranks are generated, got " + llvm::Twine(p));
  if (static_cast<int64_t>(p) * v > kMaxStage + 1 || m > kMaxMicrobatch + 1)
    return refuse(name, "too many stages or microbatches");
  // Every (stage, microbatch) has up to three compute actions (F, I, W).
  const int64_t computeActions = int64_t(p) * v * m * 3;
  if (computeActions > kMaxGeneratedActions)
    return refuse(name, "would hold " + llvm::Twine(computeActions) +
                            " compute actions; at most " +
                            llvm::Twine(kMaxGeneratedActions) +
                            " are generated (ranks x stages per rank x "
                            "microbatches x 3)");
  if (name == "gpipe")
    return gpipe(p, m);
  if (name == "1f1b")
    return oneFOneB(p, m);
  if (name == "interleaved-1f1b")
    return interleaved(name, p, m, v, /*zeroBubble=*/false);
  // interleaved-zb is zb-h1 looped over 2 stages per rank by default.
  if (name == "zb-h1" || name == "interleaved-zb")
    return interleaved(name, p, m, v, /*zeroBubble=*/true);
  if (name == "zbv")
    return zbv(p, m);
  if (m < 2 * p)
    return refuse(name, "needs microbatches >= 2 x ranks = " +
                            llvm::Twine(2 * p) + ", got " + llvm::Twine(m));
  return dualPipeV(p, m);
}

} // namespace mlir::hpr::sched
