//===- Segments.h - Regions of an executed op list --------------*- C++ -*-===//
//
// The region rules (docs/models.md, "Region rules"): which executed ops form
// which region, and how code outside every region is named. One function,
// segmentOps, applies them; the TorchScript and torch.export importers call
// it before pricing the regions, and the Python exporter calls it through
// hp_recompute._planner with the module call stack it observed per op, so
// the exporter's regions are the importers' by construction.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_MODEL_SEGMENTS_H
#define HPR_MODEL_SEGMENTS_H

#include "hpr/Model/OpCosts.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

#include <string>
#include <vector>

namespace mlir::hpr::model {

/// One region (checkpointable, named by its module path) or one run of code
/// outside regions (named after the top-level submodules it calls).
struct Segment {
  std::string name;
  bool checkpointable = true;
  std::vector<size_t> ops; ///< indices into the op list, in order
};

/// Splits \p ops into segments. The regions are the module calls at region
/// depth \p regionDepth or, when \p regionPaths is not empty, the calls of
/// exactly those module paths (the outermost one on an op's stack; the depth
/// is then not used). Of each op only `kind` (a view opens no segment of its
/// own outside modules), `chain`, `repeatedCalls` and `where` are read.
/// Errors: a region's module called again (a `repeatedCalls` entry, or a
/// second run after other code), naming the op's `where`; no region at all,
/// naming \p file and the submodules called; a path of \p regionPaths named
/// twice, inside another one, or running no op.
llvm::Expected<std::vector<Segment>>
segmentOps(llvm::StringRef file, llvm::ArrayRef<OpFacts> ops, int regionDepth,
           llvm::ArrayRef<std::string> regionPaths = {});

} // namespace mlir::hpr::model

#endif // HPR_MODEL_SEGMENTS_H
