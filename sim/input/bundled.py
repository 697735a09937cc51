"""Scenarios shipped with the package: the examples of the repository's ``scenarios/``
folder travel in the wheel as ``sim/examples/`` (a link to that folder in a checkout), so
``clustersim run llama3-8b-fsdp-h100`` works wherever clustersim is installed.

A scenario argument is a path; only when no such file exists and the argument is a bare
name (no folder, no .toml suffix; dots are part of a name) is it looked up among the bundled examples.
"""

from pathlib import Path

from ..errors import InputError

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def example_names() -> list[str]:
    """Names of the bundled example scenarios (file stems), sorted."""
    return sorted(p.stem for p in EXAMPLES.glob("*.toml"))


def scenario_file(arg: str | Path) -> Path:
    """The file a scenario argument names: the path itself, or, for a bare name that is no
    file here, the bundled example of that name (``llama3-8b-fsdp-h100``). InputError
    naming the bundled examples when neither exists."""
    path = Path(arg)
    if path.exists():
        return path
    bundled = EXAMPLES / f"{path.name}.toml"
    # a bare name may hold dots (llama3.1-70b-fp8-h100): any suffix but .toml is part of it
    if path.suffix != ".toml" and len(path.parts) == 1 and bundled.is_file():
        return bundled
    raise InputError("scenario", f"no such file: {path} (bundled examples, usable by name: "
                                 f"{', '.join(example_names())})")
