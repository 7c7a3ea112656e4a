//===- hp-recompute-opt.cpp - mlir-opt driver with the hpr dialect -------===//

#include "hpr/InitAll.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::func::FuncDialect>();
  mlir::hpr::registerAllDialects(registry);
  mlir::hpr::registerAllPasses();
  return mlir::asMainReturnCode(mlir::MlirOptMain(
      argc, argv, "hp-recompute optimizer driver\n", registry));
}
