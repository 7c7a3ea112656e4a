//===- InitAll.h - Register every hpr dialect and pass ----------*- C++ -*-===//
//
// The one place the tools and the mlir-opt plugin register what hp-recompute
// provides, so a pass is registered exactly once.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_INITALL_H
#define HPR_INITALL_H

#include "hpr/Dialect/HPR/HPRDialect.h"
#include "hpr/Transforms/Passes.h"
#include "mlir/IR/DialectRegistry.h"

namespace mlir::hpr {

/// Adds the hpr dialect to `registry`.
inline void registerAllDialects(DialectRegistry &registry) {
  registry.insert<HPRDialect>();
}

/// Registers every hpr pass and pipeline with the global pass registry.
inline void registerAllPasses() {
  registerHPRPasses();
  registerRecomputePipeline();
}

} // namespace mlir::hpr

#endif // HPR_INITALL_H
