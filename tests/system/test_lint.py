"""The linter's verdict is part of the test run: `ruff check` (configured in pyproject.toml)
finds nothing in the project's Python files."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from conftest import REPO

ROOT = REPO


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed (pip install -e '.[test]')")
def test_ruff_check_is_clean():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", str(ROOT)], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
