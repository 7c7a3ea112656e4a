//===- TorchScriptImport.h - Import TorchScript models -----------*- C++
//-*-===//
//
// Builds a ModelGraph from a TorchScript archive (`.pt`, torch.jit.save) or
// TorchScript IR text (`.ir`): regions are submodule calls named by module
// path, costs come from shape propagation and a per-op rule table
// (docs/models.md). This header has no LibTorch includes on purpose.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_MODEL_TORCHSCRIPTIMPORT_H
#define HPR_MODEL_TORCHSCRIPTIMPORT_H

#include "hpr/Model/Model.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mlir::hpr::model {

/// How to import a TorchScript model.
struct TorchScriptOptions {
  /// Which submodule calls are regions: elements of repeated containers
  /// (ModuleList/Sequential) nested this many containers deep; 0 = every
  /// direct submodule call of the top module (docs/models.md).
  int regionDepth = 1;
  /// One shape per forward input; empty = take them from the sidecar JSON
  /// (or, for `.ir`, from the graph's input types).
  std::vector<std::vector<int64_t>> inputShapes;
  /// Element type of the inputs: one name for all (`float32`, `int64`, ...)
  /// or a comma-separated list, one per input.
  std::string inputDtype = "float32";
  /// Run each region with LibTorch and record the median fwd_time_us.
  bool profile = false;
};

/// Parses `4x40x48,4x40` into {{4,40,48},{4,40}}. Messages name the column:
/// `--input-shape:1:4: expected a positive integer, got 'x3'`.
llvm::Expected<std::vector<std::vector<int64_t>>>
parseShapeList(llvm::StringRef text);

/// Parses a dtype list (see TorchScriptOptions::inputDtype) for \p numInputs
/// inputs; names are PyTorch's (`float32`/`float`, `float16`/`half`,
/// `bfloat16`, `float64`/`double`, `int64`/`long`, `int32`/`int`, `bool`...).
llvm::Expected<std::vector<std::string>> parseDtypeList(llvm::StringRef text,
                                                        size_t numInputs);

/// Imports a `.pt` archive or `.ir` IR text. Warnings (ops without a cost
/// rule, with their location) are appended to \p warnings when given, else
/// printed to stderr.
llvm::Expected<ModelGraph>
importTorchScript(llvm::StringRef path, const TorchScriptOptions &options,
                  std::vector<std::string> *warnings = nullptr);

} // namespace mlir::hpr::model

#endif // HPR_MODEL_TORCHSCRIPTIMPORT_H
