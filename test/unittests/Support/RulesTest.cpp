//===- RulesTest.cpp - The table of rules is well formed ------------------===//
//
// Rules.def is the one place rule ids are spelled; these tests check what
// docs/rules.md and the diagnostics rely on: ids of the form
// `hpr.<area>.<name>` in kebab case, each in one listed area, tags that are
// the ids in brackets.
//
//===----------------------------------------------------------------------===//

#include "hpr/Support/Rules.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/Twine.h"

#include <gtest/gtest.h>

using namespace mlir::hpr;

namespace {

/// Whether \p name is kebab case: lowercase words of letters and digits
/// joined by single hyphens.
bool isKebab(llvm::StringRef name) {
  if (name.empty() || name.front() == '-' || name.back() == '-' ||
      name.contains("--"))
    return false;
  return llvm::all_of(name, [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-';
  });
}

TEST(RulesTest, IdsAreUniqueAndWellFormed) {
  llvm::StringSet<> seen;
  for (const RuleInfo &rule : kRules) {
    SCOPED_TRACE(rule.id.str());
    EXPECT_TRUE(seen.insert(rule.id).second);
    EXPECT_EQ(ruleId(rule.rule), rule.id);
    EXPECT_EQ(ruleTag(rule.rule), rule.tag);
    auto [hpr, rest] = rule.id.split('.');
    auto [area, name] = rest.split('.');
    EXPECT_EQ(hpr, "hpr");
    EXPECT_TRUE(isKebab(area));
    EXPECT_TRUE(isKebab(name));
    EXPECT_EQ(rule.tag, (llvm::Twine("[") + rule.id + "]").str());
    EXPECT_TRUE(rule.summary.ends_with("."));
    EXPECT_TRUE(rule.doc.ends_with("."));
  }
}

TEST(RulesTest, EachRuleInOneArea) {
  for (const RuleInfo &rule : kRules) {
    SCOPED_TRACE(rule.id.str());
    int areas = llvm::count_if(
        kRuleAreas, [&](const RuleArea &area) { return area.holds(rule.id); });
    EXPECT_EQ(areas, 1);
  }
}

} // namespace
