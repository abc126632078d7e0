"""Every result file the README and docs/BENCHMARKS.md cite by name is in the repository.

The documents give each figure with the JSON (or text) file its script wrote under
`benchmarks/results/`; a figure whose file was never committed could not be checked by
anyone. Names are those in backticks that carry a date (`...-2026-12-05-...json`);
shorthand for a sibling run (`-run2-`) is left out.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
DOCUMENTS = [REPO / "README.md", REPO / "docs" / "BENCHMARKS.md"]
CITED = re.compile(r"`([A-Za-z0-9_.\-]*\d{4}-\d{2}-\d{2}[A-Za-z0-9_.\-]*\.(?:json|txt))`")


def cited_results(text: str) -> set[str]:
    """The dated result file names `text` cites in backticks."""
    return set(CITED.findall(text))


def test_the_pattern_finds_dated_names_and_skips_shorthand():
    text = ("(`attention-cpu-2026-12-05-run1-vm.json` ... `-run3-`), `report.json`, "
            "`dsl_cpu_run2.txt`, `tuned-2026-11-29-chain-vm.json`")
    assert cited_results(text) == {"attention-cpu-2026-12-05-run1-vm.json",
                                   "tuned-2026-11-29-chain-vm.json"}


def test_every_cited_result_file_is_committed():
    cited = set().union(*(cited_results(doc.read_text()) for doc in DOCUMENTS))
    assert len(cited) > 100   # the documents cite their runs: the pattern still matches
    missing = sorted(name for name in cited if not (RESULTS / name).is_file())
    assert missing == [], f"cited but not in benchmarks/results/: {missing}"
