//===- TorchCsv.cpp - torch's schedule CSV + sidecar <-> plans -----------===//

#include "hpr/Target/TorchCsv.h"
#include "PlanJsonParts.h"

#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Schedule/ScheduleUtils.h"
#include "hpr/Support/InputFile.h"
#include "hpr/Support/Json.h"
#include "hpr/Target/PlanImport.h"
#include "hpr/Target/PlanJson.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/Pass/PassManager.h"
#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/ConvertUTF.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

using namespace mlir;
using namespace mlir::hpr;
using namespace mlir::hpr::plan_json;
using nlohmann::json;
using ordered_json = nlohmann::ordered_json;

/// torch's `_ComputationType` value of an action, or "" for those torch has
/// no action for (recompute, clear: the sidecar's) and idle (no cell).
static StringRef torchType(ActionOpInterface action) {
  return llvm::StringSwitch<StringRef>(action.getPlanName())
      .Case("forward", "F")
      .Case("backward_input", "I")
      .Case("backward_weight", "W")
      .Case("backward", "B")
      .Case("send_f", "SEND_F")
      .Case("recv_f", "RECV_F")
      .Case("send_b", "SEND_B")
      .Case("recv_b", "RECV_B")
      .Case("unshard", "UNSHARD")
      .Case("reshard", "RESHARD")
      .Case("reduce_grad", "REDUCE_GRAD")
      .Default("");
}

/// `2F0`, `1SEND_B3`, `0REDUCE_GRAD`: torch's `_Action.__repr__`.
static std::string torchCell(ActionOpInterface action) {
  std::string cell = std::to_string(action.getStageIndex());
  cell += torchType(action).str();
  if (action.getMicrobatchIndex() >= 0)
    cell += std::to_string(action.getMicrobatchIndex());
  return cell;
}

namespace {
/// One element of a rank's row before it is written: a cell, or a recompute
/// or clear for the sidecar (`cell` empty).
struct RowItem {
  std::string cell;
  ordered_json insert;
};

/// One rank's items and the sidecar's lists.
struct RankRow {
  std::vector<RowItem> items;
  ordered_json consumers = ordered_json::array();
  ordered_json plain = ordered_json::array();
};
} // namespace

/// Rank `program`'s row. torch's point-to-point ops carry no tag, so two
/// ranks match messages in posting order: each RECV cell is written where the
/// plan posts it (the receives' `posts`, hpr-lower-runtime), since torch's
/// RECV only posts and the action that reads the data waits. The planner
/// lowered REDUCE_GRAD (after each stage's last W or B, where torch's
/// `_add_reduce_grad` puts it), which torch's compute+comms format expects in
/// the CSV.
static RankRow collectRow(ProgramOp program) {
  RankRow row;
  // The cell of each receive, by its index among the program's actions.
  std::map<int64_t, std::string> receiveCell;
  int64_t index = 0;
  for (Operation &op : program.getBody().getOps())
    if (auto action = dyn_cast<ActionOpInterface>(op)) {
      if (isa<RecvFOp, RecvBOp>(op))
        receiveCell[index] = torchCell(action);
      ++index;
    }
  std::string pendingForward; // the F of an overlapped pair
  for (Operation &op : program.getBody().getOps()) {
    auto action = dyn_cast<ActionOpInterface>(op);
    if (!action)
      continue;
    if (isa<RecomputeOp, ClearOp>(op)) {
      RowItem item;
      item.insert = actionJson(&op);
      row.items.push_back(std::move(item));
      continue;
    }
    if (auto consumer = dyn_cast<ConsumerOpInterface>(op))
      if (consumer.getSessionValue()) {
        ordered_json entry = actionJson(&op);
        entry.erase("overlap");
        row.consumers.push_back(std::move(entry));
      }
    if (auto forward = dyn_cast<ForwardOp>(op))
      if (forward.getNoCheckpoint())
        row.plain.push_back(
            ordered_json{{"stage", forward.getStageIndex()},
                         {"microbatch", forward.getMicrobatchIndex()}});
    if (torchType(action).empty())
      continue; // idle: torch's compute+comms rows have no empty cells
    if (isOverlapped(&op)) {
      // The verifier guarantees a marked forward is followed by its backward.
      if (isa<ForwardOp>(op)) {
        pendingForward = torchCell(action);
        continue;
      }
      row.items.push_back(
          {"(" + pendingForward + ";" + torchCell(action) + ")OVERLAP_F_B",
           ordered_json()});
      continue;
    }
    if (isa<RecvFOp, RecvBOp>(op)) {
      llvm::TypeSwitch<Operation *>(&op).Case<RecvFOp, RecvBOp>([&](auto recv) {
        if (std::optional<ArrayRef<int64_t>> posts = recv.getPosts())
          for (int64_t posted : *posts)
            if (auto cell = receiveCell.find(posted); cell != receiveCell.end())
              row.items.push_back({cell->second, ordered_json()});
      });
      continue;
    }
    row.items.push_back({torchCell(action), ordered_json()});
  }
  return row;
}

/// Writes rank `rank`'s row and returns its sidecar entry.
static ordered_json writeRow(int64_t rank, const RankRow &row,
                             llvm::raw_ostream &csv) {
  ordered_json inserts = ordered_json::array();
  int64_t cells = 0;
  for (const RowItem &item : row.items) {
    if (item.cell.empty()) {
      ordered_json entry = item.insert;
      entry["before"] = cells;
      inserts.push_back(std::move(entry));
      continue;
    }
    csv << (cells ? "," : "") << item.cell;
    ++cells;
  }
  csv << "\n";
  return ordered_json{{"rank", rank},
                      {"cells", cells},
                      {"inserts", std::move(inserts)},
                      {"consumers", row.consumers},
                      {"plain_forwards", row.plain}};
}

void mlir::hpr::writeTorchCsv(ModuleOp module, StringRef csvName,
                              llvm::raw_ostream &csv,
                              llvm::raw_ostream &sidecar) {
  ScheduleOp schedule = getSchedule(module);
  CheckpointedRegions checkpointed;
  json model = modelJson(getModel(module), checkpointed);
  ordered_json sessions = ordered_json::array(), ranks = ordered_json::array();
  int64_t rank = 0;
  for (ProgramOp program : schedule.getBody().getOps<ProgramOp>()) {
    for (SessionOp session : program.getBody().getOps<SessionOp>())
      sessions.push_back(sessionJson(session, checkpointed));
    ranks.push_back(writeRow(rank++, collectRow(program), csv));
  }
  ordered_json document = {{"format", "hp-recompute-torch-csv"},
                           {"version", 1},
                           {"csv", csvName.str()},
                           {"schedule", scheduleJson(schedule)},
                           {"model", std::move(model)},
                           {"sessions", std::move(sessions)},
                           {"ranks", std::move(ranks)}};
  sidecar << dumpJson(document) << "\n";
}

//===----------------------------------------------------------------------===//
// Reading a pair back as plan JSON
//===----------------------------------------------------------------------===//

std::string mlir::hpr::torchCsvSidecarPath(StringRef csvPath) {
  llvm::SmallString<256> path(csvPath);
  llvm::sys::path::replace_extension(path, ".hpr.json");
  return std::string(path);
}

/// What a consumer entry of the sidecar adds to its backward's cell.
static constexpr const char *kBoundFields[] = {"session", "retain_on_unpack",
                                               "frees_graph", "drops_replay",
                                               "weight_replay"};

/// Refuses `text` unless it is UTF-8, at the line and column of the first
/// bad byte (messages quote the text, and Python takes them as str).
static llvm::Error checkUtf8(StringRef text, StringRef fileName) {
  const auto *begin = reinterpret_cast<const llvm::UTF8 *>(text.begin());
  const llvm::UTF8 *bad = begin;
  if (llvm::isLegalUTF8String(&bad,
                              reinterpret_cast<const llvm::UTF8 *>(text.end())))
    return llvm::Error::success();
  size_t offset = bad - begin;
  StringRef before = text.take_front(offset);
  size_t lineStart = before.rfind('\n') + 1; // npos + 1 == 0
  return llvm::createStringError(
      llvm::formatv("{0}:{1}:{2}: invalid UTF-8 (byte 0x{3:x-2}); expected "
                    "UTF-8 text",
                    fileName, before.count('\n') + 1, offset - lineStart + 1,
                    static_cast<unsigned>(*bad))
          .str());
}

namespace {
/// One `/ranks/R` entry of the sidecar, checked against row R.
struct RankSide {
  /// Cell index -> the inserts before it: (index in `inserts`, action).
  std::map<int64_t, std::vector<std::pair<int64_t, json>>> inserts;
  /// (op, stage, microbatch) -> (index in `consumers`, entry).
  std::map<std::tuple<std::string, int64_t, int64_t>,
           std::pair<int64_t, const json *>>
      consumers;
  /// (stage, microbatch) -> index in `plain_forwards`.
  std::map<std::pair<int64_t, int64_t>, int64_t> plain;
};

/// Reads one pair; `fields` reads the sidecar.
class TorchCsvReader {
public:
  TorchCsvReader(StringRef csvPath, StringRef sidecarPath)
      : fields(sidecarPath), csvPath(csvPath.str()) {}

  /// The pair as `plan`, and where its actions came from.
  llvm::Expected<TorchCsvPlan> read(StringRef csvText, StringRef sidecarText,
                                    json &plan);

private:
  llvm::Error readSidecar(const json &side);
  /// The `key` member of `entry` at `where`: an optional list of objects.
  llvm::Expected<const json *> objectList(const json &entry,
                                          const std::string &where,
                                          const char *key) const;
  /// The `stage` and `microbatch` of sidecar entry `item` at `where`.
  llvm::Error readWork(const json &item, const std::string &where,
                       int64_t &stage, int64_t &microbatch) const {
    if (llvm::Error error = fields.readInt(item, where, "stage", stage, true, 0,
                                           sched::kMaxStage))
      return error;
    return fields.readInt(item, where, "microbatch", microbatch, true, 0,
                          sched::kMaxMicrobatch);
  }
  llvm::Expected<RankSide> readRankSide(int64_t rank, const json &entry,
                                        size_t cells) const;
  /// Rank `rank`'s actions: its row with its sidecar entry merged in.
  llvm::Error readRank(int64_t rank, const std::vector<sched::Action> &row,
                       RankSide side, json &actions,
                       std::vector<TorchCsvPlan::Source> &sources) const;
  /// The plan actions of one cell (an OVERLAP_F_B cell holds two).
  llvm::Error cellActions(int64_t rank, int64_t column,
                          const sched::Action &cell,
                          std::vector<json> &out) const;
  llvm::Error cellError(int64_t rank, int64_t column,
                        const llvm::Twine &message) const {
    return llvm::createStringError(llvm::formatv("{0}:{1}:{2}: {3}", csvPath,
                                                 rank + 1, column + 1,
                                                 message.str())
                                       .str());
  }

  JsonFieldReader fields;
  std::string csvPath;
  const json *stageToRank = nullptr;
};
} // namespace

llvm::Error TorchCsvReader::readSidecar(const json &side) {
  StringRef sidecarPath = fields.fileName();
  bool format = side.is_object() &&
                side.value("format", json()) == "hp-recompute-torch-csv";
  if (format) {
    json version = side.value("version", json());
    format = version.is_number_integer() && version == 1;
  }
  if (!format)
    return llvm::createStringError((sidecarPath +
                                    ": expected a sidecar of format "
                                    "'hp-recompute-torch-csv' version 1")
                                       .str());
  std::string name = llvm::sys::path::filename(csvPath).str();
  json csv = side.value("csv", json());
  if (!csv.is_string() || csv.get<std::string>() != name)
    return fields.fail("/csv",
                       "'" + name +
                           "', the CSV it sits beside (a sidecar written for "
                           "another CSV does not describe this one; write "
                           "both again with --emit torch-csv)",
                       csv);
  return llvm::Error::success();
}

llvm::Expected<const json *>
TorchCsvReader::objectList(const json &entry, const std::string &where,
                           const char *key) const {
  static const json empty = json::array();
  auto list = entry.find(key);
  if (list == entry.end())
    return &empty;
  if (!list->is_array())
    return fields.fail(where + "/" + key, "an array", *list);
  for (size_t k = 0; k < list->size(); ++k)
    if (!(*list)[k].is_object())
      return fields.fail(where + "/" + key + "/" + std::to_string(k),
                         "an object", (*list)[k]);
  return &*list;
}

llvm::Expected<RankSide> TorchCsvReader::readRankSide(int64_t rank,
                                                      const json &entry,
                                                      size_t rowCells) const {
  std::string where = "/ranks/" + std::to_string(rank);
  if (!entry.is_object())
    return fields.fail(where,
                       "an object with cells, and inserts, consumers and "
                       "plain_forwards as --emit torch-csv writes them",
                       entry);
  int64_t cells = 0;
  if (llvm::Error error = fields.readInt(entry, where, "cells", cells, true, 0,
                                         std::numeric_limits<int32_t>::max()))
    return error;
  if (static_cast<size_t>(cells) != rowCells)
    return llvm::createStringError(
        llvm::formatv("{0}:{1}: {2} cells, but the sidecar {3} was written "
                      "for {4}; write both again with --emit torch-csv",
                      csvPath, rank + 1, rowCells, fields.fileName(), cells)
            .str());
  RankSide side;
  auto inserts = objectList(entry, where, "inserts");
  if (!inserts)
    return inserts.takeError();
  for (auto [k, item] : llvm::enumerate(**inserts)) {
    int64_t before = 0;
    if (llvm::Error error =
            fields.readInt(item, where + "/inserts/" + std::to_string(k),
                           "before", before, true, 0, cells))
      return error;
    json action = item;
    action.erase("before");
    side.inserts[before].emplace_back(k, std::move(action));
  }
  auto consumers = objectList(entry, where, "consumers");
  if (!consumers)
    return consumers.takeError();
  for (auto [k, item] : llvm::enumerate(**consumers)) {
    std::string at = where + "/consumers/" + std::to_string(k);
    json op = item.value("op", json());
    if (op != "backward_input" && op != "backward_weight" && op != "backward")
      return fields.fail(at + "/op",
                         "backward_input, backward_weight or backward", op);
    int64_t stage = 0, microbatch = 0;
    if (llvm::Error error = readWork(item, at, stage, microbatch))
      return error;
    std::tuple<std::string, int64_t, int64_t> key{op.get<std::string>(), stage,
                                                  microbatch};
    auto [known, added] = side.consumers.try_emplace(key, k, &item);
    if (!added)
      return fields.fail(at,
                         "one entry per backward (" + where + "/consumers/" +
                             std::to_string(known->second.first) +
                             " is this one's)",
                         item);
  }
  auto plain = objectList(entry, where, "plain_forwards");
  if (!plain)
    return plain.takeError();
  for (auto [k, item] : llvm::enumerate(**plain)) {
    std::string at = where + "/plain_forwards/" + std::to_string(k);
    int64_t stage = 0, microbatch = 0;
    if (llvm::Error error = readWork(item, at, stage, microbatch))
      return error;
    auto [known, added] =
        side.plain.try_emplace(std::make_pair(stage, microbatch), k);
    if (!added)
      return fields.fail(at,
                         "one entry per forward (" + where +
                             "/plain_forwards/" +
                             std::to_string(known->second) + " is this one's)",
                         item);
  }
  return side;
}

llvm::Error TorchCsvReader::cellActions(int64_t rank, int64_t column,
                                        const sched::Action &cell,
                                        std::vector<json> &out) const {
  if (cell.kind == sched::ActionKind::Idle)
    return cellError(rank, column,
                     "empty cell; a compute+comms row has none (an idle slot "
                     "is no action)");
  bool overlap = cell.kind == sched::ActionKind::OverlapFB;
  llvm::ArrayRef<sched::Action> parts =
      overlap ? llvm::ArrayRef(cell.parts) : llvm::ArrayRef(cell);
  for (const sched::Action &part : parts) {
    if (part.kind == sched::ActionKind::Recompute ||
        part.kind == sched::ActionKind::Clear)
      return cellError(rank, column,
                       "'" + sched::formatAction(cell) +
                           "': torch's action set has no RECOMPUTE or CLEAR; "
                           "the sidecar's inserts place them");
    json action = {{"op", sched::kindJsonName(part.kind).str()},
                   {"stage", part.stage}};
    if (!sched::hasNoMicrobatch(part.kind))
      action["microbatch"] = part.microbatch;
    if (sched::isComm(part.kind)) {
      // torch's cell names no peer: the rank of the stage it talks to.
      int64_t neighbour = sched::neighbourStage(part);
      int64_t stages = static_cast<int64_t>(stageToRank->size());
      if (part.stage >= stages || neighbour < 0 || neighbour >= stages)
        return cellError(rank, column,
                         "'" + sched::formatAction(cell) +
                             "' has no neighbour stage in "
                             "/schedule/stage_to_rank of " +
                             fields.fileName());
      action["peer"] = (*stageToRank)[neighbour];
    }
    if (overlap)
      action["overlap"] = true;
    out.push_back(std::move(action));
  }
  return llvm::Error::success();
}

llvm::Error
TorchCsvReader::readRank(int64_t rank, const std::vector<sched::Action> &row,
                         RankSide side, json &actions,
                         std::vector<TorchCsvPlan::Source> &sources) const {
  std::string where = "/ranks/" + std::to_string(rank);
  int64_t cells = static_cast<int64_t>(row.size());
  for (int64_t column = 0; column <= cells; ++column) {
    if (auto before = side.inserts.find(column); before != side.inserts.end())
      for (auto &[k, action] : before->second) {
        actions.push_back(std::move(action));
        TorchCsvPlan::Source source;
        source.insert = k;
        sources.push_back(std::move(source));
      }
    if (column == cells)
      break;
    std::vector<json> cellActionsOf;
    if (llvm::Error error =
            cellActions(rank, column, row[column], cellActionsOf))
      return error;
    std::string cell = sched::formatAction(row[column]);
    for (json &action : cellActionsOf) {
      TorchCsvPlan::Source source;
      source.column = column;
      source.cell = cell;
      std::string op = action["op"].get<std::string>();
      int64_t stage = action["stage"].get<int64_t>();
      int64_t microbatch = action.value("microbatch", int64_t(-1));
      if (auto bound =
              side.consumers.find(std::make_tuple(op, stage, microbatch));
          bound != side.consumers.end()) {
        auto [k, entry] = bound->second;
        for (const char *key : kBoundFields)
          if (auto value = entry->find(key); value != entry->end()) {
            action[key] = *value;
            source.fields[key] =
                where + "/consumers/" + std::to_string(k) + "/" + key;
          }
        side.consumers.erase(bound);
      }
      // torch's RECV cell posts its receive where it stands.
      if (op == "recv_f" || op == "recv_b")
        action["posts"] = json::array({actions.size()});
      if (op == "forward")
        if (auto plain = side.plain.find(std::make_pair(stage, microbatch));
            plain != side.plain.end()) {
          action["checkpoint"] = false;
          source.fields["checkpoint"] =
              where + "/plain_forwards/" + std::to_string(plain->second);
          side.plain.erase(plain);
        }
      actions.push_back(std::move(action));
      sources.push_back(std::move(source));
    }
  }
  std::string unused;
  if (!side.consumers.empty()) {
    int64_t first = std::numeric_limits<int64_t>::max();
    for (const auto &entry : side.consumers)
      first = std::min(first, entry.second.first);
    unused = "/consumers/" + std::to_string(first);
  } else if (!side.plain.empty()) {
    int64_t first = std::numeric_limits<int64_t>::max();
    for (const auto &entry : side.plain)
      first = std::min(first, entry.second);
    unused = "/plain_forwards/" + std::to_string(first);
  }
  if (!unused.empty())
    return fields.failMsg(
        where + unused,
        llvm::formatv("names no action of row {0} of {1}; write both again "
                      "with --emit torch-csv",
                      rank + 1, csvPath)
            .str());
  return llvm::Error::success();
}

llvm::Expected<TorchCsvPlan>
TorchCsvReader::read(StringRef csvText, StringRef sidecarText, json &plan) {
  StringRef sidecarPath = fields.fileName();
  if (llvm::Error error = checkUtf8(sidecarText, sidecarPath))
    return error;
  auto side = parseJson(sidecarText, sidecarPath);
  if (!side)
    return side.takeError();
  if (llvm::Error error = readSidecar(*side))
    return error;
  if (llvm::Error error = checkUtf8(csvText, csvPath))
    return error;
  auto rows =
      sched::parseScheduleCsv(csvText, csvPath, sched::CsvDialect::Current);
  if (!rows)
    return rows.takeError();
  json schedule = side->value("schedule", json());
  json ranksSide = side->value("ranks", json());
  if (schedule.is_object())
    if (auto found = schedule.find("stage_to_rank");
        found != schedule.end() && found->is_array())
      stageToRank = &*found;
  if (!stageToRank || !ranksSide.is_array() ||
      ranksSide.size() != rows->ranks.size())
    return llvm::createStringError(
        llvm::formatv("{0}: expected /schedule/stage_to_rank and one /ranks "
                      "entry per row of {1} ({2} rows)",
                      sidecarPath, csvPath, rows->ranks.size())
            .str());

  TorchCsvPlan result;
  result.csvPath = csvPath;
  result.sidecarPath = sidecarPath.str();
  json ranks = json::array();
  for (auto [rank, row] : llvm::enumerate(rows->ranks)) {
    auto rankSide =
        readRankSide(static_cast<int64_t>(rank), ranksSide[rank], row.size());
    if (!rankSide)
      return rankSide.takeError();
    json actions = json::array();
    result.sources.emplace_back();
    if (llvm::Error error =
            readRank(static_cast<int64_t>(rank), row, std::move(*rankSide),
                     actions, result.sources.back()))
      return error;
    ranks.push_back({{"rank", rank}, {"actions", std::move(actions)}});
  }
  plan = {{"format", "hp-recompute-plan"},
          {"version", 2},
          {"schedule", std::move(schedule)},
          {"sessions", side->value("sessions", json::array())},
          {"ranks", std::move(ranks)}};
  if (auto model = side->find("model"); model != side->end())
    plan["model"] = *model;
  return result;
}

/// Adds to `plan`'s actions the members the planner lowers into every plan
/// (which receives an action waits for, where a graph is freed, ...) that the
/// pair does not carry: `plan` is read into IR, lowered by hpr-lower-runtime
/// (which keeps the RECV cells' posts) and written again by the plan JSON's
/// own writer, and each action takes the members it lacks, except `tag`
/// (torch's point-to-point ops carry none). What the pair says stays: a
/// member it has wrong is the admission check's to refuse. A plan the
/// importer refuses is left as it is, for the admission check to name.
static void addLoweredMembers(MLIRContext &context, json &plan,
                              StringRef name) {
  // What the importer finds wrong is the admission check's to report.
  ScopedDiagnosticHandler quiet(&context,
                                [](Diagnostic &) { return success(); });
  auto module = importPlanJson(context, dumpJson(plan), name);
  if (!module) {
    llvm::consumeError(module.takeError());
    return;
  }
  PassManager lower(&context);
  lower.enableVerifier(false); // the admission check's to judge
  lower.addPass(createHPRLowerRuntime());
  if (failed(lower.run(**module)))
    return;
  std::string text;
  llvm::raw_string_ostream os(text);
  // Only the actions are taken: no summary is needed (an empty one is written).
  writePlanJson(**module, PlanSummary(), PlannerOptions(), os);
  json written = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (written.is_discarded() || written["ranks"].size() != plan["ranks"].size())
    return;
  for (size_t rank = 0; rank < plan["ranks"].size(); ++rank) {
    json &actions = plan["ranks"][rank]["actions"];
    const json &lowered = written["ranks"][rank]["actions"];
    if (lowered.size() != actions.size())
      continue;
    for (size_t k = 0; k < actions.size(); ++k)
      for (const auto &member : lowered[k].items())
        if (member.key() != "tag" && !actions[k].contains(member.key()))
          actions[k][member.key()] = member.value();
  }
}

llvm::Expected<TorchCsvPlan> mlir::hpr::readTorchCsv(MLIRContext &context,
                                                     StringRef csvText,
                                                     StringRef csvPath,
                                                     StringRef sidecarText,
                                                     StringRef sidecarPath) {
  json plan;
  auto read =
      TorchCsvReader(csvPath, sidecarPath).read(csvText, sidecarText, plan);
  if (!read)
    return read.takeError();
  addLoweredMembers(context, plan, csvPath);
  read->plan = dumpJson(plan);
  return read;
}

llvm::Expected<TorchCsvPlan> mlir::hpr::readTorchCsvFiles(MLIRContext &context,
                                                          StringRef csvPath) {
  std::string sidecarPath = torchCsvSidecarPath(csvPath);
  auto csv = readInputFile(csvPath, "torch CSV");
  if (!csv)
    return csv.takeError();
  auto sidecar = readInputFile(sidecarPath, "torch CSV sidecar");
  if (!sidecar)
    return sidecar.takeError();
  return readTorchCsv(context, (*csv)->getBuffer(), csvPath,
                      (*sidecar)->getBuffer(), sidecarPath);
}

std::string TorchCsvPlan::locate(StringRef jsonPath) const {
  StringRef rest = jsonPath;
  size_t rank = 0, index = 0;
  if (rest.consume_front("/ranks/") && !rest.consumeInteger(10, rank) &&
      rest.consume_front("/actions/") && !rest.consumeInteger(10, index) &&
      (rest.empty() || rest.consume_front("/")) && rank < sources.size() &&
      index < sources[rank].size()) {
    const Source &source = sources[rank][index];
    StringRef key = rest.take_until([](char c) { return c == '/'; });
    if (auto field = source.fields.find(key); field != source.fields.end())
      return sidecarPath + ": " + field->second +
             rest.drop_front(key.size()).str();
    if (source.column < 0)
      return llvm::formatv("{0}: /ranks/{1}/inserts/{2}{3}{4}", sidecarPath,
                           rank, source.insert, rest.empty() ? "" : "/", rest)
          .str();
    return llvm::formatv("{0}:{1}:{2} ('{3}'){4}{5}", csvPath, rank + 1,
                         source.column + 1, source.cell,
                         rest.empty() ? "" : ": ", rest)
        .str();
  }
  return sidecarPath + ": " + jsonPath.str();
}
