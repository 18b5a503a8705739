"""The piece algebra (gae_xp._pieces) on one process: a row cut into pieces, summarised, joined and fixed up,
equals gae() on the whole row, on every route that can serve a piece."""

from __future__ import annotations

import numpy as np
import pytest

import gae_xp
from gae_xp import _pieces, _prepare, backends

ROUTES = ["xp", "numba"]  # the NumPy routes with segments and a carry (numba-cuda has neither: see the last test)
CUTS = [0, 17, 18, 100, 160, 240]  # 100 and 160 fall inside the masked run [100, 170); 17 is a done
T = CUTS[-1]


def make_case(name, rng, batch=3):
    case = {"rewards": rng.standard_normal((batch, T)), "values": rng.standard_normal((batch, T))}
    if name in ("mask", "everything"):
        mask = rng.random((batch, T)) > 0.4
        mask[:, 100:170] = False
        case["mask"] = mask
    if name == "everything":
        case["terminated"] = rng.random((batch, T)) < 0.03
        case["terminated"][:, 16] = True
        case["truncated"] = rng.random((batch, T)) < 0.03
        case["truncated_bootstrap"] = "next_step"  # random truncations, no final observations
        case["gamma"] = rng.uniform(0.5, 1, (1, T))
        case["lam"] = rng.uniform(0, 1, (batch, 1))
    if name == "next_values":
        case["next_values"] = rng.standard_normal((batch, T))
    else:
        case["bootstrap_value"] = rng.standard_normal(batch)
    return case


def pieces_of(case, fill_masked, backend):
    """(problem, backend) of every piece: each a call of its own, solved by a backend that takes a carry."""
    calls = []
    for start, stop in zip(CUTS[:-1], CUTS[1:]):
        piece = {k: v[:, start:stop] if isinstance(v, np.ndarray) and v.shape[-1] == T else v
                 for k, v in case.items()}
        call = _prepare.prepare(**piece, fill_masked=fill_masked, backend=backend)
        calls.append((call.problem, backends.solver(call, segments=True)))
    return calls


@pytest.mark.parametrize("backend", ROUTES)
@pytest.mark.parametrize("name", ["plain", "mask", "everything", "next_values"])
@pytest.mark.parametrize("fill_masked", [False, True])
def test_pieces_joined_equal_the_whole_row(backend, name, fill_masked):
    case = make_case(name, np.random.default_rng(["plain", "mask", "everything", "next_values"].index(name)))
    calls = pieces_of(case, fill_masked, backend)
    summaries = np.concatenate([_pieces.summarize(problem, solver) for problem, solver in calls], axis=-2)
    bootstrap = calls[-1][0].bootstrap[..., 0]
    b, c = _pieces.incoming(np, summaries, bootstrap)
    # the same chains one link at a time, from the last piece back (how the Dask backend joins blocks)
    entering_b, entering_c = bootstrap, np.zeros_like(bootstrap)
    for k in range(len(calls) - 2, -1, -1):
        entering_b, entering_c = _pieces.link(np, summaries[:, k + 1], entering_b, entering_c)
        np.testing.assert_allclose(entering_b, b[:, k], rtol=0, atol=1e-12)
        np.testing.assert_allclose(entering_c, c[:, k], rtol=0, atol=1e-12)
    parts = [_pieces.finish(problem.replace(bootstrap=b[:, k:k + 1], carry=c[:, k:k + 1]), solver, None)
             for k, (problem, solver) in enumerate(calls)]
    want_a, want_r = gae_xp.gae(**case, fill_masked=fill_masked, backend="xp")
    np.testing.assert_allclose(np.concatenate([p[0] for p in parts], -1), want_a, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([p[1] for p in parts], -1), want_r, rtol=0, atol=1e-12)


def test_a_closed_piece_takes_nothing_from_its_right():
    case = make_case("plain", np.random.default_rng(4))
    calls = pieces_of(case, False, "xp")
    summaries = np.concatenate([_pieces.summarize(problem, solver) for problem, solver in calls], axis=-2)
    closed = _pieces.close(np, summaries[:, 2], np.full(3, 5.0))
    summaries[:, 3:] = np.nan  # whatever lies after a closed piece
    summaries[:, 2] = closed
    b, c = _pieces.incoming(np, summaries, np.nan)
    assert np.isfinite(b[:, :2]).all() and np.isfinite(c[:, :2]).all()


@pytest.mark.parametrize("reverse", [True, False])
def test_scan_pieces_equal_the_whole_scan(reverse):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, T))
    a = np.where(rng.random((2, T)) < 0.05, 0.0, rng.uniform(0, 1, (2, T)))
    solve = gae_xp.backends.load("xp").scan
    edges, products = zip(*(_pieces.scan_summary(np, x[:, s:e].copy(), a[:, s:e], reverse=reverse, solve=solve)
                            for s, e in zip(CUTS[:-1], CUTS[1:])))
    count = len(edges)
    carries = [np.zeros(2)] * count
    order = range(count - 2, -1, -1) if reverse else range(1, count)
    for k in order:
        n = k + 1 if reverse else k - 1
        carries[k] = _pieces.scan_link(np, edges[n], products[n], carries[n])
    got = np.concatenate([_pieces.scan_finish(np, x[:, s:e].copy(), a[:, s:e], carries[k], reverse=reverse,
                                              solve=solve) for k, (s, e) in enumerate(zip(CUTS[:-1], CUTS[1:]))],
                         axis=-1)
    np.testing.assert_allclose(got, gae_xp.discounted_cumsum(x, a, reverse=reverse), rtol=0, atol=1e-12)


def test_a_backend_without_a_carry_cannot_finish_a_piece():
    call = _prepare.prepare(np.ones((2, 8)), np.ones((2, 8)), backend="xp")
    no_carry = type("NoCarry", (), {"name": "no-carry", "segments": False, "gae": backends.load("xp").gae})()
    with pytest.raises(ValueError, match="'no-carry' cannot take an incoming carry"):
        _pieces.finish(call.problem, no_carry, None)


@pytest.mark.parametrize("backend", ROUTES)
@pytest.mark.parametrize("fill_masked", [False, True])
def test_the_critic_chain_joins_like_the_advantages(backend, fill_masked):
    """With critic_lam a summary has 8 numbers (CRITIC_FIELDS last), and the returns' chain is joined (at once and
    link by link) and finished like the advantages'."""
    case = {**make_case("everything", np.random.default_rng(6)), "critic_lam": 1.0}
    calls = pieces_of(case, fill_masked, backend)
    summaries = np.concatenate([_pieces.summarize(problem, solver) for problem, solver in calls], axis=-2)
    assert summaries.shape[-1] == len(_pieces.FIELDS) + len(_pieces.CRITIC_FIELDS)
    bootstrap = calls[-1][0].bootstrap[..., 0]
    b, c, critic = _pieces.incoming(np, summaries, bootstrap)
    entering = (bootstrap, np.zeros_like(bootstrap), np.zeros_like(bootstrap))
    for k in range(len(calls) - 2, -1, -1):
        entering = _pieces.link(np, summaries[:, k + 1], *entering)
        for got, want in zip(entering, (b, c, critic)):
            np.testing.assert_allclose(got, want[:, k], rtol=0, atol=1e-12)
    parts = [_pieces.finish(problem.replace(bootstrap=b[:, k:k + 1], carry=c[:, k:k + 1]), solver, None,
                            critic[:, k:k + 1]) for k, (problem, solver) in enumerate(calls)]
    want_a, want_r = gae_xp.gae(**case, fill_masked=fill_masked, backend="xp")
    np.testing.assert_allclose(np.concatenate([p[0] for p in parts], -1), want_a, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([p[1] for p in parts], -1), want_r, rtol=0, atol=1e-12)
    closed = _pieces.close(np, summaries[:, 2], np.full(3, 5.0))
    assert closed.shape == summaries[:, 2].shape and (closed[:, [1, 3, 4, 6, 7]] == 0).all()


def test_an_empty_scan_piece_lets_the_carry_through():
    solve = gae_xp.backends.load("xp").scan
    edge, product = _pieces.scan_summary(np, np.zeros((2, 0)), np.zeros((2, 0)), reverse=True, solve=solve)
    np.testing.assert_array_equal(edge, 0.0)
    np.testing.assert_array_equal(product, 1.0)
    assert _pieces.scan_finish(np, np.zeros((2, 0)), 0.5, np.ones(2), reverse=True, solve=solve).shape == (2, 0)
