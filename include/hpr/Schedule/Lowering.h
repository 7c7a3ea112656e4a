//===- Lowering.h - Add send/recv and REDUCE_GRAD to schedules -*- C++ -*-===//
//
// PyTorch's `compute_only` schedules list only F/I/W/B (and OVERLAP_F_B);
// lowering adds the point-to-point transfers between ranks and each stage's
// REDUCE_GRAD.
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SCHEDULE_LOWERING_H
#define HPR_SCHEDULE_LOWERING_H

#include "hpr/Schedule/Schedule.h"

namespace mlir::hpr::sched {

/// True if any action (or composite part) is SEND_F, RECV_F, SEND_B, RECV_B
/// or a legacy batched comm.
bool hasCommunication(const Schedule &schedule);

/// Adds communication to a compute-only schedule: for F(s,m) with stage s+1
/// on another rank, SEND_F(s,m) right after the F and RECV_F(s+1,m) right
/// before F(s+1,m) on the receiver; for I(s,m) or B(s,m) with stage s-1 on
/// another rank, SEND_B(s,m) right after it and RECV_B(s-1,m) right before
/// the dx of (s-1,m). W sends nothing; stages on the same rank exchange
/// nothing. For OVERLAP_F_B the receives of both parts go before the
/// composite and the sends after it, in part order. A schedule that already
/// has communication is left unchanged. Uses schedule.stageToRank.
void lowerCommunication(Schedule &schedule);

/// Adds the REDUCE_GRAD of every stage that has a W or B and none yet, right
/// after the stage's last W or B (after the composite that holds it) and the
/// sends that directly follow it, where torch's `_add_reduce_grad` puts it
/// (torch adds REDUCE_GRAD before the transfers): the stage's gradients are
/// complete there. A REDUCE_GRAD the schedule already has keeps its place (rule
/// 8 of Validate.h checks it is after the last W and B). It takes the cell of
/// the action it follows.
void lowerReduceGrad(Schedule &schedule);

} // namespace mlir::hpr::sched

#endif // HPR_SCHEDULE_LOWERING_H
