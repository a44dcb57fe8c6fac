"""Synthetic ImageFolder datasets for the PyTorch benchmarks, with nothing but Pillow.

The images stand in for ImageNet's: 500 x 375 JPEGs of about 70 KB, so that decoding costs a loader worker
what a real photo does. Kept apart from the benchmarks that use them so that a GPU machine, which has torch
but neither boto3 nor the storage servers, can import it (`bench/pytorch_gpu.py`).
"""

from __future__ import annotations

import io
import random
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from PIL import Image

CLASSES = 10
WIDTH, HEIGHT = 500, 375


def image_key(index: int) -> str:
    """Where image `index` lives in the folder: one of `CLASSES` class folders, round robin."""
    return f"class{index % CLASSES:02d}/img{index:05d}.jpg"


def jpeg(index: int, seed: int) -> bytes:
    """Image `index`: a gradient tinted by the seeded `index`, with noise of a seeded strength. The noise itself
    comes from Pillow's own generator, which takes no seed: two calls give images of the same kind and about
    the same size, not the same bytes."""
    rng = random.Random(f"{seed}:{index}")
    base = Image.linear_gradient("L").resize((WIDTH, HEIGHT)).convert("RGB")
    noise = Image.effect_noise((WIDTH, HEIGHT), rng.uniform(30, 60)).convert("RGB")
    tint = Image.new("RGB", (WIDTH, HEIGHT), (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    image = Image.blend(Image.blend(base, tint, 0.5), noise, 0.35)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def _write_images(root: Path, indices: range, seed: int) -> dict[str, int]:
    sizes = {}
    for index in indices:
        path = root / image_key(index)
        data = jpeg(index, seed)
        path.write_bytes(data)
        sizes[image_key(index)] = len(data)
    return sizes


def make_images(root: Path, count: int, seed: int = 0, processes: int = 1) -> dict[str, int]:
    """Write `count` JPEGs under `root` in class folders, using `processes` processes; their sizes by key."""
    for index in range(min(count, CLASSES)):
        (root / image_key(index)).parent.mkdir(parents=True, exist_ok=True)
    if processes <= 1:
        return _write_images(root, range(count), seed)
    chunk = -(-count // processes)
    sizes: dict[str, int] = {}
    with ProcessPoolExecutor(processes) as pool:
        chunks = [range(start, min(start + chunk, count)) for start in range(0, count, chunk)]
        parts = [pool.submit(_write_images, root, indices, seed) for indices in chunks]
        for part in parts:
            sizes.update(part.result())
    return sizes
