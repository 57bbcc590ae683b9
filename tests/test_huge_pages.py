"""Importing quickdraft puts torch's large allocations on transparent huge pages unless told not to."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# A fresh interpreter: this one imported torch (and quickdraft) long ago.
SETTING = "import os, quickdraft; print(os.environ['THP_MEM_ALLOC_ENABLE'])"


@pytest.mark.parametrize("given, kept", [(None, "1"), ("0", "0")], ids=["default", "turned-off"])
def test_huge_pages_are_asked_for_unless_the_environment_says_otherwise(given, kept):
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    if given is not None:
        env["THP_MEM_ALLOC_ENABLE"] = given
    out = subprocess.run([sys.executable, "-c", SETTING], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == kept
