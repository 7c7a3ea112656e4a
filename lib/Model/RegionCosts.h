//===- RegionCosts.h - Regions and per-op cost rules ------------*- C++ -*-===//
//
// Private to lib/Model. The importers (TorchScript, torch.export) describe
// every executed op with the facts of hpr/Model/OpCosts.h, which hold no
// LibTorch type; buildRegions splits those ops into regions (segmentOps) and
// applies one rule table (FLOPs; what autograd saves per op) to both
// importers alike.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_LIB_MODEL_REGIONCOSTS_H
#define HPR_LIB_MODEL_REGIONCOSTS_H

#include "hpr/Model/Model.h"
#include "hpr/Model/OpCosts.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace mlir::hpr::model::detail {

/// Whether a tensor of \p sizes and \p strides can be reshaped to \p shape
/// without a copy (the rule of ATen's computeStride).
bool isViewable(llvm::ArrayRef<int64_t> sizes, llvm::ArrayRef<int64_t> strides,
                llvm::ArrayRef<int64_t> shape);

/// How the regions of an op list are formed and timed.
struct RegionOptions {
  int regionDepth = 1; ///< see TorchScriptOptions::regionDepth
  /// Measures the forward time (us) of the ops at the given indices; when
  /// set, each region's fwdTimeUs is what it returns.
  llvm::function_ref<double(llvm::ArrayRef<size_t>)> timeOps;
};

/// The region a module call stack belongs to at \p depth, or "" (outside).
std::string regionOf(const std::vector<std::string> &chain, int depth);

/// The error for a region's module called again (at \p where): a region is
/// one call of one module, named by its path, which is what the runtime
/// checkpoints; calls of one module cannot be told apart as regions.
llvm::Error repeatedRegionCall(llvm::StringRef where, llvm::StringRef region);

/// Splits \p ops into regions (segmentOps, hpr/Model/Segments.h) and applies
/// the cost rules. \p params holds the storages of parameters and buffers,
/// which count as param_bytes, never as saved or input bytes. Ops without a
/// rule become one warning per op kind, naming the op and its region; the
/// errors are segmentOps' (a region's module called again, no regions).
llvm::Expected<ModelGraph> buildRegions(const std::string &file,
                                        const std::vector<OpFacts> &ops,
                                        const std::set<uint64_t> &params,
                                        const RegionOptions &options,
                                        std::vector<std::string> &warnings);

} // namespace mlir::hpr::model::detail

#endif // HPR_LIB_MODEL_REGIONCOSTS_H
