"""One section of the world demo's report: image rows, captions, diagnostic figures, a note and a score table."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Section:
    title: str
    rows: list  # [(label, uint8 [N, H, W, 3])]
    captions: list = field(default_factory=list)  # one per column (or one for all)
    diagnostics: list = field(default_factory=list)  # figure paths
    note: str = ""
    table: list = field(default_factory=list)  # score rows {"method": ..., score: value} (edit_scores)
    table_note: str = ""  # what the scores measure
