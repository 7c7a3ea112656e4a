//===- InsertRecompute.cpp - Place one recompute per session -------------===//
//
// Puts each session's hpr.recompute before its first consumer: right before
// it (jit), or a number of compute actions earlier (lookahead), so that the
// replay can run while the rank waits on communication.
//
//===----------------------------------------------------------------------===//

#include "SessionAnalysis.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/Debug.h"

#define DEBUG_TYPE "hpr-insert-recompute"

namespace mlir::hpr {
#define GEN_PASS_DEF_HPRINSERTRECOMPUTE
#include "hpr/Transforms/Passes.h.inc"
} // namespace mlir::hpr

using namespace mlir;
using namespace mlir::hpr;

namespace {
struct InsertRecomputePass
    : public hpr::impl::HPRInsertRecomputeBase<InsertRecomputePass> {
  using HPRInsertRecomputeBase::HPRInsertRecomputeBase;
  void runOnOperation() override;
  Operation *findInsertionPoint(SessionOp session, Operation *firstConsumer);
};
} // namespace

/// With lookahead, walks up from the first consumer past `distance` compute
/// actions (an overlapped pair counts once) and past any communication in
/// between. The walk stops at the session itself, which sits after its
/// forward, so the replay never precedes the forward or the receive that fed
/// it.
Operation *InsertRecomputePass::findInsertionPoint(SessionOp session,
                                                   Operation *firstConsumer) {
  Operation *point = getPairStart(firstConsumer);
  if (policy == "jit")
    return point;
  unsigned counted = 0;
  while (Operation *prev = point->getPrevNode()) {
    if (prev == session.getOperation())
      break;
    if (isComputeAction(prev)) {
      if (counted == distance)
        break;
      ++counted;
      point = getPairStart(prev);
      continue;
    }
    point = prev;
  }
  return point;
}

/// The largest number of sessions whose recompute has run and whose last
/// consumer has not, at any point of `program`.
static unsigned countMaxLiveSessions(ProgramOp program) {
  unsigned live = 0, peak = 0;
  for (Operation &op : program.getBody().getOps()) {
    if (isa<RecomputeOp>(op))
      peak = std::max(peak, ++live);
    auto consumer = dyn_cast<ConsumerOpInterface>(op);
    if (!consumer || !consumer.getSessionValue())
      continue;
    auto session = consumer.getSessionValue().getDefiningOp<SessionOp>();
    if (getConsumers(session).back() == consumer && live > 0)
      --live;
  }
  return peak;
}

void InsertRecomputePass::runOnOperation() {
  if (policy != "jit" && policy != "lookahead") {
    getOperation().emitError() << "hpr-insert-recompute: unknown policy '"
                               << policy << "'; expected jit or lookahead";
    return signalPassFailure();
  }
  OpBuilder builder(&getContext());
  unsigned peak = 0;
  WalkResult result = getOperation().walk([&](ProgramOp program) {
    for (SessionOp session :
         llvm::make_early_inc_range(program.getBody().getOps<SessionOp>())) {
      for (Operation *user : session.getSession().getUsers())
        if (isa<RecomputeOp>(user)) {
          user->emitOpError()
              << "already exists for session \"" << session.getSid()
              << "\": hpr-insert-recompute runs once";
          return WalkResult::interrupt();
        }
      auto consumers = getConsumers(session);
      if (consumers.empty())
        continue;
      Operation *point = findInsertionPoint(session, consumers.front());
      builder.setInsertionPoint(point);
      builder.create<RecomputeOp>(session.getLoc(), session.getSession());
      ++numRecomputeInserted;
      if (point != getPairStart(consumers.front()))
        ++numPrefetched;
      LLVM_DEBUG(llvm::dbgs() << "recompute " << session.getSid() << " before "
                              << describeAction(point) << "\n");
    }
    peak = std::max(peak, countMaxLiveSessions(program));
    return WalkResult::advance();
  });
  if (result.wasInterrupted())
    return signalPassFailure();
  maxLiveSessions = peak;
}
