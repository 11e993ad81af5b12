"""Bounded work and typed errors: devices, FIFOs, growing files, memoryviews, percent-encoded URLs.

The cases that hung or ran out of memory before the fix run in a child process with a time limit
and an address-space limit, so a regression fails this test instead of hanging the suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from visioncache import ImageTooLargeError, InvalidImageError, compute_image_hash
from visioncache.identity.hasher import ImageHasher

CHILD_SECONDS = 60


def digest_in_child(setup: str, call: str) -> str:
    """Run ``call`` (an ImageHasher expression) in a child limited to 1 GiB; print what happened."""
    script = textwrap.dedent(
        f"""
        import os, resource
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from visioncache.identity.hasher import ImageHasher
        hasher = ImageHasher(max_image_bytes=1 << 20)
        {setup}
        try:
            {call}
            print("no error")
        except Exception as error:
            print(type(error).__name__, error)
        """
    )
    environment = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    finished = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=CHILD_SECONDS, env=environment
    )
    return finished.stdout.strip() + finished.stderr[-500:]


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero")
def test_regression_dev_zero_is_refused_not_read_until_memory_runs_out():
    # st_size is 0 for a device, so the size check passed and read() never ended.
    outcome = digest_in_child("", "hasher.digest('/dev/zero')")
    assert outcome.startswith("InvalidImageError") and "a device" in outcome, outcome


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_regression_fifo_is_refused_not_blocked_on(tmp_path: Path):
    # open() of a FIFO with no writer blocks forever.
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    outcome = digest_in_child("", f"hasher.digest({str(fifo)!r})")
    assert outcome.startswith("InvalidImageError") and "a FIFO" in outcome, outcome


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_file_replaced_by_a_fifo_after_its_stat_is_not_blocked_on(tmp_path: Path):
    # The race the O_NONBLOCK open closes: stat saw a regular file, open finds a FIFO.
    regular, fifo = tmp_path / "regular", tmp_path / "pipe"
    regular.write_bytes(b"content")
    os.mkfifo(fifo)
    setup = f"""
        real_stat = os.stat
        os.stat = lambda path, *a, **k: real_stat({str(regular)!r} if path == {str(fifo)!r} else path)
    """
    outcome = digest_in_child(
        textwrap.dedent(setup).strip().replace("\n", "\n        "), f"hasher.digest({str(fifo)!r})"
    )
    assert outcome.startswith("InvalidImageError") and "a FIFO" in outcome, outcome


def test_directory_is_refused(tmp_path: Path):
    with pytest.raises(InvalidImageError, match="a directory"):
        compute_image_hash(str(tmp_path))
    with pytest.raises(InvalidImageError, match="a directory"):
        compute_image_hash(tmp_path)


def test_empty_file_is_refused(tmp_path: Path):
    path = tmp_path / "empty.png"
    path.touch()
    with pytest.raises(InvalidImageError, match="empty content"):
        compute_image_hash(str(path))


def test_missing_path_object_names_the_path(tmp_path: Path):
    with pytest.raises(InvalidImageError, match="not an existing file"):
        compute_image_hash(tmp_path / "missing.mp4")


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs procfs")
def test_file_larger_than_its_stat_size_is_read_to_at_most_the_limit_plus_one(monkeypatch):
    # procfs files report st_size 0 and have content: only max_image_bytes + 1 bytes are read.
    assert os.stat("/proc/self/maps").st_size == 0
    read = []
    real_read = os.read
    monkeypatch.setattr("os.read", lambda fd, n: read.append(len(chunk := real_read(fd, n))) or chunk)
    with pytest.raises(ImageTooLargeError):
        ImageHasher(max_image_bytes=100).digest("/proc/self/maps")
    assert sum(read) == 101


def test_file_within_the_limit_reads_whole(settled_file, photo_jpeg):
    path = settled_file(photo_jpeg, "photo.jpg")
    hasher = ImageHasher(max_image_bytes=len(photo_jpeg))
    assert hasher.digest(str(path)) == hasher.digest(photo_jpeg)
    with pytest.raises(ImageTooLargeError):
        ImageHasher(max_image_bytes=len(photo_jpeg) - 1).digest(str(path))


# ---- memoryviews ---------------------------------------------------------------------------------
def test_regression_non_contiguous_memoryview_raises_typed_error():
    view = memoryview(np.arange(24, dtype=np.uint8).reshape(4, 6)[:, ::2])
    with pytest.raises(InvalidImageError, match="C-contiguous"):
        compute_image_hash(view)


def test_regression_zero_dimensional_memoryview_raises_typed_error():
    with pytest.raises(InvalidImageError, match="1-dimensional"):
        compute_image_hash(memoryview(np.array(5, dtype=np.int64)))


def test_released_memoryview_raises_typed_error():
    view = memoryview(b"content")
    view.release()
    with pytest.raises(InvalidImageError, match="released"):
        compute_image_hash(view)


def test_contiguous_memoryview_of_any_shape_is_its_bytes():
    data = bytes(range(24))
    assert compute_image_hash(memoryview(data).cast("B", (4, 6))) == compute_image_hash(data)
    assert compute_image_hash(memoryview(np.frombuffer(data, np.float32))) == compute_image_hash(data)


# ---- data: URLs ----------------------------------------------------------------------------------
def test_regression_percent_encoded_data_url_is_size_checked_before_decoding(monkeypatch):
    decoded = []
    real_unquote = __import__("urllib.parse").parse.unquote_to_bytes
    monkeypatch.setattr(
        "visioncache.identity.hasher.unquote_to_bytes", lambda s: decoded.append(1) or real_unquote(s)
    )
    hasher = ImageHasher(max_image_bytes=100)
    with pytest.raises(ImageTooLargeError):
        hasher.digest("data:text/plain," + "%41" * 101)
    assert decoded == []
    assert hasher.digest("data:text/plain," + "%41" * 100) == hasher.digest(b"A" * 100)
    assert decoded == [1]


def test_base64_data_url_is_size_checked_before_decoding(monkeypatch):
    monkeypatch.setattr("pybase64.b64decode", lambda *a, **k: pytest.fail("decoded an oversize data: URL"))
    with pytest.raises(ImageTooLargeError):
        ImageHasher(max_image_bytes=100).digest("data:video/mp4;base64," + "AAAA" * 34)


@pytest.mark.parametrize("url", ["data:;base64,\ud800AAA", "data:;base64,QUJ\u00e9"])
def test_regression_lone_surrogates_and_non_ascii_in_data_urls_raise_typed_errors(url: str):
    with pytest.raises(InvalidImageError, match="corrupt base64"):
        compute_image_hash(url)


def test_regression_lone_surrogate_in_percent_encoded_data_url_raised_unicode_error():
    # The text of a non-base64 data: URL is its content, encoded as UTF-8 (surrogates passed through).
    assert compute_image_hash("data:,\ud800abc") == compute_image_hash(b"\xed\xa0\x80abc")


def test_regression_a_missing_file_over_80_characters_is_named_only_in_part(tmp_path: Path):
    """Error messages cut every string at 80 characters, so a missing file under a deep directory
    (a fresh machine's TMPDIR) was not named whole: the message must name the path the user gave."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    missing = deep / "image.png"
    with pytest.raises(InvalidImageError) as raised:
        ImageHasher().digest(str(missing))
    assert repr(str(missing)) in str(raised.value)
    present = deep / "fifo"
    os.mkfifo(present)
    with pytest.raises(InvalidImageError) as raised:
        ImageHasher().digest(str(present))
    assert repr(str(present)) in str(raised.value)
