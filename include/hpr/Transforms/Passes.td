//===- Passes.td - hpr recompute planning passes -----------*- tablegen -*-===//

#ifndef HPR_TRANSFORMS_PASSES
#define HPR_TRANSFORMS_PASSES

include "mlir/Pass/PassBase.td"

def HPRSelectCheckpoints : Pass<"hpr-select-checkpoints", "::mlir::ModuleOp"> {
  let summary = "Choose what to checkpoint so that every rank fits a budget";
  let description = [{
    Chooses how each region of `hpr.model` is checkpointed: not, fully, or
    by the selective policy where its selective costs are measured (the same
    choice for every microbatch of a stage, as Megatron and torchtitan make
    it), and marks `no_checkpoint` the microbatches of checkpointed stages
    that may
    keep all their activations, so that every rank's activation peak under
    jit recompute stays within `budget` bytes and the simulated step time is
    as short as that allows (ties: fewer recomputes). Runs before
    `hpr-assign-sessions`.

    1. Candidates: every region not marked `non_checkpointable` whose saved
       bytes exceed its boundary input (checkpointing any other region only
       costs time).
    2. Checkpointing every candidate gives each rank its least activation
       memory; if that exceeds the budget the pass fails and names that
       smallest feasible budget. If checkpointing nothing fits, nothing is
       checkpointed.
    3. Otherwise, with at most 1024 choices (each candidate full or none,
       or selective too: ten candidates with two policies, six with three;
       and a small enough program), every choice is priced by simulation
       and the fastest that fits wins: optimal among stage-uniform choices.
       Beyond that, a greedy sweep moves candidates to a policy that keeps
       more (full to selective, to none) in order of replay time saved per
       byte kept on top while the budget holds (a move that saves no time
       is not made). With selective in play, none and full alone are searched
       too, as for a model without selective costs (exhaustively where 2^k
       choices are few enough), and the faster choice wins: the third policy
       never makes the answer slower. The least memory is sought from
       every region selective too.
    4. Then, per rank, microbatches of checkpointed stages are made plain,
       shortest-lived first, where the peak still fits and the rank saves
       time; kept only if the simulated step time does not grow.
    5. With `bubble` (the pipeline sets it with policy=bubble), the choice
       is priced as it will run: the best choice of steps 3-4, every
       candidate full, then the fastest choices of step 3 under jit (or the
       greedy sweeps' choice after each of their last moves), each also
       without its plain microbatches, as long as it fits, are planned on a
       copy of the module with the planning passes that follow this one
       (hpr-prefetch-into-bubbles within `budget`), up to 24 of them and
       2^20 schedule cells in all; the one whose simulated step is shortest
       and whose placed peak fits wins (ties: the earlier). So the answer is
       never slower than this pass's jit-priced choice, nor than every
       candidate full, once bubble has placed them. A failure of those
       passes on a copy fails this pass with their diagnostics.
    Memory is the activation model of docs/planning.md; time is the
    simulated timeline with a recompute before each first consumer.
  }];
  let dependentDialects = ["::mlir::hpr::HPRDialect"];
  let options = [
    Option<"budget", "budget", "int64_t", /*default=*/"0",
           "Per-rank activation budget in bytes (required, > 0)">,
    Option<"bubble", "bubble", "bool", /*default=*/"false",
           "Price the contenders with their replays placed by "
           "hpr-prefetch-into-bubbles within `budget`">,
  ];
  let statistics = [
    Statistic<"numBubbleContenders", "num-bubble-contenders",
              "Choices planned with bubble placement to price them">,
    Statistic<"numCheckpointedRegions", "num-checkpointed-regions",
              "Regions left checkpointed">,
    Statistic<"numSelectiveRegions", "num-selective-regions",
              "Regions left checkpointed by the selective policy">,
    Statistic<"numPlainMicrobatches", "num-plain-microbatches",
              "Microbatches of checkpointed stages marked no_checkpoint">,
  ];
}

def HPRBoundWeightDeferral
    : Pass<"hpr-bound-weight-deferral", "::mlir::ModuleOp"> {
  let summary = "Run dw earlier where a rank's activations exceed a budget";
  let description = [{
    A zero-bubble schedule defers each dw (`hpr.backward_weight`) to fill
    idle time; until it runs, its (stage, microbatch) keeps what its forward
    kept and, when checkpointed, what the dw reads of its replay (a session
    read by dx and dw cannot replay block by block inside one backward).
    Where a rank's activation peak exceeds `budget`, this pass bounds the
    deferral. Runs before `hpr-select-checkpoints` and
    `hpr-assign-sessions`.

    0. With `fuse-all`, first: every dx and dw fuse into one `hpr.backward`
       at the dx, on each stage whose weight gradients are then added in the
       order they were (its dxs in the order of its dws, no half of an
       OVERLAP_F_B pair among them): the schedule the zero-bubble one
       defers its dws from (ZB-H1's is 1F1B's). Step 1 then finds the
       least memory the schedule reaches; with `mark-fused` the pairs are
       marked `fused`, so that step 6 may split them again into idle time
       (Zero Bubble's ZB-H1: 1F1B with dws moved into its bubbles). The
       planner driver plans this beside the budget's bounds and keeps the
       fastest, so a zero-bubble plan is never slower than its schedule
       fused.
    1. Memory is the activation model of docs/planning.md, priced as the
       model marks the regions or, with `least-memory` (hpr-select-checkpoints
       follows), with every candidate region checkpointed. With
       `least-memory` the schedule changes only where no checkpoint choice
       fits: first hpr-select-checkpoints runs on a copy (diagnostics
       dropped), and where it finds a choice the pass changes nothing; then
       a rank counts as over the budget while the least
       hpr-select-checkpoints starts from (every candidate full, microbatches
       made plain where that lowers the peak) exceeds it, and once none
       does, the rank that peaks highest while hpr-select-checkpoints on a
       copy still finds no choice.
    2. While the rank that peaks highest exceeds the budget, at its first
       peak position (every candidate full): every dw pending there (its dx
       at or before the peak, the dw at or after it) offers up to three
       changes, (a) the dw runs right before the peak op (never inside an
       OVERLAP_F_B pair or between batched transfers), when its dx is before
       that; (b) the dx and the dw fuse into one `hpr.backward` at the dx,
       which replays block by block inside itself as 1F1B's backward does;
       (c) the dw is marked `weight_replay`, when its dx is before the peak
       and the dw after it, its forward runs checkpointed and the dw reads
       some of the replay: the dx drops the replay and a second one, placed
       right before the dw by `hpr-insert-recompute`, brings back what the
       dw reads, so nothing of it lives at the peak. A change that would
       reorder a stage's dws is not offered: the microbatches' weight
       gradients are added in the schedule's order.
    3. Each change is applied to a copy and priced: the simulated step
       (each replay timed with its reader, where jit places it, a replay for
       a dw as the stage's whole replay), then that rank's peak; the least
       wins (ties: the first, by stage, microbatch, move before fuse; weight
       replays after all of them). A weight replay adds a replay and moves
       nothing, so it is priced only where every move and fusion lengthens
       the step as it stands.
    4. Every change ends a lifetime earlier and extends none, and each is
       one way: dws only move up, fused pairs stay fused, a dw marked
       `weight_replay` stays marked and is not offered (c) again. So the
       peak position's bytes fall each round and the loop ends. The one
       exception, (a) on a dw marked `weight_replay` (its replay for the dw
       moves up with it, onto the position it lands on), is taken only where
       it lowers the rank's peak: without that, two such dws could take each
       other's place forever. A rank whose peak holds no pending dw ends it: with
       `least-memory` the pass leaves the rest to hpr-select-checkpoints
       (making microbatches plain may lower a peak further; it names the
       least budget it finds), otherwise it fails, naming the rank and its
       bytes.
    5. Where 2-4 changed the schedule, dws then move later where a rank
       would wait, while the step gets shorter. Each round prices, on
       copies, moving a dw right after a send or before an op its rank
       waits for (the end of the program included) in the timeline without
       replays, after its dx and across no other weight gradient of its
       stage; a pair step 2 fused may split again with its dw there. The
       16 candidates before the longest waits are priced a round (right
       after a send counts as no wait), but those past their stage's
       REDUCE_GRAD, which are never made (hpr.schedule.reduce-grad). The shortest simulated step wins
       where the rank's peak (as in 1) stays within the budget; the rounds
       end when no move shortens the step. With `least-memory`, where
       hpr-select-checkpoints then finds no choice, the schedule returns to
       what step 4 left. A move that does not fit is priced again with the
       dw marked `weight_replay` (where (c) could mark it, and where the
       rank exceeds the budget by no more than what the dw reads of the
       replay, all that dropping it after the dx can take off), and kept on
       the same terms. With `weight-replay=0` none of (c) and this: the pass
       as before weight replays (the planner driver plans both and keeps
       the faster plan, docs/planning.md).
    6. `after-choice` (the pipeline runs the pass so again right after
       hpr-select-checkpoints, with select=auto and the whole budget): step
       5 alone, on the schedule the first run left, priced with the
       checkpoints the module now marks (the choice: plain microbatches,
       stages left unchecked) rather than every candidate full, within
       `budget`; only where the first run fused a pair (the `fused` marks
       on `hpr.backward` it leaves with `mark-fused`), which it may split
       again, and it removes every mark. Of the 16 candidates a round, the
       first are those that put a dw right after the send of its own dx's
       gradient (where a zero-bubble schedule runs it) where that dx, or
       the fused backward, lies on a critical path of the simulated step,
       earliest dx first, then step 5's before the longest waits: a dx that
       sends sooner shortens the path through the stages before it (a
       warm-up's first backwards), which no wait on the dx's own rank
       shows. The first run prices steps 2-5 on
       every candidate checkpointed, which can make another rank critical
       than the choice does (the GPT's last stage, left plain, runs a
       microbatch 20 us faster); this prices the moves on the step the
       plan will have. With `bubble` the moves, priced with jit replays,
       stay only where the plan with its replays placed as the pipeline
       will (sessions, jit, hpr-prefetch-into-bubbles within `budget`,
       clears; on copies) is not slower than the plan without them, so the
       step never gets longer for them.
    A `weight_replay` dw whose (stage, microbatch) is not checkpointed in the
    end (`least-memory`: hpr-select-checkpoints chose otherwise) replays
    nothing: the replay was priced only while it ran checkpointed, and
    `hpr-insert-recompute` removes the mark.
    A schedule without dws (1F1B, interleaved 1F1B) or within the budget is
    left as it is.
  }];
  let dependentDialects = ["::mlir::hpr::HPRDialect"];
  let options = [
    Option<"budget", "budget", "int64_t", /*default=*/"0",
           "Per-rank activation budget in bytes (required, > 0)">,
    Option<"leastMemory", "least-memory", "bool", /*default=*/"false",
           "Price the peaks with every candidate region checkpointed (the "
           "pipeline sets it with select=auto)">,
    Option<"markFused", "mark-fused", "bool", /*default=*/"false",
           "Mark the pairs step 2 fuses `fused`, for an after-choice run "
           "(the pipeline sets it where one follows)">,
    Option<"afterChoice", "after-choice", "bool", /*default=*/"false",
           "Step 6: only move dws into idle time, priced with the "
           "checkpoints the module marks, where a mark-fused run fused "
           "pairs (the pipeline sets it after hpr-select-checkpoints)">,
    Option<"bubble", "bubble", "bool", /*default=*/"false",
           "With after-choice: keep the moves only where the plan with its "
           "replays placed by hpr-prefetch-into-bubbles within `budget` is "
           "not slower than without them (the pipeline sets it with "
           "policy=bubble)">,
    Option<"weightReplay", "weight-replay", "bool", /*default=*/"true",
           "Offer change (c), weight_replay, and price moves into idle time "
           "with it (0: move and fuse only)">,
    Option<"fuseAll", "fuse-all", "bool", /*default=*/"false",
           "Step 0: fuse every dx/dw pair whose stage keeps its dws' order "
           "so before steps 1-6 (the planner driver plans it beside the "
           "budget's bounds)">,
  ];
  let statistics = [
    Statistic<"numMovedWeights", "num-moved-weights",
              "dws run earlier, before a peak">,
    Statistic<"numFusedBackwards", "num-fused-backwards",
              "dx and dw pairs fused into one backward">,
    Statistic<"numDeferredWeights", "num-deferred-weights",
              "dws moved into idle time">,
    Statistic<"numDeferredAfterChoice", "num-deferred-after-choice",
              "dws moved into idle time after the checkpoint choice "
              "(after-choice)">,
    Statistic<"numWeightReplays", "num-weight-replays",
              "dws marked weight_replay (replayed again for the dw)">,
  ];
}

def HPRVerifyComm : Pass<"hpr-verify-comm", "::mlir::ModuleOp"> {
  let summary = "Check the schedule: coverage, order, transfers, deadlock freedom";
  let description = [{
    The schedule rules of docs/schedules.md ("Validation"), on the programs
    of the IR, so that IR that enters through `hp-recompute-opt` or
    `mlir-opt-19` with the plugin is checked as a schedule file is:
    0. the module's `hpr.model` has as many stages as the schedule (each
       stage needs its costs and checkpoint marks);
    1. each stage on one rank, stage and microbatch numbers in range;
    2. every (stage, microbatch) forwarded exactly once;
    3. backpropagated exactly once (one `hpr.backward`, or one
       `hpr.backward_input` and one `hpr.backward_weight`);
    4. dx and B after their forward, dw after its dx, a recompute after its
       forward;
    5. with communication: every cross-rank transfer has exactly one send
       (after its producer) and one receive (before its consumer), and there
       are no other transfers;
    6. the programs finish when run against each other (sends buffered,
       receives blocking): otherwise the deadlock is reported at the first
       waiting op, naming the cycle of waiting ranks, with a note at each
       other waiting op.
    7. message tags, where transfers carry them (`tag`): both ends agree, and
       a rank's tags towards one peer in one direction are distinct;
    8. `[hpr.schedule.reduce-grad]`: at most one `hpr.reduce_grad` per
       stage, after its last dw and backward; with `plan`, exactly one per
       stage that has either;
    9. `[hpr.schedule.posts]`: receive posting, where receives carry `posts`
       (with `plan`, every receive): each receive is posted once, by itself
       or by a receive before it, and the receives from one peer in the order
       the peer sends (untagged messages match in posting order).
    Each violation is an error at its op (rank, action index and action in
    the message; a message that names its rule ends with the rule's id,
    docs/rules.md); the pass fails. It runs first in `hpr-recompute-pipeline`.
    The checks are those of `mlir::hpr::sched::findViolations`, applied to the
    programs read back from the IR. `plan` checks a finished plan (what
    `verifyPlan` admits for the runtimes) rather than a schedule to plan.
  }];
  let options = [
    Option<"finishedPlan", "plan", "bool", /*default=*/"false",
           "Check a finished plan: every stage with a dw or backward has its "
           "reduce_grad, every receive its posts">
  ];
  let dependentDialects = ["::mlir::hpr::HPRDialect"];
}

def HPRAssignSessions : Pass<"hpr-assign-sessions", "::mlir::hpr::ProgramOp"> {
  let summary = "Give every checkpointed (stage, microbatch) one recompute session";
  let description = [{
    For each `hpr.forward` whose stage has at least one region marked
    `checkpoint` in `hpr.model` and whose (stage, microbatch) is read back by
    a later backward action, inserts `hpr.session %h as "s{stage}.mb{mb}"`
    right after the forward (after the whole pair when the forward is half
    of an overlapped F/B pair) and binds every later consumer of that
    (stage, microbatch) (`hpr.backward_input`, `hpr.backward_weight`,
    `hpr.backward`) to the session. A consumer that precedes its forward is
    left unbound for `hpr-verify` to report.

    Runs on each `hpr.program` on its own (ranks in parallel); it reads the
    enclosing module's `hpr.model`, which no program pass changes.

    Assumptions:
    1. The module holds one `hpr.model` with one `hpr.stage` per stage.
    2. No session has been assigned yet (the pass refuses to assign twice).
  }];
  let dependentDialects = ["::mlir::hpr::HPRDialect"];
  let statistics = [
    Statistic<"numSessions", "num-sessions", "Number of sessions assigned">,
    Statistic<"numConsumersBound", "num-consumers-bound",
              "Number of backward actions bound to a session">,
  ];
}

def HPRInsertRecompute : Pass<"hpr-insert-recompute", "::mlir::hpr::ProgramOp"> {
  let summary = "Insert one hpr.recompute per session, before its first consumer";
  let description = [{
    Places exactly one `hpr.recompute` per session in the program, after the
    session's forward and before its first consumer. Each program on its
    own: the placement reads nothing of other ranks.

    Policies:
    - `jit`: immediately before the first consumer. When that consumer is
      the session's only one and a whole backward (B, or the first stage's
      W: that stage's I reads nothing and reads no session), the recompute
      is marked `in_backward`: the replay runs inside the backward, region
      by region, holding one region's tensors at a time, as torch's
      checkpoint does (docs/planning.md). A session read by I and W replays
      whole before its I: W reads what I read.
    - `lookahead`: above the communication right before the consumer (the
      `recv_b` a dx waits on does not feed the replay, so the replay can run
      while the rank waits) and `distance` compute actions (forward,
      backward_input, backward_weight, backward; an overlapped pair counts
      once) further up. It never moves above the session, which follows the
      forward and so the `recv_f` that fed it, and never into an overlapped
      F/B pair.

    A dw marked `weight_replay` whose session is read by its dx and then by
    it gets a second `hpr.recompute {for_weight}` right before it (before
    its overlapped pair), whatever the policy: the replay for the dw
    (`[hpr.verify.weight-replay]`). Where its session is read otherwise, or
    it reads none (a plain microbatch, a stage not checkpointed, the first
    stage, whose dx reads nothing), the mark is removed: the plan says only
    what runs.

    `distance` with `jit` is an error, not ignored. Placing by time needs
    every rank's timeline: that is `hpr-prefetch-into-bubbles`, which moves
    the recomputes this pass placed with `jit`.
  }];
  let dependentDialects = ["::mlir::hpr::HPRDialect"];
  let options = [
    Option<"policy", "policy", "::mlir::hpr::RecomputePolicy",
           /*default=*/"::mlir::hpr::RecomputePolicy::Jit",
           "Placement policy", [{::llvm::cl::values(
             clEnumValN(::mlir::hpr::RecomputePolicy::Jit, "jit",
                        "right before the first consumer"),
             clEnumValN(::mlir::hpr::RecomputePolicy::Lookahead, "lookahead",
                        "`distance` compute actions earlier"))}]>,
    Option<"distance", "distance", "unsigned", /*default=*/"1",
           "With policy=lookahead: how many compute actions earlier">,
  ];
  let statistics = [
    Statistic<"numRecomputeInserted", "num-recompute-inserted",
              "Number of hpr.recompute ops inserted">,
    Statistic<"numPrefetched", "num-prefetched",
              "Recomputes placed earlier than right before the consumer">,
    Statistic<"numWeightReplays", "num-weight-replays",
              "hpr.recompute {for_weight} ops inserted">,
    Statistic<"numWeightReplaysDropped", "num-weight-replays-dropped",
              "weight_replay marks removed from dws that replay nothing">,
  ];
}

def HPRPrefetchIntoBubbles
    : Pass<"hpr-prefetch-into-bubbles", "::mlir::ModuleOp"> {
  let summary = "Move recomputes into simulated idle time";
  let description = [{
    Moves the recomputes `hpr-insert-recompute{policy=jit}` placed into the
    time their rank would wait anyway. A module pass: where a rank idles
    depends on every other rank's program.

    Simulates the programs under the cost model and moves each recompute on
    a critical path (zero slack: one off every critical path delays nothing
    where it is, and moved would only hold its tensors longer), latest
    consumer first, into the latest idle gap between its forward and
    its first consumer (the wait before an action whose inputs are not
    ready), and after the `hpr.unshard` of its stage that
    `hpr-insert-unshard` placed for it (FSDP: the gathers are in the
    timeline, issued beside the compute, and a moved replay neither opens
    a window nor gathers again), that still has room for the whole replay
    (counted from the end of its stage's gather, which the replay waits for),
    provided the replayed
    tensors, held from there until the consumer, keep the rank's activation
    peak within `budget` (0: the rank's peak as the recomputes stand); held
    from right after the op before the gap, they meet what is still live
    once that op is done (a backward there has freed its session by then).
    A gap with only receives between it and the recompute (or a dx that
    computes nothing, the first stage's, which nobody waits for) takes it
    even when the replay outlasts the gap (it delays no other rank's
    message, and fills the wait); any other gap takes it when the replay
    fits it to a nanosecond. A recompute that fits nowhere stays where it is. A jit replay
    inside its backward (`in_backward`) held one region at a time; moved, it
    replays every region at its new place, and the budget check counts all
    of them up to the reader. One that fits nowhere whole tries its last
    regions as a piece (`regions`; the backward reads them first and holds
    backwardReplayBytesAfter them, which the budget check counts), largest
    first: the piece moves and the rest stays inside the backward, to be
    split again in a later round.
    Rounds, each on the timeline the previous one left (with its critical
    paths), while something moves, at most 256; ranks move their own ops in
    parallel within a round. A replay for a dw (`for_weight`) stays right
    before its dw. The same rounds run on a copy of the module moving every
    recompute that fits, critical or not, at most 8 of them; both are greedy, neither
    always ahead, and the faster plan wins (on a tie, the critical one).
    `placement` keeps one of them alone instead (to compare them).

    From jit placement, every action then starts no later than before
    (durations are fixed and the programs are monotone in their inputs' end
    times; a piece takes its time off what stays inside the backward), so
    the result never loses to jit in simulated step time.
    O(A + R * W) per round for A actions, R recomputes and windows of W
    actions between a forward and its first consumer (docs/planning.md).

    Prefetching keeps recomputed tensors alive longer; `hp-recompute-plan
    --summary` reports, per rank, the most sessions live at once and the
    recompute time hidden in idle time.
  }];
  let dependentDialects = ["::mlir::hpr::HPRDialect"];
  let options = [
    Option<"budget", "budget", "int64_t", /*default=*/"0",
           "Per-rank activation bytes the prefetched replays may fill "
           "(0: each rank's peak before the moves)">,
    Option<"placement", "placement", "::mlir::hpr::BubblePlacement",
           /*default=*/"::mlir::hpr::BubblePlacement::Faster",
           "Which placement to keep", [{::llvm::cl::values(
             clEnumValN(::mlir::hpr::BubblePlacement::Faster, "faster",
                        "the faster of both (on a tie, the critical one)"),
             clEnumValN(::mlir::hpr::BubblePlacement::Critical, "critical",
                        "move only replays on a critical path"),
             clEnumValN(::mlir::hpr::BubblePlacement::EveryFit, "every-fit",
                        "move every replay that fits"))}]>,
  ];
  let statistics = [
    Statistic<"numInBubbles", "num-in-bubbles",
              "Recomputes and pieces moved into simulated idle time">,
  ];
}

def HPRInsertClear : Pass<"hpr-insert-clear", "::mlir::hpr::ProgramOp"> {
  let summary = "Insert one hpr.clear per session after its last consumer";
  let description = [{
    Inserts `hpr.clear` right after each session's last consumer and sets
    `retain_on_unpack` on every consumer but the last (dx keeps the
    recomputed tensors for dw; dw, the last reader, lets them go). A full
    backward is recompute, consume, clear. An overlapped F/B pair stays
    adjacent: the clear goes after the pair. Each program on its own.
  }];
  let dependentDialects = ["::mlir::hpr::HPRDialect"];
  let statistics = [
    Statistic<"numClearInserted", "num-clear-inserted",
              "Number of hpr.clear ops inserted">,
    Statistic<"numRetained", "num-retained",
              "Consumers marked retain_on_unpack">,
  ];
}

def HPRInsertUnshard : Pass<"hpr-insert-unshard", "::mlir::hpr::ProgramOp"> {
  let summary = "Gather each stage's FSDP parameters around the actions "
                "that use them";
  let description = [{
    With the model's `dp_shard` > 1 (FSDP2, or HSDP with `dp_replicate`),
    inserts `hpr.unshard` (all-gather) and `hpr.reshard` (free the gathered
    parameters) of each stage into its rank's program, where
    torch.distributed.pipelining's `_add_unshard_reshard` puts them, with
    every action that reads a stage's parameters counted as a user: its
    forward, backward_input, backward_weight, backward and every
    `hpr.recompute` as `hpr-insert-recompute` placed it. Runs before
    bubble placement, which prices the gathers and keeps each replay after
    its stage's unshard.

    The rule, per user (an overlapped F/B pair is one user of both stages):
    the next `max-active` distinct stages with a user from here on stay
    gathered. Before the user (and the receives right before it, outside a
    batched run of transfers: torch adds receives after this step), every
    gathered stage not among them is resharded (in stage order) and every
    one of them not yet gathered is unsharded (in the order of their next
    use); after the last op, the stages still gathered are resharded. So each stage is unsharded before
    its first user and resharded after its last; a rank with more than
    `max-active` stages may gather a stage more than once. `hpr-verify`
    checks that every user lies between an unshard and the reshard after it
    (`[hpr.verify.gathered]`, docs/rules.md).

    Does nothing without data parallelism or with `dp_shard` 1 (HSDP's
    replicate-only layout gathers nothing), and leaves alone a program
    that already has an `hpr.unshard` or `hpr.reshard` (a schedule written
    with them). Each program on its own; reads the enclosing module's
    `hpr.model`. `hpr.reduce_grad` is placed at import
    (mlir::hpr::sched::lowerReduceGrad), after the stage's last W or B.
  }];
  let dependentDialects = ["::mlir::hpr::HPRDialect"];
  let options = [
    Option<"maxActive", "max-active", "unsigned", /*default=*/"3",
           "Stages kept gathered at once (torch's max_active_stages)">,
  ];
  let statistics = [
    Statistic<"numUnshardInserted", "num-unshard-inserted",
              "Number of hpr.unshard ops inserted">,
    Statistic<"numReshardInserted", "num-reshard-inserted",
              "Number of hpr.reshard ops inserted">,
  ];
}

def HPRLowerRuntime : Pass<"hpr-lower-runtime", "::mlir::ModuleOp"> {
  let summary = "Write onto each action what its runtime executes without "
                "deriving it";
  let description = [{
    The last planning pass: after it, `--emit mlir` is the plan, and the plan
    JSON and torch CSV writers only print what the ops carry. On every
    `hpr.schedule` of the module (rules in hpr/Analysis/RuntimeLowering.h,
    ids in docs/rules.md; action indices count a program's actions as the
    plan JSON lists them, sessions not counted):
    1. `posts` on every receive: the receives to post when it is reached, in
       posting order: in its peer's send order, no later than their own
       places ([hpr.schedule.posts]). Where any receive of the schedule
       already carries `posts` (a plan read back), the given ones are kept
       and a receive without one gets an empty list.
    2. `tag` on every transfer that has none: (sending stage, microbatch,
       direction), the same number at both ends.
    3. `waits` on the forward, first `backward_input` or `backward` that
       reads a receive's data: the receives it reads ([hpr.plan.waits]).
    4. `frees_graph` on the last backward of each (stage, microbatch).
    5. `last_backward` on the last `backward_weight` or `backward` of each
       stage ([hpr.plan.last-backward]).
    6. `hands_to` on a forward, `backward_input` or `backward` whose result
       goes to a stage on the same rank: that stage ([hpr.plan.hands-to]).
    7. `drops_replay` on the `backward_input` of each session that has an
       `hpr.recompute {for_weight}` ([hpr.plan.drops-replay]).
    Members 3-7 are recomputed and replace what an op carried, so running
    the pass twice changes nothing. Passes that add, remove or move actions
    run before it: the indices of `posts` and `waits` name positions. Ranks
    are lowered in parallel once the send order of every rank is known.
  }];
  let dependentDialects = ["::mlir::hpr::HPRDialect"];
  let statistics = [
    Statistic<"numWaits", "num-waits", "Actions given waits">,
    Statistic<"numHandoffs", "num-handoffs", "Actions given hands_to">,
  ];
}

def HPRVerify : Pass<"hpr-verify", "::mlir::hpr::ProgramOp"> {
  let summary = "Statically check every recompute session's lifecycle";
  let description = [{
    Independent of the passes that build the plan: one walk per program with
    its own bookkeeping, sharing no query with them, so it also checks plans
    written by hand or by other tools. For every session, in its rank's
    program order:
    1. exactly one `hpr.recompute`, on the owning rank, after the forward,
       or pieces (check 11);
    2. the recompute (every piece) precedes every consumer;
    3. exactly one `hpr.clear`, after the last consumer;
    4. no consumer and no recompute after the clear;
    5. `retain_on_unpack` is set on every consumer but the last, and not on
       the last;
    6. no session is left without a clear (leak) or without a recompute
       while it has consumers;
    7. every consumer of a checkpointed stage that reads activations reads
       a session, unless its forward is marked `no_checkpoint` (and such a
       forward has none); the first stage's `hpr.backward_input` reads none
       (the model input needs no gradient) and may read no session;
    8. the compute order of each program equals the schedule's: its
       forward/backward actions, compared one by one with the program's
       `compute_order` record written at import (when present); the first
       op that differs is reported with what the schedule has there;
    9. `[hpr.verify.gathered]`: on a rank whose program has an
       `hpr.unshard` of a stage, every forward, backward_input,
       backward_weight, backward and recompute of that stage lies between an `hpr.unshard` of it and the
       `hpr.reshard` after it; a stage is not unsharded twice without a
       reshard in between, nor resharded while not unsharded;
    10. a recompute marked `in_backward` (replayed inside its backward,
       region by region) has one consumer, a whole backward (an
       `hpr.backward`, or the first stage's `hpr.backward_weight`), and no
       forward or backward between them but the forward of that backward's
       overlapped pair;
    11. `[hpr.verify.pieces]`: a replay in pieces (`regions` on its
       `hpr.recompute`s) is pieces only, each region replayed by one piece,
       every checkpointed region of the stage by some piece (when the
       module's `hpr.model` says how many), and a piece marked `in_backward`
       is the session's last; it is then the one check 10 covers;
    12. `[hpr.verify.weight-replay]`: a replay for a dw (`hpr.recompute
       {for_weight}`) is whole (no `regions`, not `in_backward`), at most one
       per session, on a session read by a `hpr.backward_input` and then a
       `hpr.backward_weight`, after that dx and before that dw, and exactly
       where that dw says `weight_replay`; a `weight_replay` dw reads such a
       session and has its replay. It is not the session's replay of check
       1: checks 1-4 and 11 count the others.
    Each violation is reported on the offending op with the rank, the index
    of the action in its program and the action (messages of checks 9, 11
    and 12 end with the rule's id, docs/rules.md), and the pass fails.
    Each program on its own; checks 7 and 11 read the enclosing module's
    `hpr.model` (without one, check 7 and the coverage of check 11 are
    skipped).
  }];
  let dependentDialects = ["::mlir::hpr::HPRDialect"];
  let statistics = [
    Statistic<"numSessionsVerified", "num-sessions-verified",
              "Number of sessions whose lifecycle was checked">,
  ];
}

#endif // HPR_TRANSFORMS_PASSES
