//===- Partition.cpp - Split a model's regions into pipeline stages -------===//
//
// Explicit specs are validated against the region list; balanced mode is a
// dynamic program over (stages used, regions covered) minimizing the most
// expensive stage, O(stages * regions^2).
//
//===----------------------------------------------------------------------===//

#include "hpr/Model/Partition.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <map>
#include <optional>

using namespace mlir::hpr::model;

namespace {

llvm::Error makeError(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg.str());
}

/// One `STAGE:FIRST-LAST` item of a spec, with its column for messages.
struct SpecItem {
  int stage;
  int first, last;
  size_t column;
  std::string text;
};

std::optional<int> parseIndex(llvm::StringRef text) {
  text = text.trim();
  unsigned value;
  if (text.empty() || text.getAsInteger(10, value) || value > 1000000)
    return std::nullopt;
  return static_cast<int>(value);
}

llvm::Expected<std::vector<SpecItem>> parseSpec(llvm::StringRef spec) {
  std::vector<SpecItem> items;
  size_t column = 1;
  llvm::SmallVector<llvm::StringRef> parts;
  spec.split(parts, ',', -1, /*KeepEmpty=*/true);
  for (llvm::StringRef part : parts) {
    auto bad = [&](llvm::StringRef what) {
      return makeError(llvm::formatv("stage spec:1:{0}: expected {1}, got "
                                     "'{2}'",
                                     column, what, part)
                           .str());
    };
    auto [stageText, rangeText] = part.split(':');
    if (part.find(':') == llvm::StringRef::npos)
      return bad("'STAGE:FIRST-LAST'");
    auto stage = parseIndex(stageText);
    if (!stage)
      return bad("a stage index before ':'");
    auto [firstText, lastText] = rangeText.split('-');
    auto first = parseIndex(firstText);
    auto last = rangeText.contains('-') ? parseIndex(lastText) : first;
    if (!first || !last)
      return bad("a region index range 'FIRST-LAST' after ':'");
    if (*last < *first)
      return bad("FIRST <= LAST in the region range");
    items.push_back({*stage, *first, *last, column, part.str()});
    column += part.size() + 1;
  }
  return items;
}

StagedModel build(const ModelGraph &graph, const std::vector<int> &stageOf,
                  int numStages) {
  StagedModel staged;
  staged.name = graph.name;
  staged.dataParallel = graph.dataParallel;
  for (int s = 0; s < numStages; ++s)
    staged.stages.push_back(Stage{s, {}});
  // A tied parameter is one tensor: a stage holds one copy however many of
  // its regions read it, so only the first of them counts its bytes; stages
  // are separate modules, each with its own copy (docs/models.md, "Tied
  // parameters").
  std::vector<llvm::StringSet<>> held(numStages);
  for (size_t i = 0; i < graph.regions.size(); ++i) {
    Region region = graph.regions[i];
    region.stage = stageOf[i];
    for (const TiedParam &tied : region.tiedParams)
      if (!held[stageOf[i]].insert(tied.name).second)
        region.paramBytes -= tied.bytes;
    staged.stages[stageOf[i]].regions.push_back(std::move(region));
  }
  return staged;
}

llvm::Expected<StagedModel> partitionExplicit(const ModelGraph &graph,
                                              int numStages,
                                              llvm::StringRef specText) {
  auto items = parseSpec(specText);
  if (!items)
    return items.takeError();
  int n = static_cast<int>(graph.regions.size());
  int specStages = 0;
  for (const SpecItem &item : *items)
    specStages = std::max(specStages, item.stage + 1);
  if (numStages <= 0)
    numStages = specStages;
  std::map<int, const SpecItem *> byStage;
  for (const SpecItem &item : *items) {
    auto where = [&] {
      return llvm::formatv("stage spec:1:{0}: '{1}'", item.column, item.text)
          .str();
    };
    if (item.stage >= numStages)
      return makeError(llvm::formatv("{0}: stage {1} is out of range (the "
                                     "pipeline has {2} stages)",
                                     where(), item.stage, numStages));
    if (item.last >= n)
      return makeError(llvm::formatv("{0}: region index {1} is out of range "
                                     "(model '{2}' has {3} regions, 0-{4})",
                                     where(), item.last, graph.name, n, n - 1));
    if (!byStage.emplace(item.stage, &item).second)
      return makeError(
          llvm::formatv("{0}: stage {1} is listed twice", where(), item.stage));
  }
  std::vector<int> stageOf(n, -1);
  for (const SpecItem &item : *items)
    for (int i = item.first; i <= item.last; ++i) {
      if (stageOf[i] >= 0)
        return makeError(llvm::formatv(
            "stage spec:1:{0}: '{1}': region {2} ('{3}') overlaps stage {4}",
            item.column, item.text, i, graph.regions[i].name, stageOf[i]));
      stageOf[i] = item.stage;
    }
  for (int s = 0; s < numStages; ++s)
    if (!byStage.count(s))
      return makeError(
          llvm::formatv("stage spec: stage {0} has no regions", s));
  for (int i = 0; i < n; ++i)
    if (stageOf[i] < 0)
      return makeError(llvm::formatv("stage spec: region {0} ('{1}') is in "
                                     "no stage",
                                     i, graph.regions[i].name));
  for (int i = 1; i < n; ++i)
    if (stageOf[i] < stageOf[i - 1])
      return makeError(llvm::formatv(
          "stage spec: region {0} ('{1}') is in stage {2} but comes after "
          "region {3} of stage {4}; stages must take regions in order",
          i, graph.regions[i].name, stageOf[i], i - 1, stageOf[i - 1]));
  for (int i = 0; i < n; ++i)
    if (graph.regions[i].stage >= 0 && graph.regions[i].stage != stageOf[i])
      return makeError(llvm::formatv(
          "stage spec: region {0} ('{1}') is fixed to stage {2} by the model "
          "but the spec puts it in stage {3}",
          i, graph.regions[i].name, graph.regions[i].stage, stageOf[i]));
  return build(graph, stageOf, numStages);
}

} // namespace

std::vector<double> mlir::hpr::model::partitionCosts(const ModelGraph &graph) {
  bool profiled = !graph.regions.empty() &&
                  llvm::all_of(graph.regions, [](const Region &region) {
                    return region.fwdTimeUs > 0;
                  });
  std::vector<double> costs;
  for (const Region &region : graph.regions)
    costs.push_back(profiled ? region.fwdTimeUs : region.fwdFlops);
  return costs;
}

llvm::Expected<StagedModel>
mlir::hpr::model::partitionModel(const ModelGraph &graph, int numStages,
                                 llvm::StringRef explicitSpec) {
  int n = static_cast<int>(graph.regions.size());
  if (!explicitSpec.trim().empty())
    return partitionExplicit(graph, numStages, explicitSpec.trim());
  if (numStages <= 0)
    return makeError(llvm::formatv("cannot split model '{0}' into {1} stages: "
                                   "expected a positive stage count",
                                   graph.name, numStages));
  if (n < numStages)
    return makeError(llvm::formatv("cannot split model '{0}' into {1} stages: "
                                   "it has only {2} regions",
                                   graph.name, numStages, n));
  for (int i = 0; i < n; ++i)
    if (graph.regions[i].stage >= numStages)
      return makeError(llvm::formatv(
          "region {0} ('{1}') is fixed to stage {2} but the pipeline has {3} "
          "stages",
          i, graph.regions[i].name, graph.regions[i].stage, numStages));

  std::vector<double> costs = partitionCosts(graph);
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i)
    prefix[i + 1] = prefix[i] + costs[i];
  // Region k may not join stage s when it is fixed to another stage.
  auto clashes = [&](int k, int s) {
    return graph.regions[k].stage >= 0 && graph.regions[k].stage != s;
  };
  // best[s][j]: minimal max stage cost putting regions [0, j) into stages
  // 0..s; from[s][j]: where stage s starts in that optimum, -1 when no split
  // exists (kept apart from the cost, which may itself overflow to inf).
  std::vector<std::vector<double>> best(numStages,
                                        std::vector<double>(n + 1, 0));
  std::vector<std::vector<int>> from(numStages, std::vector<int>(n + 1, -1));
  for (int j = 1; j <= n && !clashes(j - 1, 0); ++j) {
    best[0][j] = prefix[j];
    from[0][j] = 0;
  }
  // Stage s = [i, j) grows leftwards one region at a time, so only the new
  // region i needs checking: O(S n^2) in all.
  for (int s = 1; s < numStages; ++s)
    for (int j = s + 1; j <= n; ++j)
      for (int i = j - 1; i >= s; --i) {
        if (clashes(i, s))
          break; // a longer stage s would include the same region
        if (from[s - 1][i] < 0)
          continue;
        double cost = std::max(best[s - 1][i], prefix[j] - prefix[i]);
        if (from[s][j] < 0 || cost < best[s][j]) {
          best[s][j] = cost;
          from[s][j] = i;
        }
      }
  if (from[numStages - 1][n] < 0)
    return makeError(llvm::formatv(
        "cannot split model '{0}' into {1} stages: the fixed \"stage\" of its "
        "regions leaves no contiguous split with every stage non-empty",
        graph.name, numStages));
  std::vector<int> stageOf(n, 0);
  for (int s = numStages - 1, j = n; s >= 0; --s) {
    int i = from[s][j];
    for (int k = i; k < j; ++k)
      stageOf[k] = s;
    j = i;
  }
  return build(graph, stageOf, numStages);
}
