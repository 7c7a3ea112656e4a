// RUN: hp-recompute-opt %s -split-input-file -verify-diagnostics

// One case per verifier message of the hpr dialect.

hpr.model "m" {
  // expected-error @+1 {{'builtin.module' op is not allowed in 'hpr.model'; expected only 'hpr.stage'}}
  builtin.module {}
}

// -----

hpr.model "m" {
  // expected-error @+1 {{'hpr.stage' op has index 1, expected 0 (stages are numbered 0, 1, ... in order)}}
  hpr.stage 1 {}
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    // expected-error @+1 {{'builtin.module' op is not allowed in 'hpr.stage'; expected only 'hpr.region'}}
    builtin.module {}
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    // expected-error @+1 {{region 'layers.0' is marked selective but not checkpoint}}
    hpr.region "layers.0" selective flops 1.0 time_us 0.0 saved 1 input 0 params 0 {selective_replay_time_us = 1.0 : f64}
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    // expected-error @+1 {{region 'layers.0' is marked selective without its measured selective costs (selective_replay_time_us)}}
    hpr.region "layers.0" checkpoint selective flops 1.0 time_us 0.0 saved 1 input 0 params 0
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    // expected-error @+1 {{region 'embed' is marked both checkpoint and non_checkpointable}}
    hpr.region "embed" checkpoint non_checkpointable flops 1.0 time_us 0.0 saved 1 input 0 params 0
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    // expected-error @+1 {{region 'l0' has a negative time or FLOP cost}}
    hpr.region "l0" flops -1.0 time_us 0.0 saved 1 input 0 params 0
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    // expected-error @+1 {{region 'l0' has a negative time or FLOP cost}}
    hpr.region "l0" flops 1.0 time_us 0.0 saved 1 input 0 params 0 {bwd_weight_time_us = -2.0 : f64}
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    // expected-error @+1 {{region 'l0' has negative 'bwd_workspace_bytes' bytes}}
    hpr.region "l0" flops 1.0 time_us 0.0 saved 1 input 0 params 0 {bwd_workspace_bytes = -3 : i64}
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    // expected-error @+1 {{region 'l0' has negative 'saved' bytes}}
    hpr.region "l0" flops 1.0 time_us 0.0 saved -4 input 0 params 0
  }
}

// -----

// expected-error @+1 {{'hpr.schedule' op attribute 'num_ranks' failed to satisfy constraint: 64-bit signless integer attribute whose value is positive}}
hpr.schedule "s" ranks 0 stages 1 microbatches 1 stage_to_rank [0] {
}

// -----

hpr.schedule "s" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    // expected-error @+1 {{'hpr.forward' op attribute 'microbatch' failed to satisfy constraint: 64-bit signless integer attribute whose value is non-negative}}
    %h = hpr.forward stage 0 mb -1
  }
}

// -----

hpr.schedule "s" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    // expected-error @+1 {{'func.call' op is not allowed in 'hpr.program'; expected hpr actions and hpr.session}}
    func.call @f() : () -> ()
  }
}

// -----

// expected-error @+1 {{stage_to_rank has 1 entries for 2 stages}}
hpr.schedule "s" ranks 1 stages 2 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {}
}

// -----

// expected-error @+1 {{stage_to_rank maps stage 1 to rank 5, outside [0, 2)}}
hpr.schedule "s" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 5] {
  hpr.program rank 0 {}
  hpr.program rank 1 {}
}

// -----

hpr.schedule "s" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  // expected-error @+1 {{'builtin.module' op is not allowed in 'hpr.schedule'; expected only 'hpr.program'}}
  builtin.module {}
}

// -----

hpr.schedule "s" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  // expected-error @+1 {{'hpr.program' op is for rank 1, expected rank 0 (one program per rank, in rank order)}}
  hpr.program rank 1 {}
  hpr.program rank 0 {}
}

// -----

// expected-error @+1 {{'hpr.schedule' op has 1 programs for 2 ranks}}
hpr.schedule "s" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {}
}

// -----

hpr.schedule "s" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 {
    // expected-error @+1 {{is marked overlap but is not immediately followed by a backward action marked overlap}}
    %h = hpr.forward stage 0 mb 1 overlap
    hpr.idle
  }
}

// -----

hpr.schedule "s" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    // expected-error @+1 {{is marked overlap but does not follow a forward marked overlap}}
    hpr.backward stage 0 mb 0 overlap
  }
}

// -----

hpr.schedule "s" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 {
    // expected-error @+1 {{is marked overlap but ends the program}}
    %h = hpr.forward stage 0 mb 0 overlap
  }
}

// -----

hpr.schedule "s" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    // expected-error @+1 {{stage 3 is out of range: the schedule has 1 stages}}
    %h = hpr.forward stage 3 mb 0
  }
}

// -----

hpr.schedule "s" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    // expected-error @+1 {{microbatch 4 is out of range: the schedule has 1 microbatches}}
    hpr.backward_input stage 0 mb 4
  }
}

// -----

hpr.schedule "s" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    // expected-error @+1 {{stage 1 runs on rank 1, but this action is in the program of rank 0}}
    hpr.backward_weight stage 1 mb 0
  }
  hpr.program rank 1 {}
}

// -----

hpr.schedule "s" ranks 1 stages 2 microbatches 2 stage_to_rank [0, 0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 1
    %s = hpr.session %h as "s0.mb1"
    hpr.recompute %s
    // expected-error @+1 {{'hpr.backward_input' op of stage 0 mb 0 reads session "s0.mb1" of stage 0 mb 1}}
    hpr.backward_input stage 0 mb 0 session(%s)
  }
}

// -----

hpr.schedule "s" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    // expected-error @+1 {{'hpr.recv_f' op of stage 0 has no neighbouring stage -1}}
    hpr.recv_f stage 0 mb 0 peer 1
  }
  hpr.program rank 1 {}
}

// -----

hpr.schedule "s" ranks 3 stages 3 microbatches 1 stage_to_rank [0, 1, 2] {
  hpr.program rank 0 {
    // expected-error @+1 {{'hpr.send_f' op of stage 0 talks to peer 2, but stage 1 runs on rank 1}}
    hpr.send_f stage 0 mb 0 peer 2
  }
  hpr.program rank 1 {}
  hpr.program rank 2 {}
}

// -----

hpr.schedule "s" ranks 1 stages 2 microbatches 1 stage_to_rank [0, 0] {
  hpr.program rank 0 {
    // expected-error @+1 {{'hpr.send_b' op of stage 1 transfers to its own rank; co-located stages need no send/recv}}
    hpr.send_b stage 1 mb 0 peer 0
  }
}

// -----

hpr.schedule "s" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    // expected-error @+1 {{'hpr.session' op "s0.mb1" binds the handle of the forward of stage 0 mb 0; expected id "s0.mb0"}}
    %s = hpr.session %h as "s0.mb1"
  }
}

// -----

hpr.schedule "s" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = builtin.unrealized_conversion_cast to !hpr.handle
    // expected-error @+1 {{'hpr.session' op binds a handle that no hpr.forward produced}}
    %s = hpr.session %h as "s0.mb0"
  }
}

// -----

hpr.schedule "s" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    // expected-error @+1 {{use of undeclared SSA value name}}
    hpr.recompute %elsewhere
  }
}

// -----

hpr.schedule "s" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    // expected-error @+1 {{'hpr.send_f' op is marked batched but the next action is not a transfer}}
    hpr.send_f stage 0 mb 0 peer 1 batched
    hpr.idle
  }
  hpr.program rank 1 {}
}

// -----

// The map is checked by the schedule after its ops; a transfer must not
// read past a short one first.
// expected-error @+1 {{stage_to_rank has 1 entries for 2 stages}}
hpr.schedule "s" ranks 2 stages 2 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    hpr.send_f stage 0 mb 0 peer 1
  }
  hpr.program rank 1 {}
}

// -----

hpr.schedule "s" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  // expected-error @+1 {{compute_order has 4 numbers; expected (kind, stage, microbatch) triples}}
  hpr.program rank 0 attributes {compute_order = array<i64: 0, 0, 0, 3>} {
  }
}

// -----

hpr.schedule "s" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  // expected-error @+1 {{compute_order entry 0 has kind 7; expected 0 (forward), 1 (backward_input), 2 (backward_weight) or 3 (backward)}}
  hpr.program rank 0 attributes {compute_order = array<i64: 7, 0, 0>} {
  }
}
