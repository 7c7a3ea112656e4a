//===- ShapeList.cpp - Parse --input-shape and --input-dtype values -------===//
//
// Kept free of LibTorch so the CLI can validate its flags cheaply.
//
//===----------------------------------------------------------------------===//

#include "hpr/Model/TorchScriptImport.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir::hpr::model;

llvm::Expected<std::vector<std::vector<int64_t>>>
mlir::hpr::model::parseShapeList(llvm::StringRef text) {
  std::vector<std::vector<int64_t>> shapes;
  auto fail = [&](size_t column, llvm::StringRef expected,
                  llvm::StringRef got) {
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        llvm::formatv("--input-shape:1:{0}: expected {1}, got '{2}'", column,
                      expected, got)
            .str());
  };
  if (text.trim().empty())
    return fail(1, "a shape such as '4x40x48' (several separated by ',')",
                text);
  size_t shapeStart = 0;
  while (shapeStart <= text.size()) {
    size_t shapeEnd = text.find(',', shapeStart);
    if (shapeEnd == llvm::StringRef::npos)
      shapeEnd = text.size();
    llvm::StringRef shapeText = text.slice(shapeStart, shapeEnd);
    std::vector<int64_t> shape;
    size_t dimStart = shapeStart;
    while (true) {
      size_t dimEnd = text.find_first_of("x,", dimStart);
      if (dimEnd == llvm::StringRef::npos || dimEnd > shapeEnd)
        dimEnd = shapeEnd;
      llvm::StringRef dimText = text.slice(dimStart, dimEnd);
      llvm::StringRef trimmed = dimText.trim();
      uint64_t value;
      if (trimmed.empty() || trimmed.getAsInteger(10, value) || value == 0 ||
          value > (uint64_t(1) << 40))
        return fail(dimStart + 1,
                    llvm::formatv("a positive integer dimension in shape '{0}'",
                                  shapeText)
                        .str(),
                    dimText);
      shape.push_back(static_cast<int64_t>(value));
      if (dimEnd >= shapeEnd)
        break;
      dimStart = dimEnd + 1;
    }
    shapes.push_back(std::move(shape));
    shapeStart = shapeEnd + 1;
  }
  return shapes;
}

llvm::Expected<std::vector<std::string>>
mlir::hpr::model::parseDtypeList(llvm::StringRef text, size_t numInputs) {
  llvm::SmallVector<llvm::StringRef> parts;
  text.split(parts, ',');
  std::vector<std::string> names;
  size_t column = 1;
  for (llvm::StringRef part : parts) {
    llvm::StringRef name = part.trim();
    llvm::StringRef canonical = llvm::StringSwitch<llvm::StringRef>(name)
                                    .Cases("float32", "float", "float32")
                                    .Cases("float16", "half", "float16")
                                    .Case("bfloat16", "bfloat16")
                                    .Cases("float64", "double", "float64")
                                    .Cases("int64", "long", "int64")
                                    .Cases("int32", "int", "int32")
                                    .Cases("int16", "short", "int16")
                                    .Case("int8", "int8")
                                    .Case("uint8", "uint8")
                                    .Case("bool", "bool")
                                    .Default("");
    if (canonical.empty())
      return llvm::createStringError(
          llvm::inconvertibleErrorCode(),
          llvm::formatv("--input-dtype:1:{0}: expected a dtype (float32, "
                        "float16, bfloat16, float64, int64, int32, int16, "
                        "int8, uint8, bool), got '{1}'",
                        column, part)
              .str());
    names.push_back(canonical.str());
    column += part.size() + 1;
  }
  if (names.size() == 1 && numInputs > 1)
    names.resize(numInputs, names.front());
  if (names.size() != numInputs)
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(),
        llvm::formatv("--input-dtype: expected 1 or {0} dtypes (one per "
                      "input), got {1} in '{2}'",
                      numInputs, names.size(), text)
            .str());
  return names;
}
