// RUN: hp-recompute-opt %s --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-insert-recompute)))' | FileCheck %s --check-prefix=JIT
// RUN: hp-recompute-opt %s --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-insert-recompute{policy=lookahead distance=0})))' | FileCheck %s --check-prefix=LA0
// RUN: hp-recompute-opt %s --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-insert-recompute{policy=lookahead distance=1})))' | FileCheck %s --check-prefix=LA1
// RUN: hp-recompute-opt %s --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-insert-recompute{policy=lookahead distance=9})))' | FileCheck %s --check-prefix=LA9
// RUN: not hp-recompute-opt %s --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-insert-recompute{policy=soon})))' 2>&1 | FileCheck %s --check-prefix=BAD-POLICY
// RUN: not hp-recompute-opt %s --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-insert-recompute{policy=bubble})))' 2>&1 | FileCheck %s --check-prefix=BUBBLE
// RUN: not hp-recompute-opt %s --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-insert-recompute{distance=2})))' 2>&1 | FileCheck %s --check-prefix=DISTANCE

hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
  hpr.stage 2 {
    hpr.region "l2" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
hpr.schedule "prefetch_past_recv" ranks 2 stages 3 microbatches 2 stage_to_rank [1, 0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 1 mb 0
    %s0 = hpr.session %h0 as "s1.mb0"
    %h1 = hpr.forward stage 1 mb 1
    %s1 = hpr.session %h1 as "s1.mb1"
    hpr.recv_b stage 1 mb 0 peer 1
    hpr.backward_input stage 1 mb 0 session(%s0)
    hpr.backward_weight stage 1 mb 0 session(%s0)
    hpr.recv_b stage 1 mb 1 peer 1
    hpr.backward_input stage 1 mb 1 session(%s1)
    hpr.backward_weight stage 1 mb 1 session(%s1)
  }
  hpr.program rank 1 {
    %h2 = hpr.forward stage 2 mb 0
    %s2 = hpr.session %h2 as "s2.mb0"
    hpr.backward stage 2 mb 0 session(%s2)
  }
}

// The first stage's I reads nothing and no session (HPROps.td): its W is the
// session's one reader and the whole backward, so jit replays inside it.
hpr.schedule "first_stage_dw_reads" ranks 1 stages 2 microbatches 1 stage_to_rank [0, 0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    %h1 = hpr.forward stage 1 mb 0
    hpr.backward_input stage 0 mb 0
    hpr.backward_weight stage 0 mb 0 session(%s0)
  }
}

// jit: right before the first consumer. A session read by I and W replays
// whole before I; one read by a single B replays inside it.
// JIT:      hpr.recv_b stage 1 mb 0
// JIT-NEXT: hpr.recompute %s1.mb0{{$}}
// JIT-NEXT: hpr.backward_input stage 1 mb 0
// JIT-NEXT: hpr.backward_weight stage 1 mb 0
// JIT-NEXT: hpr.recv_b stage 1 mb 1
// JIT-NEXT: hpr.recompute %s1.mb1{{$}}
// JIT-NEXT: hpr.backward_input stage 1 mb 1
// JIT:      %s2.mb0 = hpr.session
// JIT-NEXT: hpr.recompute %s2.mb0 {in_backward}
// JIT-NEXT: hpr.backward stage 2 mb 0
// JIT-LABEL: hpr.schedule "first_stage_dw_reads"
// JIT:      hpr.backward_input stage 0 mb 0{{$}}
// JIT-NEXT: hpr.recompute %s0.mb0 {in_backward}
// JIT-NEXT: hpr.backward_weight stage 0 mb 0 session(%s0.mb0)

// lookahead, distance 0: above the receives the dx waits on, no further.
// LA0:      hpr.forward stage 1 mb 1
// LA0-NEXT: hpr.recompute %s1.mb0
// LA0-NEXT: %s1.mb1 = hpr.session
// LA0-NEXT: hpr.recv_b stage 1 mb 0
// LA0:      hpr.backward_weight stage 1 mb 0
// LA0-NEXT: hpr.recompute %s1.mb1
// LA0-NEXT: hpr.recv_b stage 1 mb 1

// lookahead, distance 1: one compute action earlier, but never above the
// session's own forward.
// LA1:      %s1.mb0 = hpr.session
// LA1-NEXT: hpr.recompute %s1.mb0
// LA1-NEXT: hpr.forward stage 1 mb 1
// LA1:      hpr.backward_input stage 1 mb 0
// LA1-NEXT: hpr.recompute %s1.mb1
// LA1-NEXT: hpr.backward_weight stage 1 mb 0
// The first stage's I reads no session but is still a compute action of
// the program: one compute action above its W is above that I.
// LA1-LABEL: hpr.schedule "first_stage_dw_reads"
// LA1:       hpr.forward stage 1 mb 0
// LA1-NEXT:  hpr.recompute %s0.mb0
// LA1-NEXT:  hpr.backward_input stage 0 mb 0{{$}}

// LA9:      %s1.mb0 = hpr.session
// LA9-NEXT: hpr.recompute %s1.mb0
// LA9:      %s1.mb1 = hpr.session
// LA9-NEXT: hpr.recompute %s1.mb1
// LA9-NEXT: hpr.recv_b stage 1 mb 0

// BAD-POLICY: for the --policy option: Cannot find option named 'soon'!

// Placing by time is another pass; a distance without lookahead is refused
// once, not once per program.
// BUBBLE: for the --policy option: Cannot find option named 'bubble'!
// DISTANCE: error: hpr-insert-recompute: distance applies to policy=lookahead only
// DISTANCE-NOT: error

// A dw marked weight_replay replays again right before itself (before its
// overlapped pair), whatever the policy; where its session is not read by
// its dx first (the first stage, whose dx reads nothing) or it reads none (a
// plain microbatch), nothing replays for it and the mark goes.
hpr.schedule "weight_replay" ranks 1 stages 2 microbatches 2 stage_to_rank [0, 0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    %h1 = hpr.forward stage 1 mb 0
    %s1 = hpr.session %h1 as "s1.mb0"
    %h2 = hpr.forward stage 1 mb 1 no_checkpoint
    hpr.backward_input stage 1 mb 0 session(%s1)
    hpr.backward_input stage 1 mb 1
    hpr.backward_input stage 0 mb 0
    %h3 = hpr.forward stage 0 mb 1 overlap
    hpr.backward_weight stage 1 mb 0 session(%s1) overlap weight_replay
    hpr.backward_weight stage 1 mb 1 weight_replay
    hpr.backward_weight stage 0 mb 0 session(%s0) weight_replay
  }
}
// JIT-LABEL: hpr.schedule "weight_replay"
// JIT:       hpr.recompute %s1.mb0{{$}}
// JIT-NEXT:  hpr.backward_input stage 1 mb 0 session(%s1.mb0)
// JIT:       hpr.recompute %s1.mb0 {for_weight}
// JIT-NEXT:  hpr.forward stage 0 mb 1 overlap
// JIT-NEXT:  hpr.backward_weight stage 1 mb 0 session(%s1.mb0) overlap weight_replay
// JIT-NEXT:  hpr.backward_weight stage 1 mb 1{{$}}
// JIT-NEXT:  hpr.recompute %s0.mb0 {in_backward}
// JIT-NEXT:  hpr.backward_weight stage 0 mb 0 session(%s0.mb0){{$}}
// LA9-LABEL: hpr.schedule "weight_replay"
// LA9:       hpr.recompute %s1.mb0 {for_weight}
// LA9-NEXT:  hpr.forward stage 0 mb 1 overlap
// LA9-NEXT:  hpr.backward_weight stage 1 mb 0 session(%s1.mb0) overlap weight_replay
