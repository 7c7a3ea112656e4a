// RUN: hp-recompute-opt %s -split-input-file -hpr-verify-comm -verify-diagnostics
// The same cases through stock mlir-opt-19 with the plugin: test/tools/hpr-plugin/plugin.test.

// One planted schedule bug per case, reported at the op of the action with
// its rank, action index and action (as the CSV reader would name it).

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "correct_1f1b_passes" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "deleted_send_f" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    // expected-error @+1 {{rank 0, action 0 (0F0): no SEND_F after it (stage 1 is on rank 1)}}
    %h0 = hpr.forward stage 0 mb 0
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "receive_without_send" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h0 = hpr.forward stage 1 mb 0
    // expected-error @+1 {{rank 1, action 2 (1B0): no SEND_B after it (stage 0 is on rank 0)}}
    hpr.backward stage 1 mb 0
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
// Rank 0 waits for the gradient before it sends the activation the gradient
// needs: a cycle of two waiting ranks.
hpr.schedule "deadlock" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    // expected-error @+1 {{deadlock: rank 0, action 1 (0RECV_B0) waits for 1SEND_B0 at rank 1, action 3 (1SEND_B0); rank 1, action 0 (1RECV_F0) waits for 0SEND_F0 at rank 0, action 2 (0SEND_F0)}}
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.send_f stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
    // expected-note @+1 {{rank 1 waits here}}
    hpr.recv_f stage 1 mb 0 peer 0
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
  }
}

// -----

hpr.model "one" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
// A rule about the schedule as a whole is reported at the hpr.schedule.
// expected-error @+1 {{stage 0, microbatch 1: never backpropagated (no B, or I and W)}}
hpr.schedule "dw_before_dx_and_a_missing_backward" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %h1 = hpr.forward stage 0 mb 1
    // expected-error @+1 {{rank 0, action 2 (0W0): dw before its dx (rank 0, action 3 (0I0))}}
    hpr.backward_weight stage 0 mb 0
    hpr.backward_input stage 0 mb 0
  }
}

// -----

// expected-error @+1 {{expected an hpr.model and an hpr.schedule}}
module {
  hpr.model "empty" {
    hpr.stage 0 {
      hpr.region "layers.0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
    }
  }
}

// -----

// A model with fewer stages than the schedule: the last stage has no costs.
hpr.model "one" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
// expected-error @+1 {{the schedule has 2 stages and hpr.model "one" has 1; they must agree}}
hpr.schedule "model_too_short" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
  }
}

// -----

// A rank with no actions: rules on actions cannot see it, so it is checked
// on its own, whether or not stage_to_rank gives the rank a stage.
hpr.model "one" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "idle_rank" ranks 2 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.backward stage 0 mb 0
  }
  // expected-error @+1 {{rank 1 has no actions; stage_to_rank gives it no stage: use fewer ranks}}
  hpr.program rank 1 {
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "lost_rank" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
  }
  // expected-error @+1 {{rank 1 has no actions; it runs stage 1, whose actions must be in it}}
  hpr.program rank 1 {
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "send_before_its_producer" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    // expected-error @+1 {{rank 0, action 0 (0SEND_F0): send before the action that produces it (rank 0, action 1 (0F0))}}
    hpr.send_f stage 0 mb 0 peer 1
    %h0 = hpr.forward stage 0 mb 0
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "receive_after_its_consumer" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
    %h0 = hpr.forward stage 1 mb 0
    // expected-error @+1 {{rank 1, action 1 (1RECV_F0): receive after the action that needs it (rank 1, action 0 (1F0))}}
    hpr.recv_f stage 1 mb 0 peer 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "duplicate_tag_towards_one_peer" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1 tag 7
    %h1 = hpr.forward stage 0 mb 1
    // expected-error @+1 {{rank 0, action 3 (0SEND_F1): tag 7 is already used by rank 0, action 1 (0SEND_F0), another send to rank 1; a receive takes the first message from its source with its tag, so tags must be unique per peer and direction}}
    hpr.send_f stage 0 mb 1 peer 1 tag 7
    hpr.recv_b stage 0 mb 0 peer 1 tag 1
    hpr.backward stage 0 mb 0
    hpr.recv_b stage 0 mb 1 peer 1 tag 3
    hpr.backward stage 0 mb 1
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0 tag 7
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0 tag 1
    // expected-error @+1 {{rank 1, action 4 (1RECV_F1): tag 7 is already used by rank 1, action 0 (1RECV_F0), another receive from rank 0}}
    hpr.recv_f stage 1 mb 1 peer 0 tag 7
    %h1 = hpr.forward stage 1 mb 1
    hpr.backward stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0 tag 3
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "tags_of_one_transfer_differ" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1 tag 0
    hpr.recv_b stage 0 mb 0 peer 1 tag 1
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
    // expected-error @+1 {{rank 1, action 0 (1RECV_F0): tag 4 differs from tag 0 of its send at rank 0, action 1 (0SEND_F0); both ends of a transfer carry one tag}}
    hpr.recv_f stage 1 mb 0 peer 0 tag 4
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0 tag 1
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "untagged_transfer_among_tagged" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1 tag 0
    hpr.recv_b stage 0 mb 0 peer 1 tag 1
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0 tag 0
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    // expected-error @+1 {{rank 1, action 3 (1SEND_B0): no message tag, but other transfers of this schedule have one; a tagged schedule tags every transfer}}
    hpr.send_b stage 1 mb 0 peer 0
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "reduce_grad_before_the_last_w" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %h1 = hpr.forward stage 0 mb 1
    hpr.send_f stage 0 mb 0 peer 1
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward_input stage 0 mb 0
    hpr.backward_weight stage 0 mb 0
    // expected-error @+1 {{rank 0, action 7 (0REDUCE_GRAD): REDUCE_GRAD before rank 0, action 10 (0W1), the last W or B of stage 0; gradients are reduced once per stage, after its last W and B}}
    hpr.reduce_grad stage 0
    hpr.recv_b stage 0 mb 1 peer 1
    hpr.backward_input stage 0 mb 1
    hpr.backward_weight stage 0 mb 1
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
    hpr.recv_f stage 1 mb 1 peer 0
    %h1 = hpr.forward stage 1 mb 1
    hpr.backward stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0
    hpr.reduce_grad stage 1
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "reduce_grad_twice" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
    hpr.reduce_grad stage 0
    // expected-error @+1 {{rank 0, action 5 (0REDUCE_GRAD): second REDUCE_GRAD of stage 0 (first at rank 0, action 4 (0REDUCE_GRAD)); gradients are reduced once per stage, or they are scaled twice [hpr.schedule.reduce-grad]}}
    hpr.reduce_grad stage 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
  }
}

// -----
// Rule 9, where receives carry `posts` (a plan read back): each receive is
// posted once, no later than its place, and in the order its peer sends.
hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "posted_where_they_stand_passes" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 0 peer 1 posts [4]
    hpr.backward stage 0 mb 0
    hpr.recv_b stage 0 mb 1 peer 1 posts [6]
    hpr.backward stage 0 mb 1
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0 posts [0]
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
    hpr.recv_f stage 1 mb 1 peer 0 posts [4]
    %h1 = hpr.forward stage 1 mb 1
    hpr.backward stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "posted_early_together_passes" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 0 peer 1 posts [4, 6]
    hpr.backward stage 0 mb 0
    hpr.recv_b stage 0 mb 1 peer 1 posts []
    hpr.backward stage 0 mb 1
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0 posts [0, 4]
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
    hpr.recv_f stage 1 mb 1 peer 0 posts []
    %h1 = hpr.forward stage 1 mb 1
    hpr.backward stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "posts_a_forward" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 0 peer 1 posts [4]
    hpr.backward stage 0 mb 0
    hpr.recv_b stage 0 mb 1 peer 1 posts [6]
    hpr.backward stage 0 mb 1
  }
  hpr.program rank 1 {
    // expected-error @+2 {{rank 1, action 0 (1RECV_F0): posts 1, which is not a receive of rank 1 (rank 1, action 1 (1F0)); posts lists the indices of receives [hpr.schedule.posts]}}
    // expected-error @+1 {{rank 1, action 0 (1RECV_F0): never posted: no receive lists it in posts; a plan posts each receive once, no later than its own place [hpr.schedule.posts]}}
    hpr.recv_f stage 1 mb 0 peer 0 posts [1]
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
    hpr.recv_f stage 1 mb 1 peer 0 posts [4]
    %h1 = hpr.forward stage 1 mb 1
    hpr.backward stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "posted_twice" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 0 peer 1 posts [4]
    hpr.backward stage 0 mb 0
    hpr.recv_b stage 0 mb 1 peer 1 posts [6]
    hpr.backward stage 0 mb 1
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0 posts [0, 4]
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
    // expected-error @+1 {{rank 1, action 4 (1RECV_F1): posts rank 1, action 4 (1RECV_F1) again (rank 1, action 0 (1RECV_F0) posts it first); each receive is posted once [hpr.schedule.posts]}}
    hpr.recv_f stage 1 mb 1 peer 0 posts [4]
    %h1 = hpr.forward stage 1 mb 1
    hpr.backward stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "posted_after_its_place" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 0 peer 1 posts [4]
    hpr.backward stage 0 mb 0
    hpr.recv_b stage 0 mb 1 peer 1 posts [6]
    hpr.backward stage 0 mb 1
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0 posts []
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
    // expected-error @+1 {{rank 1, action 4 (1RECV_F1): posts rank 1, action 0 (1RECV_F0), which comes before it; a receive is posted no later than its own place [hpr.schedule.posts]}}
    hpr.recv_f stage 1 mb 1 peer 0 posts [0, 4]
    %h1 = hpr.forward stage 1 mb 1
    hpr.backward stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0
  }
}

// -----

hpr.model "two" {
  hpr.stage 0 {
    hpr.region "layers.0" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
  hpr.stage 1 {
    hpr.region "layers.1" checkpoint flops 1.0e6 time_us 0.0 saved 4096 input 512 params 1024
  }
}
hpr.schedule "posted_out_of_the_peers_send_order" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 0 peer 1 posts [4]
    hpr.backward stage 0 mb 0
    hpr.recv_b stage 0 mb 1 peer 1 posts [6]
    hpr.backward stage 0 mb 1
  }
  hpr.program rank 1 {
    // expected-error @+1 {{rank 1, action 0 (1RECV_F0): posts rank 1, action 0 (1RECV_F0) after rank 1, action 4 (1RECV_F1), but rank 0 sends its message first; receives from one peer are posted in the order it sends, since untagged messages match in posting order [hpr.schedule.posts]}}
    hpr.recv_f stage 1 mb 0 peer 0 posts [4, 0]
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
    hpr.recv_f stage 1 mb 1 peer 0 posts []
    %h1 = hpr.forward stage 1 mb 1
    hpr.backward stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0
  }
}
