//===- Verify.cpp - Static check of every recompute session --------------===//
//
// Proves, from the IR alone, that each session is recomputed once (in one op
// or in pieces that replay each checkpointed region once) before any reader,
// and again for its dw only where the dw says so, cleared once after the last
// reader, and flagged right in between, that the compute order is the
// imported schedule's, and that FSDP parameters are gathered wherever they
// are read. It walks each
// program once, in order, with its own bookkeeping: nothing here is shared
// with the passes that build plans (SessionAnalysis), so it also judges plans
// written by hand or by other tools, and a bug in those queries cannot hide
// itself.
//
//===----------------------------------------------------------------------===//

#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Support/Rules.h"
#include "hpr/Transforms/Passes.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Debug.h"

#define DEBUG_TYPE "hpr-verify"

namespace mlir::hpr {
#define GEN_PASS_DEF_HPRVERIFY
#include "hpr/Transforms/Passes.h.inc"
} // namespace mlir::hpr

using namespace mlir;
using namespace mlir::hpr;

namespace {
/// Stage -> its number of checkpointed regions (checkpointed stages only).
using CheckpointedRegions = llvm::DenseMap<int64_t, int64_t>;

/// What one program does with one session, in program order.
struct SessionUses {
  /// Its replay (one op or the pieces), and the replays for its dw.
  llvm::SmallVector<RecomputeOp, 1> recomputes;
  llvm::SmallVector<RecomputeOp, 1> weightReplays;
  llvm::SmallVector<ClearOp, 1> clears;
  llvm::SmallVector<ConsumerOpInterface> consumers;
};

struct VerifyPass : public mlir::hpr::impl::HPRVerifyBase<VerifyPass> {
  void runOnOperation() override;

private:
  /// Checks one session; returns the number of violations found.
  /// `numRegions`: its stage's checkpointed regions, when the model is known.
  unsigned verifySession(SessionOp session, SessionUses &uses,
                         std::optional<int64_t> numRegions);
  unsigned verifyProgram(ProgramOp program,
                         const CheckpointedRegions *checkpointed);
  unsigned verifyComputeOrder(ProgramOp program, ArrayRef<int64_t> recorded);
  unsigned verifyGathered(ProgramOp program);

  /// The stages with a region checkpointed under a selective policy.
  llvm::DenseSet<int64_t> selectiveStages;
};
} // namespace

/// Quotes a session for messages: `session "s3.mb0"`.
static std::string quote(SessionOp session) {
  return ("session \"" + session.getSid() + "\"").str();
}

/// The session a recompute, clear or consumer reads, if any.
static SessionOp sessionOf(Value value) {
  return value ? value.getDefiningOp<SessionOp>() : SessionOp();
}

/// A replay inside its backward (`in_backward`) has one reader, a whole
/// backward (B, or the first stage's W, whose I reads nothing: HPROps.td), and
/// no compute action of its own between them (the forward of the reader's
/// overlapped pair aside): it replays region by region as that backward reads
/// them, so nothing else may read it, and it must run where it is priced.
static unsigned
verifyInBackward(RecomputeOp recompute, SessionOp session,
                 MutableArrayRef<ConsumerOpInterface> consumers) {
  Operation *reader = consumers.front().getOperation();
  if (consumers.size() != 1 || !consumers.front().isWholeBackward()) {
    recompute.emitError()
        << describeAction(recompute) << ": " << quote(session)
        << " is replayed inside its backward (in_backward), but is read by "
        << describeAction(reader)
        << (consumers.size() > 1 ? " and later actions" : "")
        << "; only a session that one whole backward reads (a backward, or "
           "the first stage's backward_weight) replays region by region";
    return 1;
  }
  if (!recompute->isBeforeInBlock(reader))
    return 0; // verifySession reports a read before the recompute.
  for (Operation *op = recompute->getNextNode(); op != reader;
       op = op->getNextNode()) {
    Operation *next = op->getNextNode();
    while (next && isa<SessionOp>(next))
      next = next->getNextNode();
    bool pairForward = isa<ForwardOp>(op) && isOverlapped(op) &&
                       isOverlapped(reader) && next == reader;
    if (isa<ForwardOp, BackwardInputOp, BackwardWeightOp, BackwardOp>(op) &&
        !pairForward) {
      recompute.emitError()
          << describeAction(recompute) << ": " << quote(session)
          << " is replayed inside its backward (in_backward), but "
          << describeAction(op) << " runs before that backward, "
          << describeAction(reader);
      return 1;
    }
  }
  return 0;
}

/// [hpr.verify.pieces]: a replay in pieces (`regions`) is pieces only, whose
/// regions are disjoint and, where the model says how many the stage
/// checkpoints, cover them all; a piece replayed inside the backward is the
/// last piece.
static unsigned verifyPieces(SessionOp session, ArrayRef<RecomputeOp> pieces,
                             std::optional<int64_t> numRegions) {
  unsigned violations = 0;
  auto report = [&](Operation *at) -> InFlightDiagnostic {
    ++violations;
    return at->emitError() << describeAction(at) << ": " << quote(session);
  };
  StringRef cite = ruleTag(Rule::VerifyPieces);
  llvm::DenseMap<int64_t, RecomputeOp> replayedBy;
  for (auto [index, constPiece] : llvm::enumerate(pieces)) {
    RecomputeOp piece = constPiece;
    if (!piece.getRegions()) {
      report(piece) << " is replayed in pieces (regions) and whole here; "
                       "each piece lists its regions "
                    << cite;
      continue;
    }
    if (piece.getInBackward() && index + 1 != pieces.size())
      report(piece) << " replays a piece inside its backward (in_backward) "
                       "before "
                    << describeAction(pieces.back())
                    << "; the piece inside the backward is the last " << cite;
    ArrayRef<int64_t> regions = *piece.getRegions();
    for (int64_t region : regions) {
      if (numRegions && region >= *numRegions) {
        report(piece) << " replays region " << region << ", but stage "
                      << piece.getStageIndex() << " checkpoints " << *numRegions
                      << " regions (0.." << *numRegions - 1 << ") " << cite;
        continue;
      }
      auto [it, inserted] = replayedBy.insert({region, piece});
      if (!inserted)
        report(piece) << " replays region " << region
                      << " a second time (first at "
                      << describeAction(it->second) << ") " << cite;
    }
  }
  if (numRegions && !violations)
    for (int64_t region = 0; region < *numRegions; ++region)
      if (!replayedBy.count(region))
        report(pieces.back())
            << " is replayed in pieces, but no piece "
            << "replays region " << region
            << "; a backward would replay it on its own " << cite;
  return violations;
}

/// [hpr.verify.weight-replay]: a replay for a dw (`for_weight`) is whole, the
/// session's only one, between its dx and its dw, on a session read by a dx
/// and then a dw, and there exactly where that dw says `weight_replay`.
static unsigned verifyWeightReplay(SessionOp session, SessionUses &uses,
                                   bool selective) {
  unsigned violations = 0;
  auto report = [&](Operation *at) -> InFlightDiagnostic {
    ++violations;
    return at->emitError() << describeAction(at) << ": ";
  };
  StringRef cite = ruleTag(Rule::VerifyWeightReplay);
  auto &consumers = uses.consumers;
  BackwardWeightOp weight;
  if (consumers.size() == 2 && isa<BackwardInputOp>(consumers.front()))
    weight = dyn_cast<BackwardWeightOp>(consumers.back().getOperation());
  for (ConsumerOpInterface consumer : consumers) {
    auto marked = dyn_cast<BackwardWeightOp>(consumer.getOperation());
    if (marked && marked.getWeightReplay() && marked != weight)
      report(marked) << "weight_replay, but " << quote(session)
                     << " is not read by a backward_input and then this "
                        "backward_weight; only such a session is dropped after "
                        "its dx and replayed again for its dw "
                     << cite;
  }
  for (RecomputeOp replay : uses.weightReplays) {
    if (replay != uses.weightReplays.front()) {
      report(replay) << quote(session)
                     << " is replayed for its dw a second time (first at "
                     << describeAction(uses.weightReplays.front()) << ") "
                     << cite;
      continue;
    }
    if (selective)
      report(replay) << quote(session)
                     << " is replayed for its dw, but its stage checkpoints a "
                        "region under a selective policy, whose replay reads "
                        "what the forward saved, once "
                     << cite;
    if (replay.getInBackward() || replay.getRegions())
      report(replay) << "the replay of " << quote(session)
                     << " for its dw (for_weight) is "
                     << (replay.getInBackward() ? "in_backward" : "a piece")
                     << "; it replays whole, before the dw " << cite;
    if (!weight) {
      report(replay) << quote(session)
                     << " is replayed for a dw (for_weight), but is not read "
                        "by a backward_input and then a backward_weight "
                     << cite;
      continue;
    }
    Operation *input = consumers.front().getOperation();
    if (!input->isBeforeInBlock(replay) || !replay->isBeforeInBlock(weight))
      report(replay) << "the replay of " << quote(session)
                     << " for its dw (for_weight) must lie after its dx, "
                     << describeAction(input) << ", and before its dw, "
                     << describeAction(weight) << " " << cite;
    if (!weight.getWeightReplay())
      report(replay) << quote(session) << " is replayed for its dw, but "
                     << describeAction(weight) << " does not say weight_replay "
                     << cite;
  }
  if (weight && weight.getWeightReplay() && uses.weightReplays.empty())
    report(weight) << "weight_replay, but " << quote(session)
                   << " has no replay for it (recompute for_weight) after its "
                      "dx, which drops the first: the dw would read dropped "
                      "tensors "
                   << cite;
  return violations;
}

unsigned VerifyPass::verifySession(SessionOp session, SessionUses &uses,
                                   std::optional<int64_t> numRegions) {
  unsigned violations = 0;
  auto report = [&](Operation *at) -> InFlightDiagnostic {
    ++violations;
    return at->emitError() << describeAction(at) << ": ";
  };
  // Uses are in program order: the first is the one that counts.
  auto once = [&](auto &ops, StringRef what) {
    using Op = typename std::decay_t<decltype(ops)>::value_type;
    if (ops.empty())
      return Op();
    for (Op op : llvm::drop_begin(ops))
      report(op) << quote(session) << " is " << what << " a second time "
                 << "(first at " << describeAction(ops.front()) << ")";
    return ops.front();
  };
  // A replay in pieces ([hpr.verify.pieces]) counts as one; its first piece
  // must come before every reader, its last before the clear.
  bool inPieces = llvm::any_of(uses.recomputes, [](RecomputeOp recompute) {
    return recompute.getRegions().has_value();
  });
  RecomputeOp recompute =
      inPieces ? uses.recomputes.front() : once(uses.recomputes, "recomputed");
  RecomputeOp lastPiece = inPieces ? uses.recomputes.back() : recompute;
  if (inPieces)
    violations += verifyPieces(session, uses.recomputes, numRegions);
  violations += verifyWeightReplay(
      session, uses,
      selectiveStages.contains(session.getForward().getStageIndex()));
  ClearOp clear = once(uses.clears, "cleared");
  auto &consumers = uses.consumers;
  if (consumers.empty() && !recompute && uses.weightReplays.empty())
    return violations; // Bound but never read nor replayed: holds nothing.

  if (!recompute)
    report(consumers.front()) << "reads " << quote(session)
                              << ", which is never recomputed before it";
  if (!clear)
    report(recompute ? recompute.getOperation()
                     : consumers.back().getOperation())
        << quote(session) << " is never cleared: its recomputed tensors leak";

  if (lastPiece && clear && clear->isBeforeInBlock(lastPiece))
    report(lastPiece) << quote(session) << " is recomputed after its clear at "
                      << describeAction(clear);

  if (lastPiece && lastPiece.getInBackward() && !consumers.empty())
    violations += verifyInBackward(lastPiece, session, consumers);

  for (auto [index, consumer] : llvm::enumerate(consumers)) {
    Operation *op = consumer.getOperation();
    if (lastPiece && op->isBeforeInBlock(lastPiece))
      report(op) << "reads " << quote(session) << " before its recompute at "
                 << describeAction(lastPiece);
    if (clear && clear->isBeforeInBlock(op))
      report(op) << "reads " << quote(session) << " after its clear at "
                 << describeAction(clear);
    bool isLast = index + 1 == consumers.size();
    if (isLast && consumer.getRetainOnUnpackFlag())
      report(op) << "is the last reader of " << quote(session)
                 << " but sets retain_on_unpack; the tensors would outlive "
                    "their last use";
    if (!isLast && !consumer.getRetainOnUnpackFlag())
      report(op) << "does not set retain_on_unpack, but "
                 << describeAction(consumers[index + 1]) << " reads "
                 << quote(session) << " later";
  }
  ++numSessionsVerified;
  return violations;
}

/// The program's forward/backward actions, in order, are the ones the
/// importer recorded from the schedule (`compute_order`).
unsigned VerifyPass::verifyComputeOrder(ProgramOp program,
                                        ArrayRef<int64_t> recorded) {
  static constexpr const char *kNames[] = {"forward", "backward_input",
                                           "backward_weight", "backward"};
  size_t next = 0; // Index into `recorded` of the next expected triple.
  for (Operation &op : program.getBody().getOps()) {
    int64_t kind = llvm::TypeSwitch<Operation *, int64_t>(&op)
                       .Case<ForwardOp>([](auto) { return 0; })
                       .Case<BackwardInputOp>([](auto) { return 1; })
                       .Case<BackwardWeightOp>([](auto) { return 2; })
                       .Case<BackwardOp>([](auto) { return 3; })
                       .Default([](auto) { return -1; });
    if (kind < 0)
      continue;
    auto action = cast<ActionOpInterface>(op);
    if (next >= recorded.size()) {
      op.emitError() << describeAction(&op)
                     << ": not in the imported schedule, whose compute order "
                        "for this rank ends before it";
      return 1;
    }
    ArrayRef<int64_t> expected = recorded.slice(next, 3);
    if (expected[0] != kind || expected[1] != action.getStageIndex() ||
        expected[2] != action.getMicrobatchIndex()) {
      op.emitError() << describeAction(&op) << ": the imported schedule has "
                     << kNames[expected[0]] << " stage " << expected[1]
                     << " mb " << expected[2] << " here (compute action "
                     << next / 3 << " of rank " << program.getRank() << ")";
      return 1;
    }
    next += 3;
  }
  if (next != recorded.size()) {
    program.emitError() << "rank " << program.getRank() << ": "
                        << (recorded.size() - next) / 3
                        << " compute actions of the imported schedule are "
                           "missing, from "
                        << kNames[recorded[next]] << " stage "
                        << recorded[next + 1] << " mb " << recorded[next + 2];
    return 1;
  }
  return 0;
}

/// [hpr.verify.gathered]: on a rank that unshards a stage, every action
/// reading the stage's parameters runs while they are gathered, between an
/// unshard and the reshard after it.
unsigned VerifyPass::verifyGathered(ProgramOp program) {
  llvm::DenseSet<int64_t> unsharded; // stages this program unshards
  for (UnshardOp unshard : program.getBody().getOps<UnshardOp>())
    unsharded.insert(unshard.getStageIndex());
  if (unsharded.empty())
    return 0;
  StringRef cite = ruleTag(Rule::VerifyGathered);
  unsigned violations = 0;
  auto report = [&](Operation *at) -> InFlightDiagnostic {
    ++violations;
    return at->emitError() << describeAction(at) << ": ";
  };
  llvm::MapVector<int64_t, Operation *> gathered; // stage -> its open unshard
  for (Operation &op : program.getBody().getOps()) {
    auto action = dyn_cast<ActionOpInterface>(op);
    if (!action)
      continue;
    int64_t stage = action.getStageIndex();
    if (isa<UnshardOp>(op)) {
      auto [it, inserted] = gathered.insert({stage, &op});
      if (!inserted)
        report(&op) << "unshards stage " << stage << ", already unsharded at "
                    << describeAction(it->second)
                    << " with no reshard in between " << cite;
    } else if (isa<ReshardOp>(op)) {
      if (!gathered.erase(stage))
        report(&op) << "reshards stage " << stage
                    << ", whose parameters are not unsharded here " << cite;
    } else if (isa<ForwardOp, BackwardInputOp, BackwardWeightOp, BackwardOp,
                   RecomputeOp>(op) &&
               unsharded.contains(stage) && !gathered.contains(stage)) {
      report(&op) << "reads the parameters of stage " << stage
                  << " while they are sharded: every forward, backward and "
                     "recompute of a stage its rank unshards lies between an "
                     "unshard of the stage and the reshard after it "
                  << cite;
    }
  }
  for (auto [stage, unshard] : gathered)
    report(unshard) << "stage " << stage
                    << " is never resharded after this unshard: its gathered "
                       "parameters outlive the step "
                    << cite;
  return violations;
}

unsigned VerifyPass::verifyProgram(ProgramOp program,
                                   const CheckpointedRegions *checkpointed) {
  unsigned violations = 0;
  llvm::MapVector<Operation *, SessionUses> uses; // by SessionOp, in order
  llvm::DenseMap<std::pair<int64_t, int64_t>, SessionOp> sessions;
  // (stage, mb)s whose forward runs plainly: their consumers read nothing.
  llvm::DenseSet<std::pair<int64_t, int64_t>> plain;
  for (Operation &op : program.getBody().getOps()) {
    if (auto forward = dyn_cast<ForwardOp>(op))
      if (forward.getNoCheckpoint())
        plain.insert({forward.getStageIndex(), forward.getMicrobatchIndex()});
    if (auto session = dyn_cast<SessionOp>(op)) {
      uses[session];
      ForwardOp forward = session.getForward();
      if (forward.getNoCheckpoint()) {
        ++violations;
        session.emitError() << describeAction(forward) << ": " << quote(session)
                            << " replays a forward marked "
                            << "no_checkpoint, which keeps its activations";
      }
      auto [it, inserted] = sessions.insert(
          {{forward.getStageIndex(), forward.getMicrobatchIndex()}, session});
      if (!inserted) {
        ++violations;
        session.emitError() << describeAction(forward) << ": " << quote(session)
                            << " is a second session for "
                            << "stage " << forward.getStage() << " mb "
                            << forward.getMicrobatch()
                            << " (first: " << quote(it->second) << ")";
      }
      continue;
    }
    if (auto recompute = dyn_cast<RecomputeOp>(op)) {
      if (SessionOp session = sessionOf(recompute.getSession()))
        (recompute.getForWeight() ? uses[session].weightReplays
                                  : uses[session].recomputes)
            .push_back(recompute);
      continue;
    }
    if (auto clear = dyn_cast<ClearOp>(op)) {
      if (SessionOp session = sessionOf(clear.getSession()))
        uses[session].clears.push_back(clear);
      continue;
    }
    auto consumer = dyn_cast<ConsumerOpInterface>(op);
    if (!consumer)
      continue;
    if (SessionOp session = sessionOf(consumer.getSessionValue())) {
      uses[session].consumers.push_back(consumer);
      continue;
    }
    if (auto weight = dyn_cast<BackwardWeightOp>(op);
        weight && weight.getWeightReplay()) {
      ++violations;
      op.emitError() << describeAction(&op)
                     << ": weight_replay, but it reads no session: nothing is "
                        "replayed for it (a plain microbatch or a stage not "
                        "checkpointed keeps its activations) "
                     << ruleTag(Rule::VerifyWeightReplay);
    }
    if (!checkpointed || !consumer.readsActivations())
      continue;
    auto action = cast<ActionOpInterface>(op);
    int64_t stage = action.getStageIndex();
    if (checkpointed->contains(stage) &&
        !plain.contains({stage, action.getMicrobatchIndex()})) {
      ++violations;
      op.emitError() << describeAction(&op) << ": reads no session, but stage "
                     << stage << " is checkpointed: it would recompute on "
                     << "its own, once per backward call";
    }
  }
  for (auto &[op, sessionUses] : uses) {
    auto session = cast<SessionOp>(op);
    std::optional<int64_t> numRegions;
    if (checkpointed)
      numRegions = checkpointed->lookup(session.getForward().getStageIndex());
    violations += verifySession(session, sessionUses, numRegions);
  }
  if (std::optional<ArrayRef<int64_t>> recorded = program.getComputeOrder())
    violations += verifyComputeOrder(program, *recorded);
  violations += verifyGathered(program);
  return violations;
}

void VerifyPass::runOnOperation() {
  ProgramOp program = getOperation();
  // The checkpointed stages, read off the enclosing module's model (no
  // program pass changes it); without a model, which consumers must read a
  // session and whether pieces cover every region cannot be checked, but the
  // rest still can.
  std::optional<CheckpointedRegions> checkpointed;
  auto module = program->getParentOfType<ModuleOp>();
  if (module && llvm::hasSingleElement(module.getOps<ModelOp>())) {
    checkpointed.emplace();
    for (StageOp stage : getModel(module).getBody().getOps<StageOp>())
      for (RegionOp region : stage.getBody().getOps<RegionOp>())
        if (region.getCheckpoint()) {
          ++(*checkpointed)[static_cast<int64_t>(stage.getIndex())];
          if (region.getSelective())
            selectiveStages.insert(static_cast<int64_t>(stage.getIndex()));
        }
  }
  unsigned violations =
      verifyProgram(program, checkpointed ? &*checkpointed : nullptr);
  LLVM_DEBUG(llvm::dbgs() << "rank " << program.getRank() << ": " << violations
                          << " violations\n");
  if (violations)
    signalPassFailure();
}

#undef DEBUG_TYPE
