//===- HPRInterfaces.td - hpr action interface -------------*- tablegen -*-===//

#ifndef HPR_INTERFACES
#define HPR_INTERFACES

include "mlir/IR/OpBase.td"

def HPR_ActionOpInterface : OpInterface<"ActionOpInterface"> {
  let cppNamespace = "::mlir::hpr";
  let description = [{
    An entry of a rank's program. Gives passes and exporters one way to ask
    any action which (stage, microbatch) it belongs to and what it is called
    in the plan formats.
  }];
  let methods = [
    InterfaceMethod<"The stage this action runs for, or -1.", "int64_t",
                    "getStageIndex">,
    InterfaceMethod<"The microbatch, or -1 when the action has none.",
                    "int64_t", "getMicrobatchIndex">,
    InterfaceMethod<"The `op` name used by the plan JSON.", "::llvm::StringRef",
                    "getPlanName">,
  ];
}

def HPR_ConsumerOpInterface : OpInterface<"ConsumerOpInterface"> {
  let cppNamespace = "::mlir::hpr";
  let description = [{
    A backward action that reads saved activations: with a session bound,
    it consumes the session's recomputed tensors.
  }];
  let methods = [
    InterfaceMethod<"The session read, or null.", "::mlir::Value",
                    "getSessionValue">,
    InterfaceMethod<"Binds (or with null, unbinds) a session.", "void",
                    "setSessionValue", (ins "::mlir::Value":$session)>,
    InterfaceMethod<"Whether the session outlives this unpack.", "bool",
                    "getRetainOnUnpackFlag">,
    InterfaceMethod<"Sets retain_on_unpack.", "void", "setRetainOnUnpackFlag",
                    (ins "bool":$retain)>,
    InterfaceMethod<[{Whether it reads saved activations: all but the first
                      stage's backward_input, which computes nothing (the
                      model input needs no gradient).}], "bool",
                    "readsActivations">,
    InterfaceMethod<[{Whether it is its (stage, microbatch)'s whole backward:
                      backward, and the first stage's backward_weight.}],
                    "bool", "isWholeBackward">,
  ];
}

#endif // HPR_INTERFACES
