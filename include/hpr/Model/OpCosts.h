//===- OpCosts.h - Per-op cost rules: the one op table ----------*- C++ -*-===//
//
// The facts every cost rule reads about one executed op (shapes, strides,
// element sizes, which storage a tensor lives in, whether it requires grad;
// no LibTorch type), and the op table's public queries: what an op is called
// (canonicalOpKind), whether it only views its input (isViewOp) and its
// forward FLOPs (opFlops). The importers (TorchScript, torch.export) and the
// Python exporter (through hp_recompute._planner) all ask this one table;
// lib/Model/RegionCosts.cpp holds it, with the saved-bytes rules and the
// region rules the importers apply on top (docs/models.md).
//
//===----------------------------------------------------------------------===//

#ifndef HPR_MODEL_OPCOSTS_H
#define HPR_MODEL_OPCOSTS_H

#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mlir::hpr::model {

/// What the cost rules need to know about one tensor.
struct TensorFacts {
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  int64_t elementSize = 4;
  bool requiresGrad = false;
  uint64_t storage = 0;     ///< identifies the storage; 0 = none
  int64_t storageBytes = 0; ///< bytes of the whole storage

  int64_t dim() const { return int64_t(sizes.size()); }
  /// Size of dimension \p d; negative counts from the end, as in PyTorch.
  int64_t size(int64_t d) const { return sizes[d < 0 ? d + dim() : d]; }
  int64_t numel() const;
  int64_t nbytes() const { return numel() * elementSize; }
  bool isContiguous() const;
};

/// One argument or result of an op: a tensor, a list of tensors, a scalar or
/// an int list. Tensors nested in other containers land in `tensors` too.
struct OpArg {
  enum class Kind { None, Tensor, TensorList, Int, Double, Bool, IntList };
  Kind kind = Kind::None;
  std::vector<TensorFacts> tensors;
  int64_t intValue = 0;
  double doubleValue = 0;
  bool boolValue = false;
  std::vector<int64_t> ints;
};

/// One executed op, in program order.
struct OpFacts {
  std::string kind;               ///< canonicalOpKind, e.g. "aten::linear"
  std::string where;              ///< location for messages
  std::vector<std::string> chain; ///< module call stack, outermost first
  /// The entries of `chain` whose call is not that module's first.
  std::vector<std::string> repeatedCalls;
  std::vector<OpArg> inputs;
  std::vector<OpArg> outputs;

  /// The tensor input \p i, or null when it is not a (defined) tensor.
  const TensorFacts *input(size_t i) const;
  /// The first result when it is a tensor, else null.
  const TensorFacts *output() const;
};

/// The name the op table knows the op \p name by, "ns::op". Every spelling
/// of an op is accepted: TorchScript's "aten::mm", torch.export's target
/// "torch.ops.aten.mm.default", the dispatcher's overload "aten.mm.default"
/// and overload packet "aten.mm". A kernel the dispatcher runs for an op
/// with the same arguments is named by that op ("aten._softmax.default" ->
/// "aten::softmax", "aten.native_layer_norm.default" -> "aten::layer_norm"),
/// so that the exporter, which sees kernels, and the importers, which see
/// ops, price them by one rule. Anything else is returned unchanged.
std::string canonicalOpKind(llvm::StringRef name);

/// Whether \p kind (a canonicalOpKind, e.g. "aten::reshape") only views or
/// describes its input: no FLOPs, nothing saved, and outside regions it
/// opens no region of its own.
bool isViewOp(llvm::StringRef kind);

/// The forward FLOPs of \p op (a multiply-add counts 2; docs/models.md,
/// "FLOP rules"), or nullopt when no rule covers its kind.
std::optional<double> opFlops(const OpFacts &op);

} // namespace mlir::hpr::model

#endif // HPR_MODEL_OPCOSTS_H
