//===- ModelFile.h - Read a model file of any supported format -*- C++ -*-===//
//
// One entry point for the CLI: dispatches on the file extension to the
// torch.export importer (`.pt2`), the TorchScript importer (`.pt`, `.ir`) or
// the JSON graph reader (`.json`).
//
//===----------------------------------------------------------------------===//

#ifndef HPR_MODEL_MODELFILE_H
#define HPR_MODEL_MODELFILE_H

#include "hpr/Model/Model.h"
#include "hpr/Model/TorchScriptImport.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <string>
#include <vector>

namespace mlir::hpr::model {

/// Reads \p path: `.pt2` through importExportedProgram (in process: it needs
/// no LibTorch), `.pt` / `.ir` through importTorchScript (with \p options,
/// from libHPRTorchScript.so, loaded on first use),
/// `.json` through parseModelJson. Any other extension is an error.
llvm::Expected<ModelGraph>
readModelFile(llvm::StringRef path, const TorchScriptOptions &options,
              std::vector<std::string> *warnings = nullptr);

} // namespace mlir::hpr::model

#endif // HPR_MODEL_MODELFILE_H
