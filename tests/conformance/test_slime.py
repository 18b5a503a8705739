"""slime's own tests of its GAE and discounted returns, restated against ``gae_xp.adapters.slime``.

Sources (THUDM/slime): tests/test_chunked_gae.py (test_gae_parallel_matches_serial: float32, atol 1e-5, shapes up
to B=256, T=131072, chunk sizes 64/128/256) and tests/test_discounted_returns.py (its chunked-returns and
chunked-GAE tests). Inputs come from torch with slime's seeds; the oracle is slime's serial loop in float32, the same
operations in the same order (frameworks.slime_vanilla_gae), computed once per shape for the module.
"""

from __future__ import annotations

import numpy as np
import pytest

from conformance.frameworks import slime_serial_discounted_returns, slime_vanilla_gae
from gae_xp.adapters import slime

torch = pytest.importorskip("torch")

_SERIAL = {}


@pytest.fixture(scope="module")
def serial_case():
    """(rewards, values, serial advantages, serial returns) for a shape: slime's inputs (seed 0) and loop, once."""

    def get(batch, steps):
        if (batch, steps) not in _SERIAL:
            torch.manual_seed(0)
            rewards = torch.randn(batch, steps, dtype=torch.float32)
            values = torch.randn(batch, steps, dtype=torch.float32)
            _SERIAL[(batch, steps)] = (rewards, values, *slime_vanilla_gae(rewards.numpy(), values.numpy(), 0.99, 0.95))
        return _SERIAL[(batch, steps)]

    yield get
    _SERIAL.clear()


@pytest.mark.parametrize("batch,steps", [(16, 4096), (32, 8192)])
@pytest.mark.parametrize("chunk_size", [64, 128, 256])
def test_gae_parallel_matches_serial(serial_case, batch, steps, chunk_size):
    """slime tests/test_chunked_gae.py::test_gae_parallel_matches_serial: chunked GAE within 1e-5 of the serial loop."""
    _parallel_matches_serial(serial_case, batch, steps, chunk_size)


@pytest.mark.slow  # 128 MiB per array, 1 GB at its peak: the full matrix runs it, the quick run the shapes above
@pytest.mark.parametrize("chunk_size", [64, 128, 256])
def test_gae_parallel_matches_serial_at_slimes_largest_shape(serial_case, chunk_size):
    """The same at slime's largest shape, B=256, T=131072."""
    _parallel_matches_serial(serial_case, 256, 128 * 1024, chunk_size)


def _parallel_matches_serial(serial_case, batch, steps, chunk_size):
    rewards, values, want_advantages, want_returns = serial_case(batch, steps)
    advantages, returns = slime.chunked_gae(rewards, values, 0.99, 0.95, chunk_size=chunk_size)
    assert advantages.dtype == returns.dtype == torch.float32
    adv_err = float(np.abs(advantages.numpy() - want_advantages).max())
    ret_err = float(np.abs(returns.numpy() - want_returns).max())
    assert adv_err < 1e-5, f"adv error too large: {adv_err}"
    assert ret_err < 1e-5, f"ret error too large: {ret_err}"


@pytest.mark.parametrize("batch,steps", [(16, 4096), (32, 8192)])
def test_vanilla_gae_matches_serial(library, serial_case, batch, steps):
    """The serial entry point too, on every namespace, within slime's float32 tolerance of its loop."""
    rewards, values, want_advantages, want_returns = serial_case(batch, steps)
    advantages, returns = slime.vanilla_gae(library.asarray(rewards.numpy()), library.asarray(values.numpy()),
                                            0.99, 0.95)
    assert float(np.abs(library.to_numpy(advantages) - want_advantages).max()) < 1e-5
    assert float(np.abs(library.to_numpy(returns) - want_returns).max()) < 1e-5


@pytest.mark.parametrize("discount", [0.0, 0.5, 0.99, 1.0])
@pytest.mark.parametrize("batch_size,sequence_length", [(1, 1), (3, 127), (3, 128), (3, 129), (3, 1000)])
@pytest.mark.parametrize("dtype,atol,rtol", [(torch.float32, 1e-4, 1e-5), (torch.float64, 1e-10, 1e-10)])
def test_chunked_discounted_returns_matches_serial(discount, batch_size, sequence_length, dtype, atol, rtol):
    """slime tests/test_discounted_returns.py::test_chunked_discounted_returns_matches_serial."""
    torch.manual_seed(0)
    rewards = torch.randn(batch_size, sequence_length, dtype=dtype)
    expected = torch.from_numpy(slime_serial_discounted_returns(rewards.numpy(), discount))
    actual = slime.chunked_discounted_returns(rewards, discount)
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)
    assert actual.dtype == rewards.dtype
    assert actual.device == rewards.device


def test_chunked_discounted_returns_preserves_right_padding():
    """slime tests/test_discounted_returns.py::test_chunked_discounted_returns_preserves_right_padding."""
    torch.manual_seed(0)
    lengths = [3, 129, 511]
    rewards = torch.zeros(len(lengths), max(lengths))
    for i, length in enumerate(lengths):
        rewards[i, :length] = torch.randn(length)
    actual = slime.chunked_discounted_returns(rewards, 0.99)
    for i, length in enumerate(lengths):
        expected = slime_serial_discounted_returns(rewards[i:i + 1, :length].numpy(), 0.99)[0]
        torch.testing.assert_close(actual[i, :length], torch.from_numpy(expected), atol=1e-4, rtol=1e-5)
        assert torch.count_nonzero(actual[i, length:]) == 0


@pytest.mark.parametrize("sequence_length", [127, 128, 129])
def test_chunked_gae_matches_serial_after_scan_reuse(sequence_length):
    """slime tests/test_discounted_returns.py::test_chunked_gae_matches_serial_after_scan_reuse."""
    torch.manual_seed(0)
    rewards = torch.randn(3, sequence_length)
    values = torch.randn(3, sequence_length)
    expected = slime_vanilla_gae(rewards.numpy(), values.numpy(), 0.99, 0.95)
    actual = slime.chunked_gae(rewards, values, gamma=0.99, lambd=0.95)
    torch.testing.assert_close(actual[0], torch.from_numpy(expected[0]), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(actual[1], torch.from_numpy(expected[1]), atol=1e-5, rtol=1e-5)


def test_shapes_and_arguments_as_slime():
    """slime takes [B, T]: vanilla_gae fails to unpack other shapes (ValueError), the chunked ones assert."""
    flat = torch.zeros(5)
    with pytest.raises(ValueError):
        slime.vanilla_gae(flat, flat, 0.99, 0.95)
    with pytest.raises(AssertionError):
        slime.chunked_gae(flat, flat, 0.99, 0.95)
    with pytest.raises(AssertionError):
        slime.chunked_discounted_returns(flat, 0.99)
    with pytest.raises(ValueError, match="chunk_size"):
        slime.chunked_gae(torch.zeros(2, 5), torch.zeros(2, 5), 0.99, 0.95, chunk_size=0)
    advantages, returns = slime.chunked_gae(torch.zeros(2, 5), torch.zeros(2, 5), 0.99, 0.95, 3)
    assert advantages.shape == returns.shape == (2, 5)
