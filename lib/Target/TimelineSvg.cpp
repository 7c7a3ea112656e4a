//===- TimelineSvg.cpp - The simulated timeline as a picture -------------===//

#include "hpr/Target/TimelineSvg.h"

#include "hpr/Analysis/ActivationModel.h"
#include "hpr/Analysis/Timeline.h"
#include "hpr/Schedule/ScheduleCsv.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>

using namespace mlir;
using namespace mlir::hpr;

namespace {

// Geometry, in pixels. The root element repeats the time mapping and each
// lane its top, so that tools (and the test) can find any action's box.
constexpr double kLeft = 90; // lane labels
constexpr double kPlotWidth = 1200;
constexpr double kTop = 56; // title and legend
constexpr double kLaneHeight = 30;
constexpr double kCurveHeight = 34;
constexpr double kRankGap = 14;
constexpr double kBottom = 36; // time axis

struct Style {
  const char *name;
  const char *fill;
};

/// Colours per kind, distinguishable in print and for common colour
/// blindness (Tableau 10).
Style styleOf(sched::ActionKind kind) {
  using Kind = sched::ActionKind;
  switch (kind) {
  case Kind::Forward:
    return {"F", "#4e79a7"};
  case Kind::BackwardInput:
    return {"I", "#59a14f"};
  case Kind::BackwardWeight:
    return {"W", "#edc948"};
  case Kind::Backward:
    return {"B", "#f28e2b"};
  case Kind::Recompute:
    return {"R", "#e15759"};
  case Kind::Clear:
    return {"C", "#3b3b3b"};
  default:
    return {"", "#bab0ac"};
  }
}
constexpr const char *kIdleFill = "#eeeeee";
constexpr const char *kCurveStroke = "#7b3294";

/// `text` with XML's special characters escaped (region names are any
/// string the model file gives).
std::string escapeXml(llvm::StringRef text) {
  std::string out;
  for (char c : text)
    switch (c) {
    case '<':
      out += "&lt;";
      break;
    case '>':
      out += "&gt;";
      break;
    case '&':
      out += "&amp;";
      break;
    case '"':
      out += "&quot;";
      break;
    default:
      out += c;
    }
  return out;
}

/// "1.45 MB": bytes for a label.
std::string formatBytes(int64_t bytes) {
  static const char *units[] = {"B", "kB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1000 && unit < 4) {
    value /= 1000;
    ++unit;
  }
  return llvm::formatv("{0:g} {1}", std::round(value * 100) / 100, units[unit])
      .str();
}

/// A round tick step near `span / 8`: 1, 2 or 5 times a power of ten.
double tickStep(double span) {
  double raw = span / 8;
  double base = std::pow(10, std::floor(std::log10(raw)));
  for (double factor : {1.0, 2.0, 5.0})
    if (base * factor >= raw)
      return base * factor;
  return base * 10;
}

void legendItem(llvm::raw_ostream &os, double x, const char *fill,
                llvm::StringRef text) {
  os << llvm::format("<rect x=\"%.1f\" y=\"30\" width=\"14\" height=\"14\" "
                     "fill=\"%s\"/>",
                     x, fill)
     << llvm::format("<text x=\"%.1f\" y=\"42\">", x + 19) << text
     << "</text>\n";
}

} // namespace

void mlir::hpr::writeTimelineSvg(ModuleOp module, const PlanSummary &summary,
                                 llvm::raw_ostream &os) {
  ModelOp model = getModel(module);
  ScheduleOp scheduleOp = getSchedule(module);
  std::vector<StageCost> costs = computeStageCosts(model);
  // What a recompute of each stage replays, and how: "layers.2 (selective)".
  std::vector<std::string> replays;
  for (StageOp stage : model.getBody().getOps<StageOp>()) {
    std::string &text = replays.emplace_back();
    for (RegionOp region : stage.getBody().getOps<RegionOp>())
      if (RegionCheckpoint checkpoint = regionCheckpointOf(region);
          checkpoint != RegionCheckpoint::None)
        text += llvm::formatv("{0}{1} ({2})", text.empty() ? "" : ", ",
                              escapeXml(region.getName()),
                              regionCheckpointName(checkpoint));
  }
  const ModuleSchedule &cells = summary.timeline;
  const sched::SimulationResult &simulation = summary.simulation;
  double makespan = std::max(simulation.makespan, 1e-9);
  double pxPerUs = kPlotWidth / makespan;
  auto xOf = [&](double us) { return kLeft + us * pxPerUs; };

  // Each rank's activation bytes, op by op, and the highest over all ranks
  // (one scale, so that curves compare across lanes).
  std::vector<ProgramActivations> activations;
  std::vector<ActivationProfile> profiles;
  int64_t highest = 1;
  for (ProgramOp program : scheduleOp.getBody().getOps<ProgramOp>()) {
    activations.push_back(collectActivationLifetimes(program));
    profiles.push_back(computeActivationProfile(activations.back(), costs));
    highest = std::max(highest, profiles.back().peak());
  }

  size_t numRanks = cells.schedule.ranks.size();
  double rankHeight = kLaneHeight + kCurveHeight + kRankGap;
  double height = kTop + numRanks * rankHeight + kBottom;
  double width = kLeft + kPlotWidth + 20;
  os << llvm::format("<svg xmlns=\"http://www.w3.org/2000/svg\" "
                     "width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
                     "font-family=\"sans-serif\" font-size=\"11\" "
                     "data-x0=\"%.1f\" data-px-per-us=\"%.9g\">\n",
                     width, height, width, height, kLeft, pxPerUs);
  os << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  os << llvm::formatv("<text x=\"{0}\" y=\"18\" font-size=\"14\">schedule "
                      "'{1}': {2} ranks, {3} microbatches; step {4:f1} us, "
                      "bubble fraction {5:f3}</text>\n",
                      kLeft, scheduleOp.getName(), numRanks,
                      scheduleOp.getNumMicrobatches(), simulation.makespan,
                      simulation.bubbleFraction);
  using Kind = sched::ActionKind;
  static const std::pair<Kind, const char *> legend[] = {
      {Kind::Forward, "forward (F)"},   {Kind::BackwardInput, "dx (I)"},
      {Kind::BackwardWeight, "dw (W)"}, {Kind::Backward, "backward (B)"},
      {Kind::Recompute, "recompute"},   {Kind::Clear, "clear"}};
  double legendX = kLeft;
  for (auto [kind, name] : legend) {
    legendItem(os, legendX, styleOf(kind).fill, name);
    legendX += 110;
  }
  legendItem(os, legendX, kIdleFill, "idle");
  os << llvm::format("<line x1=\"%.1f\" y1=\"37\" x2=\"%.1f\" y2=\"37\" "
                     "stroke=\"%s\" stroke-width=\"2\"/>",
                     legendX + 110, legendX + 124, kCurveStroke)
     << llvm::format("<text x=\"%.1f\" y=\"42\">activation bytes</text>\n",
                     legendX + 129);

  for (auto [rank, program] :
       llvm::enumerate(scheduleOp.getBody().getOps<ProgramOp>())) {
    double top = kTop + rank * rankHeight;
    const std::vector<sched::Action> &actions = cells.schedule.ranks[rank];
    const std::vector<sched::ActionTiming> &timeline =
        simulation.timelines[rank];
    os << llvm::format("<g data-rank=\"%zu\" data-lane-top=\"%.1f\" "
                       "data-lane-height=\"%.1f\">\n",
                       rank, top, kLaneHeight);
    os << llvm::format("<text x=\"8\" y=\"%.1f\">rank %zu</text>", top + 19,
                       rank);
    os << llvm::format("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" "
                       "height=\"%.1f\" fill=\"%s\"/>\n",
                       kLeft, top, kPlotWidth, kLaneHeight, kIdleFill);
    auto box = [&](const sched::Action &action, double start, double end) {
      Style style = styleOf(action.kind);
      double x = xOf(start), w = (end - start) * pxPerUs;
      std::string label = llvm::formatv("{0}{1}.{2}", style.name, action.stage,
                                        action.microbatch);
      os << llvm::format("<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" "
                         "height=\"%.1f\" fill=\"%s\" stroke=\"white\" "
                         "stroke-width=\"0.5\">",
                         x, top, std::max(w, 0.5), kLaneHeight, style.fill)
         << "<title>" << sched::formatAction(action)
         << llvm::format(": %.1f-%.1f us", start, end);
      if (action.kind == Kind::Recompute &&
          static_cast<size_t>(action.stage) < replays.size())
        os << "; replays " << replays[action.stage];
      os << "</title></rect>";
      // The whole label where it fits (about 5.5 px per character of the
      // 9 px font), else the microbatch alone.
      std::string shortLabel = std::to_string(action.microbatch);
      const std::string &shown =
          w >= 5.5 * label.size() + 3 ? label : shortLabel;
      if (w >= 5.5 * shown.size() + 3)
        os << llvm::format("<text x=\"%.2f\" y=\"%.1f\" font-size=\"9\" "
                           "text-anchor=\"middle\" fill=\"white\">",
                           x + w / 2, top + 19)
           << shown << "</text>";
      os << "\n";
    };
    for (size_t k = 0; k < actions.size(); ++k) {
      const sched::Action &cell = actions[k];
      const sched::ActionTiming &timing = timeline[k];
      if (cell.kind == sched::ActionKind::Clear) {
        double x = xOf(timing.start);
        os << llvm::format("<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" "
                           "y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\">",
                           x, top - 3, x, top + kLaneHeight + 3,
                           styleOf(cell.kind).fill)
           << "<title>" << sched::formatAction(cell) << "</title></line>\n";
        continue;
      }
      if (timing.end <= timing.start)
        continue; // transfers and other instantaneous actions
      if (cell.parts.empty()) {
        box(cell, timing.start, timing.end);
        continue;
      }
      // An overlapped pair: its parts side by side, in their proportions.
      double at = timing.start, total = 0;
      for (const sched::Action &part : cell.parts)
        total += part.durationUs.value_or(0);
      for (const sched::Action &part : cell.parts) {
        double share = total > 0 ? part.durationUs.value_or(0) / total : 0;
        double end = at + share * (timing.end - timing.start);
        if (end > at)
          box(part, at, end);
        at = end;
      }
    }

    // The activation curve: each op's bytes from its cell's start.
    double base = top + kLaneHeight + kCurveHeight;
    auto yOf = [&](int64_t bytes) {
      return base - (kCurveHeight - 4) * static_cast<double>(bytes) /
                        static_cast<double>(highest);
    };
    os << llvm::format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
                       "y2=\"%.1f\" stroke=\"#cccccc\"/>",
                       kLeft, base, kLeft + kPlotWidth, base);
    std::string path = llvm::formatv("M{0:f1},{1:f1}", kLeft, base).str();
    const std::vector<Operation *> &cellOps = cells.cellOps[rank];
    size_t cell = 0, next = 0;
    unsigned pos = 0;
    double lastY = base;
    for (Operation &op : program.getBody().getOps()) {
      if (next < cellOps.size() && &op == cellOps[next])
        cell = next++;
      double x = xOf(timeline.empty() ? 0 : timeline[cell].start);
      double y = yOf(profiles[rank].live[pos++]);
      if (y != lastY) {
        path += llvm::formatv(" H{0:f2} V{1:f2}", x, y).str();
        lastY = y;
      }
    }
    path += llvm::formatv(" H{0:f2}", kLeft + kPlotWidth).str();
    os << "<path d=\"" << path << "\" fill=\"none\" stroke=\"" << kCurveStroke
       << "\" stroke-width=\"1.5\"/>";
    os << llvm::format("<text x=\"8\" y=\"%.1f\" fill=\"%s\">peak</text>"
                       "<text x=\"8\" y=\"%.1f\" fill=\"%s\">",
                       base - 14, kCurveStroke, base - 2, kCurveStroke)
       << formatBytes(profiles[rank].peak()) << "</text>\n</g>\n";
  }

  // Time axis.
  double axisY = kTop + numRanks * rankHeight + 4;
  os << llvm::format("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" "
                     "stroke=\"black\"/>\n",
                     kLeft, axisY, kLeft + kPlotWidth, axisY);
  double step = tickStep(makespan);
  for (double t = 0; t <= makespan + step * 1e-9; t += step)
    os << llvm::format("<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" "
                       "stroke=\"black\"/><text x=\"%.2f\" y=\"%.1f\" "
                       "text-anchor=\"middle\">%g</text>\n",
                       xOf(t), axisY, xOf(t), axisY + 5, xOf(t), axisY + 17, t);
  os << llvm::format("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">time "
                     "(us, simulated)</text>\n",
                     kLeft + kPlotWidth, axisY + 30);
  os << "</svg>\n";
}
