//===- Passes.h - hpr recompute planning passes -----------------*- C++ -*-===//

#ifndef HPR_TRANSFORMS_PASSES_H
#define HPR_TRANSFORMS_PASSES_H

#include "hpr/Dialect/HPR/HPROps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"
#include "mlir/Pass/PassOptions.h"

#include <string>

namespace mlir {
namespace hpr {

#define GEN_PASS_DECL
#include "hpr/Transforms/Passes.h.inc"

/// Options of the recompute planning pipeline (`hpr-recompute-pipeline`).
struct RecomputePipelineOptions
    : public PassPipelineOptions<RecomputePipelineOptions> {
  Option<std::string> policy{*this, "policy",
                             llvm::cl::desc("Recompute placement: jit or "
                                            "lookahead"),
                             llvm::cl::init("jit")};
  Option<unsigned> distance{
      *this, "distance",
      llvm::cl::desc("With policy=lookahead: compute actions earlier"),
      llvm::cl::init(1)};
};

/// Appends the planning pipeline: assign sessions, insert recompute, insert
/// clear, verify. The CLI and `hpr-recompute-pipeline` both call this, so the
/// order is written once.
void buildRecomputePipeline(OpPassManager &pm,
                            const RecomputePipelineOptions &options);

/// Registers `hpr-recompute-pipeline` (the passes themselves are registered
/// by the generated registerHPRPasses()).
void registerRecomputePipeline();

#define GEN_PASS_REGISTRATION
#include "hpr/Transforms/Passes.h.inc"

} // namespace hpr
} // namespace mlir

#endif // HPR_TRANSFORMS_PASSES_H
