"""bench/compare_flash_mla.py's timing schedule and kernelkit-style span accounting (CPU only).

The comparison with FlashMLA is only as fair as these two pieces: which call runs where in a
round, and which GPU activities of a profiled rep belong to the call."""

from __future__ import annotations

import collections
import dataclasses
import pathlib
import sys

import pytest

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def cmp(selkv):  # the script imports selkv at import time
    bench = str(pathlib.Path(__file__).resolve().parents[2] / "bench")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import compare_flash_mla

    return compare_flash_mla


@pytest.mark.parametrize("order", ["rotate", "mirror", "alone"])
@pytest.mark.parametrize("n,reps", [(2, 8), (3, 12), (7, 14)])
def test_call_order_runs_every_call_rep_once(cmp, order, n, reps):
    run = cmp.call_order(order, n, reps)
    assert sorted(run) == [(i, r) for i in range(n) for r in range(reps)]
    if order == "alone":  # each call's reps back to back, in rep order
        assert run == [(i, r) for i in range(n) for r in range(reps)]
    else:  # interleaved: round r holds every call once
        assert all(sorted(i for i, _ in run[r * n:(r + 1) * n]) == list(range(n)) for r in range(reps))


@pytest.mark.parametrize("n", [2, 3, 7])
def test_rotate_gives_every_call_every_place_and_neighbour(cmp, n):
    reps = 2 * n
    run = cmp.call_order("rotate", n, reps)
    places = collections.Counter((i, k % n) for k, (i, _) in enumerate(run))
    assert all(places[(i, p)] == 2 for i in range(n) for p in range(n))  # each place twice per 2n reps
    # who runs right before whom within a round: with 3 calls or more, no call always follows the
    # same one (the rotation and its mirror give each call both of its neighbours)
    before = collections.defaultdict(set)
    for r in range(reps):
        seq = [i for i, _ in run[r * n:(r + 1) * n]]
        for a, b in zip(seq, seq[1:]):
            before[b].add(a)
    assert all(len(before[i]) == min(2, n - 1) for i in range(n))


def test_kineto_spans_take_the_calls_activities_of_each_rep(cmp):
    # 3 reps of: flush (3 fills), pre (1 kernel), call (decode, then a combine launched early
    # under programmatic dependent launch: it starts before the decode ends and ends last)
    acts, want, t = [], [], 0.0
    for r in range(3):
        for _ in range(3):
            acts.append((t, t + 600.0))
            t += 601.0
        acts.append((t, t + 5.0))  # pre
        t += 6.0
        dec = (t, t + 10.0 + r)
        comb = (t + 2.0, t + 13.0 + r)
        acts += [dec, comb]
        want.append(13.0 + r)
        t += 20.0 + r
    assert cmp.kineto_spans(acts, 3, 4) == pytest.approx(want)


def test_kineto_spans_use_the_last_end_not_the_last_start(cmp):
    acts = [(0.0, 1.0), (2.0, 30.0), (3.0, 10.0)]  # flush; a long kernel, then a short one inside it
    assert cmp.kineto_spans(acts, 1, 1) == pytest.approx([28.0])


@pytest.mark.parametrize("n_acts,reps,head", [(7, 2, 1), (4, 2, 2), (0, 3, 1), (6, 3, 2)])
def test_kineto_spans_refuse_reps_they_cannot_tell_apart(cmp, n_acts, reps, head):
    # 7 activities in 2 reps: uneven; 2 a rep with a head of 2: no call activity; none at all
    acts = [(float(k), float(k) + 0.5) for k in range(n_acts)]
    with pytest.raises(RuntimeError, match="activity count is not fixed"):
        cmp.kineto_spans(acts, reps, head)


def test_extra_len_sweep_labels_only_the_extra_topk_length_cases(cmp):
    dyn = [c for c in cmp.MODEL1_CASES if c.extra_len]
    fixed = [c for c in cmp.MODEL1_CASES if c.K2 and not c.extra_len]
    assert dyn and fixed
    c = dataclasses.replace(dyn[0], extra_len_fixed=(214, 290))
    assert c.shape() == dyn[0].shape() + " lengths=214,290"  # a sweep row never reads as the drawn case
    assert dataclasses.replace(fixed[0], extra_len_fixed=(0,)).shape() == fixed[0].shape()
