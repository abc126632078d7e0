"""Safe writes (`wpk.core.safe_write`): a fresh mkstemp file in the target folder, renamed
over a regular file only; links are never followed, failures leave nothing behind."""

from __future__ import annotations

import os
import stat
import tempfile

import pytest

from wpk.core.errors import OptionError
from wpk.core.safe_write import atomic_output, check_output, write_bytes, write_text


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_writes_the_whole_file_with_ordinary_permissions(tmp_path):
    target = tmp_path / "out.txt"
    write_text(target, "héllo\n", "-o")
    assert target.read_text(encoding="utf-8") == "héllo\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()
    assert os.listdir(tmp_path) == ["out.txt"]


def test_replaces_a_regular_file_and_keeps_the_old_one_on_failure(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_output(target, "-o") as handle:
        handle.write(b"half of the new")
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.bin"]
    write_bytes(target, b"new", "-o")
    assert target.read_bytes() == b"new"


def test_a_link_planted_at_the_temporary_name_is_not_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "r.html"
    # the names wpk once used, and the first name mkstemp will try, all point at the victim
    planted = ["planted", "fresh"]
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: iter(planted))
    for name in (".r.html.tmp", ".r.html.planted.tmp"):
        (tmp_path / name).symlink_to(victim)
    write_text(target, "<html>report</html>", "-o")
    assert victim.read_text() == "precious"
    assert target.read_text() == "<html>report</html>"
    assert not target.is_symlink()
    assert (tmp_path / ".r.html.planted.tmp").is_symlink()  # left alone, not written through


def test_a_symbolic_link_at_the_target_is_refused(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "out.txt"
    link.symlink_to(victim)
    with pytest.raises(OptionError, match="symbolic link"):
        write_text(link, "overwritten", "-o")
    assert victim.read_text() == "precious" and link.is_symlink()


def test_a_device_is_refused_not_replaced(char_device):
    with pytest.raises(OptionError, match="device"):
        write_bytes(char_device, b"data", "-o")
    assert stat.S_ISCHR(os.lstat(char_device).st_mode)


def test_a_folder_and_a_fifo_are_refused(tmp_path):
    (tmp_path / "folder").mkdir()
    with pytest.raises(OptionError, match="folder"):
        check_output(tmp_path / "folder", "-o")
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(OptionError, match="pipe"):
        write_text(tmp_path / "pipe", "x", "-o")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "pipe").st_mode)


def test_a_missing_folder_is_named_with_the_flag(tmp_path):
    with pytest.raises(OptionError, match=r"--output .*folder .*nowhere.* does not exist"):
        write_bytes(tmp_path / "nowhere" / "out.npz", b"", "--output")
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(OptionError, match="not writable"):
            write_text(folder / "out.txt", "x", "-o")
    finally:
        folder.chmod(0o700)


def test_the_input_file_is_refused_under_any_spelling(tmp_path, monkeypatch):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"model")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hard.onnx").hardlink_to(model)
    for spelling in ("m.onnx", "./m.onnx", str(model), "hard.onnx"):
        with pytest.raises(OptionError, match="input file"):
            check_output(spelling, "-o", inputs=[model])
    assert model.read_bytes() == b"model"


def test_a_full_disk_is_a_user_error_and_leaves_no_file(tmp_path, monkeypatch):
    def full(fd):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OptionError, match="No space left on device"):
        write_bytes(tmp_path / "out.bin", b"x" * 1000, "-o")
    assert os.listdir(tmp_path) == []
