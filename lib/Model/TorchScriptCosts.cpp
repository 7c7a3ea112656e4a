//===- TorchScriptCosts.cpp - Regions and per-op cost rules ---------------===//
//
// Splits the executed ops into regions (docs/models.md, "Region rules") and
// sums their costs: FLOPs from a rule table, saved bytes from a table of what
// autograd saves per op (PyTorch's derivatives.yaml), deduplicated by tensor
// storage, parameters and buffers excluded.
//
//===----------------------------------------------------------------------===//

#include "TorchScriptInternal.h"

#include "llvm/ADT/StringSet.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

using namespace hpr::model;
using namespace hpr::model::detail;

namespace {

//===----------------------------------------------------------------------===//
// Op classes
//===----------------------------------------------------------------------===//

/// Views and metadata: no FLOPs, nothing saved, and outside regions they do
/// not open a region of their own.
const llvm::StringSet<> kViews = {
    "aten::view",        "aten::_unsafe_view",
    "aten::reshape",     "aten::t",
    "aten::transpose",   "aten::permute",
    "aten::expand",      "aten::expand_as",
    "aten::slice",       "aten::select",
    "aten::split",       "aten::split_with_sizes",
    "aten::chunk",       "aten::unsqueeze",
    "aten::squeeze",     "aten::detach",
    "aten::alias",       "aten::as_strided",
    "aten::flatten",     "aten::unbind",
    "aten::view_as",     "aten::reshape_as",
    "aten::size",        "aten::dim",
    "aten::numel",       "aten::Int",
    "aten::Float",       "aten::ScalarImplicit",
    "aten::__getitem__", "aten::len",
    "aten::format",      "aten::warn",
    "aten::__is__",      "aten::__isnot__",
    "aten::device",      "aten::is_floating_point"};

/// Data movement and creation: no FLOPs, nothing saved.
const llvm::StringSet<> kZeroFlop = {
    "aten::clone",        "aten::contiguous",
    "aten::copy_",        "aten::empty",
    "aten::empty_like",   "aten::zeros",
    "aten::zeros_like",   "aten::ones",
    "aten::ones_like",    "aten::full",
    "aten::full_like",    "aten::arange",
    "aten::embedding",    "aten::cat",
    "aten::stack",        "aten::to",
    "aten::type_as",      "aten::tril",
    "aten::triu",         "aten::eq",
    "aten::ne",           "aten::lt",
    "aten::le",           "aten::gt",
    "aten::ge",           "aten::new_zeros",
    "aten::new_empty",    "aten::fill_",
    "aten::zero_",        "aten::scalar_tensor",
    "aten::dropout",      "aten::feature_dropout",
    "aten::index_select", "aten::gather",
    "aten::detach_",      "aten::lift_fresh"};

/// Reductions: one FLOP per input element.
const llvm::StringSet<> kReductions = {
    "aten::sum",         "aten::mean",      "aten::amax", "aten::amin",
    "aten::max",         "aten::min",       "aten::norm", "aten::var",
    "aten::std",         "aten::logsumexp", "aten::prod", "aten::nll_loss",
    "aten::nll_loss_nd", "aten::mse_loss"};

/// Element-wise and normalization ops: one FLOP per output element.
const llvm::StringSet<> kElementwise = {"aten::add",
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

const at::Tensor *tensorAt(const std::vector<c10::IValue> &values, size_t i) {
  if (i < values.size() && values[i].isTensor() &&
      values[i].toTensor().defined())
    return &values[i].toTensor();
  return nullptr;
}

bool needsGrad(const at::Tensor *t) { return t && t->requires_grad(); }

//===----------------------------------------------------------------------===//
// FLOPs
//===----------------------------------------------------------------------===//

/// Returns the op's forward FLOPs, or -1 when no rule covers it.
double opFlops(const OpRecord &op) {
  llvm::StringRef kind = op.kind;
  const at::Tensor *out = tensorAt(op.outputs, 0);
  if (kViews.contains(kind) || kZeroFlop.contains(kind))
    return 0;
  if (kMatmuls.contains(kind)) {
    // 2 * (output elements) * (contracted length); the contracted length is
    // the last dim of the first matrix operand.
    size_t a = (kind == "aten::addmm" || kind == "aten::baddbmm") ? 1 : 0;
    const at::Tensor *lhs = tensorAt(op.inputs, a);
    if (!lhs || !out || lhs->dim() == 0)
      return -1;
    return 2.0 * double(out->numel()) * double(lhs->size(-1));
  }
  if (isConv(kind)) {
    const at::Tensor *weight = tensorAt(op.inputs, 1);
    if (!weight || !out || weight->size(0) == 0)
      return -1;
    // Each output element is a dot product over Cin/groups * prod(kernel).
    return 2.0 * double(out->numel()) *
           double(weight->numel() / weight->size(0));
  }
  if (kind == "aten::scaled_dot_product_attention") {
    const at::Tensor *q = tensorAt(op.inputs, 0), *k = tensorAt(op.inputs, 1);
    if (!q || !k || !out)
      return -1;
    double s = double(k->size(-2));
    return 2.0 * double(q->numel()) * s + 2.0 * double(out->numel()) * s;
  }
  if (kind == "aten::cross_entropy_loss") {
    const at::Tensor *in = tensorAt(op.inputs, 0);
    return in ? 2.0 * double(in->numel()) : -1; // log_softmax + nll_loss
  }
  if (kReductions.contains(kind)) {
    const at::Tensor *in = tensorAt(op.inputs, 0);
    return in ? double(in->numel()) : -1;
  }
  if (kElementwise.contains(kind))
    return out ? double(out->numel()) : 0;
  return -1;
}

//===----------------------------------------------------------------------===//
// Saved tensors
//===----------------------------------------------------------------------===//

/// What one op makes autograd keep: tensors of the graph (deduplicated by
/// storage later) and bytes of op-internal buffers (always new storages).
struct Saved {
  std::vector<at::Tensor> tensors;
  int64_t extraBytes = 0;
  bool known = true;
};

int64_t nbytes(const at::Tensor &t) {
  return int64_t(t.numel()) * int64_t(t.element_size());
}

bool sameStorage(const at::Tensor &a, const at::Tensor &b) {
  return a.has_storage() && b.has_storage() &&
         a.storage().unsafeGetStorageImpl() ==
             b.storage().unsafeGetStorageImpl();
}

/// Saves \p t as the operand of a matrix product: kept as is when \p
/// folded (what the kernel really receives) is a view of it, else the copy.
void saveOperand(Saved &saved, const at::Tensor &t, const at::Tensor &folded) {
  if (sameStorage(t, folded))
    saved.tensors.push_back(t);
  else
    saved.extraBytes += nbytes(folded);
}

/// aten::matmul as PyTorch 1.13 lowers it (LinearAlgebra.cpp): 1-D/2-D
/// cases call dot/mv/mm on views; a >=3-D lhs with a <=2-D rhs folds the lhs
/// batch into rows (contiguous copy if needed); otherwise both operands are
/// broadcast and reshaped to 3-D for bmm (reshape copies non-viewable ones).
void saveMatmul(Saved &saved, const at::Tensor &a, const at::Tensor &b) {
  at::NoGradGuard noGrad;
  bool keepA = b.requires_grad(), keepB = a.requires_grad();
  int64_t da = a.dim(), db = b.dim();
  if (da <= 2 && db <= 2) {
    if (keepA)
      saved.tensors.push_back(a);
    if (keepB)
      saved.tensors.push_back(b);
    return;
  }
  if (da >= 3 && db <= 2) {
    if (keepA)
      saveOperand(saved, a, a.contiguous());
    if (keepB)
      saved.tensors.push_back(b);
    return;
  }
  // Broadcast batch dims, then reshape to [batch, n, m].
  std::vector<int64_t> batchA(a.sizes().begin(),
                              a.sizes().end() - std::min<int64_t>(da, 2));
  std::vector<int64_t> batchB(b.sizes().begin(),
                              b.sizes().end() - std::min<int64_t>(db, 2));
  std::vector<int64_t> batch = at::infer_size(batchA, batchB);
  at::Tensor a2 = da == 1 ? a.unsqueeze(0) : a;
  at::Tensor b2 = db == 1 ? b.unsqueeze(-1) : b;
  std::vector<int64_t> sizeA = batch, sizeB = batch;
  sizeA.push_back(a2.size(-2));
  sizeA.push_back(a2.size(-1));
  sizeB.push_back(b2.size(-2));
  sizeB.push_back(b2.size(-1));
  at::Tensor foldA = a2.expand(sizeA).reshape({-1, a2.size(-2), a2.size(-1)});
  at::Tensor foldB = b2.expand(sizeB).reshape({-1, b2.size(-2), b2.size(-1)});
  if (keepA)
    saveOperand(saved, a, foldA);
  if (keepB)
    saveOperand(saved, b, foldB);
}

Saved opSaved(const OpRecord &op) {
  Saved saved;
  llvm::StringRef kind = op.kind;
  auto in = [&](size_t i) { return tensorAt(op.inputs, i); };
  const at::Tensor *out = tensorAt(op.outputs, 0);
  auto keep = [&](const at::Tensor *t) {
    if (t)
      saved.tensors.push_back(*t);
  };
  // Float32 statistics per normalized group (mean and rstd / invstd).
  auto stats = [&](int64_t groups) { saved.extraBytes += 2 * groups * 4; };
  if (kViews.contains(kind) || kZeroFlop.contains(kind)) {
    if ((kind == "aten::dropout" || kind == "aten::feature_dropout") && out &&
        op.inputs.size() >= 3 && op.inputs[1].isDouble() &&
        op.inputs[1].toDouble() > 0 && op.inputs[2].isBool() &&
        op.inputs[2].toBool() && out->requires_grad())
      saved.extraBytes += out->numel(); // a bool mask (fused kernel)
    if (kind == "aten::embedding" && needsGrad(in(0)))
      keep(in(1)); // the indices
    if ((kind == "aten::index_select" || kind == "aten::gather") &&
        needsGrad(in(0)))
      keep(in(2));
    return saved;
  }
  if (kind == "aten::linear") {
    const at::Tensor *x = in(0), *w = in(1);
    if (x && w) {
      if (needsGrad(w)) {
        // 2-D goes straight to addmm; N-D is folded to rows (a view when
        // contiguous, else a contiguous copy).
        if (x->dim() <= 2)
          keep(x);
        else
          saveOperand(saved, *x, x->contiguous());
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
  if (out && !out->requires_grad())
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
    if (out && !(out->size(-1) == 1 && out->size(-2) == 1))
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
    const at::Tensor *x = in(0);
    if (x && op.inputs[1].isIntList()) {
      int64_t norm = 1;
      for (int64_t d : op.inputs[1].toIntVector())
        norm *= d;
      keep(x);
      stats(norm ? x->numel() / norm : 0);
    }
    return saved;
  }
  if (kind == "aten::batch_norm") {
    const at::Tensor *x = in(0);
    keep(x);
    if (x && x->dim() >= 2 && op.inputs.size() > 5 && op.inputs[5].isBool() &&
        op.inputs[5].toBool())
      stats(x->size(1)); // save_mean / save_invstd per channel
    return saved;
  }
  if (kind == "aten::group_norm") {
    const at::Tensor *x = in(0);
    keep(x);
    if (x && op.inputs[1].isInt())
      stats(x->size(0) * op.inputs[1].toInt());
    return saved;
  }
  if (kind == "aten::mul" || kind == "aten::mul_") {
    const at::Tensor *a = in(0), *b = in(1);
    if (a && b) {
      if (needsGrad(a))
        keep(b);
      if (needsGrad(b))
        keep(a);
    }
    return saved;
  }
  if (kind == "aten::div" || kind == "aten::div_") {
    const at::Tensor *a = in(0), *b = in(1);
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
    if (const at::Tensor *x = in(0))
      saved.extraBytes += nbytes(*x) + 4;
    keep(in(1));
    return saved;
  }
  if (kind == "aten::nll_loss" || kind == "aten::nll_loss_nd") {
    keep(in(0));
    keep(in(1));
    saved.extraBytes += 4;
    return saved;
  }
  if (kind == "aten::scaled_dot_product_attention") {
    // Flash/efficient kernels keep q, k, v, the output and a float32
    // logsumexp per query row.
    keep(in(0));
    keep(in(1));
    keep(in(2));
    keep(out);
    if (const at::Tensor *q = in(0))
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

struct Segment {
  std::string name; // region name, or "" for outside code until named
  bool checkpointable = true;
  std::vector<size_t> ops;
  std::vector<std::string> callees;
};

bool isIndex(llvm::StringRef part) {
  return !part.empty() &&
         llvm::all_of(part, [](char c) { return c >= '0' && c <= '9'; });
}

} // namespace

std::string hpr::model::detail::regionOf(const std::vector<std::string> &chain,
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

llvm::Expected<ModelGraph> hpr::model::detail::buildRegions(
    const std::string &file, std::vector<OpRecord> &records,
    const ParamSet &params, const TorchScriptOptions &options,
    std::vector<std::string> &warnings) {
  // 1. Segment the ops (mirrors python/hp_recompute/export_measure.py).
  std::vector<Segment> segments;
  for (size_t i = 0; i < records.size(); ++i) {
    const OpRecord &op = records[i];
    std::string region = regionOf(op.chain, options.regionDepth);
    if (region.empty() && kViews.contains(op.kind) && op.chain.empty() &&
        !segments.empty()) {
      segments.back().ops.push_back(i); // a bare view opens nothing
      continue;
    }
    if (!region.empty()) {
      if (segments.empty() || !segments.back().checkpointable ||
          segments.back().name != region)
        segments.push_back(Segment{region, true, {}, {}});
    } else if (segments.empty() || segments.back().checkpointable) {
      segments.push_back(Segment{"", false, {}, {}});
    }
    Segment &seg = segments.back();
    seg.ops.push_back(i);
    if (!seg.checkpointable && !op.chain.empty() &&
        !llvm::is_contained(seg.callees, op.chain.front()))
      seg.callees.push_back(op.chain.front());
  }
  if (llvm::none_of(segments,
                    [](const Segment &s) { return s.checkpointable; })) {
    std::set<std::string> seen;
    for (const OpRecord &op : records)
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
                      file, options.regionDepth, list.empty() ? "none" : list)
            .str());
  }
  // Name outside code after the top-level submodules it calls.
  std::set<std::string> used;
  for (const Segment &seg : segments)
    if (seg.checkpointable)
      used.insert(seg.name);
  for (Segment &seg : segments) {
    if (seg.checkpointable)
      continue;
    std::string base;
    for (const std::string &callee : seg.callees)
      base += (base.empty() ? "" : "+") + callee;
    if (base.empty())
      base = "top";
    std::string name = base;
    for (int k = 2; used.count(name); ++k)
      name = base + "." + std::to_string(k);
    seg.name = name;
    used.insert(name);
  }

  // 2. Costs.
  std::unordered_map<const void *, size_t> producer; // storage -> segment
  std::set<std::string> warned;
  ModelGraph graph;
  for (size_t s = 0; s < segments.size(); ++s) {
    const Segment &seg = segments[s];
    Region region;
    region.name = seg.name;
    region.checkpointable = seg.checkpointable;
    std::map<const void *, int64_t> saved, inputs, paramBytes;
    for (size_t index : seg.ops) {
      const OpRecord &op = records[index];
      double flops = opFlops(op);
      Saved kept = opSaved(op);
      if (flops < 0 || !kept.known) {
        if (warned.insert(op.kind).second)
          warnings.push_back(llvm::formatv(
              "{0}: warning: no cost rule for '{1}' (in region '{2}'); "
              "counted as 0 FLOPs and 0 saved bytes",
              op.where, op.kind, seg.name));
        flops = std::max(flops, 0.0);
      }
      region.fwdFlops += flops;
      region.savedBytes += kept.extraBytes;
      for (const at::Tensor &t : kept.tensors)
        if (t.has_storage() && !params.contains(t))
          saved[t.storage().unsafeGetStorageImpl()] = t.storage().nbytes();
      auto visit = [&](const c10::IValue &value, auto &&self) -> void {
        if (value.isTensor()) {
          const at::Tensor &t = value.toTensor();
          if (!t.defined() || !t.has_storage())
            return;
          const void *key = t.storage().unsafeGetStorageImpl();
          if (params.contains(t))
            paramBytes[key] = t.storage().nbytes();
          else if (auto it = producer.find(key);
                   it == producer.end() || it->second != s)
            inputs[key] = t.storage().nbytes();
        } else if (value.isTensorList()) {
          for (const at::Tensor &t : value.toTensorVector())
            self(c10::IValue(t), self);
        } else if (value.isList()) {
          for (const c10::IValue &item : value.toListRef())
            self(item, self);
        } else if (value.isTuple()) {
          for (const c10::IValue &item : value.toTupleRef().elements())
            self(item, self);
        }
      };
      for (const c10::IValue &in : op.inputs)
        visit(in, visit);
      for (const c10::IValue &out : op.outputs)
        if (out.isTensor() && out.toTensor().defined() &&
            out.toTensor().has_storage())
          producer.emplace(out.toTensor().storage().unsafeGetStorageImpl(), s);
    }
    for (auto &[key, bytes] : saved)
      region.savedBytes += bytes;
    for (auto &[key, bytes] : inputs)
      region.inputBytes += bytes;
    for (auto &[key, bytes] : paramBytes)
      region.paramBytes += bytes;

    // 3. Profile: replay the region's ops, median of a few runs.
    if (options.profile) {
      std::vector<double> times;
      for (int run = 0; run < 6; ++run) {
        auto start = std::chrono::steady_clock::now();
        for (size_t index : seg.ops) {
          const OpRecord &op = records[index];
          torch::jit::Stack stack(op.inputs.begin(), op.inputs.end());
          op.node->getOperation()(stack);
        }
        auto end = std::chrono::steady_clock::now();
        if (run > 0) // the first run warms caches and allocators
          times.push_back(
              std::chrono::duration<double, std::micro>(end - start).count());
      }
      std::sort(times.begin(), times.end());
      region.fwdTimeUs = std::max(times[times.size() / 2], 1e-3);
    }
    graph.regions.push_back(std::move(region));
  }
  return graph;
}
