//===- ExportedProgramImport.h - Import torch.export programs ---*- C++ -*-===//
//
// Builds a ModelGraph from an archive written by torch.export.save (`.pt2`).
// The archive's serialized program (the JSON of torch's export serde schema)
// gives every ATen op with its arguments, the shape, strides and dtype of
// every tensor and the module call stack (`nn_module_stack`) of every op;
// regions and costs follow from those with the rules the TorchScript
// importer uses (docs/models.md). No LibTorch is needed, and no weights are
// read.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_MODEL_EXPORTEDPROGRAMIMPORT_H
#define HPR_MODEL_EXPORTEDPROGRAMIMPORT_H

#include "hpr/Model/Model.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <string>
#include <vector>

namespace mlir::hpr::model {

/// Imports the `.pt2` archive \p path. \p regionDepth is as in
/// TorchScriptOptions. Warnings (ops without a cost rule) are appended to
/// \p warnings.
llvm::Expected<ModelGraph>
importExportedProgram(llvm::StringRef path, int regionDepth,
                      std::vector<std::string> &warnings);

/// Imports a serialized program (the archive's `models/model.json`) given as
/// text; messages name \p fileName.
llvm::Expected<ModelGraph>
importExportedProgramJson(llvm::StringRef json, llvm::StringRef fileName,
                          int regionDepth, std::vector<std::string> &warnings);

} // namespace mlir::hpr::model

#endif // HPR_MODEL_EXPORTEDPROGRAMIMPORT_H
