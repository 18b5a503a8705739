"""``gae-xp adapters`` times like against like: every case's framework loop (``gae_xp.bench.baselines``, or
torchrl's own function) and adapter give the same numbers, on a small shape."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")


def test_every_adapter_case_computes_what_its_framework_does():
    from gae_xp.bench import adapters
    from gae_xp.testing import libraries

    cases = adapters.adapter_cases(libraries.load("torch:cpu"), 3, 96)
    assert len(cases) >= 8
    for name, framework, adapter in cases:
        for theirs, ours in zip(framework(), adapter()):
            np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=2e-5, atol=2e-5 * float(theirs.abs().max()),
                                       err_msg=name)
