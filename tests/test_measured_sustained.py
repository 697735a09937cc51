"""The sustained-GEMM measurements (bench/measured/*-2026-11-28-sustained.json) say what
bench/measured/README.md says of them: printed as quoted, every run at the power cap, and the
FP8 / BF16 sustained ratio at Grok-1's shapes inside the span of the Llama shapes'."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import measured_sustained as ms  # noqa: E402


def test_readme_quotes_what_the_script_prints():
    printed = subprocess.run([sys.executable, "bench/measured_sustained.py"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
    readme = (ROOT / "bench" / "measured" / "README.md").read_text()
    section = readme.split("## FP8 and BF16 GEMMs held for seconds", 1)[1]
    assert re.search(r"```\n(.*?)```", section, re.S).group(1) == printed


def test_power_capped_and_fp8_no_worse_at_grok_shapes():
    for name in ms.FILES:
        _, runs = ms.rows(name)
        assert runs and all(ms.capped(r) for r in runs.values())
        ratio = {s: runs[s, "fp8"]["last_2s_tflops"] / runs[s, "bf16"]["last_2s_tflops"] for s, _ in runs}
        grok = [v for s, v in ratio.items() if s.startswith("grok1")]
        llama = [v for s, v in ratio.items() if s.startswith(("l405", "l70"))]
        assert 1.8 < min(ratio.values()) and max(ratio.values()) < 2.0
        assert min(llama) - 0.07 < min(grok) and max(grok) < max(llama) + 0.07
        # the model's FP8 saving on the Grok-1 pair is 1.37x the published one: a 1.23x FP8
        # speed-up would need FP8 / BF16 near 1.4 at its GEMMs, far from what the GPU holds
        assert min(grok) > 1.4
