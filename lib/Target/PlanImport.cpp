//===- PlanImport.cpp - Plan JSON -> hpr IR -------------------------------===//
//
// The plan's actions become a schedule (RECOMPUTE and CLEAR included) plus
// the facts only a plan has (PlannedFacts), and buildPlanModule turns both
// into IR, as it does for a schedule file. What a plan may get wrong is left
// to verifyPlan; this file refuses only what the IR cannot express.
//
//===----------------------------------------------------------------------===//

#include "hpr/Target/PlanImport.h"

#include "hpr/Analysis/RuntimeLowering.h"
#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Model/ModelJson.h"
#include "hpr/Schedule/ScheduleUtils.h"
#include "hpr/Support/Json.h"
#include "hpr/Support/Rules.h"
#include "hpr/Target/BuildModule.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/FormatVariadic.h"

#include <map>
#include <optional>
#include <vector>

using namespace mlir;
using namespace mlir::hpr;
using json = nlohmann::json;
using Kind = sched::ActionKind;

namespace {
/// The largest sizes a plan may declare; real plans are far below.
constexpr int64_t kMaxCount = 1 << 20;
/// What an action's JSON says that only verifyImportedPlan judges: the
/// members hpr-lower-runtime writes into a planned module (frees_graph,
/// last_backward, waits, hands_to, drops_replay). The importer sets them on
/// their ops as the file gives them.
struct JudgedMembers {
  bool freesGraph = false;
  bool lastBackward = false;
  bool dropsReplay = false;
  std::optional<std::vector<int64_t>> waits;
  std::optional<int64_t> handsTo;
};

class PlanReader : public JsonFieldReader {
public:
  using JsonFieldReader::JsonFieldReader;

  llvm::Error read(const json &doc);

  model::StagedModel staged;
  sched::Schedule schedule;
  PlannedFacts facts;
  /// judged[r][k]: what action k of rank r says for verifyImportedPlan.
  std::vector<std::vector<JudgedMembers>> judged;
  /// (stage, microbatch) -> the id of its session.
  std::map<std::pair<int, int>, std::string> sessionOf;
  /// The number of actions of the rank being read (`posts` indexes them).
  size_t rankSize = 0;

private:
  llvm::Error readSchedule(const json &doc);
  llvm::Error readModel(const json &doc);
  llvm::Error readSessions(const json &doc);
  llvm::Error readRank(const json &actions, int rank);
  llvm::Error readAction(const json &obj, const std::string &path, int rank,
                         int index, sched::Action &action, bool &overlap,
                         bool &batched);
  /// `key` of `obj`, when present: an array (`array` in errors) of integers
  /// in [0, bound) (each `expected`).
  llvm::Error readIndices(const json &obj, const std::string &path,
                          const char *key, llvm::StringRef array,
                          llvm::StringRef expected, int64_t bound,
                          std::optional<std::vector<int64_t>> &out) const;
  /// readIndices of action indices of rank `rank`.
  llvm::Error
  readActionIndices(const json &obj, const std::string &path, const char *key,
                    int rank, std::optional<std::vector<int64_t>> &out) const {
    return readIndices(
        obj, path, key, "an array of action indices",
        llvm::formatv("an action index of rank {0} in [0, {1})", rank, rankSize)
            .str(),
        static_cast<int64_t>(rankSize), out);
  }
  /// `obj` at `path` must be an object (or an array with `array`).
  llvm::Error expectKind(const json &obj, const std::string &path,
                         bool array) const {
    if (array ? obj.is_array() : obj.is_object())
      return llvm::Error::success();
    return fail(path, array ? "an array" : "an object", obj);
  }
};
} // namespace

llvm::Error PlanReader::readSchedule(const json &doc) {
  llvm::Expected<const json *> found = find(doc, "", "schedule", true);
  if (!found)
    return found.takeError();
  const json &obj = **found;
  if (auto err = expectKind(obj, "/schedule", false))
    return err;
  int64_t ranks, stages, microbatches;
  if (auto err = readString(obj, "/schedule", "name", schedule.name, false))
    return err;
  if (auto err =
          readInt(obj, "/schedule", "num_ranks", ranks, true, 1, kMaxCount))
    return err;
  if (auto err =
          readInt(obj, "/schedule", "num_stages", stages, true, 1, kMaxCount))
    return err;
  if (auto err = readInt(obj, "/schedule", "num_microbatches", microbatches,
                         true, 1, kMaxCount))
    return err;
  schedule.numRanks = static_cast<int>(ranks);
  schedule.numStages = static_cast<int>(stages);
  schedule.numMicrobatches = static_cast<int>(microbatches);
  llvm::Expected<const json *> map =
      find(obj, "/schedule", "stage_to_rank", true);
  if (!map)
    return map.takeError();
  if (!(*map)->is_array() || (*map)->size() != static_cast<size_t>(stages))
    return fail("/schedule/stage_to_rank",
                llvm::formatv("an array of {0} ranks", stages).str(), **map);
  for (size_t stage = 0; stage < (*map)->size(); ++stage) {
    const json &rank = (**map)[stage];
    if (!rank.is_number_integer() || rank.get<int64_t>() < 0 ||
        rank.get<int64_t>() >= ranks)
      return fail(llvm::formatv("/schedule/stage_to_rank/{0}", stage).str(),
                  llvm::formatv("a rank in [0, {0})", ranks).str(), rank);
    schedule.stageToRank.push_back(static_cast<int>(rank.get<int64_t>()));
  }
  return llvm::Error::success();
}

llvm::Error PlanReader::readModel(const json &doc) {
  llvm::Expected<const json *> found = find(doc, "", "model", true);
  if (!found)
    return found.takeError();
  const json &obj = **found;
  if (auto err = expectKind(obj, "/model", false))
    return err;
  if (auto err = readString(obj, "/model", "name", staged.name, false))
    return err;
  if (auto err = model::readDataParallelJson(obj, "/model", fileName(),
                                             staged.dataParallel))
    return err;
  llvm::Expected<const json *> stages = find(obj, "/model", "stages", true);
  if (!stages)
    return stages.takeError();
  if (!(*stages)->is_array() ||
      (*stages)->size() != static_cast<size_t>(schedule.numStages))
    return fail(
        "/model/stages",
        llvm::formatv("an array of {0} stages", schedule.numStages).str(),
        **stages);
  for (size_t index = 0; index < (*stages)->size(); ++index) {
    std::string path = llvm::formatv("/model/stages/{0}", index).str();
    const json &stage = (**stages)[index];
    if (auto err = expectKind(stage, path, false))
      return err;
    int64_t number;
    if (auto err = readInt(stage, path, "stage", number, true, index, index))
      return err;
    llvm::Expected<const json *> regions = find(stage, path, "regions", true);
    if (!regions)
      return regions.takeError();
    if (!(*regions)->is_array() || (*regions)->empty())
      return fail(path + "/regions", "a non-empty array of regions", **regions);
    model::Stage &out = staged.stages.emplace_back();
    out.index = static_cast<int>(index);
    for (size_t r = 0; r < (*regions)->size(); ++r)
      if (auto err = model::readRegionJson(
              (**regions)[r], llvm::formatv("{0}/regions/{1}", path, r).str(),
              fileName(), out.regions.emplace_back()))
        return err;
  }
  return llvm::Error::success();
}

llvm::Error PlanReader::readSessions(const json &doc) {
  llvm::Expected<const json *> found = find(doc, "", "sessions", false);
  if (!found || !*found)
    return found.takeError();
  if (auto err = expectKind(**found, "/sessions", true))
    return err;
  for (size_t index = 0; index < (*found)->size(); ++index) {
    std::string path = llvm::formatv("/sessions/{0}", index).str();
    const json &obj = (**found)[index];
    if (auto err = expectKind(obj, path, false))
      return err;
    std::string id;
    int64_t stage, microbatch, rank = -1;
    if (auto err = readString(obj, path, "id", id, true))
      return err;
    if (auto err =
            readInt(obj, path, "stage", stage, true, 0, schedule.numStages - 1))
      return err;
    if (auto err = readInt(obj, path, "microbatch", microbatch, true, 0,
                           schedule.numMicrobatches - 1))
      return err;
    if (auto err =
            readInt(obj, path, "rank", rank, false, 0, schedule.numRanks - 1))
      return err;
    int owner = schedule.stageToRank[stage];
    if (rank >= 0 && rank != owner)
      return failMsg(path + "/rank",
                     llvm::formatv("session {0} is on rank {1}, but stage {2} "
                                   "runs on rank {3}",
                                   id, rank, stage, owner)
                         .str());
    if (facts.sessions.count(id))
      return failMsg(path + "/id", "a second session with id " + id);
    auto [it, inserted] = sessionOf.insert(
        {{static_cast<int>(stage), static_cast<int>(microbatch)}, id});
    if (!inserted)
      return failMsg(path, llvm::formatv("a second session of stage {0} mb {1} "
                                         "(the first is {2})",
                                         stage, microbatch, it->second)
                               .str());
    facts.sessions[id] = it->first;
    // The runtimes replay the session's `regions`, and a piece of its replay
    // numbers them (hpr.exec.replay-in-pieces): they are the stage's
    // checkpointed regions, in forward order.
    json expected = json::array();
    for (const model::Region &region : staged.stages[stage].regions)
      if (region.checkpoint)
        expected.push_back(region.name);
    if (!obj.contains("regions") || obj["regions"] != expected)
      return fail(path + "/regions",
                  llvm::formatv("the checkpointed regions of stage {0}, in "
                                "order: {1}",
                                stage, expected.dump())
                      .str(),
                  obj.contains("regions") ? obj["regions"] : json());
  }
  return llvm::Error::success();
}

llvm::Error PlanReader::readAction(const json &obj, const std::string &path,
                                   int rank, int index, sched::Action &action,
                                   bool &overlap, bool &batched) {
  if (auto err = expectKind(obj, path, false))
    return err;
  std::string op;
  if (auto err = readString(obj, path, "op", op, true))
    return err;
  // Composites are spelled by flags in a plan (`overlap`, `batched`).
  std::optional<Kind> kind = sched::kindFromJsonName(op);
  if (kind == Kind::OverlapFB || kind == Kind::BatchedComm)
    kind.reset();
  if (!kind)
    return fail(path + "/op",
                "one of forward backward_input backward_weight backward "
                "recompute clear send_f recv_f send_b recv_b unshard reshard "
                "reduce_grad idle",
                obj["op"]);
  // A member that another kind of action takes is refused, not ignored.
  bool consumer = *kind == Kind::BackwardInput ||
                  *kind == Kind::BackwardWeight || *kind == Kind::Backward;
  llvm::Error wrongKey = llvm::Error::success();
  bool receive = *kind == Kind::RecvF || *kind == Kind::RecvB;
  if (receive)
    wrongKey = checkKeys(obj, path,
                         {"op", "stage", "microbatch", "peer", "tag", "posts",
                          "batched", "overlap"});
  else if (sched::isComm(*kind))
    wrongKey = checkKeys(
        obj, path,
        {"op", "stage", "microbatch", "peer", "tag", "batched", "overlap"});
  else if (*kind == Kind::BackwardInput)
    wrongKey = checkKeys(obj, path,
                         {"op", "stage", "microbatch", "waits", "session",
                          "retain_on_unpack", "frees_graph", "hands_to",
                          "overlap", "drops_replay"});
  else if (*kind == Kind::BackwardWeight)
    wrongKey =
        checkKeys(obj, path,
                  {"op", "stage", "microbatch", "session", "retain_on_unpack",
                   "frees_graph", "last_backward", "overlap", "weight_replay"});
  else if (*kind == Kind::Backward)
    wrongKey = checkKeys(obj, path,
                         {"op", "stage", "microbatch", "waits", "session",
                          "retain_on_unpack", "frees_graph", "last_backward",
                          "hands_to", "overlap"});
  else if (*kind == Kind::Recompute)
    wrongKey = checkKeys(obj, path,
                         {"op", "stage", "microbatch", "session", "in_backward",
                          "regions", "for_weight"});
  else if (*kind == Kind::Clear)
    wrongKey = checkKeys(obj, path, {"op", "stage", "microbatch", "session"});
  else if (*kind == Kind::Forward)
    wrongKey = checkKeys(obj, path,
                         {"op", "stage", "microbatch", "waits", "hands_to",
                          "overlap", "checkpoint"});
  else
    wrongKey = checkKeys(obj, path, {"op", "stage", "microbatch"});
  if (wrongKey)
    return wrongKey;
  action.kind = *kind;
  action.sourceCell = index;
  PlannedAction &planned = facts.actions[rank].emplace_back();
  JudgedMembers &judgedMembers = judged[rank].emplace_back();
  int64_t value;
  if (*kind != Kind::Idle) {
    if (auto err =
            readInt(obj, path, "stage", value, true, 0, schedule.numStages - 1))
      return err;
    action.stage = static_cast<int>(value);
    if (schedule.stageToRank[action.stage] != rank)
      return failMsg(path + "/stage",
                     llvm::formatv("stage {0} runs on rank {1} "
                                   "(/schedule/stage_to_rank), not on rank {2}",
                                   action.stage,
                                   schedule.stageToRank[action.stage], rank)
                         .str());
  }
  if (*kind != Kind::Idle && !sched::hasNoMicrobatch(*kind)) {
    if (auto err = readInt(obj, path, "microbatch", value, true, 0,
                           schedule.numMicrobatches - 1))
      return err;
    action.microbatch = static_cast<int>(value);
  }
  if (sched::isComm(*kind)) {
    int64_t peer;
    if (auto err =
            readInt(obj, path, "peer", peer, true, 0, schedule.numRanks - 1))
      return err;
    int neighbour = sched::neighbourStage(action);
    if (neighbour >= 0 && neighbour < schedule.numStages &&
        schedule.stageToRank[neighbour] != peer)
      return failMsg(path + "/peer",
                     llvm::formatv("peer {0}, but stage {1} runs on rank {2}",
                                   peer, neighbour,
                                   schedule.stageToRank[neighbour])
                         .str());
    if (obj.contains("tag")) {
      if (auto err = readInt(obj, path, "tag", value, true, 0, INT64_MAX))
        return err;
      action.tag = value;
    }
    if (auto err = readBool(obj, path, "batched", batched))
      return err;
  }
  if (receive) {
    // Which receives are posted where is hpr-verify-comm's to judge
    // ([hpr.schedule.posts]); here only that the member is a list of this
    // rank's action indices.
    std::optional<std::vector<int64_t>> posts;
    if (auto err = readActionIndices(obj, path, "posts", rank, posts))
      return err;
    if (posts)
      action.posts.emplace(posts->begin(), posts->end());
  }
  // Which receives an action reads ([hpr.plan.waits]), the stage it hands its
  // result to ([hpr.plan.hands-to]) and the last W or B of a stage
  // ([hpr.plan.last-backward]) are judged by verifyImportedPlan; here only
  // their types and ranges.
  if (auto err =
          readActionIndices(obj, path, "waits", rank, judgedMembers.waits))
    return err;
  if (obj.contains("hands_to")) {
    if (auto err = readInt(obj, path, "hands_to", value, true, 0,
                           schedule.numStages - 1))
      return err;
    judgedMembers.handsTo = value;
  }
  if (auto err =
          readBool(obj, path, "last_backward", judgedMembers.lastBackward))
    return err;
  if (consumer || *kind == Kind::Recompute || *kind == Kind::Clear) {
    bool sessionAction = !consumer;
    if (sessionAction || obj.contains("session")) {
      if (auto err = readString(obj, path, "session", planned.session, true))
        return err;
      auto it = facts.sessions.find(planned.session);
      if (it == facts.sessions.end())
        return fail(path + "/session", "an id listed in /sessions",
                    obj["session"]);
      if (it->second != std::pair(action.stage, action.microbatch))
        return failMsg(path + "/session",
                       llvm::formatv("session {0} belongs to stage {1} mb "
                                     "{2}, not to this action's stage {3} mb "
                                     "{4}",
                                     planned.session, it->second.first,
                                     it->second.second, action.stage,
                                     action.microbatch)
                           .str());
    }
    if (consumer && !planned.session.empty()) {
      if (auto err =
              readBool(obj, path, "retain_on_unpack", planned.retainOnUnpack))
        return err;
    }
    if (consumer)
      if (auto err =
              readBool(obj, path, "frees_graph", judgedMembers.freesGraph))
        return err;
    // Where the replay for a dw runs is hpr-verify's to judge
    // ([hpr.verify.weight-replay]), the dx that drops the first one
    // verifyImportedPlan's ([hpr.plan.drops-replay]).
    if (auto err =
            readBool(obj, path, "drops_replay", judgedMembers.dropsReplay))
      return err;
    if (auto err = readBool(obj, path, "weight_replay", planned.weightReplay))
      return err;
    if (*kind == Kind::Recompute) {
      if (auto err = readBool(obj, path, "in_backward", planned.inBackward))
        return err;
      if (auto err = readBool(obj, path, "for_weight", planned.forWeight))
        return err;
      // Which exist and that the pieces cover them: hpr-verify
      // ([hpr.verify.pieces]).
      if (auto err = readIndices(
              obj, path, "regions", "an array of checkpointed region indices",
              "a region index in [0, 1048576)", kMaxCount, planned.regions))
        return err;
    }
  }
  if (*kind == Kind::Forward) {
    if (auto it = sessionOf.find({action.stage, action.microbatch});
        it != sessionOf.end())
      planned.binds = it->second;
    bool checkpoint = true;
    if (auto err = readBool(obj, path, "checkpoint", checkpoint))
      return err;
    planned.plain = !checkpoint;
  }
  return readBool(obj, path, "overlap", overlap);
}

llvm::Error
PlanReader::readIndices(const json &obj, const std::string &path,
                        const char *key, llvm::StringRef array,
                        llvm::StringRef expected, int64_t bound,
                        std::optional<std::vector<int64_t>> &out) const {
  if (!obj.contains(key))
    return llvm::Error::success();
  const json &list = obj[key];
  std::string at = path + "/" + key;
  if (!list.is_array())
    return fail(at, array.str(), list);
  std::vector<int64_t> &indices = out.emplace();
  for (size_t k = 0; k < list.size(); ++k) {
    const json &entry = list[k];
    if (!entry.is_number_integer() || entry.get<int64_t>() < 0 ||
        entry.get<int64_t>() >= bound)
      return fail(llvm::formatv("{0}/{1}", at, k).str(), expected.str(), entry);
    indices.push_back(entry.get<int64_t>());
  }
  return llvm::Error::success();
}

llvm::Error PlanReader::readRank(const json &actions, int rank) {
  std::vector<sched::Action> &program = schedule.ranks.emplace_back();
  facts.actions.emplace_back();
  judged.emplace_back();
  // Composites are rebuilt from the flags: an overlapped forward and the
  // action after it (OVERLAP_F_B); a run of batched transfers and the one
  // that ends it (a legacy combined cell).
  std::optional<sched::Action> open;
  rankSize = actions.size();
  for (size_t index = 0; index < actions.size(); ++index) {
    std::string path =
        llvm::formatv("/ranks/{0}/actions/{1}", rank, index).str();
    bool overlap = false, batched = false;
    std::optional<sched::Action> action(std::in_place);
    if (auto err =
            readAction(actions[index], path, rank, static_cast<int>(index),
                       *action, overlap, batched))
      return err;
    Kind group = open ? open->kind : Kind::Idle;
    if (open && group == Kind::OverlapFB) {
      if (!overlap || action->kind == Kind::Forward)
        return failMsg(path, "expected the backward half of the overlapped "
                             "forward before it (\"overlap\": true)");
      open->parts.push_back(std::move(*action));
      program.push_back(std::move(*open));
      open.reset();
      continue;
    }
    if (open && group == Kind::BatchedComm) {
      if (!sched::isComm(action->kind))
        return failMsg(path, "expected a transfer: the one before it is "
                             "\"batched\" with the next");
      open->parts.push_back(std::move(*action));
      if (!batched) {
        program.push_back(std::move(*open));
        open.reset();
      }
      continue;
    }
    if (overlap || batched) {
      if (overlap && action->kind != Kind::Forward)
        return failMsg(path + "/overlap",
                       "an overlapped pair starts with its forward");
      open.emplace();
      open->kind = overlap ? Kind::OverlapFB : Kind::BatchedComm;
      open->sourceCell = static_cast<int>(index);
      open->parts.push_back(std::move(*action));
      continue;
    }
    program.push_back(std::move(*action));
  }
  if (open)
    return failMsg(llvm::formatv("/ranks/{0}/actions", rank).str(),
                   "the last action is \"overlap\" or \"batched\" with an "
                   "action that does not follow");
  return llvm::Error::success();
}

llvm::Error PlanReader::read(const json &doc) {
  if (auto err = expectKind(doc, "", false))
    return err;
  std::string format;
  if (auto err = readString(doc, "", "format", format, true))
    return err;
  if (format != "hp-recompute-plan")
    return fail("/format", "\"hp-recompute-plan\"", doc["format"]);
  int64_t version;
  if (auto err = readInt(doc, "", "version", version, true, 0, INT64_MAX))
    return err;
  if (version == 1)
    return failMsg("/version",
                   "plan version 1 does not say where graphs are freed or "
                   "how messages are tagged; write the plan again with "
                   "hp-recompute-plan --emit json");
  if (version != 2)
    return fail("/version", "2", doc["version"]);
  if (auto err = readSchedule(doc))
    return err;
  if (auto err = readModel(doc))
    return err;
  if (auto err = readSessions(doc))
    return err;
  llvm::Expected<const json *> ranks = find(doc, "", "ranks", true);
  if (!ranks)
    return ranks.takeError();
  if (!(*ranks)->is_array() ||
      (*ranks)->size() != static_cast<size_t>(schedule.numRanks))
    return fail("/ranks",
                llvm::formatv("an array of {0} ranks", schedule.numRanks).str(),
                **ranks);
  for (int rank = 0; rank < schedule.numRanks; ++rank) {
    std::string path = llvm::formatv("/ranks/{0}", rank).str();
    const json &obj = (**ranks)[rank];
    if (auto err = expectKind(obj, path, false))
      return err;
    llvm::Expected<const json *> actions = find(obj, path, "actions", true);
    if (!actions)
      return actions.takeError();
    if (auto err = expectKind(**actions, path + "/actions", true))
      return err;
    if (auto err = readRank(**actions, rank))
      return err;
  }
  return llvm::Error::success();
}

llvm::Expected<OwningOpRef<ModuleOp>>
mlir::hpr::importPlanJson(MLIRContext &context, llvm::StringRef text,
                          llvm::StringRef fileName) {
  llvm::Expected<json> doc = parseJson(text, fileName);
  if (!doc)
    return doc.takeError();
  PlanReader reader(fileName);
  if (auto err = reader.read(*doc))
    return err;
  auto module = buildPlanModule(context, reader.staged, reader.schedule,
                                fileName, &reader.facts);
  if (!module)
    return module.takeError();
  // The plan carries what a planned module's hpr-lower-runtime writes (the
  // posts and tags were built in); verifyImportedPlan judges the members
  // once the plan is otherwise sound. The reader took each member on the
  // kinds of action that carry it only.
  Builder builder(&context);
  for (ProgramOp program :
       getSchedule(**module).getBody().getOps<ProgramOp>()) {
    size_t index = 0;
    for (Operation &op : program.getBody().getOps()) {
      if (!isa<ActionOpInterface>(op))
        continue;
      const JudgedMembers &members = reader.judged[program.getRank()][index++];
      llvm::TypeSwitch<Operation *>(&op)
          .Case<ForwardOp, BackwardInputOp, BackwardOp>([&](auto action) {
            if (members.waits)
              action.setWaitsAttr(builder.getDenseI64ArrayAttr(*members.waits));
            if (members.handsTo)
              action.setHandsTo(*members.handsTo);
          });
      llvm::TypeSwitch<Operation *>(&op).Case<BackwardWeightOp, BackwardOp>(
          [&](auto backward) {
            backward.setLastBackward(members.lastBackward);
          });
      llvm::TypeSwitch<Operation *>(&op)
          .Case<BackwardInputOp, BackwardWeightOp, BackwardOp>(
              [&](auto backward) {
                backward.setFreesGraph(members.freesGraph);
              });
      if (auto input = dyn_cast<BackwardInputOp>(op))
        input.setDropsReplay(members.dropsReplay);
    }
  }
  return module;
}

//===----------------------------------------------------------------------===//
// hpr.plan.*: what the planner lowers into each action
//===----------------------------------------------------------------------===//

namespace {
/// Checks one program's `last_backward`, `waits`, `hands_to` and
/// `drops_replay` against what hpr-lower-runtime would write into it
/// (hpr/Analysis/RuntimeLowering.h).
/// Runs on a plan verifyPlan admitted: every (stage, mb) has its forward and
/// its dx, and every receive comes before the action that reads it.
class LoweredMemberCheck {
public:
  LoweredMemberCheck(ScheduleOp schedule, ProgramOp program)
      : schedule(schedule), program(program),
        lastBackward(lastBackwards(program)), waits(receiveReaders(program)),
        handsTo(handoffs(program)), droppers(replayDroppers(program)) {
    for (Operation &op : program.getBody().getOps())
      if (isa<ActionOpInterface>(op))
        actions.push_back(&op);
  }

  bool run() {
    checkLastBackward();
    checkWaits();
    checkHandsTo();
    checkDropsReplay();
    return sound;
  }

private:
  ScheduleOp schedule;
  ProgramOp program;
  /// What the analysis says.
  llvm::DenseSet<Operation *> lastBackward;
  ActionIndexLists waits;
  llvm::DenseMap<Operation *, int64_t> handsTo;
  llvm::DenseSet<Operation *> droppers;
  std::vector<Operation *> actions;
  bool sound = true;

  InFlightDiagnostic error(Operation *op) {
    sound = false;
    return op->emitError() << describeAction(op) << ": ";
  }
  static int64_t stageOf(Operation *op) {
    return cast<ActionOpInterface>(op).getStageIndex();
  }

  /// [hpr.plan.last-backward]: `last_backward` on each stage's last W or B,
  /// and only there.
  void checkLastBackward() {
    std::map<int64_t, Operation *> last;
    for (Operation *op : actions)
      if (lastBackward.contains(op))
        last[stageOf(op)] = op;
    for (Operation *op : actions) {
      bool marked = isLastBackward(op);
      bool isLast = lastBackward.contains(op);
      auto it =
          last.find(isa<BackwardWeightOp, BackwardOp>(op) ? stageOf(op) : -1);
      if (marked && !isLast && it != last.end())
        error(op) << "last_backward, but the last backward_weight or "
                     "backward of stage "
                  << stageOf(op) << " is " << describeAction(it->second)
                  << "; last_backward marks that one only "
                  << ruleTag(Rule::PlanLastBackward);
      else if (!marked && isLast)
        error(op) << "no last_backward on the last backward_weight or "
                     "backward of stage "
                  << stageOf(op)
                  << "; a plan marks it, where the stage's gradients are "
                     "complete "
                  << ruleTag(Rule::PlanLastBackward);
    }
  }

  /// [hpr.plan.waits]: every receive is waited for by the action that reads its
  /// data (receiveReaders), and by no other.
  void checkWaits() {
    llvm::DenseMap<int64_t, Operation *> readerOfReceive;
    for (Operation *op : actions)
      if (auto it = waits.find(op); it != waits.end())
        for (int64_t j : it->second)
          readerOfReceive[j] = op;
    for (Operation *op : actions) {
      llvm::ArrayRef<int64_t> given =
          getWaits(op).value_or(ArrayRef<int64_t>());
      llvm::ArrayRef<int64_t> wanted;
      if (auto it = waits.find(op); it != waits.end())
        wanted = it->second;
      llvm::DenseSet<int64_t> seen;
      for (int64_t j : given) {
        if (j < 0 || static_cast<size_t>(j) >= actions.size()) {
          error(op) << "waits for action " << j << ", past rank "
                    << program.getRank() << "'s actions "
                    << ruleTag(Rule::PlanWaits);
          continue;
        }
        Operation *receive = actions[j];
        if (!isa<RecvFOp, RecvBOp>(receive)) {
          error(op) << "waits for " << describeAction(receive)
                    << ", which is not a receive; waits lists the receives "
                       "whose data an action reads "
                    << ruleTag(Rule::PlanWaits);
          continue;
        }
        if (!seen.insert(j).second) {
          error(op) << "waits for " << describeAction(receive)
                    << " twice; each receive is waited for once "
                    << ruleTag(Rule::PlanWaits);
          continue;
        }
        if (readerOfReceive.lookup(j) != op) {
          InFlightDiagnostic diag = error(op);
          diag << "waits for " << describeAction(receive) << ", whose data ";
          if (Operation *reader = readerOfReceive.lookup(j))
            diag << describeAction(reader) << " reads";
          else
            diag << "no action of rank " << program.getRank() << " reads";
          diag << "; an action waits for the receives it reads, and only "
                  "those "
               << ruleTag(Rule::PlanWaits);
        }
      }
      for (int64_t j : wanted)
        if (!seen.contains(j))
          error(op) << "reads the data of " << describeAction(actions[j])
                    << " but does not list it in waits; an action waits for "
                       "each receive it reads "
                    << ruleTag(Rule::PlanWaits);
    }
  }

  /// [hpr.plan.hands-to]: `hands_to` names the stage a forward's output (an I's
  /// or B's input gradient) goes to when that stage runs on this rank
  /// (handoffs): no transfer carries it, the runtime hands it over in memory.
  void checkHandsTo() {
    int64_t numStages = static_cast<int64_t>(schedule.getNumStages());
    for (Operation *op : actions) {
      std::optional<int64_t> given = getHandsTo(op);
      if (!isa<ForwardOp, BackwardInputOp, BackwardOp>(op))
        continue; // the importer takes hands_to on these only
      int64_t target = resultStage(op);
      const char *what = isa<ForwardOp>(op) ? "output" : "input gradient";
      bool here = handsTo.contains(op);
      if (given && *given != target) {
        InFlightDiagnostic diag = error(op);
        diag << "hands_to " << *given << ", but its " << what << " goes to ";
        if (target >= 0 && target < numStages)
          diag << "stage " << target;
        else
          diag << "no stage";
        diag << " " << ruleTag(Rule::PlanHandsTo);
      } else if (given && !here) {
        error(op) << "hands_to " << target << ", but stage " << target
                  << " runs on rank " << schedule.getRankOf(target)
                  << "; a transfer carries its " << what
                  << ", hands_to names a stage on the same rank "
                  << ruleTag(Rule::PlanHandsTo);
      } else if (!given && here) {
        error(op) << "no hands_to, but stage " << target << ", which takes its "
                  << what
                  << ", runs on this rank too; a plan names the stage an "
                     "action hands its result to in memory "
                  << ruleTag(Rule::PlanHandsTo);
      }
    }
  }

  /// [hpr.plan.drops-replay]: `drops_replay` on the dx of each session
  /// replayed again for its dw (replayDroppers), and only there.
  void checkDropsReplay() {
    for (Operation *op : actions) {
      auto input = dyn_cast<BackwardInputOp>(op);
      if (!input)
        continue; // the importer takes drops_replay on these only
      bool wanted = droppers.contains(op);
      if (input.getDropsReplay() && !wanted)
        error(op) << "drops_replay, but its session has no replay for its dw "
                     "(recompute for_weight); the dw would read tensors this "
                     "dx dropped "
                  << ruleTag(Rule::PlanDropsReplay);
      else if (!input.getDropsReplay() && wanted)
        error(op) << "no drops_replay, but its session is replayed again for "
                     "its dw (recompute for_weight); a plan drops the first "
                     "replay at the end of the dx "
                  << ruleTag(Rule::PlanDropsReplay);
    }
  }
};
} // namespace

LogicalResult mlir::hpr::verifyImportedPlan(ModuleOp module) {
  if (failed(verifyPlan(module)))
    return failure();
  // `frees_graph` marks exactly the last backward of each (stage, mb): the
  // one place that decides it is the analysis hpr-lower-runtime writes.
  bool sound = true;
  for (ProgramOp program : getSchedule(module).getBody().getOps<ProgramOp>()) {
    llvm::DenseSet<Operation *> last = lastConsumers(program);
    for (Operation &op : program.getBody().getOps())
      if (isa<ActionOpInterface>(op) && freesGraph(&op) != last.contains(&op)) {
        op.emitError() << describeAction(&op)
                       << ": frees_graph must mark the last backward of a "
                          "stage and microbatch, and only it";
        sound = false;
      }
  }
  ScheduleOp schedule = getSchedule(module);
  for (ProgramOp program : schedule.getBody().getOps<ProgramOp>())
    sound &= LoweredMemberCheck(schedule, program).run();
  return success(sound);
}
