//===- Json.cpp - JSON reading helpers shared by the file formats --------===//

#include "hpr/Support/Json.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>

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

llvm::Expected<json> mlir::hpr::parseJson(llvm::StringRef text,
                                          llvm::StringRef fileName,
                                          unsigned maxDepth) {
  // Deeply nested input is refused while parsing: every later walk of the
  // document (and nlohmann's own dump) recurses per level.
  size_t tooDeepAt = 0;
  auto limitDepth = [&](int depth, json::parse_event_t event, json &) {
    if ((event == json::parse_event_t::object_start ||
         event == json::parse_event_t::array_start) &&
        static_cast<unsigned>(depth) >= maxDepth && !tooDeepAt)
      tooDeepAt = 1;
    return !tooDeepAt;
  };
  try {
    json value = json::parse(text.begin(), text.end(), limitDepth);
    if (tooDeepAt)
      return llvm::createStringError(
          llvm::formatv("{0}: invalid JSON: nested deeper than {1} levels",
                        fileName, maxDepth)
              .str());
    return value;
  } catch (const json::parse_error &e) {
    // e.byte is 1-based and points just past the offending character.
    auto [row, column] = rowColumnOf(text, e.byte > 0 ? e.byte - 1 : 0);
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] parse error at line
    // 1, column 2: " prefix: the location is printed our way.
    if (size_t pos = what.find(": "); pos != std::string::npos)
      if (size_t pos2 = what.find(": ", pos + 2); pos2 != std::string::npos)
        what = what.substr(pos2 + 2);
    return llvm::createStringError(
        llvm::formatv("{0}:{1}:{2}: invalid JSON: {3}", fileName, row, column,
                      what)
            .str());
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
