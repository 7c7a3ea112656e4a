// RUN: hp-recompute-opt %s | FileCheck %s
// RUN: hp-recompute-opt %s | hp-recompute-opt | FileCheck %s
// RUN: hp-recompute-opt %s --mlir-print-op-generic | hp-recompute-opt | FileCheck %s

// Every hpr op once, printed and parsed back.

// CHECK-LABEL: hpr.model "m"
// CHECK:         hpr.stage 0 {
// CHECK-NEXT:      hpr.region "embed" non_checkpointable flops 1.000000e+00 time_us 0.000000e+00 saved 8 input 0 params 16
// CHECK-NEXT:      hpr.region "layers.0" checkpoint flops 2.500000e+06 time_us 1.250000e+01 saved 4096 input 512 params 1024
// CHECK:         hpr.stage 1 {
// CHECK-NEXT:      hpr.region "layers.1" flops
// CHECK-NEXT:      hpr.region "layers.2" checkpoint selective flops 1.000000e+00 time_us 0.000000e+00 saved 8 input 4 params 0 {selective_replay_time_us = 2.500000e-01 : f64, selective_saved_bytes = 2 : i64}
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "embed" non_checkpointable flops 1.0 time_us 0.0 saved 8 input 0 params 16
    hpr.region "layers.0" checkpoint flops 2.5e6 time_us 12.5 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" flops 1.0 time_us 0.0 saved 8 input 0 params 0
    hpr.region "layers.2" checkpoint selective flops 1.0 time_us 0.0 saved 8 input 4 params 0 {selective_replay_time_us = 0.25 : f64, selective_saved_bytes = 2 : i64}
  }
}

// CHECK-LABEL: hpr.schedule "all_ops" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1]
// CHECK:       hpr.program rank 0 {
// CHECK-NEXT:    hpr.unshard stage 0
// CHECK-NEXT:    %[[H:.*]] = hpr.forward stage 0 mb 0
// CHECK-NEXT:    %[[S:.*]] = hpr.session %[[H]] as "s0.mb0"
// CHECK-NEXT:    hpr.send_f stage 0 mb 0 peer 1
// CHECK-NEXT:    %[[H1:.*]] = hpr.forward stage 0 mb 1 overlap
// CHECK-NEXT:    hpr.backward stage 0 mb 0 overlap
// CHECK-NEXT:    hpr.idle
// CHECK-NEXT:    hpr.recv_b stage 0 mb 1 peer 1 batched
// CHECK-NEXT:    hpr.send_f stage 0 mb 1 peer 1{{$}}
// CHECK-NEXT:    hpr.recompute %[[S]]
// CHECK-NEXT:    hpr.backward_input stage 0 mb 0 session(%[[S]]) retain_on_unpack
// CHECK-NEXT:    hpr.backward_weight stage 0 mb 0 session(%[[S]])
// CHECK-NEXT:    hpr.clear %[[S]]
// CHECK-NEXT:    hpr.reshard stage 0
// CHECK-NEXT:    hpr.reduce_grad stage 0
// CHECK-NEXT:  }
// CHECK:       hpr.program rank 1 {
// CHECK-NEXT:    hpr.recv_f stage 1 mb 0 peer 0 tag 0 posts [0]{{$}}
// CHECK-NEXT:    hpr.forward stage 1 mb 0
// CHECK-NEXT:    hpr.send_b stage 1 mb 0 peer 0 tag 3
hpr.schedule "all_ops" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    hpr.unshard stage 0
    %h = hpr.forward stage 0 mb 0
    %s = hpr.session %h as "s0.mb0"
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1 overlap
    hpr.backward stage 0 mb 0 overlap
    hpr.idle
    hpr.recv_b stage 0 mb 1 peer 1 batched
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recompute %s
    hpr.backward_input stage 0 mb 0 session(%s) retain_on_unpack
    hpr.backward_weight stage 0 mb 0 session(%s)
    hpr.clear %s
    hpr.reshard stage 0
    hpr.reduce_grad stage 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0 tag 0 posts [0]
    %h = hpr.forward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0 tag 3
  }
}

// Result names say what a value is.
// CHECK-LABEL: hpr.schedule "names"
// CHECK:         %h0.mb1 = hpr.forward stage 0 mb 1
// CHECK-NEXT:    %s0.mb1 = hpr.session %h0.mb1 as "s0.mb1"
hpr.schedule "names" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 {
    %0 = hpr.forward stage 0 mb 1
    %1 = hpr.session %0 as "s0.mb1"
  }
}

// A session replayed again for its dw: the dx drops the first replay
// (drops_replay), a second one before the dw brings back what it reads.
// CHECK-LABEL: hpr.schedule "weight_replay"
// CHECK:         hpr.recompute %[[W:.*]]{{$}}
// CHECK-NEXT:    hpr.backward_input stage 0 mb 0 session(%[[W]]) retain_on_unpack drops_replay
// CHECK-NEXT:    hpr.recompute %[[W]] {for_weight}
// CHECK-NEXT:    hpr.backward_weight stage 0 mb 0 session(%[[W]]) weight_replay
hpr.schedule "weight_replay" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    %s = hpr.session %h as "s0.mb0"
    hpr.recompute %s
    hpr.backward_input stage 0 mb 0 session(%s) retain_on_unpack drops_replay
    hpr.recompute %s {for_weight}
    hpr.backward_weight stage 0 mb 0 session(%s) weight_replay
    hpr.clear %s
  }
}
