"""The result of one simulated step: the summary dict and the spans DataFrame."""

from dataclasses import dataclass, field
import json

import pandas as pd

from .engine import SPAN_COLUMNS


@dataclass
class Result:
    """``summary``: CONTRACT.md's JSON object; ``spans``: one row per op and rank."""

    summary: dict
    spans: pd.DataFrame
    scenario: object = None
    memory: object = None
    info: dict = field(default_factory=dict)  # layout facts plots and reports use

    def to_json(self) -> str:
        """The summary as one line of JSON (stable key order)."""
        return json.dumps(self.summary)

    def to_chrome_trace(self, ranks=None) -> dict:
        """Chrome/Perfetto trace of the spans (see :mod:`sim.trace`)."""
        from .trace import chrome_trace

        return chrome_trace(self, ranks)


def spans_frame(rows: list[tuple]) -> pd.DataFrame:
    """Engine span tuples -> DataFrame sorted by rank, start."""
    df = pd.DataFrame(rows, columns=list(SPAN_COLUMNS))
    return df.sort_values(["rank", "start_s", "stream"], kind="stable").reset_index(drop=True)
