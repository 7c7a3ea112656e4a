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

/// The largest `data_parallel` shard or replicate count read.
inline constexpr int64_t kMaxDataParallel = int64_t(1) << 20;

/// Parses a model JSON document. \p file only names the input in messages.
/// Syntax errors are reported as `FILE:ROW:COL: ...`, schema violations as
/// `FILE: /json/path: expected ..., got '...'`.
llvm::Expected<ModelGraph> parseModelJson(llvm::StringRef text,
                                          llvm::StringRef file);

/// Reads one region object (an element of `/regions`; the plan JSON's
/// `/model/stages/S/regions` hold the same objects) at JSON path `path`.
llvm::Error readRegionJson(const nlohmann::json &obj, const std::string &path,
                           llvm::StringRef file, Region &region);

/// Reads the `data_parallel` member of `obj`, the object at JSON path `path`
/// (the model JSON's top level, the plan JSON's `/model`); leaves `out` as it
/// is when absent.
llvm::Error readDataParallelJson(const nlohmann::json &obj,
                                 const std::string &path, llvm::StringRef file,
                                 DataParallel &out);

/// Prints \p graph in the model JSON format (indented, trailing newline);
/// parseModelJson reads it back to an equal graph.
std::string printModelJson(const ModelGraph &graph);

} // namespace mlir::hpr::model

#endif // HPR_MODEL_MODELJSON_H
