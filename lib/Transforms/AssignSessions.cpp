//===- AssignSessions.cpp - One recompute session per (stage, mb) --------===//
//
// Binds the checkpoint handles of every forward of a checkpointed stage to a
// session and points the forward's backward actions that read activations at
// it.
//
//===----------------------------------------------------------------------===//

#include "SessionAnalysis.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/Support/Debug.h"

#define DEBUG_TYPE "hpr-assign-sessions"

namespace mlir::hpr {
#define GEN_PASS_DEF_HPRASSIGNSESSIONS
#include "hpr/Transforms/Passes.h.inc"
} // namespace mlir::hpr

using namespace mlir;
using namespace mlir::hpr;

namespace {
struct AssignSessionsPass
    : public mlir::hpr::impl::HPRAssignSessionsBase<AssignSessionsPass> {
  void runOnOperation() override;
  LogicalResult assignInProgram(ProgramOp program,
                                const llvm::DenseSet<int64_t> &checkpointed);
};
} // namespace

LogicalResult AssignSessionsPass::assignInProgram(
    ProgramOp program, const llvm::DenseSet<int64_t> &checkpointed) {
  using Key = std::pair<int64_t, int64_t>;
  // Only forwards whose (stage, mb) is consumed later in this program get a
  // session: a session nobody reads would be recomputed for nothing.
  llvm::DenseSet<Key> consumed;
  for (Operation &op : program.getBody().getOps()) {
    if (isa<SessionOp>(op))
      return op.emitOpError()
             << "already exists: hpr-assign-sessions runs once, on programs "
                "without sessions";
    auto reader = dyn_cast<ConsumerOpInterface>(op);
    if (reader && reader.readsActivations()) {
      auto action = cast<ActionOpInterface>(op);
      consumed.insert({action.getStageIndex(), action.getMicrobatchIndex()});
    }
  }

  llvm::DenseMap<Key, Value> sessions;
  OpBuilder builder(program.getContext());
  for (Operation &op : llvm::make_early_inc_range(program.getBody().getOps())) {
    if (isa<SessionOp>(op))
      continue; // Inserted by this walk after an overlapped pair.
    if (auto forward = dyn_cast<ForwardOp>(op)) {
      Key key{forward.getStageIndex(), forward.getMicrobatchIndex()};
      if (!checkpointed.contains(key.first) || forward.getNoCheckpoint() ||
          !consumed.contains(key))
        continue;
      // After the whole overlapped pair, so the pair stays adjacent.
      builder.setInsertionPointAfter(getPairEnd(forward));
      auto session = builder.create<SessionOp>(
          forward.getLoc(), builder.getType<SessionType>(), forward.getHandle(),
          builder.getStringAttr(getSessionId(key.first, key.second)));
      sessions[key] = session.getSession();
      ++numSessions;
      LLVM_DEBUG(llvm::dbgs() << "session " << session.getSid() << "\n");
      continue;
    }
    // The first stage's backward_input reads nothing (HPROps.td): unbound,
    // so its W is the session's one reader.
    auto consumer = dyn_cast<ConsumerOpInterface>(op);
    if (!consumer || !consumer.readsActivations())
      continue;
    if (consumer.getSessionValue())
      return op.emitOpError() << "already reads a session: "
                                 "hpr-assign-sessions runs once";
    auto action = cast<ActionOpInterface>(op);
    auto it =
        sessions.find({action.getStageIndex(), action.getMicrobatchIndex()});
    // A consumer whose forward is later (or missing) stays unbound;
    // hpr-verify reports it.
    if (it == sessions.end() ||
        !it->second.getDefiningOp()->isBeforeInBlock(&op))
      continue;
    consumer.setSessionValue(it->second);
    ++numConsumersBound;
  }
  return success();
}

void AssignSessionsPass::runOnOperation() {
  ProgramOp program = getOperation();
  FailureOr<llvm::DenseSet<int64_t>> checkpointed =
      getCheckpointedStages(program);
  if (failed(checkpointed) || failed(assignInProgram(program, *checkpointed)))
    signalPassFailure();
}

#undef DEBUG_TYPE
