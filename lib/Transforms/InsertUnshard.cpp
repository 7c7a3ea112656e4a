//===- InsertUnshard.cpp - Gather FSDP parameters around their users ------===//
//
// Places each stage's all-gather (hpr.unshard) before the actions that read
// its parameters and the matching hpr.reshard after them, with the sliding
// window of torch.distributed.pipelining's lowering, counting every replay
// where placement left it.
//
//===----------------------------------------------------------------------===//

#include "SessionAnalysis.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/Support/Debug.h"

#define DEBUG_TYPE "hpr-insert-unshard"

namespace mlir::hpr {
#define GEN_PASS_DEF_HPRINSERTUNSHARD
#include "hpr/Transforms/Passes.h.inc"
} // namespace mlir::hpr

using namespace mlir;
using namespace mlir::hpr;

namespace {
struct InsertUnshardPass
    : public mlir::hpr::impl::HPRInsertUnshardBase<InsertUnshardPass> {
  using HPRInsertUnshardBase::HPRInsertUnshardBase;
  LogicalResult initialize(MLIRContext *context) override;
  void runOnOperation() override;
};

/// An action that reads parameters, and the stages it reads: an overlapped
/// pair is one user of both its stages.
struct User {
  Operation *op;
  llvm::SmallVector<int64_t, 2> stages;
};
} // namespace

LogicalResult InsertUnshardPass::initialize(MLIRContext *context) {
  if (maxActive == 0)
    return emitError(UnknownLoc::get(context))
           << "hpr-insert-unshard: max-active must be >= 1";
  return success();
}

/// The program's users of parameters in order: forwards, backwards and
/// recomputes.
static std::vector<User> collectUsers(ProgramOp program) {
  std::vector<User> users;
  for (Operation &op : program.getBody().getOps()) {
    if (!isComputeAction(&op) && !isa<RecomputeOp>(op))
      continue;
    int64_t stage = cast<ActionOpInterface>(op).getStageIndex();
    if (getPairStart(&op) != &op && !users.empty()) {
      users.back().stages.push_back(stage);
      continue;
    }
    users.push_back({&op, {stage}});
  }
  return users;
}

/// For each user, the first `count` distinct stages that users from it on
/// read, in the order of their next use, and every stage the user itself
/// reads. One sweep from the end: a rank has
/// few stages, so each user sorts the next uses of all of them.
static std::vector<llvm::SmallVector<int64_t, 4>>
nextStages(llvm::ArrayRef<User> users, unsigned count) {
  std::vector<llvm::SmallVector<int64_t, 4>> next(users.size());
  llvm::MapVector<int64_t, size_t> nextUse; // stage -> its next user
  for (size_t k = users.size(); k-- > 0;) {
    for (int64_t stage : llvm::reverse(users[k].stages))
      nextUse[stage] = k;
    // Within one user, its stages in part order.
    llvm::SmallVector<std::pair<size_t, int64_t>> order;
    for (auto [stage, use] : nextUse) {
      size_t part =
          llvm::find(users[use].stages, stage) - users[use].stages.begin();
      order.push_back({use * 2 + part, stage});
    }
    llvm::sort(order);
    for (auto [key, stage] : llvm::ArrayRef(order).take_front(count))
      next[k].push_back(stage);
    // A pair needs both its stages, even beyond `count` (as torch's window).
    for (int64_t stage : users[k].stages)
      if (!llvm::is_contained(next[k], stage))
        next[k].push_back(stage);
  }
  return next;
}

/// Where the unshards and reshards before `user` go: above the receives
/// right before it, as torch's lowering has them (it adds each receive right
/// before its reader, after placing the unshards), but never into a batched
/// run of transfers.
static Operation *gatherInsertionPoint(Operation *user) {
  Operation *at = user;
  while (Operation *prev = at->getPrevNode()) {
    Operation *before = prev->getPrevNode();
    if (!isa<RecvFOp, RecvBOp>(prev) || isBatched(prev) ||
        (before && isBatched(before)))
      break;
    at = prev;
  }
  return at;
}

void InsertUnshardPass::runOnOperation() {
  ProgramOp program = getOperation();
  auto module = program->getParentOfType<ModuleOp>();
  ModelOp model = module ? getModel(module) : ModelOp();
  if (!model || model.getDpShard().value_or(1) <= 1)
    return;
  if (!program.getBody().getOps<UnshardOp>().empty() ||
      !program.getBody().getOps<ReshardOp>().empty())
    return; // The schedule placed them; hpr-verify checks them
            // ([hpr.verify.gathered]).

  std::vector<User> users = collectUsers(program);
  std::vector<llvm::SmallVector<int64_t, 4>> next =
      nextStages(users, maxActive);
  OpBuilder builder(&getContext());
  llvm::SmallVector<int64_t, 4> gathered; // in stage order
  auto reshard = [&](int64_t stage) {
    builder.create<ReshardOp>(program.getLoc(), stage);
    ++numReshardInserted;
  };
  for (size_t k = 0; k < users.size(); ++k) {
    const User &user = users[k];
    llvm::ArrayRef<int64_t> window = next[k];
    builder.setInsertionPoint(gatherInsertionPoint(user.op));
    for (int64_t stage : gathered)
      if (!llvm::is_contained(window, stage)) {
        reshard(stage);
        LLVM_DEBUG(llvm::dbgs() << "reshard stage " << stage << " before "
                                << describeAction(user.op) << "\n");
      }
    llvm::erase_if(gathered, [&](int64_t stage) {
      return !llvm::is_contained(window, stage);
    });
    for (int64_t stage : window)
      if (!llvm::is_contained(gathered, stage)) {
        builder.create<UnshardOp>(user.op->getLoc(), stage);
        ++numUnshardInserted;
        gathered.insert(llvm::upper_bound(gathered, stage), stage);
        LLVM_DEBUG(llvm::dbgs() << "unshard stage " << stage << " before "
                                << describeAction(user.op) << "\n");
      }
  }
  builder.setInsertionPointToEnd(&program.getBody().front());
  for (int64_t stage : gathered)
    reshard(stage);
}

#undef DEBUG_TYPE
