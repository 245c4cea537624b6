"""`make test-fast` leaves out named test files: each of them exists (a renamed file would otherwise come back into
the fast lane unnoticed, or a typo leave out nothing)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fast_lane_exclusions() -> list[str]:
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    match = re.search(r"^FAST_EXCLUDE\s*:=(.*)$", text, re.M)
    assert match, "Makefile: no FAST_EXCLUDE"
    return match.group(1).split()


def test_fast_lane_excludes_existing_files_only():
    excluded = fast_lane_exclusions()
    assert excluded, "FAST_EXCLUDE is empty"
    missing = [path for path in excluded if not (ROOT / path).exists()]
    assert not missing, f"Makefile FAST_EXCLUDE names files that do not exist: {missing}"
