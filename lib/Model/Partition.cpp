//===- Partition.cpp - Split a model's regions into pipeline stages -------===//
//
// Explicit specs (region index ranges, or module paths per stage) are
// validated against the region list; balanced mode is a
// dynamic program over (stages used, regions covered) minimizing the most
// expensive stage, O(stages * regions^2).
//
//===----------------------------------------------------------------------===//

#include "hpr/Model/Partition.h"
#include "hpr/Support/Error.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

using namespace mlir::hpr::model;
using mlir::hpr::makeError;

namespace {

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

/// Whether a spec names modules (`0:tok_embeddings,layers.0;1:layers.1`)
/// rather than region indices (`0:0-1,1:2-3`): stages separated by ';', or a
/// first stage's list that starts with a name.
bool namesModules(llvm::StringRef spec) {
  if (spec.contains(';'))
    return true;
  llvm::StringRef first = spec.split(',').first;
  llvm::StringRef rest = first.split(':').second.ltrim();
  return first.contains(':') && !rest.empty() && !llvm::isDigit(rest.front());
}

/// How specifically module path \p name names region part \p part (a
/// module path): its length when the part is that module or inside it, else
/// 0.
size_t specificity(llvm::StringRef name, llvm::StringRef part) {
  bool inside = part == name || (part.starts_with(name) &&
                                 part.drop_front(name.size()).starts_with("."));
  return inside && !name.empty() ? name.size() : 0;
}

/// The stage of every region under a module-name spec: `STAGE:NAME,...`
/// items separated by ';', each NAME a module path (torchtitan's split lists
/// module FQNs per stage). A region goes to the stage of the most specific
/// name it is in (`model.layers.3` before `model`); a segment of code between
/// modules, named by its modules joined with '+' ("norm+output"), to the
/// stage all its modules go to, or to the stage naming it whole. Every name
/// must name a region, and every region be in a stage.
llvm::Expected<std::vector<int>>
stagesByName(const ModelGraph &graph, llvm::StringRef spec, int &numStages) {
  struct Name {
    std::string text;
    int stage;
    std::string where;
  };
  std::vector<Name> names;
  std::set<int> listed;
  size_t column = 1;
  llvm::SmallVector<llvm::StringRef> items;
  spec.split(items, ';', -1, /*KeepEmpty=*/true);
  for (llvm::StringRef item : items) {
    std::string where = llvm::formatv("stage spec:1:{0}: '{1}'", column, item);
    auto [stageText, namesText] = item.split(':');
    std::optional<int> stage = parseIndex(stageText);
    if (!item.contains(':') || !stage || namesText.trim().empty())
      return makeError(where + ": expected 'STAGE:MODULE[,MODULE...]' "
                               "(stages separated by ';')");
    if (!listed.insert(*stage).second)
      return makeError(
          llvm::formatv("{0}: stage {1} is listed twice", where, *stage));
    llvm::SmallVector<llvm::StringRef> parts;
    namesText.split(parts, ',', -1, /*KeepEmpty=*/true);
    for (llvm::StringRef name : parts) {
      if (name.trim().empty())
        return makeError(where + ": an empty module path");
      names.push_back({name.trim().str(), *stage, where});
    }
    column += item.size() + 1;
  }
  int n = static_cast<int>(graph.regions.size());
  auto partsOf = [](llvm::StringRef region) {
    llvm::SmallVector<llvm::StringRef> parts;
    region.split(parts, '+');
    return parts;
  };
  for (const Name &name : names) {
    bool named = llvm::any_of(graph.regions, [&](const Region &region) {
      return name.text == region.name ||
             llvm::any_of(partsOf(region.name), [&](llvm::StringRef part) {
               return specificity(name.text, part) > 0;
             });
    });
    if (!named)
      return makeError(llvm::formatv(
          "{0}: '{1}' names no region of model '{2}' (module paths such as "
          "'{3}')",
          name.where, name.text, graph.name,
          n ? graph.regions[n - 1].name : std::string("layers.0")));
  }
  std::vector<int> stageOf(n, -1);
  for (int i = 0; i < n; ++i) {
    llvm::StringRef region = graph.regions[i].name;
    auto whole = llvm::find_if(
        names, [&](const Name &name) { return name.text == region; });
    if (whole != names.end()) {
      stageOf[i] = whole->stage;
      continue;
    }
    const Name *chosen = nullptr;
    for (llvm::StringRef part : partsOf(region)) {
      const Name *best = nullptr;
      for (const Name &name : names)
        if (size_t depth = specificity(name.text, part))
          if (!best || depth > best->text.size())
            best = &name;
      if (!best)
        continue;
      if (chosen && chosen->stage != best->stage)
        return makeError(llvm::formatv(
            "stage spec: region {0} ('{1}') is code between modules that "
            "'{2}' puts in stage {3} and '{4}' in stage {5}; name the region "
            "itself in one stage ('{6}:{1}')",
            i, region, chosen->text, chosen->stage, best->text, best->stage,
            chosen->stage));
      chosen = best;
    }
    if (chosen)
      stageOf[i] = chosen->stage;
  }
  int specStages = listed.empty() ? 0 : *listed.rbegin() + 1;
  if (numStages <= 0)
    numStages = specStages;
  for (int stage : listed)
    if (stage >= numStages)
      return makeError(llvm::formatv("stage spec: stage {0} is out of range "
                                     "(the pipeline has {1} stages)",
                                     stage, numStages));
  for (int i = 0; i < n; ++i)
    if (stageOf[i] < 0)
      return makeError(llvm::formatv("stage spec: region {0} ('{1}') is in "
                                     "no stage",
                                     i, graph.regions[i].name));
  return stageOf;
}

/// The stage of every region under an index spec (`STAGE:FIRST-LAST`).
llvm::Expected<std::vector<int>> stagesByIndex(const ModelGraph &graph,
                                               llvm::StringRef specText,
                                               int &numStages) {
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
  return stageOf;
}

llvm::Expected<StagedModel> partitionExplicit(const ModelGraph &graph,
                                              int numStages,
                                              llvm::StringRef specText) {
  llvm::Expected<std::vector<int>> assigned =
      namesModules(specText) ? stagesByName(graph, specText, numStages)
                             : stagesByIndex(graph, specText, numStages);
  if (!assigned)
    return assigned.takeError();
  const std::vector<int> &stageOf = *assigned;
  int n = static_cast<int>(graph.regions.size());
  for (int s = 0; s < numStages; ++s)
    if (!llvm::is_contained(stageOf, s))
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
