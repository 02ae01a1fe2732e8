"""sdq.files: writes that readers see whole or not at all; folders replaced without a gap."""

from __future__ import annotations

import threading

from sdq import files


def _folder(path, text):
    path.mkdir()
    (path / "table.csv").write_text(text)
    return path


def test_replace_dir_swaps_in_the_new_folder_and_removes_the_old(tmp_path):
    dst = _folder(tmp_path / "out", "old")
    src = _folder(tmp_path / "staged", "new")
    files.replace_dir(src, dst)
    assert (dst / "table.csv").read_text() == "new"
    assert not src.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # nothing left aside


def test_replace_dir_into_a_new_place(tmp_path):
    src = _folder(tmp_path / "staged", "new")
    files.replace_dir(src, tmp_path / "a" / "out")
    assert (tmp_path / "a" / "out" / "table.csv").read_text() == "new"
    assert not src.exists()


def test_the_destination_never_goes_missing(tmp_path):
    """A reader polling the destination while it is replaced 200 times always finds a whole
    folder: the names are swapped in one step, with no moment between two renames."""
    dst = _folder(tmp_path / "out", "v0")
    assert files._exchange(_folder(tmp_path / "probe", "x"), dst)  # the kernel can swap
    files._exchange(tmp_path / "probe", dst)  # and back
    seen, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                seen.append((dst / "table.csv").read_text())
            except FileNotFoundError:
                seen.append(None)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(1, 201):
            files.replace_dir(_folder(tmp_path / f"staged{i}", f"v{i}"), dst)
    finally:
        stop.set()
        t.join()
    assert None not in seen and len(seen) > 0
    assert (dst / "table.csv").read_text() == "v200"
