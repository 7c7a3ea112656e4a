// RUN: hp-recompute-opt %s -split-input-file --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-assign-sessions)))' -verify-diagnostics | FileCheck %s

// Stages 0 and 1 are checkpointed, stage 2 is not: only stages 0 and 1 get
// sessions, and dx and dw of one microbatch share one. The first stage's dx
// reads no activation (the model input needs no gradient), so its session
// has one reader, its dw.

hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
  hpr.stage 2 {
    hpr.region "l2" flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
// CHECK-LABEL: hpr.schedule "dx_then_dw_shares_session"
// CHECK:         %[[H0:.*]] = hpr.forward stage 0 mb 0
// CHECK-NEXT:    %[[S0:.*]] = hpr.session %[[H0]] as "s0.mb0"
// CHECK-NEXT:    %[[H1:.*]] = hpr.forward stage 1 mb 0
// CHECK-NEXT:    %[[S1:.*]] = hpr.session %[[H1]] as "s1.mb0"
// CHECK-NEXT:    hpr.forward stage 2 mb 0
// CHECK-NOT:     hpr.session
// CHECK-NEXT:    hpr.backward_input stage 2 mb 0{{$}}
// CHECK-NEXT:    hpr.backward_input stage 1 mb 0 session(%[[S1]])
// CHECK-NEXT:    hpr.backward_input stage 0 mb 0{{$}}
// CHECK-NEXT:    hpr.backward_weight stage 2 mb 0{{$}}
// CHECK-NEXT:    hpr.backward_weight stage 1 mb 0 session(%[[S1]])
// CHECK-NEXT:    hpr.backward_weight stage 0 mb 0 session(%[[S0]])
hpr.schedule "dx_then_dw_shares_session" ranks 1 stages 3 microbatches 1 stage_to_rank [0, 0, 0] {
  hpr.program rank 0 {
    %0 = hpr.forward stage 0 mb 0
    %1 = hpr.forward stage 1 mb 0
    %2 = hpr.forward stage 2 mb 0
    hpr.backward_input stage 2 mb 0
    hpr.backward_input stage 1 mb 0
    hpr.backward_input stage 0 mb 0
    hpr.backward_weight stage 2 mb 0
    hpr.backward_weight stage 1 mb 0
    hpr.backward_weight stage 0 mb 0
  }
}

// -----

// The session of a paired forward goes after the pair; a forward nobody
// reads back gets no session.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
// CHECK-LABEL: hpr.schedule "session_after_overlapped_pair"
// CHECK:         %[[H0:.*]] = hpr.forward stage 0 mb 0
// CHECK-NEXT:    %[[S0:.*]] = hpr.session %[[H0]] as "s0.mb0"
// CHECK-NEXT:    %[[H1:.*]] = hpr.forward stage 0 mb 1 overlap
// CHECK-NEXT:    hpr.backward stage 0 mb 0 session(%[[S0]]) overlap
// CHECK-NEXT:    hpr.session %[[H1]] as "s0.mb1"
// CHECK-NEXT:    hpr.backward stage 0 mb 1 session
// CHECK-NEXT:    hpr.forward stage 0 mb 2
// CHECK-NEXT:  }
hpr.schedule "session_after_overlapped_pair" ranks 1 stages 1 microbatches 3 stage_to_rank [0] {
  hpr.program rank 0 {
    %0 = hpr.forward stage 0 mb 0
    %1 = hpr.forward stage 0 mb 1 overlap
    hpr.backward stage 0 mb 0 overlap
    hpr.backward stage 0 mb 1
    %2 = hpr.forward stage 0 mb 2
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
hpr.schedule "assigned_twice" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %0 = hpr.forward stage 0 mb 0
    // expected-error @+1 {{already exists: hpr-assign-sessions runs once}}
    %1 = hpr.session %0 as "s0.mb0"
    hpr.backward stage 0 mb 0 session(%1)
  }
}

// -----

module {
  hpr.schedule "no_model" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
    // expected-error @+1 {{expected exactly one hpr.model in the enclosing module, found 0}}
    hpr.program rank 0 {
      %0 = hpr.forward stage 0 mb 0
    }
  }
}
