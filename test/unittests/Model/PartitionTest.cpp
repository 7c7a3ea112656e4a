//===- PartitionTest.cpp - Tests for stage partitioning -------------------===//

#include "hpr/Model/Partition.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <random>

using namespace mlir::hpr::model;

namespace {

ModelGraph chain(const std::vector<double> &flops) {
  ModelGraph graph;
  graph.name = "chain";
  for (size_t i = 0; i < flops.size(); ++i) {
    Region region;
    region.name = "r" + std::to_string(i);
    region.fwdFlops = flops[i];
    graph.regions.push_back(region);
  }
  return graph;
}

double maxStageCost(const StagedModel &staged, bool time) {
  double worst = 0;
  for (const Stage &stage : staged.stages) {
    double sum = 0;
    for (const Region &region : stage.regions)
      sum += time ? region.fwdTimeUs : region.fwdFlops;
    worst = std::max(worst, sum);
  }
  return worst;
}

/// Every way of cutting n regions into k non-empty contiguous stages.
double bruteForce(const std::vector<double> &costs, int k,
                  const std::vector<int> &fixed = {}) {
  int n = costs.size();
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> stageOf(n);
  std::function<void(int, int)> go = [&](int i, int s) {
    if (i == n) {
      if (s != k - 1)
        return;
      std::vector<double> sums(k, 0);
      for (int j = 0; j < n; ++j) {
        if (!fixed.empty() && fixed[j] >= 0 && fixed[j] != stageOf[j])
          return;
        sums[stageOf[j]] += costs[j];
      }
      best = std::min(best, *std::max_element(sums.begin(), sums.end()));
      return;
    }
    // Region i joins stage s (if i > 0) or opens stage s + 1.
    if (i > 0) {
      stageOf[i] = s;
      go(i + 1, s);
    }
    if (s + 1 < k) {
      stageOf[i] = s + 1;
      go(i + 1, s + 1);
    }
  };
  stageOf[0] = 0;
  go(1, 0);
  return best;
}

void expectContiguousCover(const ModelGraph &graph, const StagedModel &staged,
                           int k) {
  ASSERT_EQ(int(staged.stages.size()), k);
  size_t next = 0;
  for (int s = 0; s < k; ++s) {
    EXPECT_EQ(staged.stages[s].index, s);
    EXPECT_FALSE(staged.stages[s].regions.empty());
    for (const Region &region : staged.stages[s].regions) {
      ASSERT_LT(next, graph.regions.size());
      EXPECT_EQ(region.name, graph.regions[next++].name);
      EXPECT_EQ(region.stage, s);
    }
  }
  EXPECT_EQ(next, graph.regions.size());
}

TEST(Partition, BalancedMatchesBruteForce) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    int n = 1 + rng() % 9;
    int k = 1 + rng() % n;
    std::vector<double> costs(n);
    for (double &c : costs)
      c = double(rng() % 20); // zeros and ties included
    ModelGraph graph = chain(costs);
    auto staged = partitionModel(graph, k, "");
    ASSERT_TRUE(bool(staged)) << llvm::toString(staged.takeError());
    expectContiguousCover(graph, *staged, k);
    EXPECT_DOUBLE_EQ(maxStageCost(*staged, false), bruteForce(costs, k))
        << "trial " << trial << " n=" << n << " k=" << k;
  }
}

TEST(Partition, HonoursFixedStagesOptimally) {
  std::mt19937 rng(99);
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    int n = 2 + rng() % 7;
    int k = 1 + rng() % std::min(n, 4);
    std::vector<double> costs(n);
    for (double &c : costs)
      c = double(1 + rng() % 9);
    ModelGraph graph = chain(costs);
    std::vector<int> fixed(n, -1);
    // Fix a random prefix/suffix region consistently: first to 0, last to k-1.
    if (rng() % 2)
      fixed[0] = graph.regions[0].stage = 0;
    if (rng() % 2)
      fixed[n - 1] = graph.regions[n - 1].stage = k - 1;
    int mid = rng() % n;
    if (k > 2 && mid > 0 && mid < n - 1 && rng() % 2)
      fixed[mid] = graph.regions[mid].stage = 1;
    double expected = bruteForce(costs, k, fixed);
    auto staged = partitionModel(graph, k, "");
    if (expected == std::numeric_limits<double>::infinity()) {
      EXPECT_FALSE(bool(staged));
      llvm::consumeError(staged.takeError());
      continue;
    }
    ASSERT_TRUE(bool(staged)) << llvm::toString(staged.takeError());
    expectContiguousCover(graph, *staged, k);
    for (int i = 0; i < n; ++i)
      if (fixed[i] >= 0) {
        bool found = false;
        for (const Region &r : staged->stages[fixed[i]].regions)
          found |= r.name == graph.regions[i].name;
        EXPECT_TRUE(found) << graph.regions[i].name;
      }
    EXPECT_DOUBLE_EQ(maxStageCost(*staged, false), expected);
    ++checked;
  }
  EXPECT_GT(checked, 100);
}

TEST(Partition, UsesTimeWhenEveryRegionIsProfiled) {
  // FLOPs say split after r0; times say split after r2.
  ModelGraph graph = chain({100, 1, 1, 1});
  double times[] = {1, 1, 1, 3};
  for (int i = 0; i < 4; ++i)
    graph.regions[i].fwdTimeUs = times[i];
  auto staged = partitionModel(graph, 2, "");
  ASSERT_TRUE(bool(staged));
  EXPECT_EQ(staged->stages[0].regions.size(), 3u);
  graph.regions[3].fwdTimeUs = 0; // not all profiled: FLOPs decide
  staged = partitionModel(graph, 2, "");
  ASSERT_TRUE(bool(staged));
  EXPECT_EQ(staged->stages[0].regions.size(), 1u);
}

TEST(Partition, ExplicitSpec) {
  ModelGraph graph = chain({1, 2, 3, 4, 5, 6, 7, 8});
  auto staged = partitionModel(graph, 2, "0:0-5,1:6-7");
  ASSERT_TRUE(bool(staged)) << llvm::toString(staged.takeError());
  EXPECT_EQ(staged->stages[0].regions.size(), 6u);
  EXPECT_EQ(staged->stages[1].regions.front().name, "r6");
  // Stage count inferred, single-index items, any item order.
  staged = partitionModel(graph, 0, "1:1-7, 0:0");
  ASSERT_TRUE(bool(staged)) << llvm::toString(staged.takeError());
  EXPECT_EQ(staged->stages.size(), 2u);
  EXPECT_EQ(staged->stages[0].regions.size(), 1u);
}

/// The parameter bytes each stage of `staged` holds.
std::vector<int64_t> stageParamBytes(const StagedModel &staged) {
  std::vector<int64_t> bytes;
  for (const Stage &stage : staged.stages) {
    int64_t sum = 0;
    for (const Region &region : stage.regions)
      sum += region.paramBytes;
    bytes.push_back(sum);
  }
  return bytes;
}

// r0 (an embedding) and r3 (the head) read one weight `w` of 64 bytes; r1
// and r2 read `v` of 8. A stage holds each once; stages hold their own.
TEST(Partition, AStageHoldsATiedParameterOnce) {
  ModelGraph graph = chain({1, 1, 1, 1});
  for (auto [index, bytes] :
       llvm::enumerate(std::vector<int64_t>{100, 20, 30, 70}))
    graph.regions[index].paramBytes = bytes;
  graph.regions[0].tiedParams = {{"w", 64}};
  graph.regions[1].tiedParams = {{"v", 8}};
  graph.regions[2].tiedParams = {{"v", 8}};
  graph.regions[3].tiedParams = {{"w", 64}};
  auto one = partitionModel(graph, 1, "");
  ASSERT_TRUE(bool(one)) << llvm::toString(one.takeError());
  EXPECT_EQ(stageParamBytes(*one), (std::vector<int64_t>{220 - 64 - 8}));
  auto two = partitionModel(graph, 2, "0:0-1,1:2-3");
  ASSERT_TRUE(bool(two)) << llvm::toString(two.takeError());
  EXPECT_EQ(stageParamBytes(*two), (std::vector<int64_t>{120, 100}));
  auto split = partitionModel(graph, 2, "0:0-2,1:3");
  ASSERT_TRUE(bool(split)) << llvm::toString(split.takeError());
  EXPECT_EQ(stageParamBytes(*split), (std::vector<int64_t>{150 - 8, 70}));
  // The first reader in the stage keeps the bytes; the graph is unchanged.
  EXPECT_EQ(split->stages[0].regions[1].paramBytes, 20);
  EXPECT_EQ(split->stages[0].regions[2].paramBytes, 22);
  EXPECT_EQ(graph.regions[2].paramBytes, 30);
}

std::string errorOf(const ModelGraph &graph, int k, llvm::StringRef spec) {
  auto staged = partitionModel(graph, k, spec);
  if (staged)
    return "<no error>";
  return llvm::toString(staged.takeError());
}

TEST(Partition, Errors) {
  ModelGraph graph = chain({1, 2, 3, 4});
  EXPECT_NE(errorOf(graph, 5, "")
                .find("into 5 stages: it has only 4 "
                      "regions"),
            std::string::npos);
  EXPECT_NE(errorOf(graph, 0, "").find("expected a positive stage count"),
            std::string::npos);
  std::string err = errorOf(graph, 2, "0:0-1,1:2-x");
  EXPECT_NE(err.find("stage spec:1:7: expected a region index range"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("got '1:2-x'"), std::string::npos) << err;
  err = errorOf(graph, 2, "0-1,1:2-3");
  EXPECT_NE(err.find("stage spec:1:1: expected 'STAGE:FIRST-LAST', got "
                     "'0-1'"),
            std::string::npos)
      << err;
  err = errorOf(graph, 2, "0:0-2,1:2-3");
  EXPECT_NE(err.find("'1:2-3': region 2 ('r2') overlaps stage 0"),
            std::string::npos)
      << err;
  err = errorOf(graph, 2, "0:0-1,1:3-3");
  EXPECT_NE(err.find("region 2 ('r2') is in no stage"), std::string::npos)
      << err;
  err = errorOf(graph, 3, "0:0-1,2:2-3");
  EXPECT_NE(err.find("stage 1 has no regions"), std::string::npos) << err;
  err = errorOf(graph, 2, "0:0-1,1:2-9");
  EXPECT_NE(err.find("region index 9 is out of range"), std::string::npos)
      << err;
  err = errorOf(graph, 2, "0:2-3,1:0-1");
  EXPECT_NE(err.find("stages must take regions in order"), std::string::npos)
      << err;
  err = errorOf(graph, 2, "0:3-1,1:0-0");
  EXPECT_NE(err.find("FIRST <= LAST"), std::string::npos) << err;
  graph.regions[3].stage = 5;
  err = errorOf(graph, 2, "");
  EXPECT_NE(err.find("fixed to stage 5 but the pipeline has 2"),
            std::string::npos)
      << err;
  graph.regions[3].stage = 0;
  graph.regions[0].stage = 1;
  err = errorOf(graph, 2, "");
  EXPECT_NE(err.find("leaves no contiguous split"), std::string::npos) << err;
  graph.regions[0].stage = -1;
  err = errorOf(graph, 2, "0:0-2,1:3");
  EXPECT_NE(err.find("fixed to stage 0 by the model"), std::string::npos)
      << err;
}

/// A Hugging Face causal LM's regions as `costs --module` names them: the
/// code before the layers, the layers, the code after (final norm and head).
ModelGraph causalLm() {
  ModelGraph graph;
  graph.name = "LlamaForCausalLM";
  for (const char *name :
       {"model", "model.layers.0", "model.layers.1", "model.layers.2",
        "model.layers.3", "model+lm_head"}) {
    Region region;
    region.name = name;
    region.fwdFlops = 1;
    graph.regions.push_back(region);
  }
  return graph;
}

std::vector<std::vector<std::string>> namesOf(const StagedModel &staged) {
  std::vector<std::vector<std::string>> names;
  for (const Stage &stage : staged.stages) {
    names.emplace_back();
    for (const Region &region : stage.regions)
      names.back().push_back(region.name);
  }
  return names;
}

TEST(Partition, ModulePathsPerStage) {
  // torchtitan's split lists module FQNs per stage; the most specific path a
  // region is in decides, and a segment between modules is named whole or
  // by modules that all go to one stage.
  ModelGraph graph = causalLm();
  auto staged = partitionModel(
      graph, 0,
      "0:model,model.layers.0;1:model.layers.1,model.layers.2;2:model.layers."
      "3,model+lm_head");
  ASSERT_TRUE(static_cast<bool>(staged)) << llvm::toString(staged.takeError());
  std::vector<std::vector<std::string>> want = {
      {"model", "model.layers.0"},
      {"model.layers.1", "model.layers.2"},
      {"model.layers.3", "model+lm_head"}};
  EXPECT_EQ(namesOf(*staged), want);
  // torchtitan's layout: the head segment by its modules.
  ModelGraph titan = chain({1, 1, 1, 1});
  titan.regions[0].name = "tok_embeddings";
  titan.regions[1].name = "layers.0";
  titan.regions[2].name = "layers.1";
  titan.regions[3].name = "norm+output";
  staged = partitionModel(titan, 2,
                          "0:tok_embeddings,layers.0;1:layers.1,norm,output");
  ASSERT_TRUE(static_cast<bool>(staged)) << llvm::toString(staged.takeError());
  want = {{"tok_embeddings", "layers.0"}, {"layers.1", "norm+output"}};
  EXPECT_EQ(namesOf(*staged), want);
}

TEST(Partition, ModulePathErrors) {
  ModelGraph graph = causalLm();
  std::string err = errorOf(graph, 0, "0:model;1:lm_head,nothing");
  EXPECT_NE(err.find("stage spec:1:9: '1:lm_head,nothing': 'nothing' names no "
                     "region of model 'LlamaForCausalLM'"),
            std::string::npos)
      << err;
  err = errorOf(graph, 0, "0:model.layers;1:lm_head");
  EXPECT_NE(err.find("region 0 ('model') is in no stage"), std::string::npos)
      << err;
  err = errorOf(graph, 0, "0:model;1:lm_head");
  EXPECT_NE(err.find("region 5 ('model+lm_head') is code between modules "
                     "that 'model' puts in stage 0 and 'lm_head' in stage 1"),
            std::string::npos)
      << err;
  err = errorOf(graph, 0,
                "0:model,model.layers.2;1:model.layers.1,model+lm_head");
  EXPECT_NE(err.find("stages must take regions in order"), std::string::npos)
      << err;
  err = errorOf(graph, 0, "0:model;0:lm_head");
  EXPECT_NE(err.find("stage 0 is listed twice"), std::string::npos) << err;
  err = errorOf(graph, 0, "0:model;1:");
  EXPECT_NE(err.find("expected 'STAGE:MODULE[,MODULE...]'"), std::string::npos)
      << err;
  err = errorOf(graph, 3, "0:model;1:model+lm_head");
  EXPECT_NE(err.find("stage 2 has no regions"), std::string::npos) << err;
}

} // namespace
