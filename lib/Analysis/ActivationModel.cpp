//===- ActivationModel.cpp - Activation bytes live on a rank -------------===//

#include "hpr/Analysis/ActivationModel.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::hpr;

ProgramActivations mlir::hpr::collectActivationLifetimes(ProgramOp program) {
  ProgramActivations result;
  llvm::DenseMap<std::pair<int64_t, int64_t>, size_t> index;
  // Whether a recompute / a clear fixed a lifetime's replay span, and the
  // lifetime's readers.
  std::vector<char> placed, cleared;
  std::vector<llvm::SmallVector<Operation *, 2>> consumers;
  unsigned pos = 0;
  for (Operation &op : program.getBody().getOps()) {
    if (auto forward = dyn_cast<ForwardOp>(op)) {
      index[{forward.getStageIndex(), forward.getMicrobatchIndex()}] =
          result.lifetimes.size();
      ActivationLifetime &lifetime = result.lifetimes.emplace_back();
      placed.push_back(false);
      cleared.push_back(false);
      consumers.emplace_back();
      lifetime.forward = forward;
      lifetime.stage = forward.getStageIndex();
      lifetime.microbatch = forward.getMicrobatchIndex();
      lifetime.forwardPos = pos;
    } else if (isa<RecomputeOp, ClearOp>(op) ||
               (isa<ConsumerOpInterface>(op) &&
                cast<ConsumerOpInterface>(op).readsActivations())) {
      auto action = cast<ActionOpInterface>(op);
      auto it =
          index.find({action.getStageIndex(), action.getMicrobatchIndex()});
      if (it != index.end()) {
        ActivationLifetime &lifetime = result.lifetimes[it->second];
        auto recompute = dyn_cast<RecomputeOp>(op);
        if (recompute && recompute.getForWeight()) {
          lifetime.weightReplayPos = pos;
          lifetime.weightReplayPlaced = true;
        } else if (recompute) {
          if (!placed[it->second])
            lifetime.replayBeginPos = pos;
          lifetime.replayInBackward = recompute.getInBackward();
          if (recompute.getRegions() && !recompute.getInBackward())
            lifetime.prefetchedPieces.push_back(
                {pos, llvm::SmallVector<int64_t, 2>(*recompute.getRegions())});
          placed[it->second] = true;
        } else if (isa<ClearOp>(op)) {
          lifetime.replayEndPos = pos - 1;
          cleared[it->second] = true;
        } else {
          if (!lifetime.hasConsumers)
            lifetime.firstConsumerPos = pos;
          lifetime.lastConsumerPos = pos;
          lifetime.hasConsumers = true;
          consumers[it->second].push_back(&op);
        }
      }
    }
    ++pos;
  }
  result.numPositions = pos;
  // Spans not fixed by a recompute or clear follow the consumers (jit).
  for (auto [i, lifetime] : llvm::enumerate(result.lifetimes)) {
    if (!lifetime.hasConsumers)
      lifetime.firstConsumerPos = lifetime.lastConsumerPos = pos - 1;
    lifetime.replayPlaced = placed[i];
    lifetime.releasedAfterDx =
        consumers[i].size() > 1 && isa<BackwardInputOp>(consumers[i].front());
    auto weight = lifetime.releasedAfterDx
                      ? dyn_cast<BackwardWeightOp>(consumers[i].back())
                      : BackwardWeightOp();
    lifetime.weightReplay = weight && weight.getWeightReplay();
    if (!lifetime.weightReplayPlaced)
      lifetime.weightReplayPos = lifetime.lastConsumerPos;
    if (!placed[i])
      lifetime.replayInBackward = replaysInBackward(consumers[i]);
    if (!placed[i] ||
        (lifetime.replayInBackward && lifetime.prefetchedPieces.empty()))
      lifetime.replayBeginPos = lifetime.firstConsumerPos;
    if (!cleared[i] || lifetime.replayInBackward)
      lifetime.replayEndPos = lifetime.lastConsumerPos;
  }
  return result;
}

bool mlir::hpr::replaysInBackward(llvm::ArrayRef<Operation *> consumers) {
  auto reader = consumers.size() == 1
                    ? dyn_cast<ConsumerOpInterface>(consumers.front())
                    : ConsumerOpInterface();
  return reader && reader.isWholeBackward();
}

llvm::SmallVector<int64_t> ActivationLifetime::prefetchedRegions() const {
  llvm::SmallVector<int64_t> regions;
  for (const ReplayPiece &piece : prefetchedPieces)
    regions.append(piece.regions);
  return regions;
}

int64_t mlir::hpr::replayedBytesOf(const StageCost &cost,
                                   const ActivationLifetime &lifetime) {
  return lifetime.replayInBackward
             ? backwardReplayBytesAfter(cost, lifetime.prefetchedRegions())
             : cost.recomputedBytes;
}

int64_t ActivationProfile::peak() const {
  return live.empty() ? 0 : *std::max_element(live.begin(), live.end());
}

ActivationProfile mlir::hpr::computeActivationProfile(
    const ProgramActivations &activations, const std::vector<StageCost> &costs,
    llvm::function_ref<bool(const ActivationLifetime &)> checkpointed) {
  unsigned n = activations.numPositions;
  ActivationProfile profile;
  profile.live.assign(n + 1, 0);
  profile.endingAt.assign(n, 0);
  profile.underCheckpoint.assign(activations.lifetimes.size(), false);
  profile.replayAtLastConsumer.assign(activations.lifetimes.size(), 0);
  auto addSpan = [&](unsigned begin, unsigned end, int64_t bytes) {
    if (bytes == 0 || begin > end)
      return;
    profile.live[begin] += bytes;
    profile.live[end + 1] -= bytes;
    profile.endingAt[end] += bytes;
  };
  for (size_t index = 0; index < activations.lifetimes.size(); ++index) {
    const ActivationLifetime &lifetime = activations.lifetimes[index];
    const StageCost &cost = costs[lifetime.stage];
    bool underCheckpoint = checkpointed
                               ? checkpointed(lifetime)
                               : runsCheckpointed(lifetime.forward, costs);
    profile.underCheckpoint[index] = underCheckpoint;
    addSpan(lifetime.forwardPos, lifetime.lastConsumerPos,
            keptBytesOf(cost, underCheckpoint));
    // What dx keeps for dw (the gradients dw's matmuls read), from I to W,
    // checkpointed or not.
    if (lifetime.releasedAfterDx)
      addSpan(lifetime.firstConsumerPos, lifetime.lastConsumerPos,
              cost.weightStateBytes);
    if (!underCheckpoint || !lifetime.hasConsumers)
      continue;
    // Replayed bytes, noting what is still live at the last backward.
    auto add = [&](unsigned begin, unsigned end, int64_t bytes) {
      addSpan(begin, end, bytes);
      if (begin <= lifetime.lastConsumerPos && lifetime.lastConsumerPos <= end)
        profile.replayAtLastConsumer[index] += bytes;
    };
    // A span [begin, end] of `bytes`, of which only `weightBytes` stay after
    // the dx of a session it releases, and none where the dx drops it for a
    // replay for the dw (added once below).
    auto addReplay = [&](unsigned begin, unsigned end, int64_t bytes,
                         int64_t weightBytes) {
      if (!lifetime.releasedAfterDx || lifetime.firstConsumerPos >= end) {
        add(begin, end, bytes);
        return;
      }
      add(begin, lifetime.firstConsumerPos, bytes);
      if (!lifetime.weightReplay)
        add(lifetime.firstConsumerPos + 1, end, weightBytes);
    };
    if (lifetime.weightReplay)
      add(lifetime.weightReplayPos, lifetime.replayEndPos,
          cost.weightRecomputedBytes);
    if (lifetime.prefetchedPieces.empty()) {
      addReplay(lifetime.replayBeginPos, lifetime.replayEndPos,
                replayedBytesOf(cost, lifetime), cost.weightRecomputedBytes);
      continue;
    }
    // In pieces: each prefetched piece until the reader drops it (inside its
    // backward) or the clear does.
    unsigned end = lifetime.replayInBackward ? lifetime.firstConsumerPos
                                             : lifetime.replayEndPos + 1;
    for (const ReplayPiece &piece : lifetime.prefetchedPieces)
      if (piece.pos < end) // hpr-verify rejects the others
        addReplay(piece.pos, end - 1, replayBytesOf(cost, piece.regions),
                  weightReplayBytesOf(cost, piece.regions));
    if (lifetime.replayInBackward)
      add(lifetime.firstConsumerPos, lifetime.firstConsumerPos,
          replayedBytesOf(cost, lifetime));
  }
  for (unsigned k = 1; k <= n; ++k)
    profile.live[k] += profile.live[k - 1];
  profile.live.pop_back();
  return profile;
}

unsigned mlir::hpr::countMaxLiveReplays(const ProgramActivations &activations) {
  std::vector<int> change(activations.numPositions + 1, 0);
  auto span = [&](unsigned begin, unsigned end) {
    if (begin <= end) {
      ++change[begin];
      --change[end + 1];
    }
  };
  for (const ActivationLifetime &lifetime : activations.lifetimes) {
    if (!lifetime.replayPlaced)
      continue;
    if (!lifetime.weightReplay) {
      span(lifetime.replayBeginPos, lifetime.replayEndPos);
      continue;
    }
    span(lifetime.replayBeginPos, lifetime.firstConsumerPos);
    span(lifetime.weightReplayPos, lifetime.replayEndPos);
  }
  int live = 0, peak = 0;
  for (int delta : change)
    peak = std::max(peak, live += delta);
  return static_cast<unsigned>(peak);
}
