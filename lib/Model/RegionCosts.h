//===- RegionCosts.h - Regions and per-op cost rules ------------*- C++ -*-===//
//
// Private to lib/Model. The importers (TorchScript, torch.export) describe
// every executed op with the facts below, which hold no LibTorch type: shapes,
// strides, element sizes, which storage a tensor lives in and whether it
// requires grad. buildRegions splits those ops into regions and applies one
// rule table (FLOPs; what autograd saves per op) to both importers alike.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_LIB_MODEL_REGIONCOSTS_H
#define HPR_LIB_MODEL_REGIONCOSTS_H

#include "hpr/Model/Model.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace mlir::hpr::model::detail {

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

/// Whether a tensor of \p sizes and \p strides can be reshaped to \p shape
/// without a copy (the rule of ATen's computeStride).
bool isViewable(llvm::ArrayRef<int64_t> sizes, llvm::ArrayRef<int64_t> strides,
                llvm::ArrayRef<int64_t> shape);

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
  std::string kind;               ///< e.g. "aten::linear"
  std::string where;              ///< location for messages
  std::vector<std::string> chain; ///< module call stack, outermost first
  std::vector<OpArg> inputs;
  std::vector<OpArg> outputs;

  /// The tensor input \p i, or null when it is not a (defined) tensor.
  const TensorFacts *input(size_t i) const;
  /// The first result when it is a tensor, else null.
  const TensorFacts *output() const;
};

/// How the regions of an op list are formed and timed.
struct RegionOptions {
  int regionDepth = 1; ///< see TorchScriptOptions::regionDepth
  /// Measures the forward time (us) of the ops at the given indices; when
  /// set, each region's fwdTimeUs is what it returns.
  llvm::function_ref<double(llvm::ArrayRef<size_t>)> timeOps;
};

/// Whether \p kind (e.g. "aten::reshape") only views or describes its input.
bool isViewOp(llvm::StringRef kind);

/// The region a module call stack belongs to at \p depth, or "" (outside).
std::string regionOf(const std::vector<std::string> &chain, int depth);

/// The error for a region's module called again (at \p where): a region is
/// one call of one module, named by its path, which is what the runtime
/// checkpoints; calls of one module cannot be told apart as regions.
llvm::Error repeatedRegionCall(llvm::StringRef where, llvm::StringRef region);

/// Splits \p ops into regions (docs/models.md, "Region rules") and applies
/// the cost rules. \p params holds the storages of parameters and buffers,
/// which count as param_bytes, never as saved or input bytes. Ops without a
/// rule become one warning per op kind, naming the op and its region. A
/// region's module called again after other code is an error.
llvm::Expected<ModelGraph> buildRegions(const std::string &file,
                                        const std::vector<OpFacts> &ops,
                                        const std::set<uint64_t> &params,
                                        const RegionOptions &options,
                                        std::vector<std::string> &warnings);

} // namespace mlir::hpr::model::detail

#endif // HPR_LIB_MODEL_REGIONCOSTS_H
