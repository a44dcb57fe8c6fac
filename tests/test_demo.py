"""`make run` as the README describes it, in its short mode: set-up, then the whole system on one machine."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_make_run_shows_the_system_allocating_caching_and_reallocating() -> None:
    env = {**os.environ, "DEMO_SHORT": "1"}
    result = subprocess.run(["make", "-s", "run"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "== storage: azurite" in out  # the default backend is a real storage server
    assert re.search(r"resnet50\s+cache .* \(c/d 1\.00\)", out), out  # the more cache-efficient dataset, whole
    assert re.search(r"bert\s+cache .* \(c/d 0\.25\)", out), out
    assert re.search(r"\[\s*\d+\.\ds\] resnet50 epoch 1/3", out), out  # live lines
    assert "resnet50 finished; the policy reallocates" in out
    rows = re.findall(r"^(resnet50|bert)\s+(\d)\s+([\d.]+)\s+([\d.]+)", out, re.MULTILINE)
    assert [(job, int(epoch)) for job, epoch, _, _ in rows] == [("resnet50", e) for e in (1, 2, 3)] + [
        ("bert", e) for e in (1, 2, 3)
    ]
    hit = {(job, int(epoch)): float(ratio) for job, epoch, _, ratio in rows}
    assert hit[("resnet50", 1)] == 0.0 and hit[("resnet50", 2)] == 1.0 and hit[("resnet50", 3)] == 1.0
    assert 0.2 <= hit[("bert", 2)] <= 0.3  # a quarter cached: uniform caching hits c/d
    assert "done in" in out
    assert "Traceback" not in result.stderr
    assert not [line for line in Path("/proc/mounts").read_text().splitlines() if "silod-demo" in line]
