//===- InsertRecompute.cpp - Place one recompute per session -------------===//
//
// Puts each session's hpr.recompute before its first consumer: right before
// it (jit) or a number of compute actions earlier (lookahead), so that the
// replay can run while the rank waits for the gradient. Placing by time is
// hpr-prefetch-into-bubbles. A jit replay of a session that one full
// backward reads runs inside that backward (`in_backward`,
// replaysInBackward), region by region as torch's checkpoint does, so that
// it holds one region's tensors at a time rather than the whole stage's. A
// dw marked `weight_replay` gets its own replay right before it
// (`for_weight`): its dx drops the first one.
//
//===----------------------------------------------------------------------===//

#include "SessionAnalysis.h"
#include "hpr/Analysis/ActivationModel.h"
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
    : public mlir::hpr::impl::HPRInsertRecomputeBase<InsertRecomputePass> {
  using HPRInsertRecomputeBase::HPRInsertRecomputeBase;
  LogicalResult initialize(MLIRContext *context) override;
  void runOnOperation() override;
  Operation *findInsertionPoint(SessionOp session, Operation *firstConsumer);
  void placeWeightReplays();
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
  if (policy != RecomputePolicy::Lookahead)
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

/// Options that the chosen policy does not read are refused rather than
/// ignored; once per pipeline, not once per program.
LogicalResult InsertRecomputePass::initialize(MLIRContext *context) {
  if (policy == RecomputePolicy::Bubble)
    return emitError(UnknownLoc::get(context))
           << "hpr-insert-recompute: placing by time is the "
              "hpr-prefetch-into-bubbles pass, after policy=jit";
  if (policy != RecomputePolicy::Lookahead &&
      (distance != 1 || distance.getNumOccurrences()))
    return emitError(UnknownLoc::get(context))
           << "hpr-insert-recompute: distance applies to policy=lookahead only";
  return success();
}

void InsertRecomputePass::runOnOperation() {
  OpBuilder builder(&getContext());
  for (SessionOp session : llvm::make_early_inc_range(
           getOperation().getBody().getOps<SessionOp>())) {
    for (Operation *user : session.getSession().getUsers())
      if (isa<RecomputeOp>(user)) {
        user->emitOpError()
            << "already exists for session \"" << session.getSid()
            << "\": hpr-insert-recompute runs once";
        return signalPassFailure();
      }
    auto consumers = getConsumers(session);
    if (consumers.empty())
      continue;
    Operation *point = findInsertionPoint(session, consumers.front());
    builder.setInsertionPoint(point);
    bool jit = point == getPairStart(consumers.front());
    auto readers = llvm::map_to_vector(
        consumers, [](ConsumerOpInterface c) { return c.getOperation(); });
    builder.create<RecomputeOp>(session.getLoc(), session.getSession(),
                                /*in_backward=*/jit &&
                                    replaysInBackward(readers));
    ++numRecomputeInserted;
    if (!jit)
      ++numPrefetched;
    LLVM_DEBUG(llvm::dbgs() << "recompute " << session.getSid() << " before "
                            << describeAction(point) << "\n");
  }
  placeWeightReplays();
}

/// The replay for each `weight_replay` dw, jit: right before it (before its
/// overlapped pair). A dw whose session its dx does not read first replays
/// nothing for it (a plain microbatch, a stage left unchecked, the first
/// stage): the mark goes, so that the plan says only what runs.
void InsertRecomputePass::placeWeightReplays() {
  OpBuilder builder(&getContext());
  for (BackwardWeightOp weight :
       getOperation().getBody().getOps<BackwardWeightOp>()) {
    if (!weight.getWeightReplay())
      continue;
    auto session = weight.getSession()
                       ? weight.getSession().getDefiningOp<SessionOp>()
                       : SessionOp();
    auto consumers = session ? getConsumers(session)
                             : llvm::SmallVector<ConsumerOpInterface>();
    if (consumers.size() != 2 || !isa<BackwardInputOp>(consumers.front()) ||
        consumers.back() != weight) {
      weight.setWeightReplay(false);
      ++numWeightReplaysDropped;
      continue;
    }
    builder.setInsertionPoint(getPairStart(weight));
    builder.create<RecomputeOp>(session.getLoc(), session.getSession(),
                                /*in_backward=*/false,
                                /*regions=*/DenseI64ArrayAttr(),
                                /*for_weight=*/true);
    ++numWeightReplays;
    LLVM_DEBUG(llvm::dbgs()
               << "recompute " << session.getSid() << " for its dw before "
               << describeAction(getPairStart(weight)) << "\n");
  }
}

#undef DEBUG_TYPE
