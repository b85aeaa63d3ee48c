"""The RepNoise loss's pieces against closed forms, as mutation testing (`make mutation`, tests/mutation.json) asked:
`mmd` for point sets whose kernel sums are known exactly (at any scale, any kernel count and ratio, 3-D inputs), and
`repnoise_loss`'s default weights (alpha 1, beta 0.001) in the combination of its parts."""
import math

import pytest
import torch

from adaptkit.repnoise import mmd


def _closed_form(d2_xy, mean_d2, kernels=5, multiplier=2.0, within=0.0):
    "k(a, b) summed over the kernels, for squared distance `d2_xy`, with the bandwidths `mmd` derives from `mean_d2`."
    base = mean_d2 / multiplier ** (kernels // 2)
    return sum(math.exp(-d2_xy / (base * multiplier ** i)) for i in range(kernels))


# the bandwidths follow the data: the answer does not depend on scale
@pytest.mark.parametrize("scale", [1.0, 0.1, 30.0])
def test_mmd_of_two_points(scale):
    x, y = torch.tensor([[0.0]]), torch.tensor([[scale]])
    # n = 2: the mean off-diagonal squared distance is scale²; within a set d² = 0, so k = kernels there
    want = 5 + 5 - 2 * _closed_form(scale ** 2, scale ** 2)
    assert mmd(x, y).item() == pytest.approx(want, rel=1e-5)
    assert want == pytest.approx(10 - 2 * sum(math.exp(-4 / 2 ** i) for i in range(5)))


def test_mmd_with_other_kernel_counts_and_ratios():
    x, y = torch.tensor([[0.0]]), torch.tensor([[1.0]])
    want = 3 + 3 - 2 * sum(math.exp(-3 / 3 ** i) for i in range(3))  # base = 1 / 3**(3 // 2) = 1/3
    assert mmd(x, y, kernels=3, multiplier=3.0).item() == pytest.approx(want, rel=1e-5)
    want = 4 + 4 - 2 * sum(math.exp(-2.25 / 1.5 ** i) for i in range(4))  # base = 1 / 1.5**2
    assert mmd(x, y, kernels=4, multiplier=1.5).item() == pytest.approx(want, rel=1e-5)


def test_mmd_of_sets_of_different_sizes():
    x, y = torch.tensor([[0.0], [0.0]]), torch.tensor([[1.0]])
    # 3 points: 4 ordered pairs at d² = 1 out of 6 -> mean 2/3; base = (2/3) / 4 = 1/6
    k_xy = sum(math.exp(-6 / 2 ** i) for i in range(5))
    assert mmd(x, y).item() == pytest.approx(5 + 5 - 2 * k_xy, rel=1e-5)
    assert mmd(y, x).item() == pytest.approx(5 + 5 - 2 * k_xy, rel=1e-5)


def test_mmd_flattens_each_sample_and_is_zero_for_equal_sets():
    x = torch.tensor([[[0.0], [0.0]]])  # one sample of shape (2, 1)
    y = torch.tensor([[[3.0], [4.0]]])  # d² = 25
    assert mmd(x, y).item() == pytest.approx(10 - 2 * sum(math.exp(-4 / 2 ** i) for i in range(5)), rel=1e-5)
    z = torch.tensor([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]])
    assert abs(mmd(z, z.clone()).item()) < 1e-6
    assert mmd(z.double(), z.double() + 1).dtype == torch.float32


def test_repnoise_loss_default_weights_are_alpha_1_and_beta_0_001(tiny_tok):
    from adaptkit.models import tiny_causal_lm
    from adaptkit.repnoise.trainer import RepNoiseCollator, repnoise_dataset, repnoise_loss
    rows = [{"prompt": f"How do I do thing {i}?", "harmful": f"Do it like {i}.", "harmless": "I can't help with that."}
            for i in range(2)]
    batch = RepNoiseCollator(tiny_tok)([r for r in repnoise_dataset(rows, tiny_tok, max_length=32)])
    torch.manual_seed(0)
    parts = repnoise_loss(tiny_causal_lm(tiny_tok, num_layers=2).eval(), batch)
    want = parts["harmless_ce"] + 0.001 * parts["noise_mmd"] - 1.0 * torch.log1p(parts["harmful_ce"])
    assert parts["loss"].item() == pytest.approx(want.item(), rel=1e-6)
    assert parts["noise_mmd"].item() > 1e-3 and parts["harmful_ce"].item() > 0.1  # both terms weigh in
