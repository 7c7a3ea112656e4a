//===- LowerRuntime.cpp - Write what runtimes read onto each action ------===//
//
// The last planning pass: posts, tags, waits, frees_graph, last_backward,
// hands_to and drops_replay become attributes of the ops (RuntimeLowering.h
// has the rules), so every emitter prints a lowered module and derives
// nothing.
//
//===----------------------------------------------------------------------===//

#include "hpr/Analysis/RuntimeLowering.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/Threading.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/Debug.h"

#define DEBUG_TYPE "hpr-lower-runtime"

namespace mlir::hpr {
#define GEN_PASS_DEF_HPRLOWERRUNTIME
#include "hpr/Transforms/Passes.h.inc"
} // namespace mlir::hpr

using namespace mlir;
using namespace mlir::hpr;

namespace {
struct LowerRuntimePass
    : public mlir::hpr::impl::HPRLowerRuntimeBase<LowerRuntimePass> {
  void runOnOperation() override;

private:
  /// Lowers one rank; `postsGiven`: keep the receives' own `posts`.
  void lowerProgram(ProgramOp program, const SendOrder &sends, bool postsGiven);
};
} // namespace

void LowerRuntimePass::lowerProgram(ProgramOp program, const SendOrder &sends,
                                    bool postsGiven) {
  Builder builder(program.getContext());
  ActionIndexLists posts;
  if (!postsGiven)
    posts = receivePosts(program, sends);
  ActionIndexLists waits = receiveReaders(program);
  llvm::DenseSet<Operation *> freesGraph = lastConsumers(program);
  llvm::DenseSet<Operation *> lastBackward = lastBackwards(program);
  llvm::DenseMap<Operation *, int64_t> handsTo = handoffs(program);
  llvm::DenseSet<Operation *> droppers = replayDroppers(program);
  auto indices = [&](const ActionIndexLists &lists, Operation *op) {
    auto it = lists.find(op);
    return it == lists.end() ? DenseI64ArrayAttr()
                             : builder.getDenseI64ArrayAttr(it->second);
  };
  auto stage = [&](Operation *op) {
    auto it = handsTo.find(op);
    return it == handsTo.end() ? IntegerAttr()
                               : builder.getI64IntegerAttr(it->second);
  };
  for (Operation &op : program.getBody().getOps()) {
    llvm::TypeSwitch<Operation *>(&op)
        .Case<SendFOp, SendBOp>([&](auto send) {
          if (!send.getTagAttr())
            send.setTag(messageTag(send));
        })
        .Case<RecvFOp, RecvBOp>([&](auto recv) {
          if (!recv.getTagAttr())
            recv.setTag(messageTag(recv));
          if (!postsGiven)
            recv.setPostsAttr(indices(posts, recv));
          else if (!recv.getPostsAttr())
            recv.setPostsAttr(builder.getDenseI64ArrayAttr({}));
        })
        .Case<ForwardOp, BackwardInputOp, BackwardOp>([&](auto action) {
          action.setWaitsAttr(indices(waits, action));
          action.setHandsToAttr(stage(action));
        });
    llvm::TypeSwitch<Operation *>(&op).Case<BackwardWeightOp, BackwardOp>(
        [&](auto backward) {
          backward.setLastBackward(lastBackward.contains(backward));
        });
    llvm::TypeSwitch<Operation *>(&op)
        .Case<BackwardInputOp, BackwardWeightOp, BackwardOp>(
            [&](auto backward) {
              backward.setFreesGraph(freesGraph.contains(backward));
            });
    if (auto input = dyn_cast<BackwardInputOp>(op))
      input.setDropsReplay(droppers.contains(input));
  }
  numWaits += waits.size();
  numHandoffs += handsTo.size();
}

void LowerRuntimePass::runOnOperation() {
  for (ScheduleOp schedule : getOperation().getOps<ScheduleOp>()) {
    SendOrder sends = collectSendOrder(schedule);
    bool postsGiven = false;
    for (ProgramOp program : schedule.getBody().getOps<ProgramOp>())
      for (Operation &op : program.getBody().getOps())
        postsGiven |= llvm::TypeSwitch<Operation *, bool>(&op)
                          .Case<RecvFOp, RecvBOp>([](auto recv) {
                            return static_cast<bool>(recv.getPostsAttr());
                          })
                          .Default([](Operation *) { return false; });
    LLVM_DEBUG(llvm::dbgs()
               << "hpr-lower-runtime: schedule \"" << schedule.getName() << "\""
               << (postsGiven ? ", posts given\n" : "\n"));
    auto programs = llvm::to_vector(schedule.getBody().getOps<ProgramOp>());
    mlir::parallelFor(&getContext(), 0, programs.size(), [&](size_t index) {
      lowerProgram(programs[index], sends, postsGiven);
    });
  }
}

#undef DEBUG_TYPE
