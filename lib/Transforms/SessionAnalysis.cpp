//===- SessionAnalysis.cpp - Queries shared by the planning passes -------===//

#include "SessionAnalysis.h"

#include "llvm/ADT/STLExtras.h"

using namespace mlir;
using namespace mlir::hpr;

FailureOr<llvm::DenseSet<int64_t>>
mlir::hpr::getCheckpointedStages(ProgramOp program) {
  auto module = program->getParentOfType<ModuleOp>();
  auto models = module ? llvm::to_vector(module.getOps<ModelOp>())
                       : llvm::SmallVector<ModelOp>();
  if (models.size() != 1)
    return program.emitError()
           << "expected exactly one hpr.model in the enclosing module, found "
           << models.size()
           << "; the planner needs it to know which stages are checkpointed";
  llvm::DenseSet<int64_t> stages;
  for (StageOp stage : models.front().getBody().getOps<StageOp>())
    if (llvm::any_of(stage.getBody().getOps<RegionOp>(),
                     [](RegionOp region) { return region.getCheckpoint(); }))
      stages.insert(static_cast<int64_t>(stage.getIndex()));
  return stages;
}

llvm::SmallVector<ConsumerOpInterface>
mlir::hpr::getConsumers(SessionOp session) {
  llvm::SmallVector<ConsumerOpInterface> consumers;
  for (Operation *user : session.getSession().getUsers())
    if (auto consumer = dyn_cast<ConsumerOpInterface>(user))
      consumers.push_back(consumer);
  llvm::sort(consumers, [](ConsumerOpInterface a, ConsumerOpInterface b) {
    return a->isBeforeInBlock(b);
  });
  return consumers;
}

Operation *mlir::hpr::getPairStart(Operation *op) {
  if (!isOverlapped(op) || isa<ForwardOp>(op))
    return op;
  Operation *prev = op->getPrevNode();
  while (prev && isa<SessionOp>(prev))
    prev = prev->getPrevNode();
  return prev ? prev : op;
}

Operation *mlir::hpr::getPairEnd(Operation *op) {
  if (!isOverlapped(op) || !isa<ForwardOp>(op))
    return op;
  Operation *next = op->getNextNode();
  while (next && isa<SessionOp>(next))
    next = next->getNextNode();
  return next ? next : op;
}

bool mlir::hpr::isComputeAction(Operation *op) {
  return isa<ForwardOp, BackwardInputOp, BackwardWeightOp, BackwardOp>(op);
}
