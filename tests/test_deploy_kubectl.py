"""The small kustomize the deployment tests read (tests/deploy_model.py) against the real one, `kubectl
kustomize`. Tier `external`: kubectl recent enough for the kustomizations' `patches` field (1.21+) is in
neither Debian's registry (its kubernetes-client is 1.20) nor PyPI, so `make test` cannot install it and does
not run this; `make test-external` does, where kubectl is installed, and fails without it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy_model import K8S, KUSTOMIZATIONS, kustomize_build, unordered
from tests.storage_servers import missing_dependency


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda d: str(d.relative_to(K8S)))
def test_kubectl_kustomize_renders_what_these_tests_check(directory: Path) -> None:
    """The deployment tests read `kustomize_build`; this pins it to the real kustomize (offline: no cluster)."""
    if shutil.which("kubectl") is None:
        missing_dependency("kubectl (1.21 or newer, for kustomize's `patches`) is not installed")
    result = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rendered = [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]

    def by_name(resources: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
        return {(r["kind"], r["metadata"]["name"]): unordered(r) for r in resources}

    assert by_name(rendered) == by_name(kustomize_build(directory))
