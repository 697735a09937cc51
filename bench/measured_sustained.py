"""FP8 and BF16 GEMMs held for seconds at the 700 W limit, as measured (bench/gpu_measure_sustained.py).

``python bench/measured_sustained.py`` prints, per GPU and shape, each precision's rate over the
first 0.5 s and the last 2 s of back-to-back work, the SM clock and power in the last 2 s, and
the FP8 / BF16 ratio of the sustained rates (what bench/measured/README.md quotes).
"""

import json
from pathlib import Path

HERE = Path(__file__).parent / "measured"
FILES = ("h100-2026-11-28-sustained.json", "h200-2026-11-28-sustained.json")
POWER_CAP = 0x4  # nvidia-smi clocks_throttle_reasons: SW power cap


def rows(name: str) -> tuple[str, dict]:
    data = json.loads((HERE / name).read_text())
    gpu = data["env"]["gpu"]
    runs = {(r["shape"], r["precision"]): r for r in data["sustained"]["rows"]}
    return gpu, runs


def capped(run: dict) -> bool:
    """Whether nvidia-smi saw the power cap active while the run was busy."""
    return any(int(m, 16) & POWER_CAP for m in run["throttle_masks"])


def main() -> None:
    print("shape                     BF16 first->last TFLOP/s   MHz    W   FP8 first->last TFLOP/s   MHz    W  FP8/BF16  capped")
    for name in FILES:
        gpu, runs = rows(name)
        print(f"{gpu} ({name})")
        for shape in dict.fromkeys(s for s, _ in runs):
            b, f = runs[shape, "bf16"], runs[shape, "fp8"]
            print(f"  {shape:24s}{b['first_0p5s_tflops']:6.0f} ->{b['last_2s_tflops']:6.0f} "
                  f"({b['last_over_first'] - 1:+.1%}) {b['last_2s_sm_mhz']:5.0f} {b['last_2s_power_w']:4.0f}"
                  f"  {f['first_0p5s_tflops']:7.0f} ->{f['last_2s_tflops']:6.0f} ({f['last_over_first'] - 1:+.1%})"
                  f" {f['last_2s_sm_mhz']:5.0f} {f['last_2s_power_w']:4.0f}"
                  f"  {f['last_2s_tflops'] / b['last_2s_tflops']:7.3f}   {'yes' if capped(b) and capped(f) else 'no'}")


if __name__ == "__main__":
    main()
