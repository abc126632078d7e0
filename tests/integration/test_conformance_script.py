"""scripts/conformance.py on a handful of ONNX node cases: counts, reasons and its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A claimed op, a float8 cast onnxruntime computes wrongly, an int8 Mod wpk has no
# kernel of its own for, NonZero (its output shape depends on the values: no static plan), a
# sequence case (skipped by both) and a bfloat16 cast (onnxruntime's Python API cannot
# take bfloat16 arrays).
CASES = ("test_relu", "test_cast_FLOAT_to_FLOAT8E4M3FN", "test_mod_mixed_sign_int8",
         "test_nonzero_example", "test_sequence_insert_at_back", "test_cast_BFLOAT16_to_FLOAT")


def test_the_script_counts_both_engines_and_writes_its_json(tmp_path):
    out = tmp_path / "conformance.json"
    pattern = "^(" + "|".join(CASES) + ")$"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "conformance.py"),
                           "--filter", pattern, "--json", str(out), "--quiet"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    cases = result["cases"]
    assert sorted(cases) == sorted(CASES)
    outcome = {name: {engine: entry[engine][0] for engine in entry}
               for name, entry in cases.items()}
    assert outcome["test_relu"] == {"wpk": "passed", "onnxruntime": "passed"}
    assert outcome["test_cast_FLOAT_to_FLOAT8E4M3FN"] == {"wpk": "passed",
                                                          "onnxruntime": "failed"}
    assert outcome["test_mod_mixed_sign_int8"]["wpk"] == "passed"
    assert outcome["test_cast_BFLOAT16_to_FLOAT"] == {"wpk": "passed", "onnxruntime": "failed"}
    assert outcome["test_nonzero_example"]["wpk"] == "failed"
    assert outcome["test_sequence_insert_at_back"] == {"wpk": "skipped",
                                                       "onnxruntime": "skipped"}
    assert cases["test_sequence_insert_at_back"]["wpk"][1] == "sequence type"
    summary = result["summary"]
    for engine in ("wpk", "onnxruntime"):
        counts = summary[engine]
        assert counts["passed"] + counts["failed"] + counts["skipped"] == len(CASES)
        assert sum(counts["failed_by_reason"].values()) == counts["failed"]
    assert summary["wpk"]["passed"] == 4 and summary["onnxruntime"]["passed"] == 3
    assert "onnxruntime" in result["machine"] and result["command"].startswith("python")
    assert f"wpk: 4 passed, 1 failed, 1 skipped of {len(CASES)} node cases" in done.stdout
    assert "skipped by reason:" in done.stdout and "sequence type" in done.stdout
