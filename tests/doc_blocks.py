"""Code blocks of README.md, CONTRIBUTING.md and docs/*.md, with the ``<!-- doc-test: ... -->`` marker written before each.

The markers (documented in ``docs/README.md``, "Writing docs"):

- none: the block runs as written (Python: in order, in one namespace per page; shell: line by line on the CPU).
- ``needs-weights``: a Python block that loads downloaded weights; the test runs it with ``from_pretrained`` and
  ``pretrained=True`` answered by tiny random components built offline (``tests/doc_tiny_weights.py``).
- ``setup``: the set-up commands (``make demo``, ``make test``); CI runs ``make test`` itself (``.ci/run``), the
  test checks that the Makefile has the targets (``make -n``).
- ``skip <reason>``: not run (a GPU, a data set, downloaded weights or a long training); the reason is required.
- ``run``: runs as written, but see ``small:`` below.
- ``slow``: runs as written, in a test marked ``slow`` (over ~20 s on one CPU thread).

Any marker may end with ``small: `old` -> `new`, ...``: the test replaces each ``old`` text by ``new`` before running
the block (smaller shapes or fewer steps than the page shows; the page's text says so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!--\s*doc-test:\s*(?P<kind>[\w-]+)\s*(?P<reason>.*?)\s*-->\s*$")
MARKER_KINDS = {"run", "slow", "needs-weights", "setup", "skip"}
SMALL = re.compile(r"`(?P<old>[^`]+)`\s*->\s*`(?P<new>[^`]*)`")
SHELL_LANGUAGES = {"bash", "sh", "console", "shell"}
FENCE = re.compile(r"^```(?P<language>[\w-]*)\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    language: str  # "" for a fence without a language
    code: str
    marker: str = ""  # "", "needs-weights", "setup" or "skip"
    reason: str = ""

    @property
    def runnable_code(self) -> str:
        """``code`` with the marker's ``small:`` replacements made (each must occur)."""
        code = self.code
        if "small:" in self.reason:
            for found in SMALL.finditer(self.reason.split("small:", 1)[1]):
                if found["old"] not in code:
                    raise AssertionError(f"{self.where}: small: {found['old']!r} is not in the block")
                code = code.replace(found["old"], found["new"])
        return code

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def page_blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page`` in order, with the marker on the last non-blank line before it."""
    lines = page.read_text().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = next(j for j in range(index + 1, len(lines)) if lines[j].startswith("```"))
        marker = _marker_before(lines, index)
        blocks.append(Block(page, index + 1, fence["language"], "\n".join(lines[index + 1 : end]) + "\n", *marker))
        index = end + 1
    return blocks


def _marker_before(lines: list[str], index: int) -> tuple[str, str]:
    previous = index - 1
    while previous >= 0 and not lines[previous].strip():
        previous -= 1
    found = MARKER.match(lines[previous]) if previous >= 0 else None
    return (found["kind"], found["reason"]) if found else ("", "")


def shell_commands(block: Block) -> list[str]:
    """The block's commands: comments dropped, ``\\`` continuations joined, ``$ `` prompts of console blocks only."""
    commands, pending = [], ""
    for raw in block.runnable_code.splitlines():
        line = raw.rstrip()
        if block.language == "console":
            if not (line.startswith("$ ") or pending):
                continue
            line = line[2:] if line.startswith("$ ") else line
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        commands.append(pending + line)
        pending = ""
    return commands


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in page_blocks(page)]
