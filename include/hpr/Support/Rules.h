//===- Rules.h - The rules diagnostics name, by stable id -------*- C++ -*-===//
//
// The table of Rules.def as C++: an enum to cite a rule by and its id and
// tag, so that a diagnostic ends with ` [hpr.plan.waits]` without spelling
// the id (docs/rules.md).
//
//===----------------------------------------------------------------------===//

#ifndef HPR_SUPPORT_RULES_H
#define HPR_SUPPORT_RULES_H

#include "llvm/ADT/StringRef.h"

#include <cstddef>

namespace mlir::hpr {

/// A rule of Rules.def.
enum class Rule {
#define HPR_RULE(Enum, Id, Summary, Doc) Enum,
#include "hpr/Support/Rules.def"
};

/// One row of Rules.def.
struct RuleInfo {
  Rule rule;
  /// `hpr.<area>.<name>`.
  llvm::StringLiteral id;
  /// The id in brackets, as diagnostics end: `[hpr.<area>.<name>]`.
  llvm::StringLiteral tag;
  llvm::StringLiteral summary;
  llvm::StringLiteral doc;
};

/// One area of Rules.def: the rules whose id starts with `prefix` and a dot.
struct RuleArea {
  llvm::StringLiteral prefix;
  llvm::StringLiteral title;
  llvm::StringLiteral doc;

  /// Whether the rule \p id belongs to this area.
  bool holds(llvm::StringRef id) const {
    return id.starts_with(prefix) &&
           id.drop_front(prefix.size()).starts_with(".");
  }
};

/// Every rule, in table order (indexed by Rule).
inline constexpr RuleInfo kRules[] = {
#define HPR_RULE(Enum, Id, Summary, Doc)                                       \
  {Rule::Enum, Id, "[" Id "]", Summary, Doc},
#include "hpr/Support/Rules.def"
};

/// Every area, in table order.
inline constexpr RuleArea kRuleAreas[] = {
#define HPR_RULE_AREA(Prefix, Title, Doc) {Prefix, Title, Doc},
#include "hpr/Support/Rules.def"
};

/// The row of \p rule.
constexpr const RuleInfo &ruleInfo(Rule rule) {
  return kRules[static_cast<size_t>(rule)];
}

/// \p rule's id: `hpr.plan.waits`.
constexpr llvm::StringRef ruleId(Rule rule) { return ruleInfo(rule).id; }

/// \p rule's tag, which ends its diagnostics: `[hpr.plan.waits]`.
constexpr llvm::StringRef ruleTag(Rule rule) { return ruleInfo(rule).tag; }

} // namespace mlir::hpr

#endif // HPR_SUPPORT_RULES_H
