"""The MMD estimates of the core (`adaptkit.tasks`): the unbiased U-statistic against a brute-force formula, its
expectation (0 for one distribution, the same at every sample size), symmetry, unequal sizes, and the biased
estimate RepNoise's loss uses, moved from `adaptkit.repnoise` with its numbers unchanged."""
import itertools
import math
import re

import numpy as np
import pytest
import torch

from adaptkit.tasks import mmd, mmd_unbiased


def _brute_force(x, y, kernels=5, mult=2.0, bandwidth=None):
    "The U-statistic pair by pair in Python floats: within-set means leave out i == j."
    z = [list(map(float, r)) for r in [*x, *y]]
    d = lambda a, b: sum((u - v) ** 2 for u, v in zip(z[a], z[b]))
    pairs = [(a, b) for a, b in itertools.product(range(len(z)), repeat=2) if a != b]
    bw = (bandwidth or sum(d(a, b) for a, b in pairs) / len(pairs)) / mult ** (kernels // 2)
    k = lambda a, b: sum(math.exp(-d(a, b) / (bw * mult ** q)) for q in range(kernels))
    m, n = len(x), len(y)
    xx = sum(k(a, b) for a in range(m) for b in range(m) if a != b) / (m * (m - 1))
    yy = sum(k(a, b) for a in range(m, m + n) for b in range(m, m + n) if a != b) / (n * (n - 1))
    return xx + yy - 2 * sum(k(a, b) for a in range(m) for b in range(m, m + n)) / (m * n)


def _old_mmd(x, y, *, kernels=5, multiplier=2.0):
    "`adaptkit.repnoise.mmd` as it was before it moved to the core, verbatim."
    z = torch.cat([x.flatten(1), y.flatten(1)]).float()
    sq = (z * z).sum(1)
    d2 = (sq[:, None] + sq[None, :] - 2 * z @ z.T).clamp_min(0)
    n, m = len(z), len(x)
    base = (d2.detach().sum() / max(n * n - n, 1)).clamp_min(1e-12) / multiplier ** (kernels // 2)
    k = sum(torch.exp(-d2 / (base * multiplier ** i)) for i in range(kernels))
    return k[:m, :m].mean() + k[m:, m:].mean() - 2 * k[:m, m:].mean()


@pytest.mark.parametrize("sizes, kw", [((5, 8), {}), ((2, 2), {}), ((9, 4), {"kernels": 3, "multiplier": 3.0}),
                                       ((6, 7), {"bandwidth": 2.5}), ((3, 5), {"kernels": 1, "bandwidth": 0.7})])
def test_mmd_unbiased_matches_the_brute_force_formula(sizes, kw):
    g = torch.Generator().manual_seed(sum(sizes))
    x, y = torch.randn(sizes[0], 4, generator=g), torch.randn(sizes[1], 4, generator=g) * 1.5 + 0.3
    want = _brute_force(x, y, kw.get("kernels", 5), kw.get("multiplier", 2.0), kw.get("bandwidth"))
    assert mmd_unbiased(x, y, **kw) == pytest.approx(want, rel=1e-10, abs=1e-12)


def test_mmd_unbiased_is_symmetric_and_takes_arrays_and_unequal_sizes():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 2, 3, generator=g), torch.randn(11, 2, 3, generator=g) + 1  # each sample flattened
    value = mmd_unbiased(x, y)
    assert isinstance(value, float) and value > 0
    assert mmd_unbiased(y, x) == pytest.approx(value, rel=1e-12)
    assert mmd_unbiased(x.numpy(), y.tolist()) == pytest.approx(value, rel=1e-12)
    assert mmd_unbiased(x.to(torch.bfloat16), y.to(torch.bfloat16)) == pytest.approx(value, rel=0.05)
    xg = x.clone().requires_grad_(True)
    assert mmd_unbiased(xg, y) == pytest.approx(value, rel=1e-12)  # a tensor that needs grad is read, not tracked


def test_mmd_unbiased_is_unbiased_where_the_biased_estimate_is_not():
    "Same distribution: the U-statistic averages to 0 and is often negative; the V-statistic is always > 0."
    rng = np.random.default_rng(0)
    u, v = [], []
    for _ in range(400):
        x, y = rng.normal(size=(6, 3)), rng.normal(size=(10, 3))
        u.append(mmd_unbiased(x, y, bandwidth=6.0))  # one fixed kernel: the expectation is exactly 0
        v.append(mmd(torch.as_tensor(x), torch.as_tensor(y)).item())
    se = np.std(u) / math.sqrt(len(u))
    assert abs(np.mean(u)) < 3 * se and min(u) < 0 and sum(a < 0 for a in u) > 100
    assert min(v) > 0 and np.mean(v) > 10 * se  # the biased estimate's bias dwarfs the noise


def test_mmd_unbiased_estimates_the_same_value_at_every_sample_size():
    "Two different distributions: the mean estimate at (5, 5) and at (40, 25) agree; the biased one's do not."
    rng = np.random.default_rng(1)
    def means(m, n, draws):
        pairs = [(rng.normal(size=(m, 2)), rng.normal(size=(n, 2)) + 0.8) for _ in range(draws)]
        return (np.mean([mmd_unbiased(x, y, bandwidth=4.0) for x, y in pairs]),
                np.mean([mmd(torch.as_tensor(x), torch.as_tensor(y)).item() for x, y in pairs]))
    (small_u, small_v), (large_u, large_v) = means(5, 5, 600), means(40, 25, 150)
    assert large_u > 0 and abs(small_u - large_u) < 0.15 * large_u
    assert small_v > 1.5 * large_v  # the V-statistic shrinks as the samples grow


def test_mmd_unbiased_errors_name_the_problem():
    x = torch.randn(4, 3)
    with pytest.raises(ValueError, match=re.escape("x has 3 values per row, y 2")):
        mmd_unbiased(x, torch.randn(5, 2))
    with pytest.raises(ValueError, match=re.escape("y: the unbiased MMD needs at least 2 samples, got 1")):
        mmd_unbiased(x, torch.randn(1, 3))
    with pytest.raises(ValueError, match=re.escape("x: one sample per row expected (2 or more dims), got shape (4,)")):
        mmd_unbiased(torch.randn(4), x)
    with pytest.raises(ValueError, match=re.escape("bandwidth must be > 0, got 0.0")):
        mmd_unbiased(x, x + 1, bandwidth=0.0)


def test_biased_mmd_moved_to_the_core_with_its_numbers_and_gradients_unchanged():
    import adaptkit.repnoise as repnoise
    import adaptkit.repnoise.loss as loss
    assert repnoise.mmd is loss.mmd is mmd  # `from adaptkit.repnoise import mmd` still works: the same function
    g = torch.Generator().manual_seed(3)
    for shape, kw in [((4, 6), {}), ((7, 3, 5), {"kernels": 3, "multiplier": 1.5})]:
        x = torch.randn(*shape, generator=g, requires_grad=True)
        y = torch.randn(5, *shape[1:], generator=g)
        new, old = mmd(x, y, **kw), _old_mmd(x, y, **kw)
        assert torch.equal(new, old) and new.dtype == torch.float32
        assert torch.equal(torch.autograd.grad(new, x)[0], torch.autograd.grad(old, x)[0])
