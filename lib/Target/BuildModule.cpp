//===- BuildModule.cpp - Schedule + model -> hpr IR ----------------------===//

#include "hpr/Target/BuildModule.h"

#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Schedule/ScheduleUtils.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;
using namespace mlir::hpr;

model::StagedModel mlir::hpr::makeUniformModel(int numStages) {
  model::StagedModel staged;
  staged.name = "uniform";
  for (int stage = 0; stage < numStages; ++stage) {
    model::Region region;
    region.name = "stage" + std::to_string(stage);
    region.checkpoint = true;
    region.fwdTimeUs = 1;
    region.savedBytes = 1;
    region.inputBytes = 0;
    staged.stages.push_back({stage, {region}});
  }
  return staged;
}

static void buildModel(OpBuilder &builder, Location loc,
                       const model::StagedModel &staged) {
  // The layout is an attribute only when not 1 (no data parallelism).
  auto countAttr = [&](int64_t count) {
    return count > 1 ? builder.getI64IntegerAttr(count) : IntegerAttr();
  };
  auto modelOp = builder.create<ModelOp>(
      loc, staged.name, countAttr(staged.dataParallel.shard),
      countAttr(staged.dataParallel.replicate));
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToStart(&modelOp.getBody().emplaceBlock());
  for (const model::Stage &stage : staged.stages) {
    auto stageOp = builder.create<StageOp>(loc, stage.index);
    OpBuilder::InsertionGuard stageGuard(builder);
    builder.setInsertionPointToStart(&stageOp.getBody().emplaceBlock());
    for (const model::Region &region : stage.regions) {
      auto op = builder.create<RegionOp>(
          loc, region.name, region.checkpoint, region.selective,
          !region.checkpointable, llvm::APFloat(region.fwdFlops),
          llvm::APFloat(region.fwdTimeUs), region.savedBytes, region.inputBytes,
          region.paramBytes,
          /*measured costs, set below=*/FloatAttr(), FloatAttr(), FloatAttr(),
          FloatAttr(), FloatAttr(), IntegerAttr(), IntegerAttr(), IntegerAttr(),
          IntegerAttr(), IntegerAttr(), IntegerAttr(), IntegerAttr(),
          FloatAttr(), FloatAttr(), IntegerAttr(), IntegerAttr(),
          IntegerAttr());
      // Measured costs are attributes only when measured (absent = the cost
      // model's fallbacks).
      for (const model::MeasuredTime &time : model::kMeasuredTimes)
        if (region.*time.field > 0)
          op->setAttr(time.key, builder.getF64FloatAttr(region.*time.field));
      for (const model::MeasuredBytes &bytes : model::kMeasuredBytes)
        if (region.*bytes.field > 0)
          op->setAttr(bytes.key,
                      builder.getI64IntegerAttr(region.*bytes.field));
    }
  }
}

namespace {
/// Emits the ops of one rank's program.
class ProgramBuilder {
public:
  ProgramBuilder(OpBuilder &builder, const sched::Schedule &schedule,
                 llvm::StringRef file, const PlannedFacts *planned)
      : builder(builder), schedule(schedule), file(file), planned(planned) {}

  llvm::Error build(int rank);

private:
  llvm::Error emit(const sched::Action &action, Location loc, bool grouped);
  /// The location of the next primitive action of a planned program (its
  /// JSON path); `cellLoc` otherwise.
  Location nextLoc(Location cellLoc);
  /// The session the current planned action names; null when it names none.
  llvm::Expected<Value> namedSession(Location loc);
  /// The peer of a transfer: the rank of the stage on the other side.
  llvm::Expected<int64_t> peerOf(const sched::Action &action, Location loc);
  llvm::Error errorAt(Location loc, const llvm::Twine &message) const;
  /// The attribute of a stage, microbatch or rank index, uniqued once per
  /// value: a million ops share a few thousand distinct indices.
  IntegerAttr index(int64_t value);
  UnitAttr flag(bool set) { return set ? builder.getUnitAttr() : UnitAttr(); }

  OpBuilder &builder;
  const sched::Schedule &schedule;
  llvm::StringRef file;
  const PlannedFacts *planned;
  llvm::DenseMap<int64_t, IntegerAttr> indices;
  // Planned programs: the rank being built, its next primitive action, the
  // facts of the action being emitted, and the sessions bound so far.
  int rank = 0;
  size_t primitive = 0;
  const PlannedAction *current = nullptr;
  llvm::StringMap<Value> sessions;
  /// Sessions whose forward was emitted by the current cell.
  llvm::SmallVector<std::pair<std::string, ForwardOp>, 1> unbound;
};
} // namespace

llvm::Error ProgramBuilder::errorAt(Location loc,
                                    const llvm::Twine &message) const {
  if (auto name = dyn_cast<NameLoc>(loc)) // a planned action: its JSON path
    return llvm::createStringError(llvm::formatv("{0}: {1}: {2}", file,
                                                 name.getName().getValue(),
                                                 message.str())
                                       .str());
  auto fileLoc = cast<FileLineColLoc>(loc);
  return llvm::createStringError(
      llvm::formatv("{0}:{1}:{2}: {3}", fileLoc.getFilename().getValue(),
                    fileLoc.getLine(), fileLoc.getColumn(), message.str())
          .str());
}

IntegerAttr ProgramBuilder::index(int64_t value) {
  IntegerAttr &attr = indices[value];
  if (!attr)
    attr = builder.getI64IntegerAttr(value);
  return attr;
}

llvm::Expected<int64_t> ProgramBuilder::peerOf(const sched::Action &action,
                                               Location loc) {
  int neighbour = sched::neighbourStage(action);
  if (neighbour < 0 || neighbour >= schedule.numStages)
    return errorAt(loc, llvm::formatv("transfer of stage {0} has no "
                                      "neighbouring stage {1}",
                                      action.stage, neighbour));
  return schedule.stageToRank[neighbour];
}

Location ProgramBuilder::nextLoc(Location cellLoc) {
  if (!planned)
    return cellLoc;
  current = &planned->actions[rank][primitive];
  auto fileLoc =
      FileLineColLoc::get(builder.getContext(), file, rank + 1, primitive + 1);
  std::string path = llvm::formatv("/ranks/{0}/actions/{1}", rank, primitive);
  ++primitive;
  return NameLoc::get(builder.getStringAttr(path), fileLoc);
}

llvm::Expected<Value> ProgramBuilder::namedSession(Location loc) {
  if (!current || current->session.empty())
    return Value();
  if (Value session = sessions.lookup(current->session))
    return session;
  auto [stage, mb] = planned->sessions.at(current->session);
  return errorAt(loc, llvm::formatv("names session {0} before rank {1} binds "
                                    "it: the forward of stage {2} mb {3} "
                                    "must come first, on this rank",
                                    current->session, rank, stage, mb));
}

llvm::Error ProgramBuilder::emit(const sched::Action &action, Location loc,
                                 bool grouped) {
  using Kind = sched::ActionKind;
  if (action.parts.empty())
    loc = nextLoc(loc);
  IntegerAttr stage = index(action.stage), mb = index(action.microbatch);
  llvm::Expected<Value> session =
      action.parts.empty() ? namedSession(loc) : Value();
  if (!session)
    return session.takeError();
  UnitAttr retain = flag(current && current->retainOnUnpack);
  switch (action.kind) {
  case Kind::Idle:
    builder.create<IdleOp>(loc);
    return llvm::Error::success();
  case Kind::Forward: {
    auto forward = builder.create<ForwardOp>(
        loc, builder.getType<HandleType>(), stage, mb, flag(grouped),
        /*no_checkpoint=*/flag(current && current->plain),
        /*waits=*/DenseI64ArrayAttr(), /*hands_to=*/IntegerAttr());
    if (current && !current->binds.empty())
      unbound.push_back({current->binds, forward});
    return llvm::Error::success();
  }
  case Kind::BackwardInput:
    builder.create<BackwardInputOp>(
        loc, stage, mb, *session, retain, flag(grouped),
        /*frees_graph=*/UnitAttr(), /*waits=*/DenseI64ArrayAttr(),
        /*hands_to=*/IntegerAttr(), /*drops_replay=*/UnitAttr());
    return llvm::Error::success();
  case Kind::BackwardWeight:
    builder.create<BackwardWeightOp>(
        loc, stage, mb, *session, retain, flag(grouped),
        /*frees_graph=*/UnitAttr(), /*last_backward=*/UnitAttr(),
        /*weight_replay=*/flag(current && current->weightReplay));
    return llvm::Error::success();
  case Kind::Backward:
    builder.create<BackwardOp>(loc, stage, mb, *session, retain, flag(grouped),
                               /*frees_graph=*/UnitAttr(),
                               /*last_backward=*/UnitAttr(),
                               /*waits=*/DenseI64ArrayAttr(),
                               /*hands_to=*/IntegerAttr(),
                               /*fused=*/UnitAttr());
    return llvm::Error::success();
  case Kind::SendF:
  case Kind::RecvF:
  case Kind::SendB:
  case Kind::RecvB: {
    llvm::Expected<int64_t> peerRank = peerOf(action, loc);
    if (!peerRank)
      return peerRank.takeError();
    IntegerAttr peer = index(*peerRank);
    IntegerAttr tag = action.tag ? index(*action.tag) : IntegerAttr();
    DenseI64ArrayAttr posts;
    if (action.posts)
      posts = builder.getDenseI64ArrayAttr(llvm::SmallVector<int64_t>(
          action.posts->begin(), action.posts->end()));
    if (action.kind == Kind::SendF)
      builder.create<SendFOp>(loc, stage, mb, peer, flag(grouped), tag);
    else if (action.kind == Kind::RecvF)
      builder.create<RecvFOp>(loc, stage, mb, peer, flag(grouped), tag, posts);
    else if (action.kind == Kind::SendB)
      builder.create<SendBOp>(loc, stage, mb, peer, flag(grouped), tag);
    else
      builder.create<RecvBOp>(loc, stage, mb, peer, flag(grouped), tag, posts);
    return llvm::Error::success();
  }
  case Kind::Unshard:
    builder.create<UnshardOp>(loc, stage);
    return llvm::Error::success();
  case Kind::Reshard:
    builder.create<ReshardOp>(loc, stage);
    return llvm::Error::success();
  case Kind::ReduceGrad:
    builder.create<ReduceGradOp>(loc, stage);
    return llvm::Error::success();
  case Kind::OverlapFB:
    for (const sched::Action &part : action.parts)
      if (llvm::Error error = emit(part, loc, /*grouped=*/true))
        return error;
    return llvm::Error::success();
  case Kind::BatchedComm:
    // `batched` means "issued together with the next transfer": every part
    // but the last, so neighbouring groups stay apart.
    for (auto [index, part] : llvm::enumerate(action.parts))
      if (llvm::Error error =
              emit(part, loc, /*grouped=*/index + 1 < action.parts.size()))
        return error;
    return llvm::Error::success();
  case Kind::Recompute:
  case Kind::Clear:
    if (!planned)
      return errorAt(loc, "the schedule already holds planner actions "
                          "(RECOMPUTE/CLEAR); give the schedule before "
                          "planning");
    if (!*session)
      return errorAt(loc, "names no session");
    if (action.kind == Kind::Recompute)
      builder.create<RecomputeOp>(
          loc, *session, current->inBackward,
          current->regions ? builder.getDenseI64ArrayAttr(*current->regions)
                           : DenseI64ArrayAttr(),
          current->forWeight);
    else
      builder.create<ClearOp>(loc, *session);
    return llvm::Error::success();
  }
  llvm_unreachable("unknown action kind");
}

llvm::Error ProgramBuilder::build(int rank) {
  MLIRContext *context = builder.getContext();
  StringAttr fileAttr = StringAttr::get(context, file);
  this->rank = rank;
  primitive = 0;
  current = nullptr;
  sessions.clear();
  for (auto [index, action] : llvm::enumerate(schedule.ranks[rank])) {
    int cell = action.sourceCell >= 0 ? action.sourceCell : index;
    Location loc = FileLineColLoc::get(fileAttr, rank + 1, cell + 1);
    if (llvm::Error error = emit(action, loc, /*grouped=*/false))
      return error;
    // A plan's session is bound after its forward's cell (an overlapped pair
    // stays adjacent), where hpr-assign-sessions puts it.
    for (auto &[id, forward] : unbound)
      sessions[id] = builder.create<SessionOp>(
          forward.getLoc(), builder.getType<SessionType>(), forward.getHandle(),
          builder.getStringAttr(id));
    unbound.clear();
  }
  return llvm::Error::success();
}

llvm::Expected<OwningOpRef<ModuleOp>> mlir::hpr::buildPlanModule(
    MLIRContext &context, const model::StagedModel &staged,
    const sched::Schedule &schedule, llvm::StringRef scheduleFile,
    const PlannedFacts *planned) {
  if (static_cast<int>(staged.stages.size()) != schedule.numStages)
    return llvm::createStringError(llvm::formatv(
        "{0}: the schedule has {1} stages but the model was split into {2}",
        scheduleFile, schedule.numStages, staged.stages.size()));
  context.loadDialect<HPRDialect>();
  Location loc = FileLineColLoc::get(&context, scheduleFile, 0, 0);
  OpBuilder builder(&context);
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  builder.setInsertionPointToStart(module->getBody());
  buildModel(builder, loc, staged);

  auto scheduleOp = builder.create<ScheduleOp>(
      loc, schedule.name, schedule.numRanks, schedule.numStages,
      schedule.numMicrobatches,
      builder.getDenseI64ArrayAttr(llvm::SmallVector<int64_t>(
          schedule.stageToRank.begin(), schedule.stageToRank.end())));
  builder.setInsertionPointToStart(&scheduleOp.getBody().emplaceBlock());
  ProgramBuilder programs(builder, schedule, scheduleFile, planned);
  for (int rank = 0; rank < schedule.numRanks; ++rank) {
    auto program = builder.create<ProgramOp>(
        loc, rank,
        builder.getDenseI64ArrayAttr(
            sched::computeOrderRecord(schedule.ranks[rank])));
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToStart(&program.getBody().emplaceBlock());
    if (llvm::Error error = programs.build(rank))
      return error;
  }
  return module;
}
