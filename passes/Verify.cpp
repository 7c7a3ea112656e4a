//===- Verify.cpp - Static check of every recompute session --------------===//
//
// Proves, from the IR alone, that each session is recomputed once before any
// reader, cleared once after the last reader, and flagged right in between.
// It shares no logic with the passes that build plans, so it also judges
// plans written by hand or by other tools.
//
//===----------------------------------------------------------------------===//

#include "SessionAnalysis.h"
#include "hpr/Transforms/Passes.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/Debug.h"

#define DEBUG_TYPE "hpr-verify"

namespace mlir::hpr {
#define GEN_PASS_DEF_HPRVERIFY
#include "hpr/Transforms/Passes.h.inc"
} // namespace mlir::hpr

using namespace mlir;
using namespace mlir::hpr;

namespace {
struct VerifyPass : public hpr::impl::HPRVerifyBase<VerifyPass> {
  void runOnOperation() override;

private:
  /// Checks one session; returns the number of violations found.
  unsigned verifySession(SessionOp session);
  unsigned verifyProgram(ProgramOp program,
                         const llvm::DenseSet<int64_t> *checkpointed);
};
} // namespace

/// Quotes a session for messages: `session "s3.mb0"`.
static std::string quote(SessionOp session) {
  return ("session \"" + session.getSid() + "\"").str();
}

unsigned VerifyPass::verifySession(SessionOp session) {
  unsigned violations = 0;
  auto report = [&](Operation *at) -> InFlightDiagnostic {
    ++violations;
    return at->emitError() << describeAction(at) << ": ";
  };

  // Keeps the earliest op of kind `Op` in `first`; reports each later one.
  auto recordOnce = [&](auto op, auto &first, StringRef what) {
    if (!first) {
      first = op;
      return;
    }
    if (op->isBeforeInBlock(first))
      std::swap(op, first);
    report(op) << quote(session) << " is " << what << " a second time "
               << "(first at " << describeAction(first) << ")";
  };
  RecomputeOp recompute;
  ClearOp clear;
  for (Operation *user : session.getSession().getUsers()) {
    if (auto op = dyn_cast<RecomputeOp>(user))
      recordOnce(op, recompute, "recomputed");
    else if (auto op = dyn_cast<ClearOp>(user))
      recordOnce(op, clear, "cleared");
  }

  auto consumers = getConsumers(session);
  if (consumers.empty() && !recompute)
    return violations; // Bound but never read nor replayed: holds nothing.

  if (!recompute)
    report(consumers.front()) << "reads " << quote(session)
                              << ", which is never recomputed before it";
  if (!clear)
    report(recompute ? recompute.getOperation()
                     : consumers.back().getOperation())
        << quote(session) << " is never cleared: its recomputed tensors leak";

  if (recompute && clear && clear->isBeforeInBlock(recompute))
    report(recompute) << quote(session) << " is recomputed after its clear at "
                      << describeAction(clear);

  for (auto [index, consumer] : llvm::enumerate(consumers)) {
    Operation *op = consumer.getOperation();
    if (recompute && op->isBeforeInBlock(recompute))
      report(op) << "reads " << quote(session) << " before its recompute at "
                 << describeAction(recompute);
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

unsigned
VerifyPass::verifyProgram(ProgramOp program,
                          const llvm::DenseSet<int64_t> *checkpointed) {
  unsigned violations = 0;
  llvm::DenseMap<std::pair<int64_t, int64_t>, SessionOp> sessions;
  // (stage, mb)s whose forward runs plainly: their consumers read nothing.
  llvm::DenseSet<std::pair<int64_t, int64_t>> plain;
  for (Operation &op : program.getBody().getOps()) {
    if (auto forward = dyn_cast<ForwardOp>(op))
      if (forward.getNoCheckpoint())
        plain.insert({forward.getStageIndex(), forward.getMicrobatchIndex()});
    if (auto session = dyn_cast<SessionOp>(op)) {
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
      violations += verifySession(session);
      continue;
    }
    auto consumer = dyn_cast<ConsumerOpInterface>(op);
    if (!consumer || consumer.getSessionValue() || !checkpointed)
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
  if (std::optional<uint64_t> recorded = program.getComputeDigest())
    if (*recorded != program.computeOrderDigest()) {
      ++violations;
      program.emitError() << "rank " << program.getRank()
                          << ": the order of forward/backward actions differs "
                             "from the imported schedule";
    }
  return violations;
}

void VerifyPass::runOnOperation() {
  ModuleOp module = getOperation();
  // Without a model, rule 7 cannot be checked; the rest still can.
  std::optional<llvm::DenseSet<int64_t>> checkpointed;
  if (llvm::hasSingleElement(module.getOps<ModelOp>()))
    checkpointed = *getCheckpointedStages(module);
  unsigned violations = 0;
  module.walk([&](ProgramOp program) {
    violations +=
        verifyProgram(program, checkpointed ? &*checkpointed : nullptr);
  });
  LLVM_DEBUG(llvm::dbgs() << violations << " violations\n");
  if (violations)
    signalPassFailure();
}
