//===- MlirFuzzer.cpp - hpr-fuzz-mlir ------------------------------------===//
//
// hpr IR text: parse, verify, and run the planning pipeline on what
// verifies, as hp-recompute-opt would.
//
//===----------------------------------------------------------------------===//

#include "FuzzInput.h"

#include "hpr/InitAll.h"
#include "hpr/Transforms/Passes.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  mlir::DialectRegistry registry;
  mlir::hpr::registerAllDialects(registry);
  mlir::MLIRContext context(registry);
  context.disableMultithreading();
  // Diagnostics are the expected outcome of bad input; keep them quiet.
  mlir::ScopedDiagnosticHandler quiet(
      &context, [](mlir::Diagnostic &) { return mlir::success(); });
  // MLIR's lexer reads up to a terminating NUL (as file buffers have): the
  // fuzzer's bytes have none, so they are copied into a std::string.
  std::string text(mlir::hpr::fuzz::asText(data, size));
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceString<mlir::ModuleOp>(text, &context);
  if (!module || mlir::failed(mlir::verify(*module)))
    return 0;
  static const mlir::hpr::RecomputePipelineOptions options;
  mlir::PassManager pm(&context);
  mlir::hpr::buildRecomputePipeline(pm, options);
  (void)pm.run(*module);
  return 0;
}
