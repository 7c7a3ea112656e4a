//===- Partition.h - Split a model's regions into pipeline stages -*- C++
//-*-===//
//
// Turns a ModelGraph into a StagedModel: either from an explicit spec
// ("0:0-3,1:4-7") or balanced, minimizing the cost of the most expensive
// stage over all contiguous splits (optimal), honouring fixed stages.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_MODEL_PARTITION_H
#define HPR_MODEL_PARTITION_H

#include "hpr/Model/Model.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <vector>

namespace mlir::hpr::model {

/// The cost the balanced partition uses per region: fwdTimeUs when every
/// region of \p graph is profiled (fwdTimeUs > 0), fwdFlops otherwise.
std::vector<double> partitionCosts(const ModelGraph &graph);

/// Splits \p graph into \p numStages contiguous, non-empty stages.
///
/// \p explicitSpec is "" (balanced mode), a comma-separated list of
/// `STAGE:FIRST-LAST` (or `STAGE:INDEX`) region index ranges that must cover
/// every region exactly once, in order, or `STAGE:MODULE,...` items separated
/// by ';' (module paths; a region goes to the stage of the most specific path
/// it is in; docs/models.md); with a spec, \p numStages <= 0 means
/// "as many as the spec names". In balanced mode the split minimizes the
/// maximum stage cost (see partitionCosts) and respects Region::stage where it
/// is set (>= 0). Errors: fewer regions than stages, a malformed spec (the
/// message quotes the offending text), overlapping or missing regions, empty
/// stages, fixed stages out of range or out of order.
llvm::Expected<StagedModel> partitionModel(const ModelGraph &graph,
                                           int numStages,
                                           llvm::StringRef explicitSpec);

} // namespace mlir::hpr::model

#endif // HPR_MODEL_PARTITION_H
