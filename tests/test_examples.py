"""The examples run: ``examples/ppo_cartpole.py --smoke`` (a few PPO updates on CartPole-v1; the script asserts that
its losses are finite and that gae_xp's advantages equal CleanRL's loop on every rollout it collects)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _this_checkouts_env() -> dict:
    """The script's own folder leads its sys.path, not the checkout: the checkout's gae_xp goes first on
    PYTHONPATH, so the example runs the code under test, installed or not (and not another installed copy)."""
    return {**os.environ, "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def test_ppo_cartpole_smoke():
    pytest.importorskip("gymnasium", reason="the PPO example needs gymnasium (pip install '.[examples]')")
    pytest.importorskip("torch", reason="the PPO example needs torch (pip install '.[examples]')")
    done = subprocess.run([sys.executable, str(EXAMPLES / "ppo_cartpole.py"), "--smoke"], capture_output=True,
                          text=True, timeout=300, env=_this_checkouts_env())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "smoke run: seed 1, 3 updates" in done.stdout, done.stdout
    assert "CleanRL's loop" in done.stdout, done.stdout
