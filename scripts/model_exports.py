"""The command line the model export scripts share (`export_keras_models.py`,
`export_paddle_models.py`, `export_hf_models.py`): pick models, check that the exporter is
installed (it is no dependency of wpk: one `error:` line with the install hint), write
OUT/name.onnx for each and print its path."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path


def export_main(argv: list[str] | None, description: str, models: Mapping,
                modules: Sequence[str], hint: str,
                export: Callable[[str, Path], Path],
                environment: Mapping[str, str] | None = None) -> int:
    """Parse `--out` and `--models` (of `models`), import `modules` (exit status 2 with
    `hint` when one is missing), set `environment`'s defaults and call `export(name, out)`
    for each model (exit status 1 at the first RuntimeError)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True, help="folder for the .onnx files")
    parser.add_argument("--models", default=",".join(models),
                        help=f"comma-separated, of: {', '.join(models)}")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    unknown = [n for n in names if n not in models]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(models)}")
    try:
        for module in modules:
            __import__(module)
    except ImportError as exc:
        print(f"error: {exc.name} is not installed in {sys.executable} (hint: {hint})",
              file=sys.stderr)
        return 2
    for key, value in (environment or {}).items():
        os.environ.setdefault(key, value)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        try:
            print(export(name, out))
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0
