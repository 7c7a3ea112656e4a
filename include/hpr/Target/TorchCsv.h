//===- TorchCsv.h - torch's schedule CSV + sidecar <-> plans ---*- C++ -*-===//
//
// The plan in torch.distributed.pipelining's own action set: one CSV row per
// rank in `_PipelineScheduleRuntime`'s compute+comms format (F I W B SEND_F
// RECV_F SEND_B RECV_B UNSHARD RESHARD REDUCE_GRAD and OVERLAP_F_B pairs),
// which torch's `_load_csv(..., format="compute_comms")` loads. That action
// set has no recompute and no clear; the sidecar (JSON, docs/plan-format.md
// "torch CSV") says where they go, which session each backward reads and
// whether it retains, and which forwards run without checkpointing.
//
// Both directions live here: writeTorchCsv writes the pair from a planned
// module, readTorchCsv reads a pair back as plan JSON for the admission check
// (importPlanJson + verifyImportedPlan), remembering which cell or sidecar
// entry each action came from.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_TARGET_TORCHCSV_H
#define HPR_TARGET_TORCHCSV_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <string>
#include <vector>

namespace mlir::hpr {

/// Writes the CSV to `csv` and its sidecar to `sidecar`; `csvName` is the
/// CSV's file name as the sidecar records it. `module` is lowered
/// (hpr-lower-runtime): each RECV cell stands where its receive is posted.
void writeTorchCsv(ModuleOp module, llvm::StringRef csvName,
                   llvm::raw_ostream &csv, llvm::raw_ostream &sidecar);

/// The sidecar's path beside the CSV `csvPath`: `FILE.csv` -> `FILE.hpr.json`.
std::string torchCsvSidecarPath(llvm::StringRef csvPath);

/// A torch CSV and its sidecar read back as plan JSON, with where each action
/// of that plan came from.
struct TorchCsvPlan {
  /// Where one action of `plan` came from: a CSV cell, or a sidecar insert;
  /// `fields` names the sidecar entries that set some of its members.
  struct Source {
    int64_t column = -1; ///< 0-based column of its cell; -1 for an insert
    std::string cell;    ///< the cell as torch spells it (`3F0`)
    int64_t insert = -1; ///< index in the sidecar's /ranks/R/inserts
    /// Plan member (`session`, `checkpoint`) -> the sidecar JSON path it
    /// came from (`/ranks/0/consumers/2/session`).
    llvm::StringMap<std::string> fields;
  };

  /// Plan JSON, version 2: the sidecar's `schedule`, `model` and `sessions`;
  /// per rank the row's cells as actions (a transfer's `peer` the rank of the
  /// stage it talks to), with the sidecar's inserts placed before their
  /// cells, its consumers' `session`, `retain_on_unpack` and `frees_graph` on
  /// their backwards and `checkpoint: false` on its plain forwards. Untagged
  /// (torch's point-to-point ops carry no tag); each receive posts itself
  /// where its RECV cell stands. The members the planner lowers into every
  /// plan and the pair does not carry are those hpr-lower-runtime writes
  /// onto the same actions read into IR (writePlanJson prints them); a plan
  /// the importer refuses goes without them, for the admission check to
  /// name.
  std::string plan;
  std::string csvPath;
  std::string sidecarPath;
  /// sources[R][K]: action K of rank R.
  std::vector<std::vector<Source>> sources;

  /// Where the user finds plan JSON path `jsonPath`: `FILE.csv:2:5 ('3F0')`
  /// for an action from a cell (`FILE.csv:2:5 ('3F0'): peer` for one of its
  /// members), `FILE.hpr.json: /ranks/1/inserts/0/session` for an insert or
  /// a member a sidecar entry set, and `FILE.hpr.json: PATH` for what the
  /// sidecar holds as the plan does (`/schedule`, `/model`, `/sessions`).
  std::string locate(llvm::StringRef jsonPath) const;
};

/// Reads the torch CSV `csvText` (file `csvPath`) and its sidecar
/// `sidecarText` (file `sidecarPath`) as a plan. Refuses, located at the cell
/// (`FILE:ROW:COL`) or the sidecar's JSON path, what cannot be turned into
/// plan JSON: text that is not UTF-8, a cell that is not torch's, an empty
/// cell, a RECOMPUTE or CLEAR cell, a transfer without a neighbour stage, a
/// sidecar of another format or for another CSV, a row whose length is not
/// the sidecar's `cells`, and sidecar entries that are malformed or name no
/// cell. Everything else is the admission check's. `context` (with the hpr
/// dialect registered) holds the IR the lowered members are written from.
llvm::Expected<TorchCsvPlan> readTorchCsv(MLIRContext &context,
                                          llvm::StringRef csvText,
                                          llvm::StringRef csvPath,
                                          llvm::StringRef sidecarText,
                                          llvm::StringRef sidecarPath);

/// readTorchCsv of the file `csvPath` and its sidecar (torchCsvSidecarPath).
llvm::Expected<TorchCsvPlan> readTorchCsvFiles(MLIRContext &context,
                                               llvm::StringRef csvPath);

} // namespace mlir::hpr

#endif // HPR_TARGET_TORCHCSV_H
