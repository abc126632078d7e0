"""What gcc made of a generated kernel: vector instructions that touch the stack."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from wpk.dsl.toolchain import c_compiler


def stack_accesses(source: str, flags, tmp_path: Path, prefixes: tuple[str, ...]
                   ) -> dict[str, int]:
    """Vector instructions reading or writing the stack in each function of the source's
    x86 assembly (`cc -S`) whose name starts with one of `prefixes` (a `.constprop` or
    other gcc suffix dropped): a spilled accumulator, weight or broadcast."""
    c_file, asm = tmp_path / "k.c", tmp_path / "k.s"
    c_file.write_text(source)
    subprocess.run([c_compiler(), *flags, "-S", "-o", str(asm), str(c_file)], check=True)
    names = "|".join(map(re.escape, prefixes))
    wanted = re.compile(rf"^((?:{names})\w*)[.:]")
    found, function = {}, None
    for line in asm.read_text().splitlines():
        label = wanted.match(line)
        if label or re.match(r"^[A-Za-z_][\w.]*:", line):
            function = label.group(1) if label else None
            found.setdefault(function, 0)
        elif function and line.startswith("\tv") and re.search(r"\(%r[sb]p\)", line):
            found[function] += 1
    found.pop(None, None)
    return found
