//===- ModelFile.cpp - Read a model file of any supported format ----------===//

#include "hpr/Model/ModelFile.h"
#include "hpr/Model/ModelJson.h"

#include "llvm/Support/MemoryBuffer.h"

using namespace hpr::model;

llvm::Expected<ModelGraph>
hpr::model::readModelFile(llvm::StringRef path,
                          const TorchScriptOptions &options,
                          std::vector<std::string> *warnings) {
  if (path.ends_with(".pt") || path.ends_with(".ir"))
    return importTorchScript(path, options, warnings);
  if (path.ends_with(".json")) {
    auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/true);
    if (!buffer)
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "%s: cannot read: %s", path.str().c_str(),
                                     buffer.getError().message().c_str());
    return parseModelJson((*buffer)->getBuffer(), path);
  }
  return llvm::createStringError(
      llvm::inconvertibleErrorCode(),
      "%s: unknown model format; expected a file ending in .pt (TorchScript "
      "archive), .ir (TorchScript IR text) or .json (model JSON graph)",
      path.str().c_str());
}
