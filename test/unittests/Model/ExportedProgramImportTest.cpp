//===- ExportedProgramImportTest.cpp - torch.export (.pt2) import ---------===//
//
// The program reader on hand-written serialized programs (values derived by
// hand from the rules in docs/models.md), its errors, and the view rule it
// uses for reshape, checked against cases torch itself decided
// (`Tensor.view` succeeds or raises).
//
//===----------------------------------------------------------------------===//

#include "RegionCosts.h"

#include "hpr/Model/ExportedProgramImport.h"

#include "gtest/gtest.h"

#include <nlohmann/json.hpp>

#include <cstdint>

using namespace mlir::hpr::model;
using nlohmann::json;

namespace {

json tensor(std::vector<int64_t> sizes, int dtype = 7,
            bool requiresGrad = false) {
  json t = {{"dtype", dtype},
            {"requires_grad", requiresGrad},
            {"sizes", json::array()},
            {"strides", json::array()}};
  int64_t stride = 1;
  std::vector<int64_t> strides(sizes.size());
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= sizes[d];
  }
  for (size_t d = 0; d < sizes.size(); ++d) {
    t["sizes"].push_back({{"as_int", sizes[d]}});
    t["strides"].push_back({{"as_int", strides[d]}});
  }
  return t;
}

json ref(const char *name) { return {{"as_tensor", {{"name", name}}}}; }

json node(const char *target, std::vector<json> args, const char *out,
          const char *stack) {
  json n = {{"target", target},
            {"name", out},
            {"inputs", json::array()},
            {"outputs", json::array({ref(out)})},
            {"metadata", {{"nn_module_stack", stack}}}};
  for (json &arg : args)
    n["inputs"].push_back({{"name", "a"}, {"arg", arg}});
  return n;
}

/// y = layers.0.fc(x); z = relu(y) in layers.0; loss = sum(z) outside.
json program() {
  const char *inBlock = "L__self__,,M;L__self__layers.0,layers.0,Block;"
                        "L__self__layers.0.fc,layers.0.fc,Linear";
  json graph = {{"tensor_values",
                 {{"x", tensor({2, 4})},
                  {"w", tensor({3, 4}, 7, true)},
                  {"y", tensor({2, 3})},
                  {"z", tensor({2, 3})},
                  {"loss", tensor({})}}},
                {"nodes",
                 {node("torch.ops.aten.linear.default", {ref("x"), ref("w")},
                       "y", inBlock),
                  node("torch.ops.aten.relu.default", {ref("y")}, "z",
                       "L__self__,,M;L__self__layers.0,layers.0,Block"),
                  node("torch.ops.aten.sum.default", {ref("z")}, "loss",
                       "L__self__,,M")}}};
  json signature = {
      {"input_specs",
       {{{"parameter",
          {{"arg", {{"name", "w"}}}, {"parameter_name", "layers.0.fc.w"}}}},
        {{"user_input", {{"arg", ref("x")}}}}}}};
  return {{"schema_version", {{"major", 8}, {"minor", 20}}},
          {"graph_module", {{"graph", graph}, {"signature", signature}}}};
}

std::string errorOf(const json &p) {
  std::vector<std::string> warnings;
  auto graph = importExportedProgramJson(p.dump(), "p.json", 1, warnings);
  if (graph)
    return "<no error>";
  return llvm::toString(graph.takeError());
}

TEST(ExportedProgramImport, RegionsAndCostsFollowTheRules) {
  std::vector<std::string> warnings;
  auto graph =
      importExportedProgramJson(program().dump(), "p.json", 1, warnings);
  ASSERT_TRUE(bool(graph)) << llvm::toString(graph.takeError());
  EXPECT_TRUE(warnings.empty());
  ASSERT_EQ(graph->regions.size(), 2u);
  const Region &block = graph->regions[0];
  EXPECT_EQ(block.name, "layers.0");
  EXPECT_TRUE(block.checkpointable);
  // linear: 2 * numel(y) * K = 2 * 6 * 4; relu: 6 (one per element).
  EXPECT_EQ(block.fwdFlops, 48 + 6);
  // linear saves x (w needs grad; x does not, so w is not saved); relu saves
  // its output z, which requires grad through w.
  EXPECT_EQ(block.savedBytes, 2 * 4 * 4 + 2 * 3 * 4);
  EXPECT_EQ(block.inputBytes, 2 * 4 * 4);
  EXPECT_EQ(block.paramBytes, 3 * 4 * 4);
  const Region &tail = graph->regions[1];
  EXPECT_EQ(tail.name, "top");
  EXPECT_FALSE(tail.checkpointable);
  EXPECT_EQ(tail.inputBytes, 2 * 3 * 4); // z, made by layers.0
}

TEST(ExportedProgramImport, UnknownOpIsAWarningNamingOpAndRegion) {
  json p = program();
  p["graph_module"]["graph"]["nodes"][1]["target"] =
      "torch.ops.aten.hardswish.default";
  std::vector<std::string> warnings;
  auto graph = importExportedProgramJson(p.dump(), "p.json", 1, warnings);
  ASSERT_TRUE(bool(graph));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("p.json: node 'z' "
                             "(torch.ops.aten.hardswish.default): warning: no "
                             "cost rule for 'aten::hardswish' (in region "
                             "'layers.0')"),
            std::string::npos)
      << warnings[0];
}

TEST(ExportedProgramImport, Errors) {
  json p = program();
  p["schema_version"]["major"] = 3;
  EXPECT_NE(errorOf(p).find("p.json: /schema_version: schema version 3.20 is "
                            "not supported"),
            std::string::npos);
  p = program();
  p["graph_module"]["graph"]["nodes"][0]["inputs"][0]["arg"] = ref("nope");
  EXPECT_NE(errorOf(p).find("p.json: node 'y' "
                            "(torch.ops.aten.linear.default): tensor 'nope' "
                            "is used before it is defined"),
            std::string::npos)
      << errorOf(p);
  p = program();
  p["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0] = {
      {"as_expr", {{"expr_str", "s0"}}}};
  EXPECT_NE(errorOf(p).find("p.json: tensor 'x': symbolic size 's0' has no "
                            "example value (hint)"),
            std::string::npos)
      << errorOf(p);
  // With a hint, the example size is used.
  p["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0] = {
      {"as_expr", {{"expr_str", "s0"}, {"hint", {{"as_int", 2}}}}}};
  EXPECT_EQ(errorOf(p), "<no error>");
  // Sizes whose element count or byte span overflows int64 are refused.
  p = program();
  p["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][0] = {
      {"as_int", int64_t(1) << 62}};
  EXPECT_NE(errorOf(p).find("p.json: tensor 'x': its sizes and strides reach "
                            "more than 2^50 bytes"),
            std::string::npos)
      << errorOf(p);
  p = program();
  p["graph_module"]["graph"]["tensor_values"]["x"]["strides"][0] = {
      {"as_int", INT64_MIN}};
  EXPECT_NE(errorOf(p).find("its sizes and strides reach more than 2^50"),
            std::string::npos)
      << errorOf(p);
  p = program();
  p["graph_module"]["graph"]["tensor_values"]["x"]["dtype"] = 77;
  EXPECT_NE(errorOf(p).find("p.json: tensor 'x': unknown dtype 77"),
            std::string::npos);
  p = program();
  p["graph_module"]["graph"]["nodes"] = json::array();
  EXPECT_NE(errorOf(p).find("the program calls no op"), std::string::npos);
  p = program();
  p["graph_module"]["graph"]["nodes"][0]["outputs"] = 5;
  EXPECT_NE(errorOf(p).find("expected arrays 'inputs' and 'outputs'"),
            std::string::npos);
  EXPECT_NE(errorOf(json::array())
                .find("expected a serialized "
                      "ExportedProgram object"),
            std::string::npos);
}

TEST(ExportedProgramImport, MissingArchive) {
  std::vector<std::string> warnings;
  auto graph = importExportedProgram("/nonexistent/m.pt2", 1, warnings);
  ASSERT_FALSE(bool(graph));
  EXPECT_NE(llvm::toString(graph.takeError())
                .find("/nonexistent/m.pt2: cannot read: "),
            std::string::npos);
}

// Each case as torch decided it: torch.empty(N).as_strided(sizes,
// strides).view(shape) succeeds or raises.
TEST(RegionCosts, ViewRuleMatchesTorch) {
  using mlir::hpr::model::detail::isViewable;
  EXPECT_TRUE(isViewable({2, 3, 4}, {12, 4, 1}, {6, 4}));
  EXPECT_FALSE(isViewable({2, 3}, {1, 2}, {6}));
  EXPECT_TRUE(isViewable({4, 2, 3}, {0, 3, 1}, {4, 6}));
  EXPECT_FALSE(isViewable({4, 2, 3}, {0, 3, 1}, {24}));
  EXPECT_TRUE(isViewable({4, 40, 4, 12}, {1920, 48, 12, 1}, {4, 40, 48}));
  EXPECT_FALSE(isViewable({4, 4, 40, 12}, {1920, 12, 48, 1}, {4, 160, 12}));
  EXPECT_FALSE(isViewable({4, 40, 4, 12}, {1920, 12, 480, 1}, {4, 40, 48}));
  EXPECT_TRUE(isViewable({1, 5}, {99, 1}, {5}));
  EXPECT_TRUE(isViewable({3, 1, 2}, {2, 7, 1}, {6}));
}

} // namespace
