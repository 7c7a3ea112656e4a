//===- HPRTypes.td - hpr dialect types ---------------------*- tablegen -*-===//

#ifndef HPR_TYPES
#define HPR_TYPES

include "hpr/Dialect/HPR/HPRDialect.td"
include "mlir/IR/AttrTypeBase.td"

class HPR_Type<string name, string typeMnemonic>
    : TypeDef<HPR_Dialect, name> {
  let mnemonic = typeMnemonic;
}

def HPR_HandleType : HPR_Type<"Handle", "handle"> {
  let summary = "checkpoint handles of one (stage, microbatch) forward";
  let description = [{
    Produced by `hpr.forward`: the checkpoint frames its forward created,
    which a later recompute can replay.
  }];
}

def HPR_SessionType : HPR_Type<"Session", "session"> {
  let summary = "a recompute session: one replay shared by its consumers";
  let description = [{
    Produced by `hpr.session`. Recomputed once by `hpr.recompute`, read by
    backward actions, dropped by `hpr.clear`.
  }];
}

#endif // HPR_TYPES
