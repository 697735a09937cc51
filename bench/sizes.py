"""Files and functions of ``sim/`` past the house's size limits (STYLE.md: files under
~400 lines, functions under ~60): each file's line count and each function's (its ``def``
to its last line, decorators and docstring included, as ``ast`` places them), longest first.

Run: ``python bench/sizes.py`` (``--file-lines N`` / ``--function-lines N`` for other limits).
"""

import argparse
import ast
from pathlib import Path

SIM = Path(__file__).resolve().parent.parent / "sim"


def functions(path: Path) -> list[tuple[int, str, int]]:
    """(lines, qualified name, first line) of every function and method in ``path``."""
    out = []

    def walk(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno] + [d.lineno for d in child.decorator_list])
                out.append((child.end_lineno - first + 1, prefix + child.name, first))
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")

    walk(ast.parse(path.read_text()), "")
    return out


def report(file_limit: int, function_limit: int) -> list[str]:
    """Lines naming each file over ``file_limit`` lines and each function over ``function_limit``."""
    paths = sorted(p for p in SIM.rglob("*.py") if "__pycache__" not in p.parts)
    files = sorted(((len(p.read_text().splitlines()), p) for p in paths), key=lambda x: (-x[0], str(x[1])))
    funcs = sorted(((n, p, name, line) for p in paths for n, name, line in functions(p)),
                   key=lambda x: (-x[0], str(x[1]), x[3]))
    rel = lambda p: p.relative_to(SIM.parent)  # noqa: E731
    lines = [f"files over {file_limit} lines:"]
    lines += [f"  {n:5d}  {rel(p)}" for n, p in files if n > file_limit]
    lines += [f"functions over {function_limit} lines:"]
    lines += [f"  {n:5d}  {rel(p)}:{line} {name}" for n, p, name, line in funcs if n > function_limit]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file-lines", type=int, default=400)
    parser.add_argument("--function-lines", type=int, default=60)
    args = parser.parse_args()
    print("\n".join(report(args.file_lines, args.function_lines)))


if __name__ == "__main__":
    main()
