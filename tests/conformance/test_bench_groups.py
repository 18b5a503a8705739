"""``gae-xp groups`` times like against like: every row's framework code (``gae_xp.bench.groups``, written as verl
and TRL write it) and gae_xp's call give the same numbers, on a small batch; and the command runs."""

from __future__ import annotations

import numpy as np
import pytest

from gae_xp.__main__ import main

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("shuffle", [False, True])
def test_every_group_row_computes_what_its_framework_does(shuffle):
    from gae_xp.bench import groups

    data = groups.batch(6, 4, 24, shuffle=shuffle)
    compared = 0
    for name, theirs, ours in groups.rows(data):
        if name.startswith(("copy", "floor")):
            continue
        want, got = theirs(), ours()
        want, got = (want[0] if isinstance(want, tuple) else want), (got[0] if isinstance(got, tuple) else got)
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
        compared += 1
    assert compared >= 8


def test_the_command_prints_every_row(capsys):
    assert main(["groups", "--shapes", "4x2x8", "--repeat", "1"], prog="gae-xp") == 0
    out = capsys.readouterr().out
    assert "4 prompts x 2 samples x 8 tokens" in out
    assert out.count(" ms ") >= 11 and "to_tokens (bool)" in out and "TRL GRPO block" in out


@pytest.mark.parametrize("argv, message", [
    (["--repeat", "0"], "argument --repeat: 0 is not positive"),
    (["--shapes", "16x512"], "expected PROMPTSxSAMPLESxTOKENS"),
    (["--shapes", "0x2x8"], "expected PROMPTSxSAMPLESxTOKENS"),
])
def test_groups_checks_its_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["groups", *argv], prog="gae-xp")
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
