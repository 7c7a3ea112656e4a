//===- OpCostsTest.cpp - The op table: names, views, FLOPs ---------------===//
//
// The importers see ops (aten::linear, aten::dropout), the exporter sees the
// kernels the dispatcher runs for them (aten.addmm.default, and on CPU
// bernoulli_ + div_ + mul for a dropout); one table prices both, so an op
// and the kernels it dispatches to must cost the same.
//
//===----------------------------------------------------------------------===//

#include "hpr/Model/OpCosts.h"

#include <gtest/gtest.h>

using namespace mlir::hpr::model;

namespace {

TensorFacts tensorFacts(std::vector<int64_t> sizes) {
  TensorFacts t;
  t.sizes = sizes;
  int64_t stride = 1;
  t.strides.resize(sizes.size());
  for (size_t d = sizes.size(); d-- > 0;) {
    t.strides[d] = stride;
    stride *= sizes[d];
  }
  return t;
}

OpArg tensorArg(std::vector<int64_t> sizes) {
  OpArg arg;
  arg.kind = OpArg::Kind::Tensor;
  arg.tensors.push_back(tensorFacts(std::move(sizes)));
  return arg;
}
OpArg doubleArg(double value) {
  OpArg arg;
  arg.kind = OpArg::Kind::Double;
  arg.doubleValue = value;
  return arg;
}
OpArg boolArg(bool value) {
  OpArg arg;
  arg.kind = OpArg::Kind::Bool;
  arg.boolValue = value;
  return arg;
}

/// The FLOPs of op `name` (any spelling), or -1 where no rule covers it.
double flops(const std::string &name, std::vector<OpArg> inputs,
             std::vector<OpArg> outputs) {
  OpFacts op;
  op.kind = canonicalOpKind(name);
  op.inputs = std::move(inputs);
  op.outputs = std::move(outputs);
  return opFlops(op).value_or(-1);
}

TEST(OpCosts, EverySpellingOfAnOpIsOneKind) {
  for (const char *name :
       {"aten::mm", "aten.mm.default", "aten.mm", "torch.ops.aten.mm.default"})
    EXPECT_EQ(canonicalOpKind(name), "aten::mm") << name;
  EXPECT_EQ(canonicalOpKind("aten.add.Tensor"), "aten::add");
  EXPECT_EQ(canonicalOpKind("prim::GetAttr"), "prim::GetAttr");
  EXPECT_EQ(canonicalOpKind("mylib.custom.default"), "mylib::custom");
  EXPECT_EQ(canonicalOpKind("<built-in function getitem>"),
            "<built-in function getitem>");
}

TEST(OpCosts, KernelsAreNamedByTheirOp) {
  EXPECT_EQ(canonicalOpKind("aten._softmax.default"), "aten::softmax");
  EXPECT_EQ(canonicalOpKind("aten::_log_softmax"), "aten::log_softmax");
  EXPECT_EQ(canonicalOpKind("aten.native_layer_norm.default"),
            "aten::layer_norm");
  EXPECT_EQ(canonicalOpKind("aten.native_dropout.default"), "aten::dropout");
  EXPECT_EQ(canonicalOpKind(
                "aten._scaled_dot_product_flash_attention_for_cpu.default"),
            "aten::scaled_dot_product_attention");
  // Not a kernel of group_norm's argument order: keeps its name.
  EXPECT_EQ(canonicalOpKind("aten.native_group_norm.default"),
            "aten::native_group_norm");
}

TEST(OpCosts, ViewsAreDispatchedViewsToo) {
  EXPECT_TRUE(isViewOp(canonicalOpKind("aten._reshape_alias.default")));
  EXPECT_TRUE(isViewOp(canonicalOpKind("aten.t.default")));
  EXPECT_TRUE(isViewOp("aten::view"));
  EXPECT_FALSE(isViewOp("aten::clone"));
  EXPECT_FALSE(isViewOp("aten::mm"));
}

TEST(OpCosts, LinearCostsWhatItsAddmmCosts) {
  // x [4, 8, 16] @ W^T [16, 32]: the dispatcher runs addmm on x as [32, 16].
  double linear =
      flops("aten::linear",
            {tensorArg({4, 8, 16}), tensorArg({32, 16}), tensorArg({32})},
            {tensorArg({4, 8, 32})});
  double addmm =
      flops("aten.addmm.default",
            {tensorArg({32}), tensorArg({32, 16}), tensorArg({16, 32})},
            {tensorArg({32, 32})});
  EXPECT_DOUBLE_EQ(linear, 2.0 * 4 * 8 * 32 * 16);
  EXPECT_DOUBLE_EQ(addmm, linear);
}

TEST(OpCosts, CrossEntropyCostsItsTwoKernels) {
  double op = flops("aten::cross_entropy_loss",
                    {tensorArg({8, 10}), tensorArg({8})}, {tensorArg({})});
  double logSoftmax = flops("aten._log_softmax.default", {tensorArg({8, 10})},
                            {tensorArg({8, 10})});
  double nll = flops("aten.nll_loss_forward.default",
                     {tensorArg({8, 10}), tensorArg({8})},
                     {tensorArg({}), tensorArg({})});
  EXPECT_DOUBLE_EQ(op, 2.0 * 80);
  EXPECT_DOUBLE_EQ(logSoftmax + nll, op);
}

TEST(OpCosts, TrainingDropoutCostsTwoPerElementAsDispatchedOnCpuAndCuda) {
  std::vector<int64_t> x = {4, 8};
  double op =
      flops("aten::dropout", {tensorArg(x), doubleArg(0.1), boolArg(true)},
            {tensorArg(x)});
  EXPECT_DOUBLE_EQ(op, 2.0 * 32);
  // CUDA: one fused kernel.
  EXPECT_DOUBLE_EQ(flops("aten.native_dropout.default",
                         {tensorArg(x), doubleArg(0.1), boolArg(true)},
                         {tensorArg(x), tensorArg(x)}),
                   op);
  // CPU: a new mask filled by bernoulli_, scaled by div_, then a mul.
  double cpu =
      flops("aten.empty_like.default", {tensorArg(x)}, {tensorArg(x)}) +
      flops("aten.bernoulli_.float", {tensorArg(x), doubleArg(0.9)},
            {tensorArg(x)}) +
      flops("aten.div_.Scalar", {tensorArg(x), doubleArg(0.9)},
            {tensorArg(x)}) +
      flops("aten.mul.Tensor", {tensorArg(x), tensorArg(x)}, {tensorArg(x)});
  EXPECT_DOUBLE_EQ(cpu, op);
  // Eval, or p = 0: the identity.
  EXPECT_DOUBLE_EQ(flops("aten::dropout",
                         {tensorArg(x), doubleArg(0.1), boolArg(false)},
                         {tensorArg(x)}),
                   0);
  EXPECT_DOUBLE_EQ(flops("aten::dropout",
                         {tensorArg(x), doubleArg(0.0), boolArg(true)},
                         {tensorArg(x)}),
                   0);
}

TEST(OpCosts, CreationAndDtypeChangesCostNothing) {
  for (const char *name :
       {"aten::full_like", "aten.full_like.default", "aten::type_as",
        "aten._to_copy.default", "aten.lift_fresh_copy.default"})
    EXPECT_DOUBLE_EQ(flops(name, {tensorArg({4, 8})}, {tensorArg({4, 8})}), 0)
        << name;
}

TEST(OpCosts, AttentionKernelsCostWhatTheOpCosts) {
  // q [2, 4, 16, 8], k and v [2, 4, 12, 8]: two matmuls over S = 12.
  std::vector<OpArg> in = {tensorArg({2, 4, 16, 8}), tensorArg({2, 4, 12, 8}),
                           tensorArg({2, 4, 12, 8})};
  double op = flops("aten::scaled_dot_product_attention", in,
                    {tensorArg({2, 4, 16, 8})});
  EXPECT_DOUBLE_EQ(op, 2.0 * (2 * 4 * 16 * 8) * 12 * 2);
  for (const char *kernel :
       {"aten._scaled_dot_product_flash_attention_for_cpu.default",
        "aten._scaled_dot_product_efficient_attention.default"})
    EXPECT_DOUBLE_EQ(
        flops(kernel, in, {tensorArg({2, 4, 16, 8}), tensorArg({2, 4, 16})}),
        op)
        << kernel;
}

TEST(OpCosts, AnOpWithoutARuleHasNoFlops) {
  EXPECT_DOUBLE_EQ(
      flops("aten.logcumsumexp.default", {tensorArg({4})}, {tensorArg({4})}),
      -1);
  EXPECT_DOUBLE_EQ(flops("aten::mm", {}, {}), -1); // no operands to read
}

} // namespace
