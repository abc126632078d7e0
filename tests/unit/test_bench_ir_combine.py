"""`scripts/bench_inverted_residual.py --combine`: each block's median over several runs.

The README's fused-block figures on a noisy VM are each block's median over a few runs;
this summary is what computes them from the runs' JSON files.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_inverted_residual.py"


def _row(cin: int, threads: int, speedup: float) -> dict:
    return {"cin": cin, "expanded": 6 * cin, "cout": cin, "size": 14, "stride": 1, "k": 3,
            "threads": threads, "speedup": speedup}


def test_combine_takes_each_blocks_median_then_the_median_over_blocks(capsys, tmp_path):
    bench = runpy.run_path(str(SCRIPT))
    runs = [((1.5, 1.2, 1.0), 0.9), ((1.4, 1.25, 1.2), 1.1), ((2.0, 1.1, 1.5), 1.0)]
    paths = []
    for i, (two_threads, one_thread) in enumerate(runs):
        rows = [_row(cin, 2, x) for cin, x in zip((16, 32, 64), two_threads)]
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps({"rows": rows + [_row(16, 1, one_thread)]}))
    assert bench["main"](["--combine", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    # per block: 1.5 (of 1.5, 1.4, 2.0), 1.2 (of 1.2, 1.25, 1.1), 1.2 (of 1.0, 1.2, 1.5)
    assert "1.50 1.40 2.00 -> 1.50" in out and "1.00 1.20 1.50 -> 1.20" in out
    assert "2 thread(s): median of the blocks' medians 1.20x (min 1.20x)" in out
    assert "goal (MobileNet-v2) >= 1.3x not met" in out
    assert "1 thread(s): median of the blocks' medians 1.00x" in out   # kept apart


def test_combine_of_a_file_that_is_not_a_run_is_an_error_line(capsys, tmp_path):
    bench = runpy.run_path(str(SCRIPT))
    assert bench["main"](["--combine", str(tmp_path / "none.json")]) == 2
    assert "error: --combine" in capsys.readouterr().err
    (tmp_path / "other.json").write_text(json.dumps({"models": []}))
    assert bench["main"](["--combine", str(tmp_path / "other.json")]) == 2
    assert "hint: pass files written by --json" in capsys.readouterr().err
