#!/bin/sh
# Rule ids (docs/rules.md) are spelled once, in include/hpr/Support/Rules.def.
# Fails, naming the places, when
#  - a C++ source of the project (include/, lib/, tools/) outside
#    Rules.def spells an id in code rather than in a comment: a diagnostic
#    takes its tag from the table (ruleTag). Tests do spell ids, on purpose:
#    an expectation written out catches an id that changes;
#  - a tracked file (sources, tests, docs) cites an id of one of the table's
#    areas that the table does not list: a renamed or mistyped id.
# Run from the repository root of a git checkout (ctest rule-ids-in-table).
set -eu
table=include/hpr/Support/Rules.def
# The HPR_RULE rows' ids (Enum, "hpr.<area>.<name>", ...), and their areas.
ids=$(grep -oE '[A-Za-z0-9_]+, *"hpr\.[a-z0-9-]+\.[a-z0-9-]+"' "$table" |
  grep -oE 'hpr\.[a-z0-9.-]+' | sort)
areas=$(printf '%s\n' "$ids" | cut -d. -f2 | sort -u | paste -sd'|' -)
if [ -z "$ids" ] || [ -z "$areas" ]; then
  echo "no rules read from $table" >&2
  exit 1
fi
if [ -n "$(printf '%s\n' "$ids" | uniq -d)" ]; then
  echo "$table lists an id twice: $(printf '%s\n' "$ids" | uniq -d)" >&2
  exit 1
fi
status=0
token="hpr\.($areas)\.[a-z0-9_-]*[a-z0-9]"
spelled=$(git ls-files -z -- 'include/*' 'lib/*' 'tools/*' |
  grep -zE '\.(cpp|h|inc)$' | xargs -0 grep -nE "$token" |
  grep -v "^$table:" | sed 's#//.*$##' | grep -E "$token" || true)
if [ -n "$spelled" ]; then
  echo "rule ids spelled in C++ code outside $table (use ruleTag):" >&2
  printf '%s\n' "$spelled" >&2
  status=1
fi
unknown=$(git grep -noE "$token" -- ":!$table" |
  while IFS= read -r hit; do
    printf '%s\n' "$ids" | grep -qxF "${hit##*:}" || printf '%s\n' "$hit"
  done)
if [ -n "$unknown" ]; then
  echo "rule ids that $table does not list:" >&2
  printf '%s\n' "$unknown" >&2
  status=1
fi
exit $status
