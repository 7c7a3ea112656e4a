//===- HPRDialect.cpp - hpr dialect registration and types ---------------===//

#include "hpr/Dialect/HPR/HPRDialect.h"
#include "hpr/Dialect/HPR/HPROps.h"
#include "hpr/Dialect/HPR/HPRTypes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::hpr;

#include "hpr/Dialect/HPR/HPRDialect.cpp.inc"

#define GET_TYPEDEF_CLASSES
#include "hpr/Dialect/HPR/HPRTypes.cpp.inc"

void HPRDialect::initialize() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "hpr/Dialect/HPR/HPRTypes.cpp.inc"
      >();
  addOperations<
#define GET_OP_LIST
#include "hpr/Dialect/HPR/HPROps.cpp.inc"
      >();
}
