//===- ModelJson.h - JSON graph format for models ----------------*- C++
//-*-===//
//
// Reads and writes the hp-recompute model JSON format (docs/models.md,
// docs/schemas/model.schema.json): a model exported from elsewhere as its
// regions in execution order, with costs and optionally a fixed stage each.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_MODEL_MODELJSON_H
#define HPR_MODEL_MODELJSON_H

#include "hpr/Model/Model.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <nlohmann/json.hpp>

#include <string>

namespace mlir::hpr::model {

/// Value of the top-level "format" key.
inline constexpr const char *kModelJsonFormat = "hp-recompute-model";
/// The only version this code reads and writes.
inline constexpr int kModelJsonVersion = 1;

/// Parses a model JSON document. \p file only names the input in messages.
/// Syntax errors are reported as `FILE:ROW:COL: ...`, schema violations as
/// `FILE: /json/path: expected ..., got '...'`.
llvm::Expected<ModelGraph> parseModelJson(llvm::StringRef text,
                                          llvm::StringRef file);

/// Reads one region object (an element of `/regions`; the plan JSON's
/// `/model/stages/S/regions` hold the same objects) at JSON path `path`.
llvm::Error readRegionJson(const nlohmann::json &obj, const std::string &path,
                           llvm::StringRef file, Region &region);

/// Prints \p graph in the model JSON format (indented, trailing newline);
/// parseModelJson reads it back to an equal graph.
std::string printModelJson(const ModelGraph &graph);

} // namespace mlir::hpr::model

#endif // HPR_MODEL_MODELJSON_H
