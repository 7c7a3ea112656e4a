//===- TorchScriptInternal.h - Shared by the TorchScript importer -*- C++
//-*-===//
//
// Private to lib/Model: the op records the interpreter produces and the cost
// pass (TorchScriptCosts.cpp) consumes. Includes LibTorch, so never include
// it from a public header.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_LIB_MODEL_TORCHSCRIPTINTERNAL_H
#define HPR_LIB_MODEL_TORCHSCRIPTINTERNAL_H

#include "hpr/Model/Model.h"
#include "hpr/Model/TorchScriptImport.h"

#include "llvm/Support/Error.h"

#include <torch/csrc/jit/ir/ir.h>
#include <torch/torch.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace hpr::model::detail {

/// One executed op (never prim::*) with the values it saw.
struct OpRecord {
  std::string kind;               ///< e.g. "aten::linear"
  std::string where;              ///< FILE:ROW:COL for messages
  std::vector<std::string> chain; ///< module call stack, outermost first
  torch::jit::Node *node = nullptr;
  std::vector<c10::IValue> inputs;
  std::vector<c10::IValue> outputs;
};

/// Storages of parameters and buffers (excluded from saved/input bytes).
class ParamSet {
public:
  void add(const at::Tensor &t) {
    if (t.defined() && t.has_storage())
      storages.emplace(t.storage().unsafeGetStorageImpl(),
                       t.storage().nbytes());
  }
  bool contains(const at::Tensor &t) const {
    return t.has_storage() &&
           storages.count(t.storage().unsafeGetStorageImpl());
  }

private:
  std::unordered_map<const void *, size_t> storages;
};

/// The region a module call stack belongs to at \p depth, or "" (outside).
std::string regionOf(const std::vector<std::string> &chain, int depth);

/// Splits \p records into regions and applies the cost rules.
llvm::Expected<ModelGraph> buildRegions(const std::string &file,
                                        std::vector<OpRecord> &records,
                                        const ParamSet &params,
                                        const TorchScriptOptions &options,
                                        std::vector<std::string> &warnings);

} // namespace hpr::model::detail

#endif // HPR_LIB_MODEL_TORCHSCRIPTINTERNAL_H
