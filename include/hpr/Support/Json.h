//===- Json.h - JSON reading helpers shared by the file formats -*- C++ -*-===//
//
// The schedule and model JSON readers both need a parse that reports
// FILE:ROW:COL and never throws, and a safe way to quote a value in a
// message. nlohmann/json does the parsing.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SUPPORT_JSON_H
#define HPR_SUPPORT_JSON_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <nlohmann/json.hpp>

#include <string>

namespace mlir::hpr {

/// Parses `text`. Errors read `FILE:ROW:COL: invalid JSON: ...`; any
/// nlohmann exception (syntax, a number out of range, nesting deeper than
/// `maxDepth`) becomes such an error instead of escaping.
llvm::Expected<nlohmann::json> parseJson(llvm::StringRef text,
                                         llvm::StringRef fileName,
                                         unsigned maxDepth = 64);

/// A short rendering of `value` for an error message: scalars as JSON text
/// (cut at 40 characters, invalid UTF-8 replaced), containers as `[...]` or
/// `{...}` (`[]`, `{}` when empty).
std::string quoteJson(const nlohmann::json &value);

/// `value.dump()` that cannot throw on strings that are not valid UTF-8 (for
/// nlohmann::json and nlohmann::ordered_json alike).
template <typename Json>
std::string dumpJson(const Json &value, int indent = -1) {
  return value.dump(indent, ' ', false, Json::error_handler_t::replace);
}

} // namespace mlir::hpr

#endif // HPR_SUPPORT_JSON_H
