//===- Json.cpp - JSON reading helpers shared by the file formats --------===//

#include "hpr/Support/Json.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

using json = nlohmann::json;

/// 1-based row and column of byte `offset` in `text`.
static std::pair<int, int> rowColumnOf(llvm::StringRef text, size_t offset) {
  offset = std::min(offset, text.size());
  llvm::StringRef before = text.take_front(offset);
  int row = 1 + static_cast<int>(before.count('\n'));
  size_t lineStart = before.rfind('\n');
  int column = static_cast<int>(
      lineStart == llvm::StringRef::npos ? offset + 1 : offset - lineStart);
  return {row, column};
}

static llvm::Error located(llvm::StringRef text, llvm::StringRef fileName,
                           size_t offset, const llvm::Twine &what) {
  auto [row, column] = rowColumnOf(text, offset);
  return llvm::createStringError(llvm::formatv("{0}:{1}:{2}: invalid JSON: {3}",
                                               fileName, row, column,
                                               what.str())
                                     .str());
}

/// One pass over the text for what nlohmann's parser gets wrong or cannot
/// locate: a NUL byte (its lexer takes one for the end of the input and
/// ignores the rest), nesting deeper than `maxDepth` (every later walk of the
/// document, and nlohmann's own dump, recurses per level) and a number beyond
/// a double (its out_of_range error carries no position).
static llvm::Error precheck(llvm::StringRef text, llvm::StringRef fileName,
                            unsigned maxDepth) {
  unsigned depth = 0;
  bool inString = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (c == '\0')
      return located(text, fileName, i,
                     "a NUL byte; JSON text holds none (in a string, write "
                     "\\u0000)");
    if (inString) {
      if (c == '\\' && i + 1 < text.size() && text[i + 1] != '\0')
        ++i;
      else if (c == '"')
        inString = false;
    } else if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > maxDepth)
        return located(
            text, fileName, i,
            llvm::formatv("nested deeper than {0} levels", maxDepth));
    } else if (c == ']' || c == '}') {
      depth -= depth > 0;
    } else if (c == '-' || llvm::isDigit(c)) {
      size_t end = text.find_if_not(
          [](char d) {
            return llvm::isDigit(d) || llvm::StringRef("+-.eE").contains(d);
          },
          i);
      llvm::StringRef number = text.slice(i, end);
      // Up to 15 digits and no exponent: always a finite double.
      if (number.size() > 15 ||
          number.find_first_of("eE") != llvm::StringRef::npos) {
        std::string copy = number.str();
        if (!std::isfinite(std::strtod(copy.c_str(), nullptr)))
          return located(
              text, fileName, i,
              llvm::formatv("number overflow: '{0}' ({1} characters) is "
                            "beyond the range of a double",
                            number.take_front(20) +
                                (number.size() > 20 ? "..." : ""),
                            number.size()));
      }
      i = end - 1;
    }
  }
  return llvm::Error::success();
}

llvm::Expected<json> mlir::hpr::parseJson(llvm::StringRef text,
                                          llvm::StringRef fileName,
                                          unsigned maxDepth) {
  if (llvm::Error err = precheck(text, fileName, maxDepth))
    return err;
  // No parser callback: nlohmann's callback parser scans the enclosing
  // container at every object's end, quadratic in its length.
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error &e) {
    // e.byte is 1-based and points just past the offending character.
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] parse error at line
    // 1, column 2: " prefix: the location is printed our way, once.
    if (size_t pos = what.find("parse error"); pos != std::string::npos)
      if (size_t colon = what.find(": ", pos); colon != std::string::npos)
        what = what.substr(colon + 2);
    return located(text, fileName, e.byte > 0 ? e.byte - 1 : 0, what);
  } catch (const json::exception &e) {
    return llvm::createStringError(
        llvm::formatv("{0}: invalid JSON: {1}", fileName, e.what()).str());
  }
}

std::string mlir::hpr::quoteJson(const json &value) {
  // Containers are not printed: they can be arbitrarily large or deep.
  if (value.is_object())
    return value.empty() ? "{}" : "{...}";
  if (value.is_array())
    return value.empty() ? "[]" : "[...]";
  std::string text = dumpJson(value);
  if (text.size() > 40)
    text = text.substr(0, 37) + "...";
  return text;
}

using mlir::hpr::JsonFieldReader;

llvm::Error JsonFieldReader::fail(const std::string &path,
                                  const std::string &expected,
                                  const json &got) const {
  return llvm::createStringError(
      llvm::formatv("{0}: {1}: expected {2}, got '{3}'", file,
                    path.empty() ? "/" : path, expected,
                    mlir::hpr::quoteJson(got))
          .str());
}

llvm::Error JsonFieldReader::failMsg(const std::string &path,
                                     const std::string &msg) const {
  return llvm::createStringError(
      llvm::formatv("{0}: {1}: {2}", file, path.empty() ? "/" : path, msg)
          .str());
}

llvm::Expected<const json *> JsonFieldReader::find(const json &obj,
                                                   const std::string &path,
                                                   const char *key,
                                                   bool required) const {
  auto it = obj.find(key);
  if (it != obj.end())
    return &*it;
  if (required)
    return failMsg(path,
                   llvm::formatv("missing required key '{0}'", key).str());
  return nullptr;
}

llvm::Error JsonFieldReader::readString(const json &obj,
                                        const std::string &path,
                                        const char *key, std::string &out,
                                        bool required) const {
  llvm::Expected<const json *> value = find(obj, path, key, required);
  if (!value || !*value)
    return value.takeError();
  if (!(*value)->is_string() || (*value)->get<std::string>().empty())
    return fail(path + "/" + key, "a non-empty string", **value);
  out = (*value)->get<std::string>();
  return llvm::Error::success();
}

llvm::Error JsonFieldReader::readBool(const json &obj, const std::string &path,
                                      const char *key, bool &out) const {
  llvm::Expected<const json *> value = find(obj, path, key, false);
  if (!value || !*value)
    return value.takeError();
  if (!(*value)->is_boolean())
    return fail(path + "/" + key, "true or false", **value);
  out = (*value)->get<bool>();
  return llvm::Error::success();
}

llvm::Error JsonFieldReader::readInt(const json &obj, const std::string &path,
                                     const char *key, int64_t &out,
                                     bool required, int64_t low,
                                     int64_t high) const {
  llvm::Expected<const json *> value = find(obj, path, key, required);
  if (!value || !*value)
    return value.takeError();
  const json &number = **value;
  bool inRange = number.is_number_integer() &&
                 !(number.is_number_unsigned() &&
                   number.get<uint64_t>() > static_cast<uint64_t>(high)) &&
                 number.get<int64_t>() >= low && number.get<int64_t>() <= high;
  if (!inRange)
    return fail(path + "/" + key,
                llvm::formatv("an integer in [{0}, {1}]", low, high).str(),
                number);
  out = number.get<int64_t>();
  return llvm::Error::success();
}

llvm::Error
JsonFieldReader::checkKeys(const json &obj, const std::string &path,
                           llvm::ArrayRef<const char *> allowed) const {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (llvm::is_contained(allowed, it.key()))
      continue;
    std::string list;
    for (const char *key : allowed)
      list += (list.empty() ? "" : ", ") + std::string(key);
    return failMsg(path + "/" + it.key(),
                   "unknown key (expected one of: " + list + ")");
  }
  return llvm::Error::success();
}
