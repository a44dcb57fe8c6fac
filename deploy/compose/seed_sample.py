"""Seed the compose demo: write a small sample dataset to a directory and upload it to Azurite.

Run by the `seed` service of deploy/docker-compose.yml in the silod image (which has the Azure SDK). The
`minio-init` service then copies the same directory into MinIO with `mc`, so both backends serve identical
bytes. The content is deterministic, so re-running changes nothing.

    python seed_sample.py OUT_DIR   # env: AZURITE_CONNECTION_STRING, AZURITE_CONTAINER, SAMPLE_PREFIX
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

from azure.core.exceptions import ResourceExistsError, ServiceRequestError
from azure.storage.blob import BlobServiceClient

KIB = 1024
SMALL_FILES = [(f"class-{c}/img-{i:03d}.bin", 256 * KIB) for c in range(4) for i in range(16)]
LARGE_FILES = [("shards/shard-0.bin", 10 * 1024 * KIB)]  # larger than the 4 MiB chunk: several items
CONNECT_TIMEOUT = 60.0


def sample_files() -> list[tuple[str, bytes]]:
    rng = random.Random(7420)
    return [(name, rng.randbytes(size)) for name, size in SMALL_FILES + LARGE_FILES]


def write_directory(root: Path, files: list[tuple[str, bytes]]) -> None:
    for name, data in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def upload_to_azurite(connection_string: str, container: str, prefix: str, files: list[tuple[str, bytes]]) -> None:
    service = BlobServiceClient.from_connection_string(connection_string)
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while True:
        try:
            service.create_container(container)
            break
        except ResourceExistsError:
            break
        except ServiceRequestError:  # Azurite not listening yet
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
    client = service.get_container_client(container)
    for name, data in files:
        client.upload_blob(f"{prefix}/{name}", data, overwrite=True)


def main() -> int:
    out_dir = Path(sys.argv[1])
    files = sample_files()
    write_directory(out_dir, files)
    container, prefix = os.environ["AZURITE_CONTAINER"], os.environ["SAMPLE_PREFIX"]
    upload_to_azurite(os.environ["AZURITE_CONNECTION_STRING"], container, prefix, files)
    total = sum(len(data) for _, data in files)
    print(f"seeded {len(files)} files ({total} bytes) in {out_dir} and az://{container}/{prefix}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
