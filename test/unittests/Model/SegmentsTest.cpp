//===- SegmentsTest.cpp - Regions by depth and by chosen module paths ----===//
//
// segmentOps forms regions either by the depth rule or from module paths the
// user chose (python -m hp_recompute.costs --regions); both must name outside
// code alike and refuse what cannot be a region.
//
//===----------------------------------------------------------------------===//

#include "hpr/Model/Segments.h"

#include <gtest/gtest.h>

using namespace mlir::hpr::model;

namespace {

OpFacts op(std::vector<std::string> chain) {
  OpFacts facts;
  facts.kind = "aten::mm";
  facts.where = "op";
  facts.chain = std::move(chain);
  return facts;
}

/// (name, checkpointable, first op) per segment, or the error text.
std::string describe(llvm::Expected<std::vector<Segment>> segments) {
  if (!segments)
    return llvm::toString(segments.takeError());
  std::string text;
  for (const Segment &seg : *segments)
    text += seg.name + (seg.checkpointable ? "*" : "") + "@" +
            std::to_string(seg.ops.front()) + " ";
  return text;
}

/// embed; layers.0 (attn, mlp); layers.1 (attn, mlp); head.
std::vector<OpFacts> transformerOps() {
  return {op({"embed"}),
          op({"layers.0", "layers.0.attn"}),
          op({"layers.0", "layers.0.mlp"}),
          op({"layers.1", "layers.1.attn"}),
          op({"layers.1", "layers.1.mlp"}),
          op({"head"})};
}

TEST(Segments, DepthRuleTakesTheIndexedModules) {
  EXPECT_EQ(describe(segmentOps("m", transformerOps(), 1)),
            "embed@0 layers.0*@1 layers.1*@3 head@5 ");
}

TEST(Segments, ChosenPathsReplaceTheDepthRule) {
  // The sub-blocks of layer 0 and the whole of layer 1; layer 0's own code
  // outside its sub-blocks would be outside code, named after layers.0.
  EXPECT_EQ(describe(segmentOps(
                "m", transformerOps(), 1,
                {"layers.0.attn", "layers.0.mlp", "layers.1", "head"})),
            "embed@0 layers.0.attn*@1 layers.0.mlp*@2 layers.1*@3 head*@5 ");
}

TEST(Segments, ChosenPathWithoutAnIndexIsARegion) {
  std::vector<OpFacts> ops = {op({"a"}), op({}), op({"b"})};
  EXPECT_EQ(describe(segmentOps("m", ops, 1)),
            "m: no regions at region depth 1: the model calls no element of "
            "a ModuleList/Sequential that deep (submodule calls: a, b)");
  EXPECT_EQ(describe(segmentOps("m", ops, 1, {"a", "b"})), "a*@0 top@1 b*@2 ");
}

TEST(Segments, ChosenPathsThatCannotBeRegionsAreRefused) {
  EXPECT_EQ(
      describe(segmentOps("m", transformerOps(), 1, {"layers.1", "layers.1"})),
      "m: region 'layers.1' is named twice");
  EXPECT_EQ(describe(segmentOps("m", transformerOps(), 1,
                                {"layers.0.mlp", "layers.0"})),
            "m: region 'layers.0.mlp' is inside region 'layers.0'; a region "
            "is one module's call, choose one of the two");
  // A prefix that is no parent is no nesting.
  EXPECT_EQ(describe(segmentOps("m", {op({"layers.1"}), op({"layers.10"})}, 1,
                                {"layers.1", "layers.10"})),
            "layers.1*@0 layers.10*@1 ");
  EXPECT_EQ(
      describe(segmentOps("m", transformerOps(), 1, {"layers.0", "unused"})),
      "m: module 'unused' runs no op in the forward, so it is no region "
      "(a region is the ops one module call runs); leave it out");
}

TEST(Segments, ChosenRegionCalledTwiceIsRefused) {
  std::vector<OpFacts> ops = {op({"a"}), op({"b"}), op({"a"})};
  ops[2].where = "op 2";
  EXPECT_EQ(describe(segmentOps("m", ops, 1, {"a"})),
            "op 2: module 'a' is called more than once, and a region is one "
            "call of one module (regions are named by module path, which the "
            "runtime checkpoints); call each element of the "
            "ModuleList/Sequential once, or choose a --region-depth whose "
            "modules are called once");
}

} // namespace
