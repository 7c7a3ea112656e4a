//===- RuntimeLowering.cpp - What a runtime reads off each action --------===//

#include "hpr/Analysis/RuntimeLowering.h"

#include "hpr/Schedule/ScheduleUtils.h"

#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::hpr;

using Message = SendOrder::Message;

/// The key of a message: forward or backward, the receiving stage, the
/// microbatch (stages and microbatches are far below 2^31; a stage one past
/// either end, of a transfer to no stage, still gets a key of its own).
static Message messageKey(bool forward, int64_t stage, int64_t microbatch) {
  return (static_cast<uint64_t>(stage + 1) << 33) |
         (static_cast<uint64_t>(microbatch) << 1) | (forward ? 1 : 0);
}

/// The message `op` sends or receives, by its receiving end.
static Message messageOf(Operation *op) {
  auto action = cast<ActionOpInterface>(op);
  bool forward = isa<SendFOp, RecvFOp>(op);
  int64_t stage = action.getStageIndex();
  if (isa<SendFOp>(op))
    ++stage;
  if (isa<SendBOp>(op))
    --stage;
  return messageKey(forward, stage, action.getMicrobatchIndex());
}

static int64_t peerOf(Operation *op) {
  return llvm::TypeSwitch<Operation *, int64_t>(op)
      .Case<SendFOp, RecvFOp, SendBOp, RecvBOp>(
          [](auto comm) { return static_cast<int64_t>(comm.getPeer()); })
      .Default([](Operation *) { return -1; });
}

SendOrder mlir::hpr::collectSendOrder(ScheduleOp schedule) {
  SendOrder order;
  for (ProgramOp program : schedule.getBody().getOps<ProgramOp>())
    for (Operation &op : program.getBody().getOps())
      if (isa<SendFOp, SendBOp>(op))
        order.sent[{program.getRank(), peerOf(&op)}].push_back(messageOf(&op));
  return order;
}

ActionIndexLists mlir::hpr::receivePosts(ProgramOp program,
                                         const SendOrder &sends) {
  ActionIndexLists result;
  // The program's receives by message, and each receive's index.
  llvm::DenseMap<Message, int64_t> receiveOf;
  llvm::SmallVector<std::pair<Operation *, int64_t>> receives;
  int64_t index = 0;
  for (Operation &op : program.getBody().getOps()) {
    if (!isa<ActionOpInterface>(op))
      continue;
    if (isa<RecvFOp, RecvBOp>(op)) {
      receiveOf.insert({messageOf(&op), index});
      receives.push_back({&op, index});
    }
    ++index;
  }
  std::map<int64_t, size_t> nextFromPeer;
  llvm::DenseSet<int64_t> posted;
  for (auto [op, self] : receives) {
    int64_t peer = peerOf(op);
    llvm::SmallVector<int64_t> &list = result[op];
    auto sent = sends.sent.find({peer, program.getRank()});
    size_t &next = nextFromPeer[peer];
    while (sent != sends.sent.end() && !posted.contains(self) &&
           next < sent->second.size()) {
      auto recv = receiveOf.find(sent->second[next++]);
      if (recv != receiveOf.end() && posted.insert(recv->second).second)
        list.push_back(recv->second);
    }
    if (posted.insert(self).second)
      list.push_back(self);
  }
  return result;
}

ActionIndexLists mlir::hpr::receiveReaders(ProgramOp program) {
  ActionIndexLists result;
  // The message a receive brings, by its receiving end, and its index.
  llvm::DenseMap<Message, llvm::SmallVector<int64_t, 1>> receives;
  int64_t index = 0;
  for (Operation &op : program.getBody().getOps()) {
    if (!isa<ActionOpInterface>(op))
      continue;
    if (isa<RecvFOp, RecvBOp>(op))
      receives[messageOf(&op)].push_back(index);
    ++index;
  }
  // The forward reads its input; the first I or B its output gradient.
  llvm::DenseSet<Message> read;
  for (Operation &op : program.getBody().getOps()) {
    if (!isa<ForwardOp, BackwardInputOp, BackwardOp>(op))
      continue;
    auto action = cast<ActionOpInterface>(op);
    Message message = messageKey(isa<ForwardOp>(op), action.getStageIndex(),
                                 action.getMicrobatchIndex());
    auto it = receives.find(message);
    if (it != receives.end() && read.insert(message).second)
      result[&op].assign(it->second.begin(), it->second.end());
  }
  return result;
}

llvm::DenseSet<Operation *> mlir::hpr::lastConsumers(ProgramOp program) {
  llvm::DenseMap<std::pair<int64_t, int64_t>, Operation *> last;
  for (Operation &op : program.getBody().getOps())
    if (isa<ConsumerOpInterface>(op)) {
      auto action = cast<ActionOpInterface>(op);
      last[{action.getStageIndex(), action.getMicrobatchIndex()}] = &op;
    }
  llvm::DenseSet<Operation *> ops;
  for (auto &entry : last)
    ops.insert(entry.second);
  return ops;
}

llvm::DenseSet<Operation *> mlir::hpr::lastBackwards(ProgramOp program) {
  llvm::DenseMap<int64_t, Operation *> last;
  for (Operation &op : program.getBody().getOps())
    if (isa<BackwardWeightOp, BackwardOp>(op))
      last[cast<ActionOpInterface>(op).getStageIndex()] = &op;
  llvm::DenseSet<Operation *> ops;
  for (auto &entry : last)
    ops.insert(entry.second);
  return ops;
}

int64_t mlir::hpr::resultStage(Operation *op) {
  // Where the transfer of its result would go.
  sched::Action transfer;
  transfer.kind =
      isa<ForwardOp>(op) ? sched::ActionKind::SendF : sched::ActionKind::SendB;
  transfer.stage =
      static_cast<int>(cast<ActionOpInterface>(op).getStageIndex());
  return sched::neighbourStage(transfer);
}

llvm::DenseMap<Operation *, int64_t> mlir::hpr::handoffs(ProgramOp program) {
  llvm::DenseMap<Operation *, int64_t> result;
  auto schedule = program->getParentOfType<ScheduleOp>();
  auto numStages = static_cast<int64_t>(schedule.getNumStages());
  for (Operation &op : program.getBody().getOps()) {
    if (!isa<ForwardOp, BackwardInputOp, BackwardOp>(op))
      continue;
    int64_t neighbour = resultStage(&op);
    if (neighbour >= 0 && neighbour < numStages &&
        schedule.getRankOf(neighbour) ==
            static_cast<int64_t>(program.getRank()))
      result[&op] = neighbour;
  }
  return result;
}

llvm::DenseSet<Operation *> mlir::hpr::replayDroppers(ProgramOp program) {
  llvm::DenseSet<Operation *> ops;
  for (RecomputeOp recompute : program.getBody().getOps<RecomputeOp>())
    if (recompute.getForWeight())
      for (Operation *user : recompute.getSession().getUsers())
        if (isa<BackwardInputOp>(user))
          ops.insert(user);
  return ops;
}

int64_t mlir::hpr::messageTag(Operation *op) {
  auto action = cast<ActionOpInterface>(op);
  bool forward = isa<SendFOp, RecvFOp>(op);
  int64_t sender = action.getStageIndex();
  if (isa<RecvFOp>(op))
    sender -= 1;
  if (isa<RecvBOp>(op))
    sender += 1;
  int64_t microbatches = op->getParentOfType<ScheduleOp>().getNumMicrobatches();
  return (sender * microbatches + action.getMicrobatchIndex()) * 2 +
         (forward ? 0 : 1);
}
