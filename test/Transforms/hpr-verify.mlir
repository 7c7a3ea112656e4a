// RUN: hp-recompute-opt %s -split-input-file --pass-pipeline='builtin.module(hpr.schedule(hpr.program(hpr-verify)))' -verify-diagnostics

// One planted lifecycle bug per case; each gets its own message, with the
// rank, the action index (as listed in the plan) and the action.

hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
hpr.schedule "correct_plan_passes" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    %h1 = hpr.forward stage 0 mb 1
    %s1 = hpr.session %h1 as "s0.mb1"
    hpr.recompute %s0
    hpr.recompute %s1
    hpr.backward_input stage 0 mb 0 session(%s0) retain_on_unpack
    hpr.backward_input stage 0 mb 1 session(%s1) retain_on_unpack
    hpr.backward_weight stage 0 mb 0 session(%s0)
    hpr.clear %s0
    hpr.backward_weight stage 0 mb 1 session(%s1)
    hpr.clear %s1
  }
}

// -----

hpr.schedule "recomputed_twice" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    %s = hpr.session %h as "s0.mb0"
    hpr.recompute %s
    hpr.backward_input stage 0 mb 0 session(%s) retain_on_unpack
    // expected-error @+1 {{rank 0, action 3 (recompute stage 0 mb 0): session "s0.mb0" is recomputed a second time (first at rank 0, action 1 (recompute stage 0 mb 0))}}
    hpr.recompute %s
    hpr.backward_weight stage 0 mb 0 session(%s)
    hpr.clear %s
  }
}

// -----

hpr.schedule "cleared_twice" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    %s = hpr.session %h as "s0.mb0"
    hpr.recompute %s
    hpr.backward stage 0 mb 0 session(%s)
    hpr.clear %s
    // expected-error @+1 {{rank 0, action 4 (clear stage 0 mb 0): session "s0.mb0" is cleared a second time (first at rank 0, action 3 (clear stage 0 mb 0))}}
    hpr.clear %s
  }
}

// -----

hpr.schedule "never_recomputed" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    %s = hpr.session %h as "s0.mb0"
    // expected-error @+1 {{rank 0, action 1 (backward stage 0 mb 0): reads session "s0.mb0", which is never recomputed before it}}
    hpr.backward stage 0 mb 0 session(%s)
    hpr.clear %s
  }
}

// -----

hpr.schedule "leaked_session" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    %s = hpr.session %h as "s0.mb0"
    // expected-error @+1 {{rank 0, action 1 (recompute stage 0 mb 0): session "s0.mb0" is never cleared: its recomputed tensors leak}}
    hpr.recompute %s
    hpr.backward stage 0 mb 0 session(%s)
  }
}

// -----

hpr.schedule "recompute_after_clear" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    %s = hpr.session %h as "s0.mb0"
    hpr.clear %s
    // expected-error @+2 {{rank 0, action 2 (recompute stage 0 mb 0): session "s0.mb0" is recomputed after its clear at rank 0, action 1 (clear stage 0 mb 0)}}
    // expected-error @+2 {{rank 0, action 3 (backward stage 0 mb 0): reads session "s0.mb0" after its clear at rank 0, action 1 (clear stage 0 mb 0)}}
    hpr.recompute %s
    hpr.backward stage 0 mb 0 session(%s)
  }
}

// -----

hpr.schedule "clear_before_last_consumer" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    %s = hpr.session %h as "s0.mb0"
    hpr.recompute %s
    hpr.backward_input stage 0 mb 0 session(%s) retain_on_unpack
    hpr.clear %s
    // expected-error @+1 {{rank 0, action 4 (backward_weight stage 0 mb 0): reads session "s0.mb0" after its clear at rank 0, action 3 (clear stage 0 mb 0)}}
    hpr.backward_weight stage 0 mb 0 session(%s)
  }
}

// -----

hpr.schedule "consumer_before_recompute" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    %s = hpr.session %h as "s0.mb0"
    // expected-error @+1 {{rank 0, action 1 (backward_input stage 0 mb 0): reads session "s0.mb0" before its recompute at rank 0, action 2 (recompute stage 0 mb 0)}}
    hpr.backward_input stage 0 mb 0 session(%s) retain_on_unpack
    hpr.recompute %s
    hpr.backward_weight stage 0 mb 0 session(%s)
    hpr.clear %s
  }
}

// -----

hpr.schedule "last_reader_retains" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    %s = hpr.session %h as "s0.mb0"
    hpr.recompute %s
    hpr.backward_input stage 0 mb 0 session(%s) retain_on_unpack
    // expected-error @+1 {{rank 0, action 3 (backward_weight stage 0 mb 0): is the last reader of session "s0.mb0" but sets retain_on_unpack; the tensors would outlive their last use}}
    hpr.backward_weight stage 0 mb 0 session(%s) retain_on_unpack
    hpr.clear %s
  }
}

// -----

hpr.schedule "dx_does_not_retain" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    %s = hpr.session %h as "s0.mb0"
    hpr.recompute %s
    // expected-error @+1 {{rank 0, action 2 (backward_input stage 0 mb 0): does not set retain_on_unpack, but rank 0, action 3 (backward_weight stage 0 mb 0) reads session "s0.mb0" later}}
    hpr.backward_input stage 0 mb 0 session(%s)
    hpr.backward_weight stage 0 mb 0 session(%s)
    hpr.clear %s
  }
}

// -----

hpr.schedule "two_sessions_one_forward" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    %s = hpr.session %h as "s0.mb0"
    // expected-error @+1 {{rank 0, action 0 (forward stage 0 mb 0): session "s0.mb0" is a second session for stage 0 mb 0 (first: session "s0.mb0")}}
    %t = hpr.session %h as "s0.mb0"
    hpr.recompute %s
    hpr.backward stage 0 mb 0 session(%s)
    hpr.clear %s
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
hpr.schedule "checkpointed_consumer_without_session" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h = hpr.forward stage 0 mb 0
    // expected-error @+1 {{rank 0, action 1 (backward stage 0 mb 0): reads no session, but stage 0 is checkpointed: it would recompute on its own, once per backward call}}
    hpr.backward stage 0 mb 0
  }
}

// -----

// Rules 7 and 10: the first stage's I reads no activation (the model input
// needs no gradient) and so no session; its W, the whole backward, replays
// inside. Stage 1's I reads activations, and without a session it is refused.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
hpr.schedule "first_stage_dx_reads_nothing" ranks 1 stages 2 microbatches 1 stage_to_rank [0, 0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    %h1 = hpr.forward stage 1 mb 0
    %s1 = hpr.session %h1 as "s1.mb0"
    // expected-error @+1 {{rank 0, action 2 (backward_input stage 1 mb 0): reads no session, but stage 1 is checkpointed: it would recompute on its own, once per backward call}}
    hpr.backward_input stage 1 mb 0
    hpr.recompute %s1
    hpr.backward_weight stage 1 mb 0 session(%s1)
    hpr.clear %s1
    hpr.backward_input stage 0 mb 0
    hpr.recompute %s0 {in_backward}
    hpr.backward_weight stage 0 mb 0 session(%s0)
    hpr.clear %s0
  }
}

// -----

// The compute order recorded at import (kind, stage, mb): here F0, then B0.
hpr.schedule "compute_order_swapped" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 attributes {compute_order = array<i64: 0, 0, 0, 3, 0, 0, 0, 0, 1, 3, 0, 1>} {
    %h0 = hpr.forward stage 0 mb 0
    // expected-error @+1 {{rank 0, action 1 (forward stage 0 mb 1): the imported schedule has backward stage 0 mb 0 here (compute action 1 of rank 0)}}
    %h1 = hpr.forward stage 0 mb 1
    hpr.backward stage 0 mb 0
    hpr.backward stage 0 mb 1
  }
}

// -----

hpr.schedule "compute_action_missing" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  // expected-error @+1 {{rank 0: 1 compute actions of the imported schedule are missing, from backward stage 0 mb 0}}
  hpr.program rank 0 attributes {compute_order = array<i64: 0, 0, 0, 3, 0, 0>} {
    %h0 = hpr.forward stage 0 mb 0
  }
}

// -----

// Rule 13: a stage this rank unshards is read only while gathered.
hpr.schedule "replay_after_reshard" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    hpr.unshard stage 0
    %h = hpr.forward stage 0 mb 0
    %s = hpr.session %h as "s0.mb0"
    hpr.reshard stage 0
    // expected-error @+1 {{rank 0, action 3 (recompute stage 0 mb 0): reads the parameters of stage 0 while they are sharded: every forward, backward and recompute of a stage its rank unshards lies between an unshard of the stage and the reshard after it [hpr.verify.gathered]}}
    hpr.recompute %s
    hpr.unshard stage 0
    hpr.backward stage 0 mb 0 session(%s)
    hpr.clear %s
    hpr.reshard stage 0
  }
}

// -----

hpr.schedule "unshard_twice_reshard_unsharded_never_resharded" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    // expected-error @+1 {{rank 0, action 0 (unshard stage 0): stage 0 is never resharded after this unshard: its gathered parameters outlive the step [hpr.verify.gathered]}}
    hpr.unshard stage 0
    // expected-error @+1 {{rank 0, action 1 (unshard stage 0): unshards stage 0, already unsharded at rank 0, action 0 (unshard stage 0) with no reshard in between [hpr.verify.gathered]}}
    hpr.unshard stage 0
    %h = hpr.forward stage 0 mb 0
    hpr.backward stage 0 mb 0
  }
}

// -----

hpr.schedule "reshard_while_sharded" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    hpr.unshard stage 0
    %h = hpr.forward stage 0 mb 0
    hpr.reshard stage 0
    // expected-error @+1 {{rank 0, action 3 (reshard stage 0): reshards stage 0, whose parameters are not unsharded here [hpr.verify.gathered]}}
    hpr.reshard stage 0
    // expected-error @+1 {{rank 0, action 4 (backward stage 0 mb 0): reads the parameters of stage 0 while they are sharded: every forward, backward and recompute of a stage its rank unshards lies between an unshard of the stage and the reshard after it [hpr.verify.gathered]}}
    hpr.backward stage 0 mb 0
  }
}

// -----

// Rule 10: a replay inside its backward needs one whole backward as reader;
// stage 1's I reads what its W reads.
hpr.schedule "in_backward_read_by_i_and_w" ranks 1 stages 2 microbatches 1 stage_to_rank [0, 0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %h = hpr.forward stage 1 mb 0
    %s = hpr.session %h as "s1.mb0"
    // expected-error @+1 {{rank 0, action 2 (recompute stage 1 mb 0): session "s1.mb0" is replayed inside its backward (in_backward), but is read by rank 0, action 3 (backward_input stage 1 mb 0) and later actions; only a session that one whole backward reads (a backward, or the first stage's backward_weight) replays region by region}}
    hpr.recompute %s {in_backward}
    hpr.backward_input stage 1 mb 0 session(%s) retain_on_unpack
    hpr.backward_weight stage 1 mb 0 session(%s)
    hpr.clear %s
    hpr.backward_input stage 0 mb 0
    hpr.backward_weight stage 0 mb 0
  }
}

// -----

// Rule 10: a W alone is no whole backward past the first stage.
hpr.schedule "in_backward_read_by_w_of_stage_1" ranks 1 stages 2 microbatches 1 stage_to_rank [0, 0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %h = hpr.forward stage 1 mb 0
    %s = hpr.session %h as "s1.mb0"
    hpr.backward_input stage 1 mb 0
    // expected-error @+1 {{rank 0, action 3 (recompute stage 1 mb 0): session "s1.mb0" is replayed inside its backward (in_backward), but is read by rank 0, action 4 (backward_weight stage 1 mb 0); only a session that one whole backward reads (a backward, or the first stage's backward_weight) replays region by region}}
    hpr.recompute %s {in_backward}
    hpr.backward_weight stage 1 mb 0 session(%s)
    hpr.clear %s
    hpr.backward_input stage 0 mb 0
    hpr.backward_weight stage 0 mb 0
  }
}

// -----

// Rule 10: and nothing computed between the two.
hpr.schedule "in_backward_not_next" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    // expected-error @+1 {{rank 0, action 1 (recompute stage 0 mb 0): session "s0.mb0" is replayed inside its backward (in_backward), but rank 0, action 2 (forward stage 0 mb 1) runs before that backward, rank 0, action 3 (backward stage 0 mb 0)}}
    hpr.recompute %s0 {in_backward}
    %h1 = hpr.forward stage 0 mb 1
    %s1 = hpr.session %h1 as "s0.mb1"
    hpr.backward stage 0 mb 0 session(%s0)
    hpr.clear %s0
    hpr.recompute %s1 {in_backward}
    hpr.backward stage 0 mb 1 session(%s1)
    hpr.clear %s1
  }
}

// -----

// Rule 11: a replay in pieces. Correct: the last region prefetched, the
// first inside the backward; no diagnostic.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
    hpr.region "mid" flops 1.0 time_us 0.0 saved 8 input 1 params 0
    hpr.region "l1" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
hpr.schedule "pieces_pass" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    hpr.recompute %s0 {regions = array<i64: 1>}
    %h1 = hpr.forward stage 0 mb 1
    %s1 = hpr.session %h1 as "s0.mb1"
    hpr.recompute %s0 {in_backward, regions = array<i64: 0>}
    hpr.backward stage 0 mb 0 session(%s0)
    hpr.clear %s0
    hpr.recompute %s1 {regions = array<i64: 0>}
    hpr.recompute %s1 {regions = array<i64: 1>}
    hpr.backward stage 0 mb 1 session(%s1)
    hpr.clear %s1
  }
}

// -----

// Rule 11: pieces only, each region once, all of them, the one inside the
// backward last.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
    hpr.region "l1" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
hpr.schedule "pieces_broken" ranks 1 stages 1 microbatches 4 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    hpr.recompute %s0 {regions = array<i64: 1>}
    // expected-error @+1 {{rank 0, action 2 (recompute stage 0 mb 0): session "s0.mb0" is replayed in pieces (regions) and whole here; each piece lists its regions [hpr.verify.pieces]}}
    hpr.recompute %s0
    hpr.backward stage 0 mb 0 session(%s0)
    hpr.clear %s0
    %h1 = hpr.forward stage 0 mb 1
    %s1 = hpr.session %h1 as "s0.mb1"
    hpr.recompute %s1 {regions = array<i64: 0, 1>}
    // expected-error @+1 {{rank 0, action 7 (recompute stage 0 mb 1): session "s0.mb1" replays region 1 a second time (first at rank 0, action 6 (recompute stage 0 mb 1)) [hpr.verify.pieces]}}
    hpr.recompute %s1 {regions = array<i64: 1>}
    hpr.backward stage 0 mb 1 session(%s1)
    hpr.clear %s1
    %h2 = hpr.forward stage 0 mb 2
    %s2 = hpr.session %h2 as "s0.mb2"
    // expected-error @+1 {{rank 0, action 11 (recompute stage 0 mb 2): session "s0.mb2" replays region 2, but stage 0 checkpoints 2 regions (0..1) [hpr.verify.pieces]}}
    hpr.recompute %s2 {regions = array<i64: 2>}
    // expected-error @+1 {{rank 0, action 12 (recompute stage 0 mb 2): session "s0.mb2" replays a piece inside its backward (in_backward) before rank 0, action 13 (recompute stage 0 mb 2); the piece inside the backward is the last [hpr.verify.pieces]}}
    hpr.recompute %s2 {in_backward, regions = array<i64: 0>}
    hpr.recompute %s2 {regions = array<i64: 1>}
    hpr.backward stage 0 mb 2 session(%s2)
    hpr.clear %s2
    %h3 = hpr.forward stage 0 mb 3
    %s3 = hpr.session %h3 as "s0.mb3"
    // expected-error @+1 {{rank 0, action 17 (recompute stage 0 mb 3): session "s0.mb3" is replayed in pieces, but no piece replays region 0; a backward would replay it on its own [hpr.verify.pieces]}}
    hpr.recompute %s3 {in_backward, regions = array<i64: 1>}
    hpr.backward stage 0 mb 3 session(%s3)
    hpr.clear %s3
  }
}

// -----

hpr.schedule "piece_regions_unsorted" ranks 1 stages 1 microbatches 1 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    // expected-error @+1 {{'hpr.recompute' op regions: expected ascending indices >= 0, each once, got 0 at position 1}}
    hpr.recompute %s0 {regions = array<i64: 1, 0>}
    hpr.backward stage 0 mb 0 session(%s0)
    hpr.clear %s0
  }
}

// -----

// [hpr.verify.weight-replay]: the dx drops its session's replay and a
// second one, before the dw, replays what the dw reads; mb 1's first replay
// is in pieces.
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
    hpr.region "l1" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
hpr.schedule "weight_replay_passes" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    %h1 = hpr.forward stage 0 mb 1
    %s1 = hpr.session %h1 as "s0.mb1"
    hpr.recompute %s0
    hpr.recompute %s1 {regions = array<i64: 1>}
    hpr.backward_input stage 0 mb 0 session(%s0) retain_on_unpack drops_replay
    hpr.recompute %s1 {regions = array<i64: 0>}
    hpr.backward_input stage 0 mb 1 session(%s1) retain_on_unpack drops_replay
    hpr.recompute %s0 {for_weight}
    hpr.backward_weight stage 0 mb 0 session(%s0) weight_replay
    hpr.clear %s0
    hpr.recompute %s1 {for_weight}
    hpr.backward_weight stage 0 mb 1 session(%s1) weight_replay
    hpr.clear %s1
  }
}

// -----

hpr.schedule "replay_for_weight_misplaced" ranks 1 stages 1 microbatches 4 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    hpr.recompute %s0
    // expected-error @+1 {{rank 0, action 2 (recompute stage 0 mb 0): the replay of session "s0.mb0" for its dw (for_weight) must lie after its dx, rank 0, action 3 (backward_input stage 0 mb 0), and before its dw, rank 0, action 4 (backward_weight stage 0 mb 0) [hpr.verify.weight-replay]}}
    hpr.recompute %s0 {for_weight}
    hpr.backward_input stage 0 mb 0 session(%s0) retain_on_unpack
    hpr.backward_weight stage 0 mb 0 session(%s0) weight_replay
    hpr.clear %s0
    %h1 = hpr.forward stage 0 mb 1
    %s1 = hpr.session %h1 as "s0.mb1"
    hpr.recompute %s1
    hpr.backward_input stage 0 mb 1 session(%s1) retain_on_unpack
    hpr.backward_weight stage 0 mb 1 session(%s1) weight_replay
    // expected-error @+1 {{rank 0, action 10 (recompute stage 0 mb 1): the replay of session "s0.mb1" for its dw (for_weight) must lie after its dx, rank 0, action 8 (backward_input stage 0 mb 1), and before its dw, rank 0, action 9 (backward_weight stage 0 mb 1) [hpr.verify.weight-replay]}}
    hpr.recompute %s1 {for_weight}
    hpr.clear %s1
    %h2 = hpr.forward stage 0 mb 2
    %s2 = hpr.session %h2 as "s0.mb2"
    hpr.recompute %s2
    hpr.backward_input stage 0 mb 2 session(%s2) retain_on_unpack
    hpr.recompute %s2 {for_weight}
    // expected-error @+1 {{rank 0, action 16 (recompute stage 0 mb 2): session "s0.mb2" is replayed for its dw a second time (first at rank 0, action 15 (recompute stage 0 mb 2)) [hpr.verify.weight-replay]}}
    hpr.recompute %s2 {for_weight}
    hpr.backward_weight stage 0 mb 2 session(%s2) weight_replay
    hpr.clear %s2
    %h3 = hpr.forward stage 0 mb 3
    %s3 = hpr.session %h3 as "s0.mb3"
    hpr.recompute %s3
    hpr.backward_input stage 0 mb 3 session(%s3) retain_on_unpack
    // expected-error @+1 {{rank 0, action 22 (recompute stage 0 mb 3): the replay of session "s0.mb3" for its dw (for_weight) is a piece; it replays whole, before the dw [hpr.verify.weight-replay]}}
    hpr.recompute %s3 {for_weight, regions = array<i64: 0>}
    hpr.backward_weight stage 0 mb 3 session(%s3) weight_replay
    hpr.clear %s3
  }
}

// -----

hpr.schedule "weight_replay_unmatched" ranks 1 stages 1 microbatches 4 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    hpr.recompute %s0
    hpr.backward_input stage 0 mb 0 session(%s0) retain_on_unpack
    // expected-error @+1 {{rank 0, action 3 (recompute stage 0 mb 0): session "s0.mb0" is replayed for its dw, but rank 0, action 4 (backward_weight stage 0 mb 0) does not say weight_replay [hpr.verify.weight-replay]}}
    hpr.recompute %s0 {for_weight}
    hpr.backward_weight stage 0 mb 0 session(%s0)
    hpr.clear %s0
    %h1 = hpr.forward stage 0 mb 1
    %s1 = hpr.session %h1 as "s0.mb1"
    hpr.recompute %s1
    hpr.backward_input stage 0 mb 1 session(%s1) retain_on_unpack
    // expected-error @+1 {{rank 0, action 9 (backward_weight stage 0 mb 1): weight_replay, but session "s0.mb1" has no replay for it (recompute for_weight) after its dx, which drops the first: the dw would read dropped tensors [hpr.verify.weight-replay]}}
    hpr.backward_weight stage 0 mb 1 session(%s1) weight_replay
    hpr.clear %s1
    %h2 = hpr.forward stage 0 mb 2
    %s2 = hpr.session %h2 as "s0.mb2"
    hpr.recompute %s2 {in_backward}
    hpr.backward stage 0 mb 2 session(%s2)
    // expected-error @+1 {{rank 0, action 14 (recompute stage 0 mb 2): session "s0.mb2" is replayed for a dw (for_weight), but is not read by a backward_input and then a backward_weight [hpr.verify.weight-replay]}}
    hpr.recompute %s2 {for_weight}
    hpr.clear %s2
    %h3 = hpr.forward stage 0 mb 3 no_checkpoint
    hpr.backward_input stage 0 mb 3
    // expected-error @+1 {{rank 0, action 18 (backward_weight stage 0 mb 3): weight_replay, but it reads no session: nothing is replayed for it (a plain microbatch or a stage not checkpointed keeps its activations) [hpr.verify.weight-replay]}}
    hpr.backward_weight stage 0 mb 3 weight_replay
  }
}
