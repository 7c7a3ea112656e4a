//===- HPRDialect.h - hpr dialect declaration -------------------*- C++ -*-===//

#ifndef HPR_DIALECT_HPR_HPRDIALECT_H
#define HPR_DIALECT_HPR_HPRDIALECT_H

#include "mlir/IR/Dialect.h"

#include "hpr/Dialect/HPR/HPRDialect.h.inc"

#endif // HPR_DIALECT_HPR_HPRDIALECT_H
