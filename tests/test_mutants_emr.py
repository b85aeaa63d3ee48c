"""adaptkit.emr's chunking and rescaler sums at their boundaries, as mutation testing (`make mutation`,
tests/mutation.json) asked: chunk rows at exactly `_CHUNK`, 1-D and wide tensors, chunk sizes, and `_RescalerSums`
on empty, chunked, non-finite and all-zero input, against hand computations."""
import math

import pytest
import torch

import adaptkit.emr.merge as emr

C = emr._CHUNK


def test_row_chunks_at_and_past_the_chunk_size():
    assert emr._row_chunks(()) == [None] and emr._row_chunks((C,)) == [None] and emr._row_chunks((C // 8, 8)) == [None]
    assert emr._row_chunks((2 * C + 5,)) == [(0, C), (C, 2 * C), (2 * C, 2 * C + 5)]  # 1-D: rows are parameters
    assert emr._row_chunks((100, 3000)) == [(0, 80), (80, 100)]  # C // 3000 = 87 rows, down to a multiple of 8
    assert emr._row_chunks((20, 2 ** 16)) == [(0, 8), (8, 16), (16, 20)]  # at least 8 rows (whole mask bytes)
    assert emr._row_chunks((3, C)) == [(0, 3)]


def test_chunk_numel():
    assert emr._chunk_numel((4, 5, 6), None) == 120 and emr._chunk_numel((4, 5, 6), (1, 3)) == 60
    assert emr._chunk_numel((), None) == 1 and emr._chunk_numel((7,), (2, 7)) == 5


def _elect(taus):
    "The `add` inputs for task vectors `taus` (tasks, n), as the merge makes them."
    flat = taus.clone().float()
    mask_values = torch.empty_like(flat)
    _, magnitude = emr._elect_in_place(flat, torch.empty(flat.shape[1]), mask_values)
    return flat, magnitude, mask_values


TAUS = torch.tensor([[1.0, -2.0, 3.0, 0.5], [2.0, 1.0, -1.0, 0.0]])
# signs of the mean: +, -, +, +; |τ_uni| = (2, 2, 3, 0.5); masks a (1, 1, 1, 1), b (1, 0, 0, 0)
# Σ|τ_a| = 6.5, Σ|M_a ⊙ τ_uni| = 7.5; Σ|τ_b| = 4, Σ|M_b ⊙ τ_uni| = 2


def test_rescaler_sums_whole_tensor_chunks_and_modes():
    whole = emr._RescalerSums(2, "tensor_mean")
    assert whole.add(*_elect(TAUS), numel=4)
    assert whole.abs_task_vectors.dtype == torch.float32 and whole.values() == pytest.approx(
        [6.5 / 7.5, 4 / 2], rel=1e-6
    )
    assert whole.abs_task_vectors.tolist() == [6.5 / 4, 4 / 4] and whole.abs_masked_unified.tolist() == [7.5 / 4, 2 / 4]
    chunked = emr._RescalerSums(2, "tensor_mean")  # the same tensor in two chunks: the same per-tensor means
    assert chunked.add(*_elect(TAUS[:, :2]), numel=4) and chunked.add(*_elect(TAUS[:, 2:]), numel=4)
    assert chunked.abs_task_vectors.tolist() == [6.5 / 4, 4 / 4] and chunked.abs_masked_unified.tolist() == [
        7.5 / 4,
        0.5,
    ]
    glob = emr._RescalerSums(2, "global")  # global: plain sums, in float64
    assert glob.add(*_elect(TAUS), numel=4) and glob.abs_task_vectors.dtype == torch.float64
    assert glob.abs_task_vectors.tolist() == [6.5, 4.0] and glob.abs_masked_unified.tolist() == [7.5, 2.0]
    assert glob.add(*_elect(TAUS), numel=4) and glob.abs_task_vectors.tolist() == [13.0, 8.0]  # sums accumulate


def test_rescaler_sums_of_nothing_and_of_non_finite_input():
    sums = emr._RescalerSums(2, "tensor_mean")
    assert sums.add(torch.empty(2, 0), torch.empty(0), torch.empty(2, 0), numel=0)  # an empty tensor changes nothing
    assert sums.abs_task_vectors.tolist() == [0.0, 0.0] and sums.values() == [1.0, 1.0]
    assert not sums.add(*_elect(torch.tensor([[math.inf, 1.0], [1.0, 1.0]])), numel=2)
    only_den = emr._RescalerSums(2, "global")
    assert not only_den.add(
        torch.tensor([[1.0], [1.0]]), torch.tensor([math.nan]), torch.tensor([[1.0], [1.0]]), numel=1
    )


def test_a_task_with_no_masked_unified_mass_gets_rescaler_one_and_others_their_ratio():
    sums = emr._RescalerSums(2, "global")
    sums.abs_task_vectors, sums.abs_masked_unified = torch.tensor([3.0, 5.0], dtype=torch.float64), torch.tensor(
        [0.0, 2.0], dtype=torch.float64)
    assert sums.values() == [1.0, 2.5]
