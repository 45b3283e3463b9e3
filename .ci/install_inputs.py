"""Print a digest of what tests/test_install_resolves.py resolves: pyproject's requirements
(dependencies, extras, requires-python) and the per-rule conda envs (envs/*.yaml).

.ci/run resolves the documented installs against the package index only when this digest differs
from .ci/resolved.sha256, the digest of the requirements last resolved; a resolution reads the
index for minutes. Record a new digest after `pytest -m slow tests/test_install_resolves.py`
passes on the changed requirements. (A release yanked from the index without a change here is
not caught by CI then; the test itself still catches it.)"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
inputs = {
    "requires-python": project.get("requires-python"),
    "dependencies": project["dependencies"],
    "optional-dependencies": project["optional-dependencies"],
    "envs": {p.name: p.read_text() for p in sorted((ROOT / "envs").glob("*.yaml"))},
}
print(hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest())
