//===- ScheduleCsv.cpp - torch.distributed.pipelining CSV schedules -------===//
//
// A hand-written lexer over one cell at a time. Grammar (docs/schedules.md):
//
//   cell      ::= ''                                  (idle)
//               | simple
//               | '(' compute (';' compute)+ ')' 'OVERLAP_F_B'
//               | comm ('_' comm)+                    (legacy dialect only)
//   simple    ::= stage type microbatch | stage nomb-type
//   stage, microbatch ::= [0-9]+
//
// The whole cell must match; anything left over is an error.
//
//===----------------------------------------------------------------------===//

#include "hpr/Schedule/ScheduleCsv.h"
#include "hpr/Schedule/ScheduleUtils.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

namespace mlir::hpr::sched {
namespace {

constexpr llvm::StringLiteral kCurrentTypes =
    "F, I, W, B, SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, "
    "REDUCE_GRAD, RECOMPUTE or CLEAR";
constexpr llvm::StringLiteral kLegacyTypes =
    "F, B, W, BW, SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, "
    "REDUCE_GRAD, RECOMPUTE or CLEAR";

/// Maps a type name to its kind in `dialect`; false if unknown.
bool lookupType(llvm::StringRef name, CsvDialect dialect, ActionKind &kind) {
  if (name == "F")
    kind = ActionKind::Forward;
  else if (name == "W")
    kind = ActionKind::BackwardWeight;
  else if (name == "I" && dialect == CsvDialect::Current)
    kind = ActionKind::BackwardInput;
  else if (name == "B")
    kind = dialect == CsvDialect::Current ? ActionKind::Backward
                                          : ActionKind::BackwardInput;
  else if (name == "BW" && dialect == CsvDialect::Legacy)
    kind = ActionKind::Backward;
  else if (name == "SEND_F")
    kind = ActionKind::SendF;
  else if (name == "RECV_F")
    kind = ActionKind::RecvF;
  else if (name == "SEND_B")
    kind = ActionKind::SendB;
  else if (name == "RECV_B")
    kind = ActionKind::RecvB;
  else if (name == "UNSHARD")
    kind = ActionKind::Unshard;
  else if (name == "RESHARD")
    kind = ActionKind::Reshard;
  else if (name == "REDUCE_GRAD")
    kind = ActionKind::ReduceGrad;
  else if (name == "RECOMPUTE")
    kind = ActionKind::Recompute;
  else if (name == "CLEAR")
    kind = ActionKind::Clear;
  else
    return false;
  return true;
}

llvm::StringRef typeName(ActionKind kind, CsvDialect dialect) {
  bool legacy = dialect == CsvDialect::Legacy;
  switch (kind) {
  case ActionKind::Forward:
    return "F";
  case ActionKind::BackwardInput:
    return legacy ? "B" : "I";
  case ActionKind::BackwardWeight:
    return "W";
  case ActionKind::Backward:
    return legacy ? "BW" : "B";
  case ActionKind::SendF:
    return "SEND_F";
  case ActionKind::RecvF:
    return "RECV_F";
  case ActionKind::SendB:
    return "SEND_B";
  case ActionKind::RecvB:
    return "RECV_B";
  case ActionKind::Unshard:
    return "UNSHARD";
  case ActionKind::Reshard:
    return "RESHARD";
  case ActionKind::ReduceGrad:
    return "REDUCE_GRAD";
  case ActionKind::Recompute:
    return "RECOMPUTE";
  case ActionKind::Clear:
    return "CLEAR";
  case ActionKind::Idle:
  case ActionKind::OverlapFB:
  case ActionKind::BatchedComm:
    break;
  }
  return "";
}

/// Lexes one primitive action at the start of `text`, advancing `text` past
/// it. On failure sets `expected` to the "expected ..." message.
bool lexPrimitive(llvm::StringRef &text, CsvDialect dialect, Action &out,
                  std::string &expected) {
  expected.clear();
  auto lexNumber = [&](int limit, const char *what, int &value) {
    size_t n = 0;
    int64_t v = 0;
    while (n < text.size() && llvm::isDigit(text[n])) {
      v = v * 10 + (text[n] - '0');
      if (v > limit) {
        expected = (llvm::Twine("a ") + what + " number of at most " +
                    llvm::Twine(limit))
                       .str();
        return false;
      }
      ++n;
    }
    if (n == 0)
      return false;
    value = static_cast<int>(v);
    text = text.drop_front(n);
    return true;
  };

  int stage = 0;
  if (!lexNumber(kMaxStage, "stage", stage)) {
    if (expected.empty())
      expected = "expected {stage}{type}{microbatch} starting with a stage "
                 "number, got '" +
                 text.str() + "'";
    else
      expected = "expected " + expected;
    return false;
  }
  size_t n = 0;
  while (n < text.size() && (llvm::isAlpha(text[n]) || text[n] == '_'))
    ++n;
  llvm::StringRef name = text.take_front(n);
  // A legacy combined comm continues with '_' and a digit: do not swallow
  // the separator into the type name.
  if (name.size() > 1 && name.back() == '_' && n < text.size() &&
      llvm::isDigit(text[n]))
    name = name.drop_back();
  ActionKind kind;
  llvm::StringRef types =
      dialect == CsvDialect::Current ? kCurrentTypes : kLegacyTypes;
  if (name.empty()) {
    expected = ("expected an action type (" + types +
                ") after the stage number, got '" + text + "'")
                   .str();
    return false;
  }
  if (!lookupType(name, dialect, kind)) {
    expected = ("expected an action type (" + types +
                ") after the stage number, got '" + name + "'")
                   .str();
    if (dialect == CsvDialect::Current && name == "BW")
      expected += " (BW is the legacy dialect's full backward; the current "
                  "dialect writes B)";
    else if (dialect == CsvDialect::Legacy && name == "I")
      expected += " (I is the current dialect's dx; the legacy dialect writes "
                  "B)";
    return false;
  }
  text = text.drop_front(name.size());
  out = Action();
  out.kind = kind;
  out.stage = stage;
  if (hasNoMicrobatch(kind)) {
    return true;
  }
  int mb = 0;
  if (!lexNumber(kMaxMicrobatch, "microbatch", mb)) {
    if (expected.empty())
      expected = ("expected a microbatch number after '" + name + "'" +
                  (text.empty() ? llvm::Twine("")
                                : llvm::Twine(", got '") + text + "'"))
                     .str();
    else
      expected = "expected " + expected;
    return false;
  }
  out.microbatch = mb;
  return true;
}

/// Parses a whole cell; on failure returns the "expected ..." text.
bool parseCell(llvm::StringRef cell, CsvDialect dialect, Action &out,
               std::string &expected) {
  if (cell.empty()) {
    out = Action();
    return true;
  }
  if (cell.front() == '(') {
    size_t close = cell.find(')');
    if (close == llvm::StringRef::npos) {
      expected = "expected ')' closing the composite";
      return false;
    }
    llvm::StringRef inner = cell.slice(1, close);
    llvm::StringRef suffix = cell.drop_front(close + 1);
    if (inner.contains('(')) {
      expected = "expected a composite of primitive actions (no nesting)";
      return false;
    }
    if (suffix != "OVERLAP_F_B") {
      expected =
          ("expected 'OVERLAP_F_B' after ')', got '" + suffix + "'").str();
      return false;
    }
    Action composite;
    composite.kind = ActionKind::OverlapFB;
    llvm::SmallVector<llvm::StringRef, 2> pieces;
    inner.split(pieces, ';');
    if (pieces.size() < 2) {
      expected = "expected at least two ';'-separated actions inside "
                 "'(...)OVERLAP_F_B'";
      return false;
    }
    for (llvm::StringRef piece : pieces) {
      llvm::StringRef rest = piece;
      Action part;
      if (!lexPrimitive(rest, dialect, part, expected))
        return false;
      if (!rest.empty()) {
        expected = ("expected ';' or ')' after '" +
                    piece.drop_back(rest.size()) + "', got '" + rest + "'")
                       .str();
        return false;
      }
      if (!isCompute(part.kind)) {
        expected = ("expected a compute action (F, I, W, B) inside "
                    "OVERLAP_F_B, got '" +
                    piece + "'")
                       .str();
        return false;
      }
      composite.parts.push_back(std::move(part));
    }
    out = std::move(composite);
    return true;
  }

  llvm::StringRef rest = cell;
  Action first;
  if (!lexPrimitive(rest, dialect, first, expected))
    return false;
  if (rest.empty()) {
    out = std::move(first);
    return true;
  }
  bool batched = dialect == CsvDialect::Legacy && isComm(first.kind) &&
                 rest.size() > 1 && rest.front() == '_' &&
                 llvm::isDigit(rest[1]);
  if (!batched) {
    llvm::StringRef done = cell.drop_back(rest.size());
    expected =
        ("expected the cell to end after '" + done + "', got '" + rest + "'")
            .str();
    if (dialect == CsvDialect::Current && isComm(first.kind) &&
        rest.front() == '_')
      expected += " (combined comm cells exist only in the legacy dialect)";
    return false;
  }
  Action combined;
  combined.kind = ActionKind::BatchedComm;
  combined.parts.push_back(std::move(first));
  while (!rest.empty()) {
    if (rest.size() < 2 || rest.front() != '_' || !llvm::isDigit(rest[1])) {
      expected =
          ("expected '_' and the next comm action, got '" + rest + "'").str();
      return false;
    }
    rest = rest.drop_front();
    Action part;
    llvm::StringRef before = rest;
    if (!lexPrimitive(rest, dialect, part, expected))
      return false;
    if (!isComm(part.kind)) {
      expected = ("expected a SEND/RECV action in a combined comm cell, got '" +
                  before.drop_back(rest.size()) + "'")
                     .str();
      return false;
    }
    combined.parts.push_back(std::move(part));
  }
  out = std::move(combined);
  return true;
}

void appendAction(std::string &out, const Action &action, CsvDialect dialect) {
  switch (action.kind) {
  case ActionKind::Idle:
    return;
  case ActionKind::OverlapFB:
    out += '(';
    for (size_t i = 0; i < action.parts.size(); ++i) {
      if (i)
        out += ';';
      appendAction(out, action.parts[i], dialect);
    }
    out += ")OVERLAP_F_B";
    return;
  case ActionKind::BatchedComm:
    for (size_t i = 0; i < action.parts.size(); ++i) {
      if (i)
        out += '_';
      appendAction(out, action.parts[i], dialect);
    }
    return;
  default:
    break;
  }
  char buf[16];
  auto appendInt = [&](int v) {
    int n = 0;
    unsigned u = v < 0 ? 0u : static_cast<unsigned>(v);
    do {
      buf[n++] = static_cast<char>('0' + u % 10);
      u /= 10;
    } while (u);
    while (n)
      out += buf[--n];
  };
  appendInt(action.stage);
  out += typeName(action.kind, dialect);
  if (!hasNoMicrobatch(action.kind))
    appendInt(action.microbatch);
}

/// `text` as an error message quotes it: control bytes as `\xNN`, and cut
/// after `limit` characters with its length noted (a cell can be megabytes).
std::string forMessage(llvm::StringRef text, size_t limit) {
  std::string out;
  for (char c : text.take_front(limit)) {
    auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f)
      out += llvm::formatv("\\x{0:x-2}", static_cast<unsigned>(byte)).str();
    else
      out += c;
  }
  if (text.size() > limit)
    out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

} // namespace

llvm::Expected<Action> parseAction(llvm::StringRef cell, CsvDialect dialect) {
  Action action;
  std::string expected;
  if (!parseCell(cell, dialect, action, expected))
    return llvm::createStringError(
        llvm::inconvertibleErrorCode(), "invalid action '%s': %s",
        forMessage(cell, 64).c_str(), forMessage(expected, 240).c_str());
  return action;
}

llvm::Expected<Schedule> parseScheduleCsv(llvm::StringRef text,
                                          llvm::StringRef fileName,
                                          CsvDialect dialect) {
  Schedule schedule;
  schedule.name = llvm::sys::path::stem(fileName).str();
  // Trailing blank lines do not make ranks.
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r'))
    text = text.drop_back();
  if (text.empty())
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "%s: empty schedule: expected one line of "
                                   "actions per rank",
                                   fileName.str().c_str());
  std::string expected;
  int row = 0;
  while (true) {
    size_t eol = text.find('\n');
    llvm::StringRef line = text.substr(0, eol);
    if (!line.empty() && line.back() == '\r')
      line = line.drop_back();
    ++row;
    std::vector<Action> program;
    program.reserve(line.size() / 4 + 1);
    int col = 0;
    while (true) {
      size_t comma = line.find(',');
      llvm::StringRef cell = line.substr(0, comma).trim(" \t");
      ++col;
      Action action;
      if (!parseCell(cell, dialect, action, expected))
        return llvm::createStringError(
            llvm::inconvertibleErrorCode(), "%s:%d:%d: invalid action '%s': %s",
            fileName.str().c_str(), row, col, forMessage(cell, 64).c_str(),
            forMessage(expected, 240).c_str());
      action.sourceCell = col - 1;
      program.push_back(std::move(action));
      if (comma == llvm::StringRef::npos)
        break;
      line = line.drop_front(comma + 1);
    }
    schedule.ranks.push_back(std::move(program));
    if (eol == llvm::StringRef::npos)
      break;
    text = text.drop_front(eol + 1);
  }
  inferScheduleShape(schedule);
  return schedule;
}

std::string formatAction(const Action &action, CsvDialect dialect) {
  std::string out;
  appendAction(out, action, dialect);
  return out;
}

std::string printScheduleCsv(const Schedule &schedule, CsvDialect dialect) {
  std::string out;
  for (const auto &program : schedule.ranks) {
    bool first = true;
    for (const Action &action : program) {
      if (action.kind == ActionKind::BatchedComm &&
          dialect == CsvDialect::Current) {
        for (const Action &part : action.parts) {
          if (!first)
            out += ',';
          first = false;
          appendAction(out, part, dialect);
        }
        continue;
      }
      if (!first)
        out += ',';
      first = false;
      appendAction(out, action, dialect);
    }
    out += '\n';
  }
  return out;
}

} // namespace mlir::hpr::sched
