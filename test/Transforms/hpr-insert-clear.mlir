// RUN: hp-recompute-opt %s -split-input-file --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-insert-clear)))' -verify-diagnostics | FileCheck %s

hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
// dx retains for dw; dw, the last reader, does not; the clear follows it.
// CHECK-LABEL: hpr.schedule "dx_retains_dw_clears"
// CHECK:       hpr.recompute %[[S:.*]]
// CHECK-NEXT:  hpr.backward_input stage 0 mb 0 session(%[[S]]) retain_on_unpack
// CHECK-NEXT:  hpr.forward stage 0 mb 1
// CHECK-NEXT:  hpr.backward_weight stage 0 mb 0 session(%[[S]]){{$}}
// CHECK-NEXT:  hpr.clear %[[S]]
// CHECK-NEXT:  hpr.backward stage 0 mb 1
hpr.schedule "dx_retains_dw_clears" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    hpr.recompute %s0
    hpr.backward_input stage 0 mb 0 session(%s0) retain_on_unpack
    %h1 = hpr.forward stage 0 mb 1
    hpr.backward_weight stage 0 mb 0 session(%s0) retain_on_unpack
    hpr.backward stage 0 mb 1
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
// A full backward in an overlapped pair: the clear goes after the pair.
// CHECK-LABEL: hpr.schedule "clear_after_overlapped_pair"
// CHECK:       hpr.forward stage 0 mb 1 overlap
// CHECK-NEXT:  hpr.backward stage 0 mb 0 session(%[[S:.*]]) overlap
// CHECK-NEXT:  hpr.clear %[[S]]
hpr.schedule "clear_after_overlapped_pair" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    hpr.recompute %s0
    %h1 = hpr.forward stage 0 mb 1 overlap
    hpr.backward stage 0 mb 0 session(%s0) overlap
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
hpr.schedule "cleared_twice" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    hpr.recompute %s0
    hpr.backward stage 0 mb 0 session(%s0)
    // expected-error @+1 {{already exists for session "s0.mb0": hpr-insert-clear runs once}}
    hpr.clear %s0
  }
}
