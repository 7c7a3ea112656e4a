//===- Error.h - An llvm::Error that carries a message ----------*- C++ -*-===//
//
// The readers' and importers' errors are read by people: a message, no error
// code (inconvertibleErrorCode).
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SUPPORT_ERROR_H
#define HPR_SUPPORT_ERROR_H

#include "llvm/ADT/Twine.h"
#include "llvm/Support/Error.h"

namespace mlir::hpr {

/// An error whose text is `message`.
inline llvm::Error makeError(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message.str());
}

} // namespace mlir::hpr

#endif // HPR_SUPPORT_ERROR_H
