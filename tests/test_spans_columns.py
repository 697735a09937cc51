"""The spans table's and the summary's memory-saving paths give what the plain pandas calls
give: text columns factorized in chunks (sim/outputs/result.py ``_codes``) and bytes per rank
and category summed by runs of ranks (sim/outputs/metrics.py ``bytes_sent``).

Run: ``python -m pytest -q tests/test_spans_columns.py``
"""

import numpy as np
import pandas as pd

from sim.engine.ops import Op
from sim.engine.kinds import Category
from sim.outputs import metrics, result


def test_codes_in_chunks_match_factorize(monkeypatch):
    monkeypatch.setattr(result, "CHUNK", 7)  # many chunks, values first seen in later ones
    rng = np.random.default_rng(3)
    names = [f"op{k}" for k in range(40)] + [None]
    ops = [Op(names[i], Category.COMPUTE, "compute") for i in rng.integers(0, len(names), 500)]
    codes, uniques = result._codes(ops, Op._fields.index("name"))
    want_codes, want_uniques = pd.factorize(np.array([op.name for op in ops], dtype=object), use_na_sentinel=False)
    def plain(values):  # (None is a NaN once factorized: one NaN object per call)
        return [None if v != v else v for v in values]

    assert plain(uniques) == plain(want_uniques) and None in plain(uniques) and (codes == want_codes).all()


def test_bytes_sent_by_runs_is_the_groupby(monkeypatch):
    monkeypatch.setattr(metrics, "GROUP_ROWS", 50)  # runs of a few ranks each
    rng = np.random.default_rng(5)
    n = 2000
    cats = np.array(["compute", "tp", "pp", "dp"], dtype=object)[rng.integers(0, 4, n)]
    spans = pd.DataFrame({"rank": np.sort(rng.integers(0, 60, n)), "category": cats,
                          "bytes": rng.random(n) * 1e9 * (cats != "compute")})
    spans.loc[spans["rank"] == 7, "category"] = "compute"  # a rank that sent nothing
    want = spans.groupby(["rank", "category"]).bytes.sum().unstack(fill_value=0.0)
    got = metrics.bytes_sent(spans)
    assert got.equals(want) and got.index.name == "rank" and got.columns.name == "category"
