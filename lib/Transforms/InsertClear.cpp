//===- InsertClear.cpp - Clear each session after its last consumer ------===//
//
// Ends every session's life right after its last reader and tells the
// readers before it to keep the recomputed tensors (retain_on_unpack).
//
//===----------------------------------------------------------------------===//

#include "SessionAnalysis.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/Support/Debug.h"

#define DEBUG_TYPE "hpr-insert-clear"

namespace mlir::hpr {
#define GEN_PASS_DEF_HPRINSERTCLEAR
#include "hpr/Transforms/Passes.h.inc"
} // namespace mlir::hpr

using namespace mlir;
using namespace mlir::hpr;

namespace {
struct InsertClearPass
    : public mlir::hpr::impl::HPRInsertClearBase<InsertClearPass> {
  void runOnOperation() override;
};
} // namespace

void InsertClearPass::runOnOperation() {
  OpBuilder builder(&getContext());
  for (SessionOp session : getOperation().getBody().getOps<SessionOp>()) {
    for (Operation *user : session.getSession().getUsers())
      if (isa<ClearOp>(user)) {
        user->emitOpError()
            << "already exists for session \"" << session.getSid()
            << "\": hpr-insert-clear runs once";
        return signalPassFailure();
      }
    auto consumers = getConsumers(session);
    if (consumers.empty())
      continue;
    for (ConsumerOpInterface consumer : consumers) {
      bool isLast = consumer == consumers.back();
      consumer.setRetainOnUnpackFlag(!isLast);
      if (!isLast)
        ++numRetained;
    }
    // A reader is never a pair's first half, so this is after any pair too.
    builder.setInsertionPointAfter(consumers.back());
    builder.create<ClearOp>(session.getLoc(), session.getSession());
    ++numClearInserted;
    LLVM_DEBUG(llvm::dbgs() << "clear " << session.getSid() << " after "
                            << describeAction(consumers.back()) << "\n");
  }
}

#undef DEBUG_TYPE
