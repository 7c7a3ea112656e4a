//===- Json.h - JSON reading helpers shared by the file formats -*- C++ -*-===//
//
// The schedule and model JSON readers both need a parse that reports
// FILE:ROW:COL and never throws, and a safe way to quote a value in a
// message. nlohmann/json does the parsing.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SUPPORT_JSON_H
#define HPR_SUPPORT_JSON_H

#include "llvm/ADT/ArrayRef.h"
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

/// Reads fields of a parsed document with errors at their JSON path:
/// `FILE: /json/path: expected WHAT, got 'VALUE'`. Shared by the model and
/// plan readers; each reports the first violation it finds.
class JsonFieldReader {
public:
  using json = nlohmann::json;
  explicit JsonFieldReader(llvm::StringRef file) : file(file) {}

  llvm::Error fail(const std::string &path, const std::string &expected,
                   const json &got) const;
  llvm::Error failMsg(const std::string &path, const std::string &msg) const;
  /// The value of `key` in `obj`: null when absent and optional, an error
  /// when absent and required.
  llvm::Expected<const json *> find(const json &obj, const std::string &path,
                                    const char *key, bool required) const;
  /// A non-empty string.
  llvm::Error readString(const json &obj, const std::string &path,
                         const char *key, std::string &out,
                         bool required) const;
  /// true or false; `out` is left alone when the key is absent.
  llvm::Error readBool(const json &obj, const std::string &path,
                       const char *key, bool &out) const;
  /// An integer in [low, high] (booleans are not integers).
  llvm::Error readInt(const json &obj, const std::string &path, const char *key,
                      int64_t &out, bool required, int64_t low,
                      int64_t high) const;
  /// Refuses keys outside `allowed`.
  llvm::Error checkKeys(const json &obj, const std::string &path,
                        llvm::ArrayRef<const char *> allowed) const;

  llvm::StringRef fileName() const { return file; }

private:
  std::string file;
};

} // namespace mlir::hpr

#endif // HPR_SUPPORT_JSON_H
