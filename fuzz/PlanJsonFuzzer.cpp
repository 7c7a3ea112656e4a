//===- PlanJsonFuzzer.cpp - hpr-fuzz-plan-json ----------------------------===//
//
// A plan JSON read back into IR and, when it imports, put through the
// admission check every runtime runs (importPlanJson + verifyImportedPlan):
// what a hand-edited or hostile plan file reaches.
//
//===----------------------------------------------------------------------===//

#include "FuzzInput.h"

#include "hpr/InitAll.h"
#include "hpr/Target/PlanImport.h"

#include "mlir/IR/MLIRContext.h"

using namespace mlir;
using namespace mlir::hpr;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static DialectRegistry *registry = [] {
    auto *registry = new DialectRegistry();
    registerAllDialects(*registry);
    return registry;
  }();
  MLIRContext context(*registry, MLIRContext::Threading::DISABLED);
  ScopedDiagnosticHandler quiet(&context,
                                [](Diagnostic &) { return success(); });
  auto module = importPlanJson(context, fuzz::asText(data, size), "fuzz.json");
  if (module)
    (void)verifyImportedPlan(**module);
  else
    llvm::consumeError(module.takeError());
  return 0;
}
