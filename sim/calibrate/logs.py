"""Training logs: the measured seconds per optimizer step, and the GPU count the log states.

Recognised lines (each framework's own wording):

- Megatron-LM (megatron/training/training.py ``training_log``): ``elapsed time per iteration
  (ms): 1234.5``; the world size from ``using world size: 64`` / ``world_size ..... 64``.
- NeMo (Lightning's logged ``train_step_timing in s``): ``train_step_timing in s=1.23`` or
  ``train_step_timing in s: 1.23``; the world size from ``MEMBER: 1/64``.
- torchtitan (torchtitan/train.py, the metrics line ``step: 10  loss: ...  tps: 5,432  tflops:
  ...  mfu: 40.1%``): ``tps = ntokens_since_last_log / (time_delta * non_data_parallel_size)``,
  a rank's tokens (global / dp) over the logging window per model-parallel GPU -- tokens per
  second per GPU -- so a step is global tokens / (tps x GPUs); ``world_size=8`` gives the GPUs.
- Hugging Face Trainer / accelerate: ``'train_steps_per_second': 0.5`` (step = 1 / that), or
  per-step ``'step_time': 1.2``; the world size from ``Num processes: 8``.

The first step of a log is warm-up (compilation, NCCL setup) and is dropped when more follow;
the run's step time is the median of the rest.
"""

from dataclasses import dataclass
from pathlib import Path
import re
import statistics

from .. import bounds
from ..errors import InputError

MAX_BYTES = 256 << 20  # a long training log or a big sweep of tables

_NUM = r"([0-9][0-9,]*\.?[0-9]*(?:[eE][-+]?\d+)?)"
STEP_PATTERNS = (  # (framework, regex, converter of the number to seconds per step, or "tps")
    ("megatron", re.compile(r"elapsed time per iteration \(ms\):\s*" + _NUM), lambda v: v / 1e3),
    ("nemo", re.compile(r"train_step_timing in s\s*[=:]\s*" + _NUM), lambda v: v),
    ("torchtitan", re.compile(r"\btps:\s*" + _NUM), "tps"),
    ("hf", re.compile(r"'train_steps_per_second':\s*" + _NUM), lambda v: 1 / v if v else 0.0),
    ("hf", re.compile(r"'step_time':\s*" + _NUM), lambda v: v),
)
WORLD_PATTERNS = (re.compile(r"using world size:\s*(\d+)"), re.compile(r"\bworld_size\b[ .=:]*(\d+)", re.I),
                  re.compile(r"MEMBER:\s*\d+/(\d+)"), re.compile(r"Num processes:\s*(\d+)"))


@dataclass(frozen=True)
class Log:
    """A training log's measured step: seconds, how many steps it is the median of, the
    framework, the GPU count it states (None if it states none), and where."""

    path: str
    framework: str
    step_s: float
    steps: int
    world: int | None
    world_line: int
    last_line: int


def looks_like(text: str) -> bool:
    """Whether a text has any step-time line this module reads."""
    return any(p.search(text) for _, p, _ in STEP_PATTERNS)


def parse(path: str | Path, tokens_per_step: float, gpus: int, text: str | None = None) -> Log:
    """Read a log; ``tokens_per_step`` (global batch x sequence) and ``gpus`` (the scenario's,
    unless the log states its own) convert torchtitan's ``tps``.
    InputError naming ``file:line`` when it holds no step time."""
    path = Path(path)
    text = bounds.read_text(path, "INPUT", MAX_BYTES) if text is None else text
    lines = text.splitlines()
    found, framework, world, world_line = [], None, None, 0
    for number, line in enumerate(lines, 1):
        for name, pattern, convert in STEP_PATTERNS:
            match = pattern.search(line)
            if match and framework in (None, name):
                framework = name
                found.append((float(match.group(1).replace(",", "")), convert, number))
                break
        if world is None:
            for pattern in WORLD_PATTERNS:
                match = pattern.search(line)
                if match:
                    world, world_line = int(match.group(1)), number
                    break
    if not found:
        raise InputError("INPUT", f"{path}:{len(lines)}: no step times (Megatron 'elapsed time per iteration (ms)', "
                                  "NeMo 'train_step_timing in s', torchtitan 'tps', HF 'train_steps_per_second')")
    kept = found[1:] if len(found) > 2 else found
    steps = [_seconds(v, convert, tokens_per_step, world or gpus) for v, convert, _ in kept]
    if min(steps) <= 0:
        raise InputError("INPUT", f"{path}:{kept[0][2]}: a step time of zero is no measurement")
    return Log(str(path), framework, statistics.median(steps), len(steps), world, world_line, found[-1][2])


def _seconds(value: float, convert, tokens_per_step: float, gpus: int) -> float:
    if convert == "tps":  # tokens per second per GPU (torchtitan): the step's tokens over all GPUs
        return tokens_per_step / (value * gpus) if value else 0.0
    return convert(value)


def check_world(log: Log, gpus: int, scenario_name: str) -> None:
    """A log that states its GPU count must match the scenario said to produce it."""
    if log.world is not None and log.world != gpus:
        raise InputError("INPUT", f"{log.path}:{log.world_line}: the log ran on {log.world} GPUs, but scenario "
                                  f"{scenario_name!r} has {gpus}")
