"""Headless Chromium for the report tests: the DOM after the page's scripts ran, its
console messages and a screenshot.

    browser = find_chromium()                      # None where it is not installed
    dom, console = dump_dom(browser, path, "#sort=-median", tmp_path)
    screenshot(browser, path, png, tmp_path, width=1280, height=2000)

Debian's `chromium` package (`apt-get install -y chromium`). Each call starts
a fresh profile under the test's temporary folder, with every background
service off, so the browser reaches nothing outside the page.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--hide-scrollbars", "--disable-extensions", "--enable-logging=stderr", "--v=0")


def find_chromium() -> str | None:
    """The path of a Chromium-family browser, or None."""
    return next((found for found in map(shutil.which, NAMES) if found), None)


def _run(browser: str, extra: list[str], url: str, profile: Path,
         timeout: float = 60.0) -> subprocess.CompletedProcess:
    profile.mkdir(parents=True, exist_ok=True)
    return subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *extra, url],
                          capture_output=True, text=True, timeout=timeout, check=False)


def console_messages(stderr: str) -> list[str]:
    """The page's console lines in Chromium's log (errors say 'Uncaught ...')."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def dump_dom(browser: str, page: Path, fragment: str, work: Path) -> tuple[str, list[str]]:
    """(the serialized DOM after the scripts ran, the console messages) of the page opened
    with `fragment` (e.g. '#sort=-median') in its address."""
    done = _run(browser, ["--dump-dom"], page.resolve().as_uri() + fragment,
                work / "profile-dom")
    if done.returncode != 0:
        raise RuntimeError(f"chromium --dump-dom failed ({done.returncode}): {done.stderr}")
    return done.stdout, console_messages(done.stderr)


def screenshot(browser: str, page: Path, png: Path, work: Path, width: int = 1280,
               height: int = 2000) -> None:
    """A PNG of the page's first `height` pixels at `width`."""
    done = _run(browser, [f"--window-size={width},{height}", f"--screenshot={png}"],
                page.resolve().as_uri(), work / "profile-shot")
    if done.returncode != 0 or not png.exists():
        raise RuntimeError(f"chromium --screenshot failed ({done.returncode}): {done.stderr}")
