// RUN: hp-recompute-opt %s -split-input-file --hpr-lower-runtime | FileCheck %s
// Lowering twice changes nothing: members 3-7 are recomputed, given posts and
// tags kept.
// RUN: hp-recompute-opt %s -split-input-file --hpr-lower-runtime --hpr-lower-runtime | FileCheck %s

hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1" flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
// Each receive posts itself; the forward (the backward) that reads it waits
// for it; tags are (sending stage, mb, direction), equal at both ends; the
// last backward of each stage completes its gradients.
// CHECK-LABEL: hpr.schedule "gpipe_two_ranks"
// CHECK:       hpr.program rank 0
// CHECK-NEXT:  hpr.forward stage 0 mb 0{{$}}
// CHECK-NEXT:  hpr.send_f stage 0 mb 0 peer 1 tag 0{{$}}
// CHECK-NEXT:  hpr.forward stage 0 mb 1{{$}}
// CHECK-NEXT:  hpr.send_f stage 0 mb 1 peer 1 tag 2{{$}}
// CHECK-NEXT:  hpr.recv_b stage 0 mb 0 peer 1 tag 5 posts [4]{{$}}
// CHECK-NEXT:  hpr.backward stage 0 mb 0 frees_graph waits [4]{{$}}
// CHECK-NEXT:  hpr.recv_b stage 0 mb 1 peer 1 tag 7 posts [6]{{$}}
// CHECK-NEXT:  hpr.backward stage 0 mb 1 frees_graph last_backward waits [6]{{$}}
// CHECK:       hpr.program rank 1
// CHECK-NEXT:  hpr.recv_f stage 1 mb 0 peer 0 tag 0 posts [0]{{$}}
// CHECK-NEXT:  hpr.forward stage 1 mb 0 waits [0]{{$}}
// CHECK-NEXT:  hpr.recv_f stage 1 mb 1 peer 0 tag 2 posts [2]{{$}}
// CHECK-NEXT:  hpr.forward stage 1 mb 1 waits [2]{{$}}
// CHECK-NEXT:  hpr.backward stage 1 mb 0 frees_graph{{$}}
// CHECK-NEXT:  hpr.send_b stage 1 mb 0 peer 0 tag 5{{$}}
// CHECK-NEXT:  hpr.backward stage 1 mb 1 frees_graph last_backward{{$}}
// CHECK-NEXT:  hpr.send_b stage 1 mb 1 peer 0 tag 7{{$}}
hpr.schedule "gpipe_two_ranks" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
    hpr.recv_b stage 0 mb 1 peer 1
    hpr.backward stage 0 mb 1
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h0 = hpr.forward stage 1 mb 0
    hpr.recv_f stage 1 mb 1 peer 0
    %h1 = hpr.forward stage 1 mb 1
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
    hpr.backward stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1" flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
// Both stages on one rank: the forward hands its output to stage 1 and the
// dx of stage 1 its input gradient to stage 0, in memory; the dw of each
// (stage, mb) frees its graph, the last one of each stage completes it.
// CHECK-LABEL: hpr.schedule "v_on_one_rank"
// CHECK:       hpr.forward stage 0 mb 0 hands_to 1{{$}}
// CHECK-NEXT:  hpr.forward stage 1 mb 0{{$}}
// CHECK-NEXT:  hpr.backward_input stage 1 mb 0 hands_to 0{{$}}
// CHECK-NEXT:  hpr.backward_weight stage 1 mb 0 frees_graph last_backward{{$}}
// CHECK-NEXT:  hpr.backward_input stage 0 mb 0{{$}}
// CHECK-NEXT:  hpr.backward_weight stage 0 mb 0 frees_graph last_backward{{$}}
hpr.schedule "v_on_one_rank" ranks 1 stages 2 microbatches 1 stage_to_rank [0, 0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %h1 = hpr.forward stage 1 mb 0
    hpr.backward_input stage 1 mb 0
    hpr.backward_weight stage 1 mb 0
    hpr.backward_input stage 0 mb 0
    hpr.backward_weight stage 0 mb 0
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1" flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
// Rank 0 reaches mb 1's gradient first, but rank 1 sends mb 0's first: the
// first receive posts both, in the peer's send order, and the second none.
// CHECK-LABEL: hpr.schedule "posts_in_send_order"
// CHECK:       hpr.recv_b stage 0 mb 1 peer 1 tag 7 posts [6, 4]{{$}}
// CHECK-NEXT:  hpr.backward stage 0 mb 1 frees_graph waits [4]{{$}}
// CHECK-NEXT:  hpr.recv_b stage 0 mb 0 peer 1 tag 5 posts []{{$}}
// CHECK-NEXT:  hpr.backward stage 0 mb 0 frees_graph last_backward waits [6]{{$}}
hpr.schedule "posts_in_send_order" ranks 2 stages 2 microbatches 2 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    hpr.send_f stage 0 mb 0 peer 1
    %h1 = hpr.forward stage 0 mb 1
    hpr.send_f stage 0 mb 1 peer 1
    hpr.recv_b stage 0 mb 1 peer 1
    hpr.backward stage 0 mb 1
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0
    %h0 = hpr.forward stage 1 mb 0
    hpr.recv_f stage 1 mb 1 peer 0
    %h1 = hpr.forward stage 1 mb 1
    hpr.backward stage 1 mb 0
    hpr.send_b stage 1 mb 0 peer 0
    hpr.backward stage 1 mb 1
    hpr.send_b stage 1 mb 1 peer 0
  }
}

// -----

hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
  hpr.stage 1 {
    hpr.region "l1" flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
// A plan read back keeps the posts and tags it gives (hpr-verify-comm judges
// them); a receive it gives no posts posts nothing. What the analysis
// decides is written over: the stale waits and frees_graph go.
// CHECK-LABEL: hpr.schedule "given_posts_and_tags_kept"
// CHECK:       hpr.forward stage 0 mb 0{{$}}
// CHECK-NEXT:  hpr.send_f stage 0 mb 0 peer 1 tag 40{{$}}
// CHECK-NEXT:  hpr.recv_b stage 0 mb 0 peer 1 tag 3 posts []{{$}}
// CHECK-NEXT:  hpr.backward stage 0 mb 0 frees_graph last_backward waits [2]{{$}}
// CHECK:       hpr.recv_f stage 1 mb 0 peer 0 tag 40 posts [0]{{$}}
// CHECK-NEXT:  hpr.forward stage 1 mb 0 waits [0]{{$}}
// CHECK-NEXT:  hpr.backward stage 1 mb 0 frees_graph last_backward{{$}}
hpr.schedule "given_posts_and_tags_kept" ranks 2 stages 2 microbatches 1 stage_to_rank [0, 1] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0 waits [0]
    hpr.send_f stage 0 mb 0 peer 1 tag 40
    hpr.recv_b stage 0 mb 0 peer 1
    hpr.backward stage 0 mb 0
  }
  hpr.program rank 1 {
    hpr.recv_f stage 1 mb 0 peer 0 tag 40 posts [0]
    %h0 = hpr.forward stage 1 mb 0
    hpr.backward stage 1 mb 0 frees_graph waits [0]
    hpr.send_b stage 1 mb 0 peer 0
  }
}

// -----

// drops_replay on the dx of a session replayed again for its dw (mb 0), on
// no other dx (mb 1 keeps its replay for its dw); a given one is recomputed.
// CHECK-LABEL: hpr.schedule "weight_replay"
// CHECK:       hpr.backward_input stage 0 mb 0 session(%{{.*}}) retain_on_unpack drops_replay{{$}}
// CHECK:       hpr.backward_input stage 0 mb 1 session(%{{.*}}) retain_on_unpack{{$}}
hpr.model "m" {
  hpr.stage 0 {
    hpr.region "l0" checkpoint flops 1.0 time_us 0.0 saved 8 input 1 params 0
  }
}
hpr.schedule "weight_replay" ranks 1 stages 1 microbatches 2 stage_to_rank [0] {
  hpr.program rank 0 {
    %h0 = hpr.forward stage 0 mb 0
    %s0 = hpr.session %h0 as "s0.mb0"
    %h1 = hpr.forward stage 0 mb 1
    %s1 = hpr.session %h1 as "s0.mb1"
    hpr.recompute %s0
    hpr.backward_input stage 0 mb 0 session(%s0) retain_on_unpack
    hpr.recompute %s1
    hpr.backward_input stage 0 mb 1 session(%s1) retain_on_unpack drops_replay
    hpr.recompute %s0 {for_weight}
    hpr.backward_weight stage 0 mb 0 session(%s0) weight_replay
    hpr.clear %s0
    hpr.backward_weight stage 0 mb 1 session(%s1)
    hpr.clear %s1
  }
}
