//===- ModelJson.cpp - JSON graph format for models -----------------------===//
//
// Strict reader (every schema violation names its JSON path) and writer for
// the model JSON format described in docs/models.md.
//
//===----------------------------------------------------------------------===//

#include "hpr/Model/ModelJson.h"
#include "hpr/Support/Json.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <map>

using namespace mlir::hpr::model;
using json = nlohmann::json;

namespace {

/// Bounds of region costs (see readNumber and readBytes).
constexpr double kMaxTimeUs = 1e12;
constexpr double kMaxFlops = 1e21;

/// Every key a region may have: its name, policy and required costs, then
/// the measured ones (kMeasuredTimes, kMeasuredBytes).
const std::vector<const char *> &regionKeys() {
  static const std::vector<const char *> keys = [] {
    std::vector<const char *> keys = {
        "name",        "checkpoint",  "checkpointable", "fwd_flops",
        "fwd_time_us", "saved_bytes", "input_bytes",    "param_bytes",
        "tied_params", "stage"};
    for (const MeasuredTime &time : kMeasuredTimes)
      keys.push_back(time.key);
    for (const MeasuredBytes &bytes : kMeasuredBytes)
      keys.push_back(bytes.key);
    return keys;
  }();
  return keys;
}

/// Collects the first schema violation with its path.
class Reader : public mlir::hpr::JsonFieldReader {
public:
  using JsonFieldReader::JsonFieldReader;

  /// A non-negative number up to `max`: the bounds keep every sum the
  /// simulator forms over a million actions finite (the largest time, 10^12
  /// us, is 11 days per region).
  llvm::Error readNumber(const json &obj, const std::string &path,
                         const char *key, double &out, bool required,
                         double max, const char *maxText) {
    llvm::Expected<const json *> value = find(obj, path, key, required);
    if (!value || !*value)
      return value.takeError();
    const json &number = **value;
    if (!number.is_number() || !std::isfinite(number.get<double>()) ||
        number.get<double>() < 0 || number.get<double>() > max)
      return fail(path + "/" + key,
                  std::string("a number between 0 and ") + maxText, number);
    out = number.get<double>();
    return llvm::Error::success();
  }

  llvm::Error readBytes(const json &obj, const std::string &path,
                        const char *key, int64_t &out, bool required) {
    llvm::Expected<const json *> value = find(obj, path, key, required);
    if (!value || !*value)
      return value.takeError();
    const json &bytes = **value;
    // 1 TiB per region is far beyond any real activation and keeps every
    // per-rank sum of the cost model (up to 2^22 lifetimes live at once) from
    // int64 overflow.
    constexpr int64_t kMaxBytes = int64_t(1) << 40;
    if (bytes.is_number_integer() &&
        !(bytes.is_number_unsigned() &&
          bytes.get<uint64_t>() > uint64_t(kMaxBytes))) {
      int64_t count = bytes.get<int64_t>();
      if (count >= 0 && count <= kMaxBytes) {
        out = count;
        return llvm::Error::success();
      }
    }
    return fail(path + "/" + key, "an integer between 0 and 2^40 (1 TiB)",
                bytes);
  }

  llvm::Error readRegion(const json &obj, const std::string &path,
                         Region &region) {
    if (!obj.is_object())
      return fail(path, "a region object", obj);
    if (auto err = checkKeys(obj, path, regionKeys()))
      return err;
    if (auto err = readString(obj, path, "name", region.name, true))
      return err;
    if (auto err = readCheckpoint(obj, path, region))
      return err;
    if (auto err = readBool(obj, path, "checkpointable", region.checkpointable))
      return err;
    if (auto err = readNumber(obj, path, "fwd_flops", region.fwdFlops, true,
                              kMaxFlops, "1e21"))
      return err;
    if (auto err = readNumber(obj, path, "fwd_time_us", region.fwdTimeUs, false,
                              kMaxTimeUs, "1e12 us"))
      return err;
    for (const MeasuredTime &time : kMeasuredTimes)
      if (auto err = readNumber(obj, path, time.key, region.*time.field, false,
                                kMaxTimeUs, "1e12 us"))
        return err;
    if (auto err = readBytes(obj, path, "saved_bytes", region.savedBytes, true))
      return err;
    if (auto err = readBytes(obj, path, "input_bytes", region.inputBytes, true))
      return err;
    if (auto err = readBytes(obj, path, "param_bytes", region.paramBytes, true))
      return err;
    if (auto err = readTiedParams(obj, path, region))
      return err;
    for (const MeasuredBytes &bytes : kMeasuredBytes)
      if (auto err =
              readBytes(obj, path, bytes.key, region.*bytes.field, false))
        return err;
    if (auto it = obj.find("stage"); it != obj.end()) {
      if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
          it->get<int64_t>() > 1000000)
        return fail(path + "/stage", "a non-negative integer stage index", *it);
      region.stage = static_cast<int>(it->get<int64_t>());
    }
    if (region.checkpoint && !region.checkpointable)
      return failMsg(path + "/checkpoint",
                     "a region with \"checkpointable\": false cannot be "
                     "checkpointed");
    // The selective policy has no cost fallback: what it saves is measured.
    if (region.selective && region.selectiveReplayTimeUs <= 0)
      return failMsg(path + "/checkpoint",
                     "\"selective\" needs the region's measured selective "
                     "costs (selective_replay_time_us, ...: python -m "
                     "hp_recompute.costs)");
    return llvm::Error::success();
  }

  /// `tied_params`: [{"name": FQN, "bytes": N}, ...], each name once, their
  /// bytes together within the region's param_bytes (read before).
  llvm::Error readTiedParams(const json &obj, const std::string &parent,
                             Region &region) {
    auto it = obj.find("tied_params");
    if (it == obj.end())
      return llvm::Error::success();
    const std::string path = parent + "/tied_params";
    if (!it->is_array())
      return fail(path, "an array of {\"name\": ..., \"bytes\": ...}", *it);
    llvm::StringSet<> names;
    int64_t total = 0;
    for (size_t i = 0; i < it->size(); ++i) {
      const json &entry = (*it)[i];
      std::string at = llvm::formatv("{0}/{1}", path, i).str();
      if (!entry.is_object())
        return fail(at, "an object {\"name\": ..., \"bytes\": ...}", entry);
      TiedParam &tied = region.tiedParams.emplace_back();
      if (auto err = checkKeys(entry, at, {"name", "bytes"}))
        return err;
      if (auto err = readString(entry, at, "name", tied.name, true))
        return err;
      if (auto err = readBytes(entry, at, "bytes", tied.bytes, true))
        return err;
      if (!names.insert(tied.name).second)
        return failMsg(at + "/name",
                       "tied parameter '" + tied.name + "' is listed twice");
      total += tied.bytes;
      if (total > region.paramBytes)
        return failMsg(at + "/bytes",
                       llvm::formatv("the region's tied parameters hold {0} "
                                     "bytes, more than its param_bytes {1}, "
                                     "which counts them",
                                     total, region.paramBytes)
                           .str());
    }
    return llvm::Error::success();
  }

  /// Every tied parameter is one tensor that at least two regions read: the
  /// same bytes wherever it is listed.
  llvm::Error checkTiedParams(const ModelGraph &graph) {
    struct FirstSeen {
      std::string path;
      int64_t bytes;
      int regions = 0;
    };
    std::map<std::string, FirstSeen> seen;
    for (auto [r, region] : llvm::enumerate(graph.regions))
      for (auto [i, tied] : llvm::enumerate(region.tiedParams)) {
        std::string path =
            llvm::formatv("/regions/{0}/tied_params/{1}", r, i).str();
        auto [first, isNew] =
            seen.try_emplace(tied.name, FirstSeen{path, tied.bytes});
        ++first->second.regions;
        if (!isNew && first->second.bytes != tied.bytes)
          return failMsg(
              path + "/bytes",
              llvm::formatv("tied parameter '{0}' has {1} bytes here but {2} "
                            "at {3}; it is one tensor",
                            tied.name, tied.bytes, first->second.bytes,
                            first->second.path)
                  .str());
      }
    for (const auto &[name, first] : seen)
      if (first.regions < 2)
        return failMsg(first.path + "/name",
                       "tied parameter '" + name +
                           "' is read by no other region; list it in every "
                           "region that reads it, or not at all");
    return llvm::Error::success();
  }

  /// `checkpoint`: false (none), true (full) or "selective"; false when
  /// absent.
  llvm::Error readCheckpoint(const json &obj, const std::string &path,
                             Region &region) {
    auto it = obj.find("checkpoint");
    if (it == obj.end())
      return llvm::Error::success();
    if (it->is_boolean()) {
      region.checkpoint = it->get<bool>();
      return llvm::Error::success();
    }
    if (it->is_string() && it->get<std::string>() == "selective") {
      region.checkpoint = region.selective = true;
      return llvm::Error::success();
    }
    return fail(path + "/checkpoint", "false, true or \"selective\"", *it);
  }

  /// `data_parallel` of `obj` at `parent`: {"shard": N, "replicate": M},
  /// each an integer in [1, kMaxDataParallel] and 1 when absent.
  llvm::Error readDataParallel(const json &obj, const std::string &parent,
                               DataParallel &out) {
    auto it = obj.find("data_parallel");
    if (it == obj.end())
      return llvm::Error::success();
    const std::string path = parent + "/data_parallel";
    if (!it->is_object())
      return fail(path, "an object with \"shard\" and \"replicate\"", *it);
    if (auto err = checkKeys(*it, path, {"shard", "replicate"}))
      return err;
    for (auto [key, field] :
         {std::pair{"shard", &DataParallel::shard},
          std::pair{"replicate", &DataParallel::replicate}}) {
      auto value = it->find(key);
      if (value == it->end())
        continue;
      if (!value->is_number_integer() || value->get<int64_t>() < 1 ||
          value->get<int64_t>() > kMaxDataParallel)
        return fail(
            path + "/" + key,
            llvm::formatv("an integer between 1 and {0}", kMaxDataParallel)
                .str(),
            *value);
      out.*field = value->get<int64_t>();
    }
    return llvm::Error::success();
  }

  llvm::Expected<ModelGraph> read(const json &doc) {
    ModelGraph graph;
    if (!doc.is_object())
      return fail("", "a JSON object at the top level", doc);
    if (auto err = checkKeys(doc, "",
                             {"format", "version", "name", "regions", "source",
                              "data_parallel"}))
      return err;
    if (auto it = doc.find("format");
        it != doc.end() && (!it->is_string() || *it != kModelJsonFormat))
      return fail("/format", llvm::formatv("\"{0}\"", kModelJsonFormat).str(),
                  *it);
    if (auto it = doc.find("version");
        it != doc.end() &&
        (!it->is_number_integer() || it->get<int64_t>() != kModelJsonVersion))
      return fail("/version", llvm::formatv("{0}", kModelJsonVersion).str(),
                  *it);
    if (auto err = readString(doc, "", "name", graph.name, true))
      return err;
    if (auto err = readDataParallel(doc, "", graph.dataParallel))
      return err;
    auto regions = doc.find("regions");
    if (regions == doc.end())
      return failMsg("", "missing required key 'regions'");
    if (!regions->is_array() || regions->empty())
      return fail("/regions", "a non-empty array of regions", *regions);
    llvm::StringSet<> names;
    int lastStage = -1;
    for (size_t i = 0; i < regions->size(); ++i) {
      std::string path = llvm::formatv("/regions/{0}", i).str();
      Region region;
      if (auto err = readRegion((*regions)[i], path, region))
        return err;
      if (!names.insert(region.name).second)
        return failMsg(path + "/name",
                       "duplicate region name '" + region.name + "'");
      if (region.stage >= 0) {
        if (region.stage < lastStage)
          return failMsg(path + "/stage",
                         llvm::formatv("stage {0} comes after stage {1}; "
                                       "stages must be non-decreasing in "
                                       "region order",
                                       region.stage, lastStage)
                             .str());
        lastStage = region.stage;
      }
      graph.regions.push_back(std::move(region));
    }
    if (auto err = checkTiedParams(graph))
      return err;
    return graph;
  }
};

} // namespace

llvm::Expected<ModelGraph>
mlir::hpr::model::parseModelJson(llvm::StringRef text, llvm::StringRef file) {
  llvm::Expected<json> doc = mlir::hpr::parseJson(text, file);
  if (!doc)
    return doc.takeError();
  return Reader(file).read(*doc);
}

llvm::Error mlir::hpr::model::readRegionJson(const nlohmann::json &obj,
                                             const std::string &path,
                                             llvm::StringRef file,
                                             Region &region) {
  return Reader(file).readRegion(obj, path, region);
}

llvm::Error mlir::hpr::model::readDataParallelJson(const nlohmann::json &obj,
                                                   const std::string &path,
                                                   llvm::StringRef file,
                                                   DataParallel &out) {
  return Reader(file).readDataParallel(obj, path, out);
}

std::string mlir::hpr::model::printModelJson(const ModelGraph &graph) {
  // ordered_json keeps keys in the documented order.
  using ojson = nlohmann::ordered_json;
  ojson doc = ojson::object();
  doc["format"] = kModelJsonFormat;
  doc["version"] = kModelJsonVersion;
  doc["name"] = graph.name;
  if (graph.dataParallel.shard != 1 || graph.dataParallel.replicate != 1)
    doc["data_parallel"] = {{"shard", graph.dataParallel.shard},
                            {"replicate", graph.dataParallel.replicate}};
  ojson regions = ojson::array();
  auto number = [](double value) -> ojson {
    // Whole numbers print without a fraction so files diff cleanly.
    if (value == std::floor(value) && std::fabs(value) < 9.0e15)
      return static_cast<int64_t>(value);
    return value;
  };
  for (const Region &region : graph.regions) {
    ojson r = ojson::object();
    r["name"] = region.name;
    r["checkpoint"] =
        region.selective ? ojson("selective") : ojson(region.checkpoint);
    r["checkpointable"] = region.checkpointable;
    r["fwd_flops"] = number(region.fwdFlops);
    r["fwd_time_us"] = number(region.fwdTimeUs);
    for (const MeasuredTime &time : kMeasuredTimes)
      if (region.*time.field > 0)
        r[time.key] = number(region.*time.field);
    r["saved_bytes"] = region.savedBytes;
    r["input_bytes"] = region.inputBytes;
    r["param_bytes"] = region.paramBytes;
    if (!region.tiedParams.empty()) {
      ojson tied = ojson::array();
      for (const TiedParam &param : region.tiedParams)
        tied.push_back({{"name", param.name}, {"bytes", param.bytes}});
      r["tied_params"] = std::move(tied);
    }
    for (const MeasuredBytes &bytes : kMeasuredBytes)
      if (region.*bytes.field > 0)
        r[bytes.key] = region.*bytes.field;
    if (region.stage >= 0)
      r["stage"] = region.stage;
    regions.push_back(std::move(r));
  }
  doc["regions"] = std::move(regions);
  return mlir::hpr::dumpJson(doc, 2) + "\n";
}
