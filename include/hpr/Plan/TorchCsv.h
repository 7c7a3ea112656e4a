//===- TorchCsv.h - Planned hpr IR -> torch's schedule CSV ------*- C++ -*-===//
//
// The plan in torch.distributed.pipelining's own action set: one CSV row per
// rank in `_PipelineScheduleRuntime`'s compute+comms format (F I W B SEND_F
// RECV_F SEND_B RECV_B UNSHARD RESHARD REDUCE_GRAD and OVERLAP_F_B pairs),
// which torch's `_load_csv(..., format="compute_comms")` loads. That action
// set has no recompute and no clear; the sidecar (JSON, docs/plan-format.md
// "torch CSV") says where they go, which session each backward reads and
// whether it retains, and which forwards run without checkpointing.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_PLAN_TORCHCSV_H
#define HPR_PLAN_TORCHCSV_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::hpr {

/// Writes the CSV to `csv` and its sidecar to `sidecar`; `csvName` is the
/// CSV's file name as the sidecar records it.
void writeTorchCsv(ModuleOp module, llvm::StringRef csvName,
                   llvm::raw_ostream &csv, llvm::raw_ostream &sidecar);

} // namespace mlir::hpr

#endif // HPR_PLAN_TORCHCSV_H
