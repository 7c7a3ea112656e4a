//===- HPRTypes.h - hpr dialect types ---------------------------*- C++ -*-===//

#ifndef HPR_DIALECT_HPR_HPRTYPES_H
#define HPR_DIALECT_HPR_HPRTYPES_H

#include "mlir/IR/Types.h"

#define GET_TYPEDEF_CLASSES
#include "hpr/Dialect/HPR/HPRTypes.h.inc"

#endif // HPR_DIALECT_HPR_HPRTYPES_H
