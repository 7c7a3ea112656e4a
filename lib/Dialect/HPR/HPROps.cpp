//===- HPROps.cpp - hpr operation verifiers and helpers ------------------===//

#include "hpr/Dialect/HPR/HPROps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir;
using namespace mlir::hpr;

#include "hpr/Dialect/HPR/HPRInterfaces.cpp.inc"

#define GET_OP_CLASSES
#include "hpr/Dialect/HPR/HPROps.cpp.inc"

//===----------------------------------------------------------------------===//
// Shared checks
//===----------------------------------------------------------------------===//

/// Checks that `stage` (and `microbatch`, unless negative) exist in the
/// enclosing schedule and that `stage` runs on the enclosing program's rank.
static LogicalResult verifyPlacement(Operation *op, uint64_t stage,
                                     std::optional<uint64_t> microbatch) {
  auto program = op->getParentOfType<ProgramOp>();
  auto schedule = program->getParentOfType<ScheduleOp>();
  if (!schedule)
    return success();
  uint64_t numStages = schedule.getNumStages();
  if (stage >= numStages)
    return op->emitOpError()
           << "stage " << static_cast<int64_t>(stage)
           << " is out of range: the schedule has " << numStages << " stages";
  if (microbatch && *microbatch >= schedule.getNumMicrobatches())
    return op->emitOpError()
           << "microbatch " << static_cast<int64_t>(*microbatch)
           << " is out of range: the schedule has "
           << schedule.getNumMicrobatches() << " microbatches";
  ArrayRef<int64_t> stageToRank = schedule.getStageToRank();
  if (stage >= stageToRank.size())
    return success(); // The schedule's own verifier reports the short map.
  int64_t owner = stageToRank[stage];
  if (owner != static_cast<int64_t>(program.getRank()))
    return op->emitOpError() << "stage " << stage << " runs on rank " << owner
                             << ", but this action is in the program of rank "
                             << program.getRank();
  return success();
}

/// Verifies that a region body holds only ops of type `Child`.
template <typename Child>
static LogicalResult verifyOnlyChildren(Operation *parent, Region &body,
                                        StringRef childName) {
  for (Operation &op : body.getOps())
    if (!isa<Child>(op))
      return op.emitOpError() << "is not allowed in '" << parent->getName()
                              << "'; expected only '" << childName << "'";
  return success();
}

//===----------------------------------------------------------------------===//
// Model
//===----------------------------------------------------------------------===//

LogicalResult ModelOp::verifyRegions() {
  if (failed(verifyOnlyChildren<StageOp>(*this, getBody(), "hpr.stage")))
    return failure();
  uint64_t expected = 0;
  for (StageOp stage : getBody().getOps<StageOp>()) {
    if (stage.getIndex() != expected)
      return stage.emitOpError()
             << "has index " << stage.getIndex() << ", expected " << expected
             << " (stages are numbered 0, 1, ... in order)";
    ++expected;
  }
  return success();
}

LogicalResult StageOp::verifyRegions() {
  return verifyOnlyChildren<RegionOp>(*this, getBody(), "hpr.region");
}

LogicalResult RegionOp::verify() {
  if (getCheckpoint() && getNonCheckpointable())
    return emitOpError() << "region '" << getName()
                         << "' is marked both checkpoint and "
                            "non_checkpointable";
  if (getSelective() && !getCheckpoint())
    return emitOpError() << "region '" << getName()
                         << "' is marked selective but not checkpoint";
  if (getSelective() && !getSelectiveReplayTimeUs())
    return emitOpError() << "region '" << getName()
                         << "' is marked selective without its measured "
                            "selective costs (selective_replay_time_us)";
  auto negative = [](std::optional<llvm::APFloat> value) {
    return value && value->convertToDouble() < 0;
  };
  if (getFwdFlops().convertToDouble() < 0 ||
      getFwdTimeUs().convertToDouble() < 0 || negative(getBwdInputTimeUs()) ||
      negative(getBwdWeightTimeUs()) || negative(getBwdTimeUs()) ||
      negative(getCheckpointFwdTimeUs()) || negative(getReplayTimeUs()) ||
      negative(getSelectiveFwdTimeUs()) || negative(getSelectiveReplayTimeUs()))
    return emitOpError() << "region '" << getName()
                         << "' has a negative time or FLOP cost";
  for (auto [value, label] :
       {std::pair<uint64_t, StringRef>{getSavedBytes(), "saved"},
        {getInputBytes(), "input"},
        {getParamBytes(), "params"},
        {getBwdWeightInputBytes().value_or(0), "bwd_weight_input_bytes"},
        {getBwdWorkspaceBytes().value_or(0), "bwd_workspace_bytes"},
        {getBwdInputWorkspaceBytes().value_or(0), "bwd_input_workspace_bytes"},
        {getBwdWeightWorkspaceBytes().value_or(0),
         "bwd_weight_workspace_bytes"},
        {getCheckpointStateBytes().value_or(0), "checkpoint_state_bytes"},
        {getReplayBytes().value_or(0), "replay_bytes"},
        {getReplayWeightBytes().value_or(0), "replay_weight_bytes"},
        {getSelectiveSavedBytes().value_or(0), "selective_saved_bytes"},
        {getSelectiveReplayBytes().value_or(0), "selective_replay_bytes"}})
    if (static_cast<int64_t>(value) < 0)
      return emitOpError() << "region '" << getName() << "' has negative '"
                           << label << "' bytes";
  return success();
}

//===----------------------------------------------------------------------===//
// Schedule and programs
//===----------------------------------------------------------------------===//

LogicalResult ScheduleOp::verifyRegions() {
  int64_t numRanks = getNumRanks();
  ArrayRef<int64_t> stageToRank = getStageToRank();
  if (static_cast<int64_t>(stageToRank.size()) !=
      static_cast<int64_t>(getNumStages()))
    return emitOpError() << "stage_to_rank has " << stageToRank.size()
                         << " entries for " << getNumStages() << " stages";
  for (auto [stage, rank] : llvm::enumerate(stageToRank))
    if (rank < 0 || rank >= numRanks)
      return emitOpError() << "stage_to_rank maps stage " << stage
                           << " to rank " << rank << ", outside [0, "
                           << numRanks << ")";
  if (failed(verifyOnlyChildren<ProgramOp>(*this, getBody(), "hpr.program")))
    return failure();
  int64_t expected = 0;
  for (ProgramOp program : getBody().getOps<ProgramOp>()) {
    if (static_cast<int64_t>(program.getRank()) != expected)
      return program.emitOpError()
             << "is for rank " << program.getRank() << ", expected rank "
             << expected << " (one program per rank, in rank order)";
    ++expected;
  }
  if (expected != numRanks)
    return emitOpError() << "has " << expected << " programs for " << numRanks
                         << " ranks";
  return success();
}

/// True for an op that may stand second in an overlapped F/B pair.
static bool isBackwardKind(Operation *op) {
  return isa<BackwardInputOp, BackwardWeightOp, BackwardOp>(op);
}

bool mlir::hpr::isBatched(Operation *op) {
  return llvm::TypeSwitch<Operation *, bool>(op)
      .Case<SendFOp, RecvFOp, SendBOp, RecvBOp>(
          [](auto comm) { return comm.getBatched(); })
      .Default([](Operation *) { return false; });
}

bool mlir::hpr::isOverlapped(Operation *op) {
  return llvm::TypeSwitch<Operation *, bool>(op)
      .Case<ForwardOp, BackwardInputOp, BackwardWeightOp, BackwardOp>(
          [](auto action) { return action.getOverlap(); })
      .Default([](Operation *) { return false; });
}

std::optional<ArrayRef<int64_t>> mlir::hpr::getWaits(Operation *op) {
  return llvm::TypeSwitch<Operation *, std::optional<ArrayRef<int64_t>>>(op)
      .Case<ForwardOp, BackwardInputOp, BackwardOp>(
          [](auto action) { return action.getWaits(); })
      .Default([](Operation *) { return std::nullopt; });
}

std::optional<int64_t> mlir::hpr::getHandsTo(Operation *op) {
  return llvm::TypeSwitch<Operation *, std::optional<int64_t>>(op)
      .Case<ForwardOp, BackwardInputOp, BackwardOp>(
          [](auto action) -> std::optional<int64_t> {
            if (std::optional<uint64_t> stage = action.getHandsTo())
              return static_cast<int64_t>(*stage);
            return std::nullopt;
          })
      .Default([](Operation *) { return std::nullopt; });
}

bool mlir::hpr::isLastBackward(Operation *op) {
  return llvm::TypeSwitch<Operation *, bool>(op)
      .Case<BackwardWeightOp, BackwardOp>(
          [](auto backward) { return backward.getLastBackward(); })
      .Default([](Operation *) { return false; });
}

bool mlir::hpr::freesGraph(Operation *op) {
  return llvm::TypeSwitch<Operation *, bool>(op)
      .Case<BackwardInputOp, BackwardWeightOp, BackwardOp>(
          [](auto backward) { return backward.getFreesGraph(); })
      .Default([](Operation *) { return false; });
}

std::string mlir::hpr::describeAction(Operation *op) {
  auto program = op->getParentOfType<ProgramOp>();
  unsigned index = 0;
  for (Operation &other : program.getBody().getOps()) {
    if (&other == op)
      break;
    if (isa<ActionOpInterface>(other))
      ++index;
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << "rank " << program.getRank() << ", action " << index << " ("
     << op->getName().stripDialect();
  if (auto action = dyn_cast<ActionOpInterface>(op)) {
    if (action.getStageIndex() >= 0)
      os << " stage " << action.getStageIndex();
    if (action.getMicrobatchIndex() >= 0)
      os << " mb " << action.getMicrobatchIndex();
  }
  os << ")";
  return text;
}

LogicalResult ProgramOp::verifyRegions() {
  if (std::optional<ArrayRef<int64_t>> order = getComputeOrder()) {
    if (order->size() % 3 != 0)
      return emitOpError() << "compute_order has " << order->size()
                           << " numbers; expected (kind, stage, microbatch) "
                              "triples";
    for (size_t i = 0; i < order->size(); i += 3)
      if ((*order)[i] < 0 || (*order)[i] > 3)
        return emitOpError()
               << "compute_order entry " << i / 3 << " has kind " << (*order)[i]
               << "; expected 0 (forward), 1 (backward_input), "
                  "2 (backward_weight) or 3 (backward)";
  }
  // A program is a list of actions: the passes and exporters read every op
  // of it as one, so anything else (another dialect's op) is refused here.
  for (Operation &op : getBody().getOps())
    if (!isa<ActionOpInterface, SessionOp>(op))
      return op.emitOpError()
             << "is not allowed in 'hpr.program'; expected hpr actions and "
                "hpr.session";
  // Overlapped pairs: a forward marked `overlap` is immediately followed by
  // a backward marked `overlap`, and a marked backward immediately follows
  // such a forward.
  Operation *pendingForward = nullptr;
  for (Operation &op : getBody().getOps()) {
    if (isa<SessionOp>(op))
      continue; // Bookkeeping, not an action: it may follow a paired forward.
    bool marked = isOverlapped(&op);
    if (pendingForward) {
      if (!marked || !isBackwardKind(&op))
        return pendingForward->emitOpError()
               << "is marked overlap but is not immediately followed by a "
                  "backward action marked overlap";
      pendingForward = nullptr;
      continue;
    }
    if (!marked)
      continue;
    if (!isa<ForwardOp>(op))
      return op.emitOpError() << "is marked overlap but does not follow a "
                                 "forward marked overlap";
    pendingForward = &op;
  }
  if (pendingForward)
    return pendingForward->emitOpError()
           << "is marked overlap but ends the program";

  // A transfer marked batched goes out together with the next action, which
  // must be a transfer too.
  for (Operation &op : getBody().getOps()) {
    if (!isBatched(&op))
      continue;
    Operation *next = op.getNextNode();
    if (!next || !isa<SendFOp, RecvFOp, SendBOp, RecvBOp>(next))
      return op.emitOpError()
             << "is marked batched but the next action is not a transfer";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Actions
//===----------------------------------------------------------------------===//

void ForwardOp::getAsmResultNames(OpAsmSetValueNameFn setNameFn) {
  std::string name;
  llvm::raw_string_ostream(name)
      << "h" << getStage() << ".mb" << getMicrobatch();
  setNameFn(getHandle(), name);
}

LogicalResult ForwardOp::verify() {
  return verifyPlacement(*this, getStage(), getMicrobatch());
}

/// A consumer's session must belong to the consumer's own (stage, microbatch).
template <typename Backward> static LogicalResult verifyConsumer(Backward op) {
  if (failed(verifyPlacement(op, op.getStage(), op.getMicrobatch())))
    return failure();
  Value session = op.getSession();
  if (!session)
    return success();
  auto sessionOp = session.template getDefiningOp<SessionOp>();
  if (!sessionOp || !sessionOp.getForward())
    return success(); // SessionOp's verifier reports this.
  ForwardOp forward = sessionOp.getForward();
  if (forward.getStage() != op.getStage() ||
      forward.getMicrobatch() != op.getMicrobatch())
    return op.emitOpError()
           << "of stage " << op.getStage() << " mb " << op.getMicrobatch()
           << " reads session \"" << sessionOp.getSid() << "\" of stage "
           << forward.getStage() << " mb " << forward.getMicrobatch();
  return success();
}

LogicalResult BackwardInputOp::verify() { return verifyConsumer(*this); }
LogicalResult BackwardWeightOp::verify() { return verifyConsumer(*this); }
LogicalResult BackwardOp::verify() { return verifyConsumer(*this); }

/// Checks a transfer's peer: the rank of the neighbouring stage it talks to.
/// Sends of activations and receives of gradients face stage + 1; the other
/// two face stage - 1.
template <typename Comm>
static LogicalResult verifyComm(Comm op, int64_t direction) {
  if (failed(verifyPlacement(op, op.getStage(), op.getMicrobatch())))
    return failure();
  auto schedule = op->template getParentOfType<ScheduleOp>();
  int64_t neighbour = static_cast<int64_t>(op.getStage()) + direction;
  if (neighbour < 0 ||
      neighbour >= static_cast<int64_t>(schedule.getNumStages()))
    return op.emitOpError() << "of stage " << op.getStage()
                            << " has no neighbouring stage " << neighbour;
  if (neighbour >= static_cast<int64_t>(schedule.getStageToRank().size()))
    return success(); // The schedule's own verifier reports the short map.
  int64_t expectedPeer = schedule.getRankOf(neighbour);
  if (static_cast<int64_t>(op.getPeer()) != expectedPeer)
    return op.emitOpError()
           << "of stage " << op.getStage() << " talks to peer "
           << static_cast<int64_t>(op.getPeer()) << ", but stage " << neighbour
           << " runs on rank " << expectedPeer;
  if (expectedPeer ==
      static_cast<int64_t>(op->template getParentOfType<ProgramOp>().getRank()))
    return op.emitOpError() << "of stage " << op.getStage()
                            << " transfers to its own rank; co-located stages "
                               "need no send/recv";
  return success();
}

LogicalResult SendFOp::verify() { return verifyComm(*this, +1); }
LogicalResult RecvFOp::verify() { return verifyComm(*this, -1); }
LogicalResult SendBOp::verify() { return verifyComm(*this, -1); }
LogicalResult RecvBOp::verify() { return verifyComm(*this, +1); }

LogicalResult UnshardOp::verify() {
  return verifyPlacement(*this, getStage(), std::nullopt);
}
LogicalResult ReshardOp::verify() {
  return verifyPlacement(*this, getStage(), std::nullopt);
}
LogicalResult ReduceGradOp::verify() {
  return verifyPlacement(*this, getStage(), std::nullopt);
}

//===----------------------------------------------------------------------===//
// Sessions
//===----------------------------------------------------------------------===//

ModelOp mlir::hpr::getModel(ModuleOp module) {
  auto models = module.getOps<ModelOp>();
  return models.empty() ? ModelOp() : *models.begin();
}

ScheduleOp mlir::hpr::getSchedule(ModuleOp module) {
  auto schedules = module.getOps<ScheduleOp>();
  return schedules.empty() ? ScheduleOp() : *schedules.begin();
}

std::string mlir::hpr::getSessionId(int64_t stage, int64_t microbatch) {
  return "s" + std::to_string(stage) + ".mb" + std::to_string(microbatch);
}

void SessionOp::getAsmResultNames(OpAsmSetValueNameFn setNameFn) {
  setNameFn(getSession(), getSid());
}

LogicalResult SessionOp::verify() {
  ForwardOp forward = getForward();
  if (!forward)
    return emitOpError() << "binds a handle that no hpr.forward produced";
  std::string expected =
      getSessionId(forward.getStage(), forward.getMicrobatch());
  if (getSid() != expected)
    return emitOpError() << "\"" << getSid()
                         << "\" binds the handle of the forward of stage "
                         << forward.getStage() << " mb "
                         << forward.getMicrobatch() << "; expected id \""
                         << expected << "\"";
  return success();
}

/// Stage and microbatch of a session action are those of the session's
/// forward.
#define HPR_SESSION_ACTION_ACCESSORS(OP)                                       \
  SessionOp OP::getSessionOp() {                                               \
    return getSession().getDefiningOp<SessionOp>();                            \
  }                                                                            \
  int64_t OP::getStageIndex() {                                                \
    return getSessionOp().getForward().getStageIndex();                        \
  }                                                                            \
  int64_t OP::getMicrobatchIndex() {                                           \
    return getSessionOp().getForward().getMicrobatchIndex();                   \
  }

HPR_SESSION_ACTION_ACCESSORS(RecomputeOp)
HPR_SESSION_ACTION_ACCESSORS(ClearOp)
#undef HPR_SESSION_ACTION_ACCESSORS

/// A piece's regions are checkpointed-region indices, ascending, each once;
/// which exist and that the pieces cover them is hpr-verify's (it reads the
/// model).
LogicalResult RecomputeOp::verify() {
  std::optional<ArrayRef<int64_t>> regions = getRegions();
  if (!regions)
    return success();
  if (regions->empty())
    return emitOpError("regions: expected at least one region index");
  for (auto [index, region] : llvm::enumerate(*regions))
    if (region < 0 || (index && region <= (*regions)[index - 1]))
      return emitOpError("regions: expected ascending indices >= 0, each "
                         "once, got ")
             << region << " at position " << index;
  return success();
}
