//===- RegionCosts.cpp - Regions and per-op cost rules --------------------===//
//
// The op table (hpr/Model/OpCosts.h: names, views, FLOPs), and the region
// rules on top of it: splits the executed ops into regions (docs/models.md,
// "Region rules") and sums their costs: FLOPs from the table, saved bytes from
// a table of what autograd saves per op (PyTorch's derivatives.yaml),
// deduplicated by tensor storage, parameters and buffers excluded. Shared by
// the TorchScript and the torch.export importers, and (names, views, FLOPs,
// the segmentation of segmentOps) by the Python exporter through
// hp_recompute._planner; nothing here depends on LibTorch.
//
//===----------------------------------------------------------------------===//

#include "RegionCosts.h"

#include "hpr/Model/Segments.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <map>
#include <set>

using namespace mlir::hpr::model;
using namespace mlir::hpr::model::detail;

namespace {

//===----------------------------------------------------------------------===//
// Op classes
//===----------------------------------------------------------------------===//

/// Views and metadata: no FLOPs, nothing saved, and outside regions they do
/// not open a region of their own.
const llvm::StringSet<> kViews = {
    "aten::view",           "aten::_unsafe_view",
    "aten::reshape",        "aten::t",
    "aten::transpose",      "aten::permute",
    "aten::expand",         "aten::expand_as",
    "aten::slice",          "aten::select",
    "aten::split",          "aten::split_with_sizes",
    "aten::chunk",          "aten::unsqueeze",
    "aten::squeeze",        "aten::detach",
    "aten::alias",          "aten::as_strided",
    "aten::flatten",        "aten::unbind",
    "aten::view_as",        "aten::reshape_as",
    "aten::size",           "aten::dim",
    "aten::numel",          "aten::Int",
    "aten::Float",          "aten::ScalarImplicit",
    "aten::__getitem__",    "aten::len",
    "aten::format",         "aten::warn",
    "aten::__is__",         "aten::__isnot__",
    "aten::device",         "aten::is_floating_point",
    "aten::_reshape_alias", "aten::view_as_complex",
    "aten::view_as_real",   "aten::_assert_tensor_metadata"};

/// Data movement and creation: no FLOPs, nothing saved. No arithmetic on
/// data: filling with a constant (`full_like`, as `full`) or with random
/// numbers (`bernoulli_`: the mask CPU's dropout draws, see kDropouts), a
/// dtype change (`to`, `type_as`, `_to_copy`), and reading one element
/// (`_local_scalar_dense`: `.item()`).
const llvm::StringSet<> kZeroFlop = {"aten::clone",
                                     "aten::contiguous",
                                     "aten::copy_",
                                     "aten::empty",
                                     "aten::empty_like",
                                     "aten::zeros",
                                     "aten::zeros_like",
                                     "aten::ones",
                                     "aten::ones_like",
                                     "aten::full",
                                     "aten::full_like",
                                     "aten::arange",
                                     "aten::embedding",
                                     "aten::cat",
                                     "aten::stack",
                                     "aten::to",
                                     "aten::type_as",
                                     "aten::tril",
                                     "aten::triu",
                                     "aten::eq",
                                     "aten::ne",
                                     "aten::lt",
                                     "aten::le",
                                     "aten::gt",
                                     "aten::ge",
                                     "aten::new_zeros",
                                     "aten::new_empty",
                                     "aten::fill_",
                                     "aten::zero_",
                                     "aten::scalar_tensor",
                                     "aten::index_select",
                                     "aten::gather",
                                     "aten::detach_",
                                     "aten::lift_fresh",
                                     "aten::lift_fresh_copy",
                                     "aten::_to_copy",
                                     "aten::empty_strided",
                                     "aten::new_ones",
                                     "aten::new_full",
                                     "aten::bernoulli",
                                     "aten::bernoulli_",
                                     "aten::rand",
                                     "aten::randn",
                                     "aten::rand_like",
                                     "aten::randn_like",
                                     "aten::_local_scalar_dense"};

/// Dropout in training: one multiply by the mask and one by the scale
/// 1 / (1 - p) per element, 2 FLOPs (docs/models.md). CPU runs it as
/// bernoulli_ (0) on a new mask, div_ of the mask and a mul, CUDA as one
/// native_dropout kernel: 2 per element either way. In eval, 0.
const llvm::StringSet<> kDropouts = {"aten::dropout", "aten::feature_dropout"};

/// Reductions: one FLOP per input element.
const llvm::StringSet<> kReductions = {
    "aten::sum",         "aten::mean",       "aten::amax",     "aten::amin",
    "aten::max",         "aten::min",        "aten::norm",     "aten::var",
    "aten::std",         "aten::logsumexp",  "aten::prod",     "aten::nll_loss",
    "aten::nll_loss_nd", "aten::nll_loss2d", "aten::mse_loss", "aten::all",
    "aten::any"};

/// Element-wise and normalization ops, and scans (`cumsum`: one add per
/// element; Hugging Face's causal masks run it): one FLOP per output element.
const llvm::StringSet<> kElementwise = {"aten::polar",
                                        "aten::cumsum",
                                        "aten::cumprod",
                                        "aten::add",
                                        "aten::add_",
                                        "aten::sub",
                                        "aten::sub_",
                                        "aten::rsub",
                                        "aten::mul",
                                        "aten::mul_",
                                        "aten::div",
                                        "aten::div_",
                                        "aten::neg",
                                        "aten::relu",
                                        "aten::relu_",
                                        "aten::gelu",
                                        "aten::silu",
                                        "aten::sigmoid",
                                        "aten::tanh",
                                        "aten::exp",
                                        "aten::log",
                                        "aten::sqrt",
                                        "aten::rsqrt",
                                        "aten::pow",
                                        "aten::square",
                                        "aten::abs",
                                        "aten::sin",
                                        "aten::cos",
                                        "aten::softmax",
                                        "aten::log_softmax",
                                        "aten::layer_norm",
                                        "aten::batch_norm",
                                        "aten::group_norm",
                                        "aten::native_group_norm",
                                        "aten::masked_fill",
                                        "aten::masked_fill_",
                                        "aten::where",
                                        "aten::max_pool2d",
                                        "aten::max_pool1d",
                                        "aten::avg_pool2d",
                                        "aten::adaptive_avg_pool2d",
                                        "aten::hardtanh",
                                        "aten::leaky_relu",
                                        "aten::clamp",
                                        "aten::clamp_min",
                                        "aten::erf",
                                        "aten::reciprocal",
                                        "aten::floor_divide",
                                        "aten::remainder",
                                        "aten::fmod"};

const llvm::StringSet<> kMatmuls = {
    "aten::matmul",  "aten::mm",     "aten::bmm", "aten::addmm",
    "aten::baddbmm", "aten::linear", "aten::mv",  "aten::dot"};

bool isConv(llvm::StringRef kind) {
  return kind == "aten::conv1d" || kind == "aten::conv2d" ||
         kind == "aten::conv3d" || kind == "aten::convolution" ||
         kind == "aten::_convolution";
}

/// Kernels the dispatcher runs for an op, with the op's arguments in the
/// op's order (the first ones at least, which the rules read), named by that
/// op: the exporter sees the kernel, the importers the op. native_group_norm
/// takes its groups elsewhere and keeps its own name.
const llvm::StringMap<llvm::StringRef> kKernelOps = {
    {"_softmax", "softmax"},
    {"_log_softmax", "log_softmax"},
    {"native_layer_norm", "layer_norm"},
    {"native_batch_norm", "batch_norm"},
    {"_native_batch_norm_legit", "batch_norm"},
    {"_native_batch_norm_legit_no_training", "batch_norm"},
    {"native_dropout", "dropout"},
    {"max_pool2d_with_indices", "max_pool2d"},
    {"_adaptive_avg_pool2d", "adaptive_avg_pool2d"},
    {"nll_loss_forward", "nll_loss"},
    {"nll_loss2d_forward", "nll_loss2d"},
    {"mkldnn_convolution", "convolution"},
    {"_scaled_dot_product_flash_attention", "scaled_dot_product_attention"},
    {"_scaled_dot_product_flash_attention_for_cpu",
     "scaled_dot_product_attention"},
    {"_scaled_dot_product_efficient_attention", "scaled_dot_product_attention"},
    {"_scaled_dot_product_cudnn_attention", "scaled_dot_product_attention"}};

bool needsGrad(const TensorFacts *t) { return t && t->requiresGrad; }

} // namespace

//===----------------------------------------------------------------------===//
// FLOPs
//===----------------------------------------------------------------------===//

std::optional<double> mlir::hpr::model::opFlops(const OpFacts &op) {
  llvm::StringRef kind = op.kind;
  const TensorFacts *out = op.output();
  auto arg = [&](size_t i, OpArg::Kind kind) -> const OpArg * {
    return i < op.inputs.size() && op.inputs[i].kind == kind ? &op.inputs[i]
                                                             : nullptr;
  };
  if (kViews.contains(kind) || kZeroFlop.contains(kind))
    return 0;
  if (kDropouts.contains(kind)) {
    const OpArg *p = arg(1, OpArg::Kind::Double);
    const OpArg *train = arg(2, OpArg::Kind::Bool);
    bool active = p && p->doubleValue > 0 && train && train->boolValue;
    return active && out ? 2.0 * double(out->numel()) : 0;
  }
  if (kMatmuls.contains(kind)) {
    // 2 * (output elements) * (contracted length); the contracted length is
    // the last dim of the first matrix operand.
    size_t a = (kind == "aten::addmm" || kind == "aten::baddbmm") ? 1 : 0;
    const TensorFacts *lhs = op.input(a);
    if (!lhs || !out || lhs->dim() == 0)
      return std::nullopt;
    return 2.0 * double(out->numel()) * double(lhs->size(-1));
  }
  if (isConv(kind)) {
    const TensorFacts *weight = op.input(1);
    if (!weight || !out || weight->dim() == 0 || weight->size(0) == 0)
      return std::nullopt;
    // Each output element is a dot product over Cin/groups * prod(kernel).
    return 2.0 * double(out->numel()) *
           double(weight->numel() / weight->size(0));
  }
  if (kind == "aten::scaled_dot_product_attention") {
    // q @ k^T and attention @ v, as torch.utils.flop_counter counts them
    // (a causal mask does not halve the count).
    const TensorFacts *q = op.input(0), *k = op.input(1);
    if (!q || !k || !out || k->dim() < 2)
      return std::nullopt;
    double s = double(k->size(-2));
    return 2.0 * double(q->numel()) * s + 2.0 * double(out->numel()) * s;
  }
  if (kind == "aten::cross_entropy_loss") {
    const TensorFacts *in = op.input(0);
    if (!in)
      return std::nullopt;
    return 2.0 * double(in->numel()); // log_softmax + nll_loss
  }
  if (kReductions.contains(kind)) {
    const TensorFacts *in = op.input(0);
    if (!in)
      return std::nullopt;
    return double(in->numel());
  }
  if (kElementwise.contains(kind))
    return out ? double(out->numel()) : 0;
  return std::nullopt;
}

namespace {

//===----------------------------------------------------------------------===//
// Saved tensors
//===----------------------------------------------------------------------===//

/// What one op makes autograd keep: tensors of the graph (deduplicated by
/// storage later) and bytes of op-internal buffers (always new storages).
struct Saved {
  std::vector<TensorFacts> tensors;
  int64_t extraBytes = 0;
  bool known = true;
};

/// aten::matmul as ATen lowers it (LinearAlgebra.cpp): 1-D/2-D cases call
/// dot/mv/mm on views; a >=3-D lhs with a <=2-D rhs folds the lhs batch into
/// rows (a contiguous copy if needed); otherwise both operands are broadcast
/// and reshaped to 3-D for bmm (reshape copies non-viewable ones). An operand
/// is saved as it is when the kernel receives a view of it, else the copy's
/// bytes count.
void saveMatmul(Saved &saved, const TensorFacts &a, const TensorFacts &b) {
  bool keepA = b.requiresGrad, keepB = a.requiresGrad;
  int64_t da = a.dim(), db = b.dim();
  auto saveFolded = [&](const TensorFacts &t, bool isView) {
    if (isView)
      saved.tensors.push_back(t);
    else
      saved.extraBytes += t.nbytes();
  };
  if (da <= 2 && db <= 2) {
    if (keepA)
      saved.tensors.push_back(a);
    if (keepB)
      saved.tensors.push_back(b);
    return;
  }
  if (da >= 3 && db <= 2) {
    if (keepA)
      saveFolded(a, a.isContiguous());
    if (keepB)
      saved.tensors.push_back(b);
    return;
  }
  // Broadcast the batch dims, then reshape to [batch, n, m]; broadcast dims
  // have stride 0, which reshape can fold only where sizes allow a view.
  auto batchOf = [](const TensorFacts &t) {
    return std::vector<int64_t>(t.sizes.begin(),
                                t.sizes.end() - std::min<int64_t>(t.dim(), 2));
  };
  std::vector<int64_t> batchA = batchOf(a), batchB = batchOf(b);
  size_t rank = std::max(batchA.size(), batchB.size());
  std::vector<int64_t> batch(rank, 1);
  for (size_t i = 0; i < rank; ++i) {
    auto at = [&](const std::vector<int64_t> &v) -> int64_t {
      size_t off = rank - v.size();
      return i < off ? 1 : v[i - off];
    };
    batch[i] = std::max(at(batchA), at(batchB));
  }
  auto folds = [&](const TensorFacts &t, bool isLhs) {
    // The operand as a matrix stack: a 1-D lhs is a row, a 1-D rhs a column.
    std::vector<int64_t> sizes = t.sizes, strides = t.strides;
    if (t.dim() == 1) {
      sizes.insert(isLhs ? sizes.begin() : sizes.end(), 1);
      strides.insert(isLhs ? strides.begin() : strides.end(), 1);
    }
    int64_t rows = sizes[sizes.size() - 2], cols = sizes.back();
    std::vector<int64_t> expSizes = batch, expStrides(batch.size(), 0);
    size_t own = sizes.size() - 2, off = batch.size() - own;
    for (size_t i = 0; i < own; ++i)
      if (sizes[i] == batch[off + i])
        expStrides[off + i] = strides[i];
    expSizes.push_back(rows);
    expSizes.push_back(cols);
    expStrides.push_back(strides[strides.size() - 2]);
    expStrides.push_back(strides.back());
    int64_t stack = 1;
    for (int64_t s : batch)
      stack *= s;
    return isViewable(expSizes, expStrides, {stack, rows, cols});
  };
  if (keepA)
    saveFolded(a, folds(a, /*isLhs=*/true));
  if (keepB)
    saveFolded(b, folds(b, /*isLhs=*/false));
}

Saved opSaved(const OpFacts &op) {
  Saved saved;
  llvm::StringRef kind = op.kind;
  auto in = [&](size_t i) { return op.input(i); };
  const TensorFacts *out = op.output();
  auto keep = [&](const TensorFacts *t) {
    if (t)
      saved.tensors.push_back(*t);
  };
  auto arg = [&](size_t i, OpArg::Kind kind) -> const OpArg * {
    return i < op.inputs.size() && op.inputs[i].kind == kind ? &op.inputs[i]
                                                             : nullptr;
  };
  // Float32 statistics per normalized group (mean and rstd / invstd).
  auto stats = [&](int64_t groups) { saved.extraBytes += 2 * groups * 4; };
  if (kDropouts.contains(kind)) {
    const OpArg *p = arg(1, OpArg::Kind::Double);
    const OpArg *train = arg(2, OpArg::Kind::Bool);
    if (out && p && p->doubleValue > 0 && train && train->boolValue &&
        out->requiresGrad)
      saved.extraBytes += out->numel(); // a bool mask (fused kernel)
    return saved;
  }
  if (kViews.contains(kind) || kZeroFlop.contains(kind)) {
    if (kind == "aten::embedding" && needsGrad(in(0)))
      keep(in(1)); // the indices
    if ((kind == "aten::index_select" || kind == "aten::gather") &&
        needsGrad(in(0)))
      keep(in(2));
    return saved;
  }
  if (kind == "aten::linear") {
    const TensorFacts *x = in(0), *w = in(1);
    if (x && w) {
      if (needsGrad(w)) {
        // 2-D goes straight to addmm; N-D is folded to rows (a view when
        // contiguous, else a contiguous copy).
        if (x->dim() <= 2 || x->isContiguous())
          keep(x);
        else
          saved.extraBytes += x->nbytes();
      }
      if (needsGrad(x))
        keep(w);
    }
    return saved;
  }
  if (kind == "aten::matmul") {
    if (in(0) && in(1))
      saveMatmul(saved, *in(0), *in(1));
    return saved;
  }
  if (kind == "aten::mm" || kind == "aten::bmm" || kind == "aten::mv" ||
      kind == "aten::dot" || kind == "aten::addmm" || kind == "aten::baddbmm") {
    size_t a = (kind == "aten::addmm" || kind == "aten::baddbmm") ? 1 : 0;
    if (needsGrad(in(a + 1)))
      keep(in(a));
    if (needsGrad(in(a)))
      keep(in(a + 1));
    return saved;
  }
  if (isConv(kind)) {
    if (needsGrad(in(1)))
      keep(in(0));
    if (needsGrad(in(0)))
      keep(in(1));
    return saved;
  }
  if (out && !out->requiresGrad)
    return saved; // nothing to differentiate: autograd records nothing
  if (kind == "aten::relu" || kind == "aten::relu_" ||
      kind == "aten::sigmoid" || kind == "aten::tanh" || kind == "aten::exp" ||
      kind == "aten::sqrt" || kind == "aten::rsqrt" ||
      kind == "aten::softmax" || kind == "aten::log_softmax" ||
      kind == "aten::reciprocal") {
    keep(out); // these backward formulas use the result
    return saved;
  }
  if (kind == "aten::gelu" || kind == "aten::silu" || kind == "aten::log" ||
      kind == "aten::sin" || kind == "aten::cos" || kind == "aten::abs" ||
      kind == "aten::pow" || kind == "aten::square" ||
      kind == "aten::hardtanh" || kind == "aten::leaky_relu" ||
      kind == "aten::erf" || kind == "aten::clamp" ||
      kind == "aten::clamp_min" || kind == "aten::avg_pool2d") {
    keep(in(0)); // these use the input
    return saved;
  }
  if (kind == "aten::adaptive_avg_pool2d") {
    if (out && out->dim() >= 2 && !(out->size(-1) == 1 && out->size(-2) == 1))
      keep(in(0)); // a 1x1 output is computed by mean(), which saves nothing
    return saved;
  }
  if (kind == "aten::max_pool2d" || kind == "aten::max_pool1d") {
    keep(in(0));
    if (out)
      saved.extraBytes += out->numel() * 8; // int64 argmax indices
    return saved;
  }
  if (kind == "aten::layer_norm") {
    const TensorFacts *x = in(0);
    if (const OpArg *shape = arg(1, OpArg::Kind::IntList); x && shape) {
      int64_t norm = 1;
      for (int64_t d : shape->ints)
        norm *= d;
      keep(x);
      stats(norm ? x->numel() / norm : 0);
    }
    return saved;
  }
  if (kind == "aten::batch_norm") {
    const TensorFacts *x = in(0);
    keep(x);
    const OpArg *training = arg(5, OpArg::Kind::Bool);
    if (x && x->dim() >= 2 && training && training->boolValue)
      stats(x->size(1)); // save_mean / save_invstd per channel
    return saved;
  }
  if (kind == "aten::group_norm" || kind == "aten::native_group_norm") {
    const TensorFacts *x = in(0);
    keep(x);
    // group_norm(input, num_groups, ...); native_group_norm(input, weight,
    // bias, N, C, HxW, group, eps).
    const OpArg *groups =
        arg(kind == "aten::group_norm" ? 1 : 6, OpArg::Kind::Int);
    if (x && groups)
      stats(x->size(0) * groups->intValue);
    return saved;
  }
  if (kind == "aten::mul" || kind == "aten::mul_") {
    const TensorFacts *a = in(0), *b = in(1);
    if (a && b) {
      if (needsGrad(a))
        keep(b);
      if (needsGrad(b))
        keep(a);
    }
    return saved;
  }
  if (kind == "aten::div" || kind == "aten::div_") {
    const TensorFacts *a = in(0), *b = in(1);
    if (a && b) {
      if (needsGrad(a) || needsGrad(b))
        keep(b);
      if (needsGrad(b))
        keep(a);
    }
    return saved;
  }
  if (kind == "aten::masked_fill" || kind == "aten::masked_fill_") {
    keep(in(1)); // the mask
    return saved;
  }
  if (kind == "aten::where") {
    keep(in(0)); // the condition
    return saved;
  }
  if (kind == "aten::cross_entropy_loss") {
    // log_softmax keeps its result (new, input-sized); nll_loss keeps that,
    // the target and a scalar total_weight.
    if (const TensorFacts *x = in(0))
      saved.extraBytes += x->nbytes() + 4;
    keep(in(1));
    return saved;
  }
  if (kind == "aten::nll_loss" || kind == "aten::nll_loss_nd" ||
      kind == "aten::nll_loss2d") {
    keep(in(0));
    keep(in(1));
    saved.extraBytes += 4;
    return saved;
  }
  if (kind == "aten::scaled_dot_product_attention") {
    // The flash kernels (CUDA, and CPU's _for_cpu) keep q, k, v, the output
    // and a float32 logsumexp per query row.
    keep(in(0));
    keep(in(1));
    keep(in(2));
    keep(out);
    if (const TensorFacts *q = in(0); q && q->dim() >= 1 && q->size(-1))
      saved.extraBytes += (q->numel() / q->size(-1)) * 4;
    return saved;
  }
  if (kElementwise.contains(kind) || kReductions.contains(kind))
    return saved; // add, sub, neg, sum, mean, ...: nothing kept
  saved.known = false;
  return saved;
}

//===----------------------------------------------------------------------===//
// Segments
//===----------------------------------------------------------------------===//

bool isIndex(llvm::StringRef part) {
  return !part.empty() &&
         llvm::all_of(part, [](char c) { return c >= '0' && c <= '9'; });
}

} // namespace

int64_t TensorFacts::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes)
    n *= s;
  return n;
}

bool TensorFacts::isContiguous() const {
  int64_t expected = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] == 1)
      continue; // any stride is fine for a size-1 dim
    if (d < strides.size() && strides[d] != expected)
      return numel() == 0;
    expected *= sizes[d];
  }
  return true;
}

bool mlir::hpr::model::detail::isViewable(llvm::ArrayRef<int64_t> sizes,
                                          llvm::ArrayRef<int64_t> strides,
                                          llvm::ArrayRef<int64_t> shape) {
  if (sizes.empty())
    return true;
  int64_t numel = 1;
  for (int64_t s : sizes)
    numel *= s;
  if (numel == 0)
    return true;
  // Walk the old dims from the innermost, in chunks of dims that are
  // contiguous with each other; each chunk must be covered exactly by a run
  // of new dims.
  int64_t viewD = int64_t(shape.size()) - 1;
  int64_t chunkBaseStride = strides.back();
  int64_t tensorNumel = 1, viewNumel = 1;
  for (int64_t d = int64_t(sizes.size()) - 1; d >= 0; --d) {
    tensorNumel *= sizes[d];
    bool chunkEnds =
        d == 0 ||
        (sizes[d - 1] != 1 && strides[d - 1] != tensorNumel * chunkBaseStride);
    if (!chunkEnds)
      continue;
    while (viewD >= 0 && (viewNumel < tensorNumel || shape[viewD] == 1))
      viewNumel *= shape[viewD--];
    if (viewNumel != tensorNumel)
      return false;
    if (d > 0) {
      chunkBaseStride = strides[d - 1];
      tensorNumel = 1;
      viewNumel = 1;
    }
  }
  return viewD == -1;
}

const TensorFacts *OpFacts::input(size_t i) const {
  return i < inputs.size() && inputs[i].kind == OpArg::Kind::Tensor
             ? &inputs[i].tensors.front()
             : nullptr;
}

const TensorFacts *OpFacts::output() const {
  return !outputs.empty() && outputs[0].kind == OpArg::Kind::Tensor
             ? &outputs[0].tensors.front()
             : nullptr;
}

bool mlir::hpr::model::isViewOp(llvm::StringRef kind) {
  return kViews.contains(kind);
}

std::string mlir::hpr::model::canonicalOpKind(llvm::StringRef name) {
  llvm::StringRef ns, op;
  if (name.contains("::")) {
    std::tie(ns, op) = name.split("::");
  } else {
    // torch.ops.aten.mm.default, aten.mm.default, aten.mm
    llvm::StringRef qualified = name;
    qualified.consume_front("torch.ops.");
    llvm::SmallVector<llvm::StringRef> parts;
    qualified.split(parts, '.');
    if (parts.size() < 2 || parts[0].empty() || parts[1].empty())
      return name.str();
    ns = parts[0];
    op = parts[1];
  }
  if (ns == "aten")
    if (auto it = kKernelOps.find(op); it != kKernelOps.end())
      op = it->second;
  return (ns + "::" + op).str();
}

std::string
mlir::hpr::model::detail::regionOf(const std::vector<std::string> &chain,
                                   int depth) {
  if (depth == 0)
    return chain.empty() ? "" : chain.front();
  for (const std::string &path : chain) {
    llvm::SmallVector<llvm::StringRef> parts;
    llvm::StringRef(path).split(parts, '.');
    int indices = llvm::count_if(parts, isIndex);
    if (isIndex(parts.back()) && indices == depth)
      return path;
  }
  return "";
}

llvm::Error
mlir::hpr::model::detail::repeatedRegionCall(llvm::StringRef where,
                                             llvm::StringRef region) {
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      llvm::formatv("{0}: module '{1}' is called more than once, and a region "
                    "is one call of one module (regions are named by module "
                    "path, which the runtime checkpoints); call each element "
                    "of the ModuleList/Sequential once, or choose a "
                    "--region-depth whose modules are called once",
                    where, region)
          .str());
}

/// Refuses a list of chosen region paths that cannot all be regions: a path
/// twice, or one inside another (a region is one module's call).
static llvm::Error checkRegionPaths(llvm::StringRef file,
                                    llvm::ArrayRef<std::string> paths) {
  for (auto [i, path] : llvm::enumerate(paths))
    for (const std::string &other : paths.take_front(i)) {
      if (path == other)
        return llvm::createStringError(
            llvm::inconvertibleErrorCode(),
            llvm::formatv("{0}: region '{1}' is named twice", file, path)
                .str());
      llvm::StringRef inner = path, outer = other;
      if (llvm::StringRef(other).starts_with(path + "."))
        std::swap(inner, outer);
      if (inner.starts_with((outer + ".").str()))
        return llvm::createStringError(
            llvm::inconvertibleErrorCode(),
            llvm::formatv("{0}: region '{1}' is inside region '{2}'; a region "
                          "is one module's call, choose one of the two",
                          file, inner, outer)
                .str());
    }
  return llvm::Error::success();
}

llvm::Expected<std::vector<Segment>>
mlir::hpr::model::segmentOps(llvm::StringRef file, llvm::ArrayRef<OpFacts> ops,
                             int regionDepth,
                             llvm::ArrayRef<std::string> regionPaths) {
  if (llvm::Error error = checkRegionPaths(file, regionPaths))
    return error;
  auto regionFor = [&](const std::vector<std::string> &chain) -> std::string {
    if (regionPaths.empty())
      return regionOf(chain, regionDepth);
    for (const std::string &path : chain)
      if (llvm::is_contained(regionPaths, path))
        return path;
    return "";
  };
  std::vector<Segment> segments;
  std::vector<std::vector<std::string>> callees; // per segment
  std::set<std::string> opened; // names of the checkpointable segments
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpFacts &op = ops[i];
    std::string region = regionFor(op.chain);
    if (region.empty() && kViews.contains(op.kind) && op.chain.empty() &&
        !segments.empty()) {
      segments.back().ops.push_back(i); // a bare view opens nothing
      continue;
    }
    if (!region.empty()) {
      if (llvm::is_contained(op.repeatedCalls, region))
        return repeatedRegionCall(op.where, region);
      if (segments.empty() || !segments.back().checkpointable ||
          segments.back().name != region) {
        if (!opened.insert(region).second)
          return repeatedRegionCall(op.where, region);
        segments.push_back(Segment{region, true, {}});
        callees.emplace_back();
      }
    } else if (segments.empty() || segments.back().checkpointable) {
      segments.push_back(Segment{"", false, {}});
      callees.emplace_back();
    }
    Segment &seg = segments.back();
    seg.ops.push_back(i);
    if (!seg.checkpointable && !op.chain.empty() &&
        !llvm::is_contained(callees.back(), op.chain.front()))
      callees.back().push_back(op.chain.front());
  }
  for (const std::string &path : regionPaths)
    if (!opened.count(path))
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          llvm::formatv("{0}: module '{1}' runs no op in the forward, so it "
                        "is no region (a region is the ops one module call "
                        "runs); leave it out",
                        file, path)
              .str());
  if (llvm::none_of(segments,
                    [](const Segment &s) { return s.checkpointable; })) {
    std::set<std::string> seen;
    for (const OpFacts &op : ops)
      for (const std::string &path : op.chain)
        seen.insert(path);
    std::string list;
    for (const std::string &path : seen)
      list += (list.empty() ? "" : ", ") + path;
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        llvm::formatv("{0}: no regions at region depth {1}: the model calls "
                      "no element of a ModuleList/Sequential that deep "
                      "(submodule calls: {2})",
                      file, regionDepth, list.empty() ? "none" : list)
            .str());
  }
  // Name outside code after the top-level submodules it calls.
  std::set<std::string> used;
  for (const Segment &seg : segments)
    if (seg.checkpointable)
      used.insert(seg.name);
  for (auto [seg, called] : llvm::zip(segments, callees)) {
    if (seg.checkpointable)
      continue;
    std::string base;
    for (const std::string &callee : called)
      base += (base.empty() ? "" : "+") + callee;
    if (base.empty())
      base = "top";
    std::string name = base;
    for (int k = 2; used.count(name); ++k)
      name = base + "." + std::to_string(k);
    seg.name = name;
    used.insert(name);
  }
  return segments;
}

llvm::Expected<ModelGraph> mlir::hpr::model::detail::buildRegions(
    const std::string &file, const std::vector<OpFacts> &ops,
    const std::set<uint64_t> &params, const RegionOptions &options,
    std::vector<std::string> &warnings) {
  // 1. Segment the ops (segmentOps, which the Python exporter calls too).
  auto segmented = segmentOps(file, ops, options.regionDepth);
  if (!segmented)
    return segmented.takeError();
  const std::vector<Segment> &segments = *segmented;

  // 2. Costs.
  std::map<uint64_t, size_t> producer; // storage -> segment
  std::set<std::string> warned;
  ModelGraph graph;
  for (size_t s = 0; s < segments.size(); ++s) {
    const Segment &seg = segments[s];
    Region region;
    region.name = seg.name;
    region.checkpointable = seg.checkpointable;
    std::map<uint64_t, int64_t> saved, inputs, paramBytes;
    for (size_t index : seg.ops) {
      const OpFacts &op = ops[index];
      std::optional<double> flops = opFlops(op);
      Saved kept = opSaved(op);
      if (!flops || !kept.known) {
        if (warned.insert(op.kind).second)
          warnings.push_back(llvm::formatv(
              "{0}: warning: no cost rule for '{1}' (in region '{2}'); "
              "counted as 0 FLOPs and 0 saved bytes",
              op.where, op.kind, seg.name));
      }
      region.fwdFlops += flops.value_or(0);
      region.savedBytes += kept.extraBytes;
      for (const TensorFacts &t : kept.tensors)
        if (t.storage && !params.count(t.storage))
          saved[t.storage] = t.storageBytes;
      for (const OpArg &arg : op.inputs)
        for (const TensorFacts &t : arg.tensors) {
          if (!t.storage)
            continue;
          if (params.count(t.storage))
            paramBytes[t.storage] = t.storageBytes;
          else if (auto it = producer.find(t.storage);
                   it == producer.end() || it->second != s)
            inputs[t.storage] = t.storageBytes;
        }
      for (const OpArg &out : op.outputs)
        for (const TensorFacts &t : out.tensors)
          if (t.storage)
            producer.emplace(t.storage, s);
    }
    for (auto &[key, bytes] : saved)
      region.savedBytes += bytes;
    for (auto &[key, bytes] : inputs)
      region.inputBytes += bytes;
    for (auto &[key, bytes] : paramBytes)
      region.paramBytes += bytes;
    if (options.timeOps)
      region.fwdTimeUs = options.timeOps(seg.ops);
    graph.regions.push_back(std::move(region));
  }
  return graph;
}
