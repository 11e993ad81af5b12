"""Hit latency by input form next to the floor of each (issues #2 and #12), measured side by side.

Floors are the fastest well-kept implementation of the unavoidable steps: blake3 (Rust, SIMD) of
the raw bytes; for a data URL and for raw base64, pybase64's SIMD decode plus blake3; for a path,
reading the file plus blake3 (what a hit would cost without the path memo). Targets: bytes,
data-URL and raw-base64 hits <= 1.2x their floor; raw base64 <= 1.2x the same bytes as a data URL;
a hit on an unchanged path ~0.1x re-hashing its bytes (<= 0.2x); a ContentId hit, which hashes
only the ID, no slower than a bytes hit.

usage: python benchmarks/bench_identity.py [--rounds N]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pybase64
from blake3 import blake3
from PIL import Image

sys.path.insert(0, str(Path(__file__).parent))
from visioncache import ContentId, VisionEmbeddingCache
from visioncache.identity.path_memo import SETTLE_SECONDS

from _timing import interleaved_medians, print_table


def photo_jpeg(target_bytes: int = 1_000_000) -> bytes:
    """A real photo (matplotlib's Grace Hopper) upscaled to a JPEG of about ``target_bytes``."""
    from visioncache.bench.workload import sample_photos

    photo = Image.fromarray(sample_photos()[0][1])
    scale = 1.0
    while True:
        size = (int(photo.width * scale), int(photo.height * scale))
        buffer = io.BytesIO()
        photo.resize(size, Image.Resampling.BICUBIC).save(buffer, "JPEG", quality=95)
        if buffer.tell() >= target_bytes:
            return buffer.getvalue()
        scale *= 1.15


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=400)
    args = parser.parse_args()

    jpeg = photo_jpeg()
    url = "data:image/jpeg;base64," + pybase64.b64encode(jpeg).decode()
    payload = url.split(",", 1)[1]
    directory = tempfile.mkdtemp()
    path = os.path.join(directory, "photo.jpg")
    Path(path).write_bytes(jpeg)
    past = time.time() - 60  # an unchanged file (see path_memo: fresh files are not memoised)
    os.utime(path, (past, past))
    time.sleep(SETTLE_SECONDS + 0.05)  # its ctime, which nothing sets back, must age too

    cache = VisionEmbeddingCache()
    embedding = np.zeros((999, 1536), dtype=np.float16)
    identifier = ContentId("sha256:" + blake3(jpeg).hexdigest())
    forms: dict[str, object] = {"bytes": jpeg, "data URL": url, "raw base64": payload, "path": path}
    forms["ContentId"] = identifier
    cache.set_image_embeddings([jpeg, identifier], [embedding, embedding])

    def read_and_hash() -> bytes:
        with open(path, "rb") as file:
            return bytes(blake3(file.read()).digest())

    def decode_and_hash() -> bytes:
        return bytes(blake3(pybase64.b64decode(payload, validate=True)).digest())

    candidates: dict[str, Callable[[], object]] = {
        "blake3": lambda: blake3(jpeg).digest(),
        "b64decode + blake3": decode_and_hash,
        "read + blake3": read_and_hash,
    }
    for form, image in forms.items():
        candidates[form] = lambda image=image: cache.get_image_embeddings([image])
    times = interleaved_medians(candidates, rounds=args.rounds)
    assert all(value is embedding for value in cache.get_image_embeddings(list(forms.values())))

    checks = [
        ("bytes", "bytes", "blake3", 1.2),
        ("data URL", "data URL", "b64decode + blake3", 1.2),
        ("raw base64", "raw base64", "b64decode + blake3", 1.2),
        ("raw base64 vs data URL", "raw base64", "data URL", 1.2),
        ("unchanged file path", "path", "read + blake3", 0.2),
        ("ContentId vs bytes", "ContentId", "bytes", 1.0),
    ]
    print(
        f"JPEG {len(jpeg) / 1e6:.2f} MB, data URL {len(url) / 1e6:.2f} MB; median of {args.rounds} "
        "interleaved rounds"
    )
    rows = []
    for label, hit, floor, target in checks:
        ratio = times[hit] / times[floor]
        rows.append(
            (
                label,
                f"{times[hit] * 1e3:.3f} ms",
                f"{times[floor] * 1e3:.3f} ms ({floor})",
                f"{ratio:.2f}x",
                f"<= {target}x",
                "ok" if ratio <= target else "MISSED",
            )
        )
    print_table(rows, ("input", "hit", "compared with", "ratio", "target", ""))
    return 0 if all(row[-1] == "ok" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
