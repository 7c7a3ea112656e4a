"""Rows of bench/gpu/run.sh's table: each check appends JSON lines to a file, check.py renders them.

A row is ``{"check": ..., "status": ..., "details": ...}``; ``status`` is ``ok``,
``FAILED``, ``skipped: why`` or ``not supported yet: why``. The table (README.md):

| check | status | details | seconds |
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

HEADER = "| check | status | details | seconds |"
RULE = "| --- | --- | --- | ---: |"


def add_row(path: Optional[str], check: str, status: str, details: str) -> None:
    """Appends one row to ``path`` (nothing when None: a helper run by hand)."""
    if path is None:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"check": check, "status": status, "details": details}) + "\n")


def read_rows(path: str) -> List[Dict[str, Any]]:
    """The rows appended to ``path``, in order (none when it does not exist)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(rows: List[Dict[str, Any]]) -> str:
    """The markdown table of ``rows`` (each may carry ``seconds``)."""
    lines = [HEADER, RULE]
    for r in rows:
        seconds = r.get("seconds")
        shown = "" if seconds is None else f"{seconds:.1f}"
        lines.append(f"| {_cell(r['check'])} | {_cell(r['status'])} | {_cell(r['details'])} | {shown} |")
    return "\n".join(lines) + "\n"


def fmt_bytes(n: Optional[int]) -> str:
    return "n/a" if n is None else f"{n / 2**20:.2f} MiB"
