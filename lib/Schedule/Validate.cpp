//===- Validate.cpp - Pipeline schedule validation ------------------------===//
//
// Rules are checked in the order listed in Validate.h; every violation is
// collected with its location, and the deadlock simulation runs only on a
// schedule whose structure is sound (it relies on unique producers).
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/Validate.h"
#include "hpr/Schedule/Lowering.h"
#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Schedule/ScheduleUtils.h"
#include "hpr/Schedule/Simulate.h"
#include "hpr/Support/Rules.h"

#include "ActionTable.h"

#include <map>
#include <set>
#include <tuple>

namespace mlir::hpr::sched {

using namespace detail;

namespace {

constexpr size_t kMaxReported = 50;

/// A primitive action's place: rank, action index, composite part (-1).
struct Loc {
  int rank = -1;
  int index = -1;
  int part = -1;
  bool valid() const { return rank >= 0; }
  bool before(const Loc &o) const {
    return index < o.index || (index == o.index && part < o.part);
  }
};

class Validator {
public:
  Validator(const Schedule &schedule, ValidateOptions options)
      : schedule(schedule), options(options), numbering(schedule) {}

  Violations run();

private:
  const Schedule &schedule;
  ValidateOptions options;
  ActionNumbering numbering;
  ActionTable table;
  std::vector<uint8_t> dxIsFull; // per (stage, mb): the Dx slot holds a B
  Violations found;

  void report(Violation violation) {
    if (found.list.size() < kMaxReported)
      found.list.push_back(std::move(violation));
    else
      ++found.dropped;
  }
  void report(const std::string &message) {
    report(Violation{-1, -1, message, {}});
  }
  const Action &primitiveAt(const Loc &loc) const {
    const Action &a = schedule.ranks[loc.rank][loc.index];
    return loc.part >= 0 ? a.parts[loc.part] : a;
  }
  std::string where(const Loc &loc) const {
    std::string s = "rank " + std::to_string(loc.rank) + ", action " +
                    std::to_string(loc.index);
    if (loc.part >= 0)
      s += " part " + std::to_string(loc.part);
    return s + " (" + formatAction(primitiveAt(loc)) + ")";
  }
  void reportAt(const Loc &loc, const std::string &message) {
    report(Violation{loc.rank, loc.index, where(loc) + ": " + message, {}});
  }
  Loc locate(int slot, int stage, int mb) const {
    size_t k = table.key(slot, stage, mb);
    if (table.count[k] == 0)
      return {};
    int64_t id = table.first[k];
    int r = numbering.rankOf(id);
    return {r, static_cast<int>(id - numbering.offset[r]), table.firstPart[k]};
  }
  int countOf(int slot, int stage, int mb) const {
    return table.count[table.key(slot, stage, mb)];
  }
  static std::string sm(int stage, int mb) {
    return "stage " + std::to_string(stage) + ", microbatch " +
           std::to_string(mb);
  }

  template <typename Fn> void forEachLoc(Fn &&fn) const {
    for (int r = 0, nr = static_cast<int>(schedule.ranks.size()); r < nr; ++r) {
      const auto &program = schedule.ranks[r];
      for (int k = 0, n = static_cast<int>(program.size()); k < n; ++k) {
        const Action &a = program[k];
        if (a.parts.empty()) {
          if (a.kind != ActionKind::Idle)
            fn(a, Loc{r, k, -1});
        } else {
          for (int p = 0, np = static_cast<int>(a.parts.size()); p < np; ++p)
            fn(a.parts[p], Loc{r, k, p});
        }
      }
    }
  }

  bool checkShape();
  void checkComposites();
  void indexActions();
  void checkCoverage();
  void checkOrder();
  void checkComms();
  void checkTags();
  void checkReduceGrad();
  void checkPosts();
};

bool Validator::checkShape() {
  bool ok = true;
  if (schedule.numRanks != static_cast<int>(schedule.ranks.size())) {
    report("numRanks is " + std::to_string(schedule.numRanks) +
           " but there are " + std::to_string(schedule.ranks.size()) +
           " rank programs");
    ok = false;
  }
  if (schedule.numStages <= 0 || schedule.numMicrobatches <= 0) {
    report("expected at least one stage and one microbatch, got " +
           std::to_string(schedule.numStages) + " stages and " +
           std::to_string(schedule.numMicrobatches) + " microbatches");
    return false;
  }
  if (schedule.stageToRank.size() != static_cast<size_t>(schedule.numStages)) {
    report("stageToRank has " + std::to_string(schedule.stageToRank.size()) +
           " entries for " + std::to_string(schedule.numStages) + " stages");
    return false;
  }
  // Every (stage, microbatch) needs its own forward, so more pairs than
  // actions cannot be valid; refuse before building tables of that size.
  int64_t pairs =
      static_cast<int64_t>(schedule.numStages) * schedule.numMicrobatches;
  if (pairs > numbering.size()) {
    report(std::to_string(schedule.numStages) + " stages x " +
           std::to_string(schedule.numMicrobatches) + " microbatches need " +
           std::to_string(pairs) + " forwards but the schedule has only " +
           std::to_string(numbering.size()) + " actions");
    return false;
  }
  std::vector<Loc> firstOn(schedule.numStages);
  std::set<std::pair<int, int>> reportedPlacement;
  forEachLoc([&](const Action &a, const Loc &loc) {
    if (a.stage < 0 || a.stage >= schedule.numStages) {
      reportAt(loc, "stage out of range (the schedule has " +
                        std::to_string(schedule.numStages) + " stages)");
      ok = false;
      return;
    }
    if (!hasNoMicrobatch(a.kind) &&
        (a.microbatch < 0 || a.microbatch >= schedule.numMicrobatches)) {
      reportAt(loc, "microbatch out of range (the schedule has " +
                        std::to_string(schedule.numMicrobatches) +
                        " microbatches)");
      ok = false;
      return;
    }
    Loc &first = firstOn[a.stage];
    if (!first.valid()) {
      first = loc;
    } else if (first.rank != loc.rank &&
               reportedPlacement.insert({a.stage, loc.rank}).second) {
      reportAt(loc, "stage " + std::to_string(a.stage) + " also runs on rank " +
                        std::to_string(first.rank) + " (" + where(first) +
                        "); each stage runs on exactly one rank");
      ok = false;
    }
  });
  for (int s = 0; s < schedule.numStages; ++s) {
    if (!firstOn[s].valid()) {
      report("stage " + std::to_string(s) + ": no rank runs it");
      ok = false;
    } else if (schedule.stageToRank[s] != firstOn[s].rank) {
      report("stage " + std::to_string(s) + ": stageToRank says rank " +
             std::to_string(schedule.stageToRank[s]) +
             " but its actions are on rank " + std::to_string(firstOn[s].rank));
      ok = false;
    }
  }
  return ok;
}

void Validator::indexActions() {
  table.reset(schedule.numStages, schedule.numMicrobatches);
  dxIsFull.assign(
      static_cast<size_t>(schedule.numStages) * schedule.numMicrobatches, 0);
  static const char *what[] = {"forward", "dx/backward", "dw",
                               "SEND_F",  "SEND_B",      "RECV_F",
                               "RECV_B",  "RECOMPUTE",   "CLEAR"};
  forEachLoc([&](const Action &a, const Loc &loc) {
    int slot = slotOf(a.kind);
    if (slot < 0)
      return;
    Loc first = locate(slot, a.stage, a.microbatch);
    int n = table.add(slot, a.stage, a.microbatch,
                      numbering.id(loc.rank, loc.index), loc.part);
    if (slot == SlotDx && n == 1)
      dxIsFull[static_cast<size_t>(a.stage) * schedule.numMicrobatches +
               a.microbatch] = a.kind == ActionKind::Backward;
    // A session's clears and the pieces of its replay are hpr-verify's
    // (rules 1, 3 and 11): it sees the sessions and the pieces' regions.
    if (n > 1 && slot != SlotClear && slot != SlotRecompute)
      reportAt(loc, std::string("second ") + what[slot] + " of " +
                        sm(a.stage, a.microbatch) + " (first at " +
                        where(first) + ")");
  });
}

void Validator::checkCoverage() {
  for (int s = 0; s < schedule.numStages; ++s) {
    for (int mb = 0; mb < schedule.numMicrobatches; ++mb) {
      if (countOf(SlotF, s, mb) == 0)
        report(sm(s, mb) + ": never forwarded (stage " + std::to_string(s) +
               " runs on rank " + std::to_string(schedule.stageToRank[s]) +
               ")");
      Loc dx = locate(SlotDx, s, mb);
      Loc w = locate(SlotW, s, mb);
      bool full =
          dxIsFull[static_cast<size_t>(s) * schedule.numMicrobatches + mb];
      if (!dx.valid()) {
        if (w.valid())
          reportAt(w, "dw without its dx: no I for " + sm(s, mb));
        else
          report(sm(s, mb) + ": never backpropagated (no B, or I and W)");
      } else if (full && w.valid()) {
        reportAt(w, "dw after a full backward: " + where(dx) +
                        " already computes the weight gradient");
      } else if (!full && !w.valid()) {
        reportAt(dx, "dx without dw: no W for " + sm(s, mb));
      }
    }
  }
}

void Validator::checkOrder() {
  forEachLoc([&](const Action &a, const Loc &loc) {
    const char *rule = nullptr;
    Loc need;
    switch (a.kind) {
    case ActionKind::BackwardInput:
      need = locate(SlotF, a.stage, a.microbatch);
      rule = "dx before its forward";
      break;
    case ActionKind::Backward:
      need = locate(SlotF, a.stage, a.microbatch);
      rule = "backward before its forward";
      break;
    case ActionKind::BackwardWeight:
      need = locate(SlotDx, a.stage, a.microbatch);
      rule = "dw before its dx";
      break;
    case ActionKind::Recompute:
      need = locate(SlotF, a.stage, a.microbatch);
      rule = "recompute before its forward";
      break;
    default:
      return;
    }
    if (!need.valid() || need.rank != loc.rank)
      return; // reported by coverage / placement
    if (need.index == loc.index && loc.part >= 0)
      reportAt(loc, std::string("depends on ") + where(need) +
                        " in the same OVERLAP_F_B; overlapped parts run "
                        "concurrently and must be independent");
    else if (!need.before(loc))
      reportAt(loc, std::string(rule) + " (" + where(need) + ")");
  });
}

void Validator::checkComms() {
  const auto &owner = schedule.stageToRank;
  const int S = schedule.numStages;
  auto needsTransfer = [&](int from, int to) {
    return from >= 0 && to >= 0 && from < S && to < S &&
           owner[from] != owner[to];
  };
  // Transfers that must exist, located at their compute actions.
  auto expect = [&](int sendSlot, int recvSlot, const char *sendName,
                    const char *recvName, int s, int mb, int peer) {
    Loc producer = locate(sendSlot == SlotSendF ? SlotF : SlotDx, s, mb);
    Loc consumer = locate(sendSlot == SlotSendF ? SlotF : SlotDx, peer, mb);
    Loc send = locate(sendSlot, s, mb);
    Loc recv = locate(recvSlot, peer, mb);
    if (!send.valid())
      reportAt(producer, std::string("no ") + sendName + " after it (stage " +
                             std::to_string(peer) + " is on rank " +
                             std::to_string(owner[peer]) + ")");
    else if (!producer.before(send))
      reportAt(send, std::string("send before the action that produces it (") +
                         where(producer) + ")");
    if (!recv.valid()) {
      if (consumer.valid())
        reportAt(consumer, std::string("no ") + recvName +
                               " before it (stage " + std::to_string(s) +
                               " is on rank " + std::to_string(owner[s]) + ")");
    } else if (consumer.valid() && !recv.before(consumer)) {
      reportAt(recv, std::string("receive after the action that needs it (") +
                         where(consumer) + ")");
    }
  };
  for (int s = 0; s < S; ++s)
    for (int mb = 0; mb < schedule.numMicrobatches; ++mb) {
      if (needsTransfer(s, s + 1) && countOf(SlotF, s, mb))
        expect(SlotSendF, SlotRecvF, "SEND_F", "RECV_F", s, mb, s + 1);
      if (needsTransfer(s, s - 1) && countOf(SlotDx, s, mb))
        expect(SlotSendB, SlotRecvB, "SEND_B", "RECV_B", s, mb, s - 1);
    }
  // Transfers that must not exist.
  forEachLoc([&](const Action &a, const Loc &loc) {
    if (!isComm(a.kind))
      return;
    int s = a.stage, peer = neighbourStage(a);
    if (peer < 0 || peer >= S)
      reportAt(loc, "no stage " + std::to_string(peer) + " to exchange with");
    else if (!needsTransfer(s, peer))
      reportAt(loc, "unneeded transfer: stages " + std::to_string(s) + " and " +
                        std::to_string(peer) + " are both on rank " +
                        std::to_string(owner[s]));
  });
}

void Validator::checkTags() {
  const auto &owner = schedule.stageToRank;
  const int S = schedule.numStages;
  bool tagged = false;
  forEachLoc([&](const Action &a, const Loc &) {
    tagged |= isComm(a.kind) && a.tag.has_value();
  });
  if (!tagged)
    return;
  // (rank, peer, is a send, tag) -> the first transfer that uses it.
  std::map<std::tuple<int, int, bool, int64_t>, Loc> used;
  forEachLoc([&](const Action &a, const Loc &loc) {
    if (!isComm(a.kind))
      return;
    if (!a.tag) {
      reportAt(loc, "no message tag, but other transfers of this schedule "
                    "have one; a tagged schedule tags every transfer");
      return;
    }
    bool isSend = a.kind == ActionKind::SendF || a.kind == ActionKind::SendB;
    int neighbour = neighbourStage(a);
    if (neighbour < 0 || neighbour >= S)
      return; // reported by checkComms
    auto [it, inserted] =
        used.insert({{loc.rank, owner[neighbour], isSend, *a.tag}, loc});
    if (!inserted)
      reportAt(loc, "tag " + std::to_string(*a.tag) + " is already used by " +
                        where(it->second) + ", another " +
                        (isSend ? "send to" : "receive from") + " rank " +
                        std::to_string(owner[neighbour]) +
                        "; a receive takes the first message from its source "
                        "with its tag, so tags must be unique per peer and "
                        "direction");
  });
  // Both ends of a transfer carry the same tag.
  for (int s = 0; s < S; ++s)
    for (int mb = 0; mb < schedule.numMicrobatches; ++mb)
      for (auto [sendSlot, recvSlot, peer] :
           {std::tuple{SlotSendF, SlotRecvF, s + 1},
            std::tuple{SlotSendB, SlotRecvB, s - 1}}) {
        if (peer < 0 || peer >= S)
          continue;
        Loc send = locate(sendSlot, s, mb), recv = locate(recvSlot, peer, mb);
        if (!send.valid() || !recv.valid())
          continue;
        const auto &sendTag = primitiveAt(send).tag,
                   &recvTag = primitiveAt(recv).tag;
        if (sendTag && recvTag && *sendTag != *recvTag)
          reportAt(recv, "tag " + std::to_string(*recvTag) +
                             " differs from tag " + std::to_string(*sendTag) +
                             " of its send at " + where(send) +
                             "; both ends of a transfer carry one tag");
      }
}

void Validator::checkReduceGrad() {
  std::vector<Loc> lastGradient(schedule.numStages),
      reduced(schedule.numStages);
  forEachLoc([&](const Action &a, const Loc &loc) {
    if (a.kind == ActionKind::BackwardWeight ||
        a.kind == ActionKind::Backward) {
      Loc &last = lastGradient[a.stage];
      if (!last.valid() || last.before(loc))
        last = loc;
    }
  });
  forEachLoc([&](const Action &a, const Loc &loc) {
    if (a.kind != ActionKind::ReduceGrad)
      return;
    Loc &first = reduced[a.stage];
    const Loc &last = lastGradient[a.stage];
    if (first.valid())
      reportAt(loc, "second REDUCE_GRAD of stage " + std::to_string(a.stage) +
                        " (first at " + where(first) +
                        "); gradients are reduced once per stage, or they "
                        "are scaled twice " +
                        ruleTag(Rule::ScheduleReduceGrad).str());
    else if (last.valid() && last.rank == loc.rank && loc.before(last))
      reportAt(loc, "REDUCE_GRAD before " + where(last) +
                        ", the last W or B of stage " +
                        std::to_string(a.stage) +
                        "; gradients are reduced once per stage, after its "
                        "last W and B " +
                        ruleTag(Rule::ScheduleReduceGrad).str());
    if (!first.valid())
      first = loc;
  });
  if (!options.finishedPlan)
    return;
  for (int s = 0; s < schedule.numStages; ++s)
    if (lastGradient[s].valid() && !reduced[s].valid())
      reportAt(lastGradient[s],
               "no REDUCE_GRAD of stage " + std::to_string(s) +
                   " after this, its last W or B; a plan reduces each "
                   "stage's gradients exactly once, after its last W and B " +
                   ruleTag(Rule::ScheduleReduceGrad).str());
}

/// [hpr.schedule.posts]: the posting order a plan gives its receives. torch's
/// point-to-point ops carry no tag, so two ranks match messages in posting
/// order; each receive must be posted once, no later than its own place, and
/// a rank posts its receives from one peer in the order the peer sends them.
void Validator::checkPosts() {
  bool given = options.finishedPlan;
  forEachLoc(
      [&](const Action &a, const Loc &) { given |= a.posts.has_value(); });
  if (!given)
    return;
  const std::string cite = ruleTag(Rule::SchedulePosts).str();
  const auto &owner = schedule.stageToRank;
  const int S = schedule.numStages;
  auto isRecv = [](const Action &a) {
    return a.kind == ActionKind::RecvF || a.kind == ActionKind::RecvB;
  };
  auto isSend = [](const Action &a) {
    return a.kind == ActionKind::SendF || a.kind == ActionKind::SendB;
  };
  // A message by its sender: (forward?, sending stage, microbatch), and the
  // rank on the other side of a transfer (-1 when it has none).
  using Message = std::tuple<bool, int, int>;
  auto messageOf = [](const Action &a) {
    bool forward = a.kind == ActionKind::SendF || a.kind == ActionKind::RecvF;
    bool send = a.kind == ActionKind::SendF || a.kind == ActionKind::SendB;
    return Message{forward, send ? a.stage : neighbourStage(a), a.microbatch};
  };
  auto peerOf = [&](const Action &a) {
    int neighbour = neighbourStage(a);
    return neighbour >= 0 && neighbour < S ? owner[neighbour] : -1;
  };
  // Each rank's primitives by plan index (idle slots and composite parts
  // count one each).
  std::vector<std::vector<Loc>> flat(schedule.ranks.size());
  for (int r = 0, nr = static_cast<int>(schedule.ranks.size()); r < nr; ++r)
    for (int k = 0, n = static_cast<int>(schedule.ranks[r].size()); k < n;
         ++k) {
      const Action &a = schedule.ranks[r][k];
      if (a.parts.empty())
        flat[r].push_back(Loc{r, k, -1});
      for (int p = 0, np = static_cast<int>(a.parts.size()); p < np; ++p)
        flat[r].push_back(Loc{r, k, p});
    }
  // (rank, peer) -> the messages the rank sends there, in its order.
  std::map<std::pair<int, int>, std::vector<Message>> sent;
  forEachLoc([&](const Action &a, const Loc &loc) {
    if (isSend(a) && peerOf(a) >= 0)
      sent[{loc.rank, peerOf(a)}].push_back(messageOf(a));
  });
  for (int r = 0, nr = static_cast<int>(flat.size()); r < nr; ++r) {
    const std::vector<Loc> &locs = flat[r];
    std::vector<int> postedBy(locs.size(), -1);
    // peer -> (message, the receive, the receive that posts it), in posting
    // order.
    std::map<int, std::vector<std::tuple<Message, Loc, Loc>>> posted;
    for (int i = 0, n = static_cast<int>(locs.size()); i < n; ++i) {
      const Action &a = primitiveAt(locs[i]);
      if (!a.posts)
        continue;
      if (!isRecv(a)) {
        reportAt(locs[i], "only a receive posts receives " + cite);
        continue;
      }
      for (int j : *a.posts) {
        if (j < 0 || j >= n || !isRecv(primitiveAt(locs[j]))) {
          reportAt(locs[i],
                   "posts " + std::to_string(j) +
                       ", which is not a receive of rank " + std::to_string(r) +
                       (j >= 0 && j < n ? " (" + where(locs[j]) + ")" : "") +
                       "; posts lists the indices of receives " + cite);
          continue;
        }
        if (postedBy[j] >= 0) {
          reportAt(locs[i],
                   "posts " + where(locs[j]) + " again (" +
                       where(locs[postedBy[j]]) +
                       " posts it first); each receive is posted once " + cite);
          continue;
        }
        postedBy[j] = i;
        if (j < i)
          reportAt(locs[i],
                   "posts " + where(locs[j]) +
                       ", which comes before it; a receive is posted no later "
                       "than its own place " +
                       cite);
        const Action &recv = primitiveAt(locs[j]);
        if (peerOf(recv) >= 0)
          posted[peerOf(recv)].push_back({messageOf(recv), locs[j], locs[i]});
      }
    }
    for (int j = 0, n = static_cast<int>(locs.size()); j < n; ++j)
      if (postedBy[j] < 0 && isRecv(primitiveAt(locs[j])))
        reportAt(locs[j],
                 "never posted: no receive lists it in posts; a plan "
                 "posts each receive once, no later than its own place " +
                     cite);
    // Against the peer's send order, over the messages both sides name (a
    // transfer without its other end is Validate.h's rule 5).
    for (auto &[peer, list] : posted) {
      auto sends = sent.find({peer, r});
      if (sends == sent.end())
        continue;
      std::map<Message, size_t> sendIndex;
      for (size_t k = 0; k < sends->second.size(); ++k)
        sendIndex.insert({sends->second[k], k});
      size_t previous = 0;
      const std::tuple<Message, Loc, Loc> *previousPost = nullptr;
      for (const auto &entry : list) {
        auto it = sendIndex.find(std::get<0>(entry));
        if (it == sendIndex.end())
          continue;
        if (previousPost && it->second < previous) {
          reportAt(std::get<2>(entry),
                   "posts " + where(std::get<1>(entry)) + " after " +
                       where(std::get<1>(*previousPost)) + ", but rank " +
                       std::to_string(peer) +
                       " sends its message first; receives from one peer "
                       "are posted in the order it sends, since untagged "
                       "messages match in posting order " +
                       cite);
          break;
        }
        previous = it->second;
        previousPost = &entry;
      }
    }
  }
}

/// OVERLAP_F_B is exactly a forward followed by one backward action (I, W or
/// B), as PyTorch's runtime executes it.
void Validator::checkComposites() {
  for (int r = 0, nr = static_cast<int>(schedule.ranks.size()); r < nr; ++r)
    for (int k = 0, n = static_cast<int>(schedule.ranks[r].size()); k < n;
         ++k) {
      const Action &a = schedule.ranks[r][k];
      if (a.kind != ActionKind::OverlapFB)
        continue;
      bool wellFormed = a.parts.size() == 2 &&
                        a.parts[0].kind == ActionKind::Forward &&
                        (a.parts[1].kind == ActionKind::BackwardInput ||
                         a.parts[1].kind == ActionKind::BackwardWeight ||
                         a.parts[1].kind == ActionKind::Backward);
      if (!wellFormed)
        report(Violation{
            r,
            k,
            "rank " + std::to_string(r) + ", action " + std::to_string(k) +
                " (" + formatAction(a) +
                "): OVERLAP_F_B takes a forward then one backward (I, W or B)",
            {}});
    }
}

Violations Validator::run() {
  if (checkShape()) {
    checkComposites();
    indexActions();
    checkCoverage();
    checkOrder();
    if (hasCommunication(schedule)) {
      checkComms();
      checkTags();
    }
    checkReduceGrad();
    bool sound = found.list.empty();
    checkPosts();
    if (sound) {
      auto sim = simulateSchedule(schedule, SimulationCosts(), /*fileName=*/"");
      if (!sim)
        llvm::handleAllErrors(
            sim.takeError(),
            [&](const DeadlockError &deadlock) {
              Violation v{deadlock.cycle.front().first,
                          deadlock.cycle.front().second,
                          deadlock.message,
                          {}};
              v.related.assign(deadlock.cycle.begin() + 1,
                               deadlock.cycle.end());
              report(std::move(v));
            },
            [&](const llvm::ErrorInfoBase &other) { report(other.message()); });
    }
  }
  return std::move(found);
}

} // namespace

Violations findViolations(const Schedule &schedule, ValidateOptions options) {
  return Validator(schedule, options).run();
}

llvm::Error validateSchedule(const Schedule &schedule,
                             llvm::StringRef fileName) {
  Violations found = findViolations(schedule);
  if (found.list.empty())
    return llvm::Error::success();
  std::string joined;
  for (const Violation &v : found.list) {
    if (!joined.empty())
      joined += '\n';
    joined += (fileName + ": " + v.message).str();
  }
  if (found.dropped)
    joined += ("\n" + fileName + ": ... and " + std::to_string(found.dropped) +
               " more violations")
                  .str();
  return llvm::createStringError(llvm::inconvertibleErrorCode(), joined);
}

} // namespace mlir::hpr::sched
