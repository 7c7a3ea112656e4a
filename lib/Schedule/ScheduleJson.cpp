//===- ScheduleJson.cpp - JSON pipeline schedules -------------------------===//
//
// Reads and writes the `hp-recompute-schedule` JSON format with
// nlohmann::json. Every error names the JSON path of the offending value.
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/ScheduleJson.h"
#include "hpr/Schedule/ScheduleUtils.h"
#include "hpr/Support/Json.h"

#include "llvm/Support/Path.h"

#include <nlohmann/json.hpp>

#include <cmath>

namespace mlir::hpr::sched {
namespace {

using nlohmann::json;

constexpr llvm::StringLiteral kFormat = "hp-recompute-schedule";

/// Carries the file name and builds located errors.
struct Reader {
  std::string fileName;

  llvm::Error error(const std::string &path, const llvm::Twine &message) {
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   fileName + ": " + path + ": " +
                                       message.str());
  }

  llvm::Error readInt(const json &value, const std::string &path, int limit,
                      int &out) {
    if (!value.is_number_integer() ||
        (value.is_number_integer() && value.get<int64_t>() < 0))
      return error(path, "expected a non-negative integer, got " +
                             mlir::hpr::quoteJson(value));
    int64_t v = value.get<int64_t>();
    if (v > limit)
      return error(path, "expected at most " + llvm::Twine(limit) + ", got " +
                             mlir::hpr::quoteJson(value));
    out = static_cast<int>(v);
    return llvm::Error::success();
  }

  llvm::Error readAction(const json &value, const std::string &path,
                         bool allowComposite, Action &out) {
    if (!value.is_object())
      return error(path, "expected an action object, got " +
                             mlir::hpr::quoteJson(value));
    auto opIt = value.find("op");
    if (opIt == value.end())
      return error(path, "expected a key 'op'");
    if (!opIt->is_string())
      return error(path + "/op",
                   "expected a string, got " + mlir::hpr::quoteJson(*opIt));
    std::string op = opIt->get<std::string>();
    std::optional<ActionKind> kind = kindFromJsonName(op);
    if (kind) {
      out = Action();
      out.kind = *kind;
    }
    if (!kind)
      return error(path + "/op",
                   "expected one of idle, forward, backward_input, "
                   "backward_weight, backward, send_f, recv_f, send_b, "
                   "recv_b, unshard, reshard, reduce_grad, recompute, clear, "
                   "overlap_f_b, batched_comm; got '" +
                       op + "'");
    bool composite = out.kind == ActionKind::OverlapFB ||
                     out.kind == ActionKind::BatchedComm;
    bool needsStage = !composite && out.kind != ActionKind::Idle;
    bool needsMb = needsStage && !hasNoMicrobatch(out.kind);
    for (auto it = value.begin(); it != value.end(); ++it) {
      const std::string &key = it.key();
      if (key == "op")
        continue;
      std::string sub = path + "/" + key;
      if (key == "stage" && needsStage) {
        if (auto err = readInt(*it, sub, kMaxStage, out.stage))
          return err;
      } else if (key == "microbatch" && needsMb) {
        if (auto err = readInt(*it, sub, kMaxMicrobatch, out.microbatch))
          return err;
      } else if (key == "duration_us") {
        if (!it->is_number() || it->get<double>() < 0 ||
            !std::isfinite(it->get<double>()))
          return error(sub, "expected a non-negative number, got " +
                                mlir::hpr::quoteJson(*it));
        out.durationUs = it->get<double>();
      } else if (key == "parts" && composite) {
        if (!allowComposite)
          return error(sub, "expected no nested composite");
        if (!it->is_array() || it->size() < 2)
          return error(sub, "expected an array of at least two actions");
        for (size_t i = 0; i < it->size(); ++i) {
          Action part;
          std::string partPath = sub + "/" + std::to_string(i);
          if (auto err = readAction((*it)[i], partPath, false, part))
            return err;
          if (out.kind == ActionKind::OverlapFB && !isCompute(part.kind))
            return error(partPath + "/op",
                         "expected a compute action (forward, "
                         "backward_input, backward_weight, backward) in "
                         "overlap_f_b");
          if (out.kind == ActionKind::BatchedComm && !isComm(part.kind))
            return error(partPath + "/op",
                         "expected send_f, recv_f, send_b or recv_b in "
                         "batched_comm");
          out.parts.push_back(std::move(part));
        }
      } else {
        return error(sub, "unexpected key for op '" + op + "'");
      }
    }
    if (needsStage && !value.contains("stage"))
      return error(path, "expected a key 'stage' for op '" + op + "'");
    if (needsMb && !value.contains("microbatch"))
      return error(path, "expected a key 'microbatch' for op '" + op + "'");
    if (composite && !value.contains("parts"))
      return error(path, "expected a key 'parts' for op '" + op + "'");
    return llvm::Error::success();
  }

  llvm::Expected<Schedule> read(const json &root) {
    if (!root.is_object())
      return error("", "expected a JSON object at the top level");
    auto format = root.find("format");
    if (format == root.end() || *format != kFormat.str())
      return error("/format", "expected \"" + kFormat + "\"");
    auto version = root.find("version");
    if (version == root.end() || *version != 1)
      return error("/version", "expected 1");
    static const char *known[] = {
        "format",     "version",          "name",          "num_ranks",
        "num_stages", "num_microbatches", "stage_to_rank", "ranks"};
    for (auto it = root.begin(); it != root.end(); ++it)
      if (std::find_if(std::begin(known), std::end(known), [&](const char *k) {
            return it.key() == k;
          }) == std::end(known))
        return error("/" + it.key(), "unexpected key");

    Schedule schedule;
    schedule.name = llvm::sys::path::stem(fileName).str();
    if (auto name = root.find("name"); name != root.end()) {
      if (!name->is_string())
        return error("/name",
                     "expected a string, got " + mlir::hpr::quoteJson(*name));
      schedule.name = name->get<std::string>();
    }
    auto ranks = root.find("ranks");
    if (ranks == root.end() || !ranks->is_array() || ranks->empty())
      return error("/ranks", "expected a non-empty array of ranks");
    for (size_t r = 0; r < ranks->size(); ++r) {
      const json &rank = (*ranks)[r];
      std::string rankPath = "/ranks/" + std::to_string(r);
      if (!rank.is_object())
        return error(rankPath, "expected an object with 'actions'");
      for (auto it = rank.begin(); it != rank.end(); ++it)
        if (it.key() != "rank" && it.key() != "actions")
          return error(rankPath + "/" + it.key(), "unexpected key");
      if (auto idx = rank.find("rank"); idx != rank.end() && *idx != r)
        return error(rankPath + "/rank",
                     "expected " + std::to_string(r) +
                         " (ranks are listed in order), got " +
                         mlir::hpr::quoteJson(*idx));
      auto actions = rank.find("actions");
      if (actions == rank.end() || !actions->is_array())
        return error(rankPath + "/actions", "expected an array of actions");
      std::vector<Action> program;
      program.reserve(actions->size());
      for (size_t k = 0; k < actions->size(); ++k) {
        Action action;
        if (auto err = readAction((*actions)[k],
                                  rankPath + "/actions/" + std::to_string(k),
                                  true, action))
          return err;
        action.sourceCell = static_cast<int>(k);
        program.push_back(std::move(action));
      }
      schedule.ranks.push_back(std::move(program));
    }
    inferScheduleShape(schedule);

    // Declared shape: checked against what the actions use.
    if (auto it = root.find("num_ranks"); it != root.end()) {
      int n;
      if (auto err = readInt(*it, "/num_ranks", 1 << 20, n))
        return err;
      if (n != schedule.numRanks)
        return error("/num_ranks", "expected " +
                                       std::to_string(schedule.numRanks) +
                                       " (the length of /ranks), got " +
                                       mlir::hpr::quoteJson(*it));
    }
    auto checkAtLeast = [&](const char *key, int used, int limit,
                            int &field) -> llvm::Error {
      auto it = root.find(key);
      if (it == root.end())
        return llvm::Error::success();
      int n;
      std::string path = std::string("/") + key;
      if (auto err = readInt(*it, path, limit, n))
        return err;
      if (n < used)
        return error(path, "expected at least " + std::to_string(used) +
                               " (the actions use that many), got " +
                               mlir::hpr::quoteJson(*it));
      field = n;
      return llvm::Error::success();
    };
    if (auto err = checkAtLeast("num_stages", schedule.numStages, kMaxStage + 1,
                                schedule.numStages))
      return err;
    if (auto err = checkAtLeast("num_microbatches", schedule.numMicrobatches,
                                kMaxMicrobatch + 1, schedule.numMicrobatches))
      return err;
    std::vector<int> inferred = schedule.stageToRank;
    inferred.resize(schedule.numStages, -1);
    schedule.stageToRank = inferred;
    if (auto it = root.find("stage_to_rank"); it != root.end()) {
      if (!it->is_array() ||
          it->size() != static_cast<size_t>(schedule.numStages))
        return error("/stage_to_rank", "expected an array of " +
                                           std::to_string(schedule.numStages) +
                                           " rank numbers (one per stage)");
      for (size_t s = 0; s < it->size(); ++s) {
        std::string path = "/stage_to_rank/" + std::to_string(s);
        int rank;
        if (auto err = readInt((*it)[s], path, schedule.numRanks - 1, rank))
          return err;
        if (inferred[s] >= 0 && inferred[s] != rank)
          return error(path, "expected " + std::to_string(inferred[s]) +
                                 " (stage " + std::to_string(s) +
                                 " first appears on that rank), got " +
                                 std::to_string(rank));
        schedule.stageToRank[s] = rank;
      }
    }
    return schedule;
  }
};

/// Key order op, stage, microbatch, parts, duration_us reads like a CSV cell.
nlohmann::ordered_json actionToJson(const Action &action) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  out["op"] = kindJsonName(action.kind).str();
  if (action.kind == ActionKind::OverlapFB ||
      action.kind == ActionKind::BatchedComm) {
    nlohmann::ordered_json parts = nlohmann::ordered_json::array();
    for (const Action &part : action.parts)
      parts.push_back(actionToJson(part));
    out["parts"] = std::move(parts);
  } else if (action.kind != ActionKind::Idle) {
    out["stage"] = action.stage;
    if (!hasNoMicrobatch(action.kind))
      out["microbatch"] = action.microbatch;
  }
  if (action.durationUs)
    out["duration_us"] = *action.durationUs;
  return out;
}

} // namespace

llvm::Expected<Schedule> parseScheduleJson(llvm::StringRef text,
                                           llvm::StringRef fileName) {
  llvm::Expected<json> parsed = mlir::hpr::parseJson(text, fileName);
  if (!parsed)
    return parsed.takeError();
  const json &root = *parsed;
  Reader reader{fileName.str()};
  return reader.read(root);
}

std::string printScheduleJson(const Schedule &schedule) {
  std::string out = "{\n";
  auto field = [&](const char *key, const json &value) {
    out += "  \"";
    out += key;
    out += "\": ";
    out += mlir::hpr::dumpJson(value);
    out += ",\n";
  };
  field("format", kFormat.str());
  field("version", 1);
  field("name", schedule.name);
  field("num_ranks", schedule.numRanks);
  field("num_stages", schedule.numStages);
  field("num_microbatches", schedule.numMicrobatches);
  field("stage_to_rank", schedule.stageToRank);
  out += "  \"ranks\": [";
  for (size_t r = 0; r < schedule.ranks.size(); ++r) {
    out += r ? ",\n" : "\n";
    out += "    {\"rank\": " + std::to_string(r) + ", \"actions\": [";
    const auto &program = schedule.ranks[r];
    for (size_t k = 0; k < program.size(); ++k) {
      out += k ? ",\n      " : "\n      ";
      out += mlir::hpr::dumpJson(actionToJson(program[k]));
    }
    out += program.empty() ? "]}" : "\n    ]}";
  }
  out += "\n  ]\n}\n";
  return out;
}

} // namespace mlir::hpr::sched
