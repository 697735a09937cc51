"""The measured-vs-model comparison (bench/measured_compare.py) prints what
bench/measured/README.md quotes, and its verdicts read from the numbers."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def printed() -> str:
    return subprocess.run([sys.executable, "bench/measured_compare.py"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


def test_readme_quotes_what_the_comparison_prints():
    readme = (ROOT / "bench" / "measured" / "README.md").read_text()
    block = re.search(r"```\n(.*?)```", readme, re.S).group(1)
    assert block == printed()


def test_comparison_says_small_k_gemms_are_modelled_in_both_precisions():
    """Hopper's reduction-dim terms (sim/model/gemm_sources.py BF16_K_HALF and FP8_K_HALF) take the
    small-K loss in both precisions: from K 128 to 1,024 the K-sweep is within 15% of the level in
    both (the min-dim curve alone missed by 17-19% in BF16 and 27% in FP8 at K 128-256), the two
    within 5 points at K 512; large K still runs above the level."""
    out = printed()
    sweep = {name: dict((int(k), float(v)) for k, v in re.findall(r"K (\d+) ([+-][\d.]+)%", line))
             for name, line in re.findall(r"  (BF16|FP8) K-sweep[^:]*: (.*)", out)}
    assert all(abs(sweep[p][k]) < 15 for p in ("BF16", "FP8") for k in (128, 256, 512, 1024)), sweep
    assert 0 < sweep["BF16"][8192] and abs(sweep["FP8"][512] - sweep["BF16"][512]) < 5
    ratios = [float(r) for r in re.findall(r"\d+\.\d\s+\d+\.\d\s+(\d\.\d\d)", out)]
    assert len(ratios) == 7 and all(0.5 < r < 3 for r in ratios)
