"""The repository documents itself, and its examples cannot drift.

- Every ```console block of the README and docs/ is run, in document order, in a fresh
  folder that holds the repository's top-level entries (as a reader at the repository's
  root would have them; what the commands write lands in that folder): each `$ ` line
  (with its `\\` continuations) is a command, the lines up to the next one its expected
  output (stdout and stderr together). `...` on a line of its own stands for any number
  of lines; inside a line, for any text (doctest's ELLIPSIS).
- Every ```python block is run there too; a `print(...)  # TEXT` line must print TEXT.
- No link or path of the README and docs/ points outside the repository, and every
  relative link exists.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
             REPO / "dsl" / "LANGUAGE.md"]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
OUTSIDE = ("../shared", "/work/", "shared/DESIGN.md")


@dataclass
class Example:
    """One command of a console block and the output the document shows for it."""

    command: str
    expected: list[str]


def console_examples(text: str) -> list[Example]:
    """The commands of a console block's text, each with its expected output lines."""
    examples: list[Example] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        if not line.startswith("$ "):
            if not examples:
                raise AssertionError(f"console block starts with output: {line!r}")
            examples[-1].expected.append(line.rstrip())
            index += 1
            continue
        command = line[2:]
        while command.endswith("\\"):
            index += 1
            command = command[:-1] + " " + lines[index].strip()
        examples.append(Example(command, []))
        index += 1
    return examples


def line_matches(expected: str, actual: str) -> bool:
    """A line with `...` standing for any text."""
    pattern = ".*?".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, actual.rstrip()) is not None


def output_matches(expected: list[str], actual: list[str]) -> bool:
    """Whether the output lines match, a `...` line standing for any number of lines."""
    if not expected:
        return not actual
    if expected[0] == "...":
        return any(output_matches(expected[1:], actual[start:])
                   for start in range(len(actual) + 1))
    return bool(actual) and line_matches(expected[0], actual[0]) and \
        output_matches(expected[1:], actual[1:])


def argv_of(command: str) -> list[str]:
    """The process to start for a documented command (`wpk ...` or `python ...`)."""
    words = shlex.split(command)
    if words[0] == "wpk":
        return [sys.executable, "-m", "wpk.cli", *words[1:]]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    raise AssertionError(f"documented command of an unknown program: {command}")


def workspace(tmp_path: Path) -> Path:
    """A folder holding links to the repository's top-level entries."""
    for entry in REPO.iterdir():
        if not entry.name.startswith(".") and entry.name != "build":
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def run(argv: list[str], cwd: Path) -> list[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "80", "NO_COLOR": "1"}
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"{argv} failed ({done.returncode}):\n{done.stdout}"
    return [line.rstrip() for line in done.stdout.splitlines()]


def check_python(code: str, cwd: Path) -> None:
    """Run a python block; each `print(...)  # TEXT` line must have printed TEXT."""
    printed = run([sys.executable, "-c", code], cwd)
    wanted = [line.split("#", 1)[1].strip() for line in code.splitlines()
              if line.lstrip().startswith("print(") and "#" in line]
    if wanted:
        assert printed[-len(wanted):] == wanted, (printed, wanted)


@pytest.mark.slow
@pytest.mark.parametrize("document", [d for d in DOCUMENTS if d.exists()],
                         ids=lambda d: str(d.relative_to(REPO)))
def test_every_example_prints_what_the_document_shows(document, tmp_path):
    folder = workspace(tmp_path)
    for kind, body in BLOCK.findall(document.read_text(encoding="utf-8")):
        if kind == "python":
            check_python(body, folder)
        if kind != "console":
            continue
        for example in console_examples(body):
            actual = run(argv_of(example.command), folder)
            assert output_matches(example.expected, actual), (
                f"$ {example.command}\n--- the document shows:\n" + "\n".join(example.expected)
                + "\n--- the command printed:\n" + "\n".join(actual))


def test_the_matching_rules():
    assert output_matches(["a", "...", "z"], ["a", "b", "c", "z"])
    assert output_matches(["a", "...", "z"], ["a", "z"])
    assert not output_matches(["a", "...", "z"], ["a", "b"])
    assert output_matches(["took ... s"], ["took 1.5 s"])
    assert not output_matches(["took ... s"], ["took 1.5 ms!"])
    examples = console_examples("$ wpk run a \\\n    --b c\nout 1\n$ wpk devices\n")
    assert [e.command for e in examples] == ["wpk run a  --b c", "wpk devices"]
    assert examples[0].expected == ["out 1"] and examples[1].expected == []


@pytest.mark.parametrize("document", [d for d in DOCUMENTS if d.exists()],
                         ids=lambda d: str(d.relative_to(REPO)))
def test_documents_point_only_inside_the_repository(document):
    text = document.read_text(encoding="utf-8")
    for outside in OUTSIDE:
        assert outside not in text, f"{document.name} points outside the repository: {outside}"
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue   # a web address
        file, _, anchor = target.partition("#")
        path = (document.parent / file).resolve() if file else document
        assert path.is_relative_to(REPO), f"{document.name}: {target} leaves the repository"
        assert path.exists(), f"{document.name}: {target} does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in anchors_of(path), (
                f"{document.name}: {target}: {path.name} has no heading of that anchor")


@functools.cache
def anchors_of(path: Path) -> frozenset[str]:
    """`heading_anchors` of the document at `path`, read once however many links point
    into it."""
    return frozenset(heading_anchors(path.read_text(encoding="utf-8")))


FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def heading_anchors(text: str) -> set[str]:
    """The anchors of a markdown text's headings as GitHub makes them (lower case,
    punctuation dropped, spaces as hyphens, a repeated one numbered), outside code blocks."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", text).splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def test_heading_anchors_follow_githubs_rule():
    text = "# A: b (c, 1)\n```\n# not a heading\n```\n## A: b (c, 1)\n### `x` y\n"
    assert heading_anchors(text) == {"a-b-c-1", "a-b-c-1-1", "x-y"}


def test_the_architecture_document_covers_its_subjects():
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    for heading in ("## Data flow", "## Layers", "## The interfaces between stages",
                    "## Adding an operator", "## Adding a target"):
        assert heading in text


def test_ci_runs_the_readme_test_command():
    """`.ci/run` installs and tests exactly as the README tells a reader to."""
    readme = (REPO / "README.md").read_text()
    commands = [line for line in readme.splitlines()
                if line.startswith('python -m pip install -e ".[dev]"')]
    assert len(commands) == 1, commands
    assert commands[0] in (REPO / ".ci" / "run").read_text().splitlines()
