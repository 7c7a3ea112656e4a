//===- HPRPlugin.cpp - hpr dialect and passes for stock mlir-opt ---------===//
//
// Loaded by `mlir-opt --load-dialect-plugin=... --load-pass-plugin=...`.
// The library deliberately does not link libMLIR: it resolves MLIR from the
// host tool, so its dialect and passes land in the host's registries.
//
//===----------------------------------------------------------------------===//

#include "hpr/InitAll.h"

#include "mlir/Tools/Plugins/DialectPlugin.h"
#include "mlir/Tools/Plugins/PassPlugin.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/Compiler.h"

extern "C" LLVM_ATTRIBUTE_WEAK mlir::DialectPluginLibraryInfo
mlirGetDialectPluginInfo() {
  return {MLIR_PLUGIN_API_VERSION, "HPR", LLVM_VERSION_STRING,
          [](mlir::DialectRegistry *registry) {
            mlir::hpr::registerAllDialects(*registry);
          }};
}

extern "C" LLVM_ATTRIBUTE_WEAK mlir::PassPluginLibraryInfo
mlirGetPassPluginInfo() {
  return {MLIR_PLUGIN_API_VERSION, "HPRPasses", LLVM_VERSION_STRING,
          []() { mlir::hpr::registerAllPasses(); }};
}
