//===- HPRDialect.td - hpr dialect definition --------------*- tablegen -*-===//
//
// The hpr dialect: a model (stages, checkpointable regions, costs) and a
// pipeline schedule (one program of actions per rank) in one module, so that
// recompute planning is a sequence of ordinary MLIR passes.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_DIALECT
#define HPR_DIALECT

include "mlir/IR/OpBase.td"

def HPR_Dialect : Dialect {
  let name = "hpr";
  let cppNamespace = "::mlir::hpr";
  let summary = "Planned activation recomputation for pipeline parallelism";
  let description = [{
    A module holds an `hpr.model` (stages and their checkpointable regions
    with costs) and an `hpr.schedule` (one `hpr.program` per rank, each an
    ordered list of actions). Forward actions produce `!hpr.handle` values;
    an `!hpr.session` binds one handle, is recomputed once, consumed by dx
    and dw, and cleared. SSA use-def chains carry those lifetimes, so MLIR's
    own dominance checks and `hpr-verify` together prove a plan sound.
  }];
  let useDefaultTypePrinterParser = 1;
}

class HPR_Op<string mnemonic, list<Trait> traits = []>
    : Op<HPR_Dialect, mnemonic, traits>;

#endif // HPR_DIALECT
