"""Tests for rl8.policies.distributions: agreement with torch.distributions, sampling, masks, errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.distributions as td
from gymnasium import spaces

from rl8.policies.distributions import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    Bernoulli,
    Categorical,
    Distribution,
    MultiCategorical,
    Normal,
    SquashedNormal,
    default_distribution_cls,
)

B = 64
_NEG = torch.finfo(torch.float32).min

# (distribution class, action space) pairs exercised by the generic tests.
CASES = [
    (Categorical, spaces.Discrete(5)),
    (MultiCategorical, spaces.MultiDiscrete([3, 3, 3])),
    (MultiCategorical, spaces.MultiDiscrete([2, 5, 3])),
    (MultiCategorical, spaces.MultiDiscrete([[2, 3], [4, 2]])),
    (Normal, spaces.Box(-2.0, 3.0, (3,))),
    (Normal, spaces.Box(-np.inf, np.inf, (2, 2))),
    (SquashedNormal, spaces.Box(-1.0, 1.0, (2,))),
    (SquashedNormal, spaces.Box(np.float32([0.0, -5.0]), np.float32([1.0, 5.0]))),
    (Bernoulli, spaces.MultiBinary(4)),
    (Bernoulli, spaces.MultiBinary([2, 3])),
]
IDS = [f"{c.__name__}-{s}" for c, s in CASES]


def make(cls, space, batch=B, *, scale=1.0, requires_grad=False, dtype=torch.float32, **kw):
    params = (scale * torch.randn(batch, cls.param_size(space))).to(dtype)
    params.requires_grad_(requires_grad)
    return params, cls(params, space, **kw)


def box_tensors(space):
    low = torch.as_tensor(space.low, dtype=torch.float32)
    high = torch.as_tensor(space.high, dtype=torch.float32)
    return low, high, (high + low) / 2, (high - low) / 2


def reference(cls, space, params, mask=None):
    """The same distribution built from torch.distributions, over RAW actions (or env actions
    for SquashedNormal), with log_prob summed over components."""
    params = params.float()
    if cls is Categorical:
        logits = params if mask is None else params.masked_fill(~mask, -math.inf)
        return td.Categorical(logits=logits)
    if cls is MultiCategorical:
        nvec = space.nvec.reshape(-1)
        logits = params if mask is None else params.masked_fill(~mask, -math.inf)
        return [td.Categorical(logits=chunk) for chunk in logits.split(list(nvec), dim=-1)]
    if cls is Bernoulli:
        return td.Independent(td.Bernoulli(logits=params), 1)
    d = params.shape[-1] // 2
    mean, std = params[:, :d], params[:, d:].clamp(LOG_STD_MIN, LOG_STD_MAX).exp()
    base = td.Normal(mean, std)
    if cls is Normal:
        return td.Independent(base, 1)
    _, _, center, half = box_tensors(space)
    transforms = [
        td.TanhTransform(cache_size=1),
        td.AffineTransform(center.reshape(-1), half.reshape(-1), cache_size=1),
    ]
    return td.Independent(td.TransformedDistribution(base, transforms), 1)


def squash(ref, u):
    """Env action of pre-tanh ``u`` through the reference's own (caching) transforms, so its
    log_prob inverts exactly instead of taking atanh of a saturated value."""
    for t in ref.base_dist.transforms:
        u = t(u)
    return u


def reference_log_prob(cls, space, ref, actions):
    if cls is Categorical:
        return ref.log_prob(actions)
    if cls is MultiCategorical:
        flat = actions.reshape(actions.shape[0], -1)
        return sum(r.log_prob(flat[:, k]) for k, r in enumerate(ref))
    flat = actions.reshape(actions.shape[0], -1)
    if cls is Bernoulli:
        return ref.log_prob(flat.float())
    if cls is SquashedNormal:
        env = squash(ref, flat)
        torch.testing.assert_close(env, cls.to_env_action(actions, space).reshape(env.shape))
        return ref.log_prob(env)
    return ref.log_prob(flat)


# -- agreement with torch.distributions ---------------------------------------------------------


@pytest.mark.parametrize(("cls", "space"), CASES, ids=IDS)
def test_log_prob_matches_torch_distributions(cls, space):
    torch.manual_seed(0)
    params, dist = make(cls, space)
    actions = dist.sample()
    ref = reference(cls, space, params)
    expected = reference_log_prob(cls, space, ref, actions)
    got = dist.log_prob(actions)
    assert got.shape == (B,) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("cls", "space"), [c for c in CASES if c[0] is not SquashedNormal])
def test_entropy_matches_torch_distributions(cls, space):
    torch.manual_seed(1)
    params, dist = make(cls, space)
    ref = reference(cls, space, params)
    expected = sum(r.entropy() for r in ref) if cls is MultiCategorical else ref.entropy()
    got = dist.entropy()
    assert got.shape == (B,) and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_masked_categorical_matches_torch_with_minus_inf_logits():
    torch.manual_seed(2)
    space = spaces.Discrete(6)
    params = torch.randn(B, 6)
    mask = torch.rand(B, 6) > 0.5
    mask[torch.arange(B), torch.randint(0, 6, (B,))] = True
    dist = Categorical(params, space, action_mask=mask)
    ref = reference(Categorical, space, params, mask)
    actions = dist.sample()
    torch.testing.assert_close(dist.log_prob(actions), ref.log_prob(actions))
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    torch.testing.assert_close(dist.probs, ref.probs)
    assert (dist.probs[~mask] == 0).all()


def test_masked_multicategorical_matches_sum_of_categoricals():
    torch.manual_seed(3)
    space = spaces.MultiDiscrete([2, 4, 3])
    params = torch.randn(B, 9)
    mask = torch.rand(B, 9) > 0.4
    for start, n in ((0, 2), (2, 4), (6, 3)):  # at least one allowed choice per component
        mask[torch.arange(B), start + torch.randint(0, n, (B,))] = True
    dist = MultiCategorical(params, space, action_mask=mask)
    ref = reference(MultiCategorical, space, params, mask)
    actions = dist.sample()
    expected = reference_log_prob(MultiCategorical, space, ref, actions)
    torch.testing.assert_close(dist.log_prob(actions), expected)
    torch.testing.assert_close(dist.entropy(), sum(r.entropy() for r in ref))


def test_squashed_normal_entropy_is_a_one_sample_estimate():
    torch.manual_seed(4)
    space = spaces.Box(-2.0, 1.0, (3,))
    params, dist = make(SquashedNormal, space, requires_grad=True)
    torch.manual_seed(10)
    estimate = dist.entropy()
    torch.manual_seed(10)
    u = dist.sample()
    torch.testing.assert_close(estimate, -dist.log_prob(u))
    estimate.sum().backward()  # reparameterised: gradients reach mean and log_std
    assert params.grad is not None and params.grad[:, :3].abs().sum() > 0

    # Averaged over many samples it estimates the true entropy of the squashed distribution.
    one = torch.tensor([[0.3, -0.5, 1.0, -0.2, 0.1, -1.0]])
    big = SquashedNormal(one.expand(200_000, 6), space)
    ref = reference(SquashedNormal, space, one)
    u = ref.base_dist.base_dist.sample((200_000,)).squeeze(1)
    true_entropy = -ref.log_prob(squash(ref, u)).mean()
    assert abs(big.entropy().mean().item() - true_entropy.item()) < 0.02


def test_squashed_normal_log_prob_is_finite_far_in_the_tails():
    space = spaces.Box(-1.0, 1.0, (2,))
    dist = SquashedNormal(torch.zeros(3, 4), space)
    u = torch.tensor([[30.0, -30.0], [100.0, 0.0], [-80.0, 5.0]])
    lp = dist.log_prob(u)
    assert torch.isfinite(lp).all()
    # log(1 - tanh(u)^2) = 2 * (log 2 - |u| - log1p(exp(-2|u|))), exact, in float64
    u64 = u.double()
    log_det = 2 * (math.log(2) - u64.abs() - torch.log1p(torch.exp(-2 * u64.abs())))
    expected = td.Normal(0.0, 1.0).log_prob(u64).sum(-1) - log_det.sum(-1)
    torch.testing.assert_close(lp, expected.float())


# -- sampling -------------------------------------------------------------------------------


@pytest.mark.parametrize(("cls", "space"), CASES, ids=IDS)
def test_sample_shapes_dtypes_and_env_actions(cls, space):
    torch.manual_seed(5)
    _, dist = make(cls, space, scale=3.0)
    shape = (B, *cls.raw_action_shape(space))
    for actions in (dist.sample(), dist.deterministic_sample()):
        assert actions.shape == shape
        assert actions.dtype == cls.raw_action_dtype(space)
        env = cls.to_env_action(actions, space)
        assert env.shape == shape
        assert space.contains(env[0].numpy().astype(space.dtype))
        if isinstance(space, spaces.Box):
            assert env.dtype == torch.float32
            low, high, _, _ = box_tensors(space)
            assert (env >= low).all() and (env <= high).all()
        else:
            assert env.dtype == torch.int64
            if isinstance(space, spaces.Discrete):
                assert ((env >= 0) & (env < space.n)).all()
            elif isinstance(space, spaces.MultiDiscrete):
                assert ((env >= 0) & (env < torch.as_tensor(space.nvec))).all()
            else:
                assert ((env == 0) | (env == 1)).all()


def test_normal_to_env_action_maps_unit_range_onto_bounds_and_clips():
    low, high = np.float32([-2.0, 0.0, -np.inf, 1.0]), np.float32([2.0, 10.0, np.inf, np.inf])
    space = spaces.Box(low, high)
    raw = torch.tensor(
        [[-1.0, -1.0, -7.0, -3.0], [1.0, 1.0, 7.0, 3.0], [0.5, 0.0, 0.0, 5.0], [9.0, -9.0, 1e6, 0.5]]
    )
    env = Normal.to_env_action(raw, space)
    expected = torch.tensor(
        [[-2.0, 0.0, -7.0, 1.0], [2.0, 10.0, 7.0, 3.0], [1.0, 5.0, 0.0, 5.0], [2.0, 0.0, 1e6, 1.0]]
    )
    torch.testing.assert_close(env, expected)
    unbounded = spaces.Box(-np.inf, np.inf, (2,))
    torch.testing.assert_close(Normal.to_env_action(raw[:, :2], unbounded), raw[:, :2])


def test_squashed_normal_to_env_action():
    space = spaces.Box(np.float32([0.0, -4.0]), np.float32([2.0, 4.0]))
    u = torch.tensor([[0.0, 0.0], [50.0, -50.0], [0.5, 1.0]])
    env = SquashedNormal.to_env_action(u, space)
    expected = torch.tensor([[1.0, 0.0], [2.0, -4.0], [1 + math.tanh(0.5), 4 * math.tanh(1.0)]])
    torch.testing.assert_close(env, expected)


def test_discrete_start_is_added_for_the_env():
    space = spaces.Discrete(3, start=-1)
    actions = torch.tensor([0, 1, 2])
    torch.testing.assert_close(Categorical.to_env_action(actions, space), torch.tensor([-1, 0, 1]))
    md = spaces.MultiDiscrete([2, 3], start=[1, 0])
    actions = torch.tensor([[0, 2], [1, 0]])
    torch.testing.assert_close(
        MultiCategorical.to_env_action(actions, md), torch.tensor([[1, 2], [2, 0]])
    )
    plain = spaces.Discrete(3)
    assert Categorical.to_env_action(actions, plain) is actions


def chi_square(counts, probs):
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_categorical_sample_frequencies_match_probs():
    torch.manual_seed(6)
    n, samples = 4, 40_000
    logits = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4]))
    dist = Categorical(logits.expand(samples, n), spaces.Discrete(n))
    counts = torch.bincount(dist.sample(), minlength=n).double()
    assert chi_square(counts, torch.tensor([0.1, 0.2, 0.3, 0.4]).double()) < 16.3  # df=3, p=.001


def test_masked_sample_frequencies_are_renormalised():
    torch.manual_seed(7)
    samples = 40_000
    logits = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.4])).expand(samples, 4)
    mask = torch.tensor([True, False, True, False]).expand(samples, 4)
    dist = Categorical(logits, spaces.Discrete(4), action_mask=mask)
    counts = torch.bincount(dist.sample(), minlength=4).double()
    assert counts[1] == 0 and counts[3] == 0
    assert chi_square(counts[[0, 2]], torch.tensor([0.25, 0.75]).double()) < 10.9  # df=1


def test_multicategorical_sample_frequencies_match_probs():
    torch.manual_seed(8)
    samples = 40_000
    space = spaces.MultiDiscrete([2, 3])
    probs = [torch.tensor([0.7, 0.3]), torch.tensor([0.2, 0.5, 0.3])]
    params = torch.cat([p.log() for p in probs]).expand(samples, 5)
    actions = MultiCategorical(params, space).sample()
    for k, p in enumerate(probs):
        counts = torch.bincount(actions[:, k], minlength=len(p)).double()
        assert chi_square(counts, p.double()) < 13.9  # df <= 2, p=.001


def test_bernoulli_sample_frequencies_match_probs():
    torch.manual_seed(9)
    samples = 40_000
    p = torch.tensor([0.1, 0.5, 0.8])
    actions = Bernoulli(torch.logit(p).expand(samples, 3), spaces.MultiBinary(3)).sample()
    freq = actions.double().mean(0)
    std = (p.double() * (1 - p.double()) / samples).sqrt()
    assert ((freq - p.double()).abs() < 4 * std).all()


def test_normal_sample_moments():
    torch.manual_seed(10)
    samples = 40_000
    params = torch.tensor([1.0, -2.0, math.log(0.5), math.log(2.0)]).expand(samples, 4)
    x = Normal(params, spaces.Box(-np.inf, np.inf, (2,))).sample()
    torch.testing.assert_close(x.mean(0), torch.tensor([1.0, -2.0]), atol=0.05, rtol=0)
    torch.testing.assert_close(x.std(0), torch.tensor([0.5, 2.0]), atol=0.05, rtol=0)


def test_log_std_is_clamped():
    space = spaces.Box(-1.0, 1.0, (1,))
    dist = Normal(torch.tensor([[0.0, -100.0], [0.0, 100.0]]), space)
    torch.testing.assert_close(dist.log_std, torch.tensor([[LOG_STD_MIN], [LOG_STD_MAX]]))
    assert torch.isfinite(dist.entropy()).all()
    assert torch.isfinite(dist.log_prob(torch.zeros(2, 1))).all()


def test_masked_actions_are_never_sampled_nor_chosen():
    torch.manual_seed(11)
    n, batch = 5, 4096
    # Masked actions get the LARGEST logits, so a leak would show up quickly.
    params = torch.randn(batch, n)
    mask = torch.rand(batch, n) > 0.6
    mask[torch.arange(batch), torch.randint(0, n, (batch,))] = True
    params = torch.where(mask, params, params + 20.0)
    dist = Categorical(params, spaces.Discrete(n), action_mask=mask)
    for _ in range(20):
        a = dist.sample()
        assert mask.gather(1, a.unsqueeze(1)).all()
    det = dist.deterministic_sample()
    assert mask.gather(1, det.unsqueeze(1)).all()
    # Only the last action allowed: always that one.
    only = torch.zeros(batch, n, dtype=torch.bool)
    only[:, n - 1] = True
    assert (Categorical(params, spaces.Discrete(n), action_mask=only).sample() == n - 1).all()

    space = spaces.MultiDiscrete([3, 4])
    params = torch.randn(batch, 7) + 20.0 * torch.tensor([1, 0, 0, 0, 1, 1, 0.0])
    mask = torch.tensor([False, True, True, True, False, False, True]).expand(batch, 7)
    dist = MultiCategorical(params, space, action_mask=mask)
    for _ in range(20):
        a = dist.sample()
        assert (a[:, 0] != 0).all() and (a[:, 1] == 0).logical_or(a[:, 1] == 3).all()
        assert ((a[:, 1] != 1) & (a[:, 1] != 2)).all()
    det = dist.deterministic_sample()
    assert (det[:, 0] != 0).all() and ((det[:, 1] == 0) | (det[:, 1] == 3)).all()


@pytest.mark.parametrize("u", [0.0, 1.0 - 2.0**-24])
def test_inverse_cdf_never_picks_a_zero_probability_choice_at_the_edges(monkeypatch, u):
    """rand() returns [0, 1): at both ends the first and last (masked) choices stay unpicked,
    even without the fallback used for masked rows."""
    from rl8.policies.distributions import discrete as distributions

    logits = torch.tensor([[_NEG, 0.0, 1.0, _NEG], [_NEG, _NEG, 2.0, _NEG]])
    log_probs = torch.log_softmax(logits, -1)
    assert (log_probs.exp()[:, [0, 3]] == 0).all()
    monkeypatch.setattr(distributions.torch, "rand", lambda shape, **kw: torch.full(shape, u))
    actions = distributions._categorical_sample(log_probs, None, logits)  # on the CPU: no fallback
    expected = [2, 2] if u == 0.0 else [1, 2]  # u is mapped to the CDF level (1 - u) * total
    assert actions.tolist() == expected


@pytest.mark.parametrize("batch", [8, 1024])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize(
    ("cls", "space", "masked"),
    [(c, s, m) for c, s in CASES for m in (False, True) if c.supports_action_mask or not m],
    ids=lambda x: str(x),
)
def test_sample_with_log_prob_writes_into_out(cls, space, batch, masked, deterministic):
    """``out=``: the same actions and log-probs as without it, written into the given
    tensors (contiguous rows, as PPO's buffer gives, or strided ones), which are returned."""
    torch.manual_seed(14)
    params = torch.randn(batch, cls.param_size(space))
    kw = {"action_mask": torch.rand(params.shape) < 0.8} if masked else {}
    if masked and cls is Categorical:
        kw["action_mask"][:, 0] = True
    if masked and cls is MultiCategorical:
        kw["action_mask"][:, np.concatenate([[0], np.cumsum(space.nvec)[:-1]])] = True
    dist = cls(params, space, **kw)
    expected = dist.sample_with_log_prob(torch.Generator().manual_seed(3), deterministic=deterministic)
    raw = (batch, *cls.raw_action_shape(space))
    dtype = cls.raw_action_dtype(space)
    for strided in (False, True):
        if strided:  # every other row of bigger tensors
            actions = torch.full((2 * batch, *raw[1:]), -7, dtype=dtype)[::2]
            logp = torch.full((2 * batch,), -7.0)[::2]
        else:
            actions, logp = torch.full(raw, -7, dtype=dtype), torch.full((batch,), -7.0)
        got = dist.sample_with_log_prob(
            torch.Generator().manual_seed(3), deterministic=deterministic, out=(actions, logp)
        )
        assert got[0] is actions and got[1] is logp
        assert torch.equal(actions, expected[0])
        torch.testing.assert_close(logp, expected[1])


def test_fully_masked_row_gives_no_nan():
    params = torch.randn(3, 4, requires_grad=True)
    mask = torch.tensor([[False] * 4, [True, False, False, False], [True] * 4])
    dist = Categorical(params, spaces.Discrete(4), action_mask=mask)
    a = dist.sample()
    lp, ent = dist.log_prob(a), dist.entropy()
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    assert ent[1] == 0 and lp[1] == 0  # one allowed action: certain
    (lp.sum() + ent.sum()).backward()
    assert torch.isfinite(params.grad).all()
    assert (params.grad[1, 1:] == 0).all()  # masked logits get no gradient


@pytest.mark.parametrize(("cls", "space"), CASES, ids=IDS)
def test_deterministic_sample_is_the_mode(cls, space):
    torch.manual_seed(12)
    params, dist = make(cls, space)
    det = dist.deterministic_sample()
    if cls in (Normal, SquashedNormal):
        d = params.shape[-1] // 2
        torch.testing.assert_close(det.reshape(B, -1), params[:, :d])
        return
    # The mode has the highest log_prob among many samples.
    best = dist.log_prob(det)
    for _ in range(10):
        assert (dist.log_prob(dist.sample()) <= best + 1e-6).all()
    if cls is Categorical:
        assert (det == params.argmax(-1)).all()
    if cls is Bernoulli:
        assert (det.reshape(B, -1) == (params > 0).long()).all()


def test_sampling_is_reproducible_with_manual_seed_and_generator():
    space = spaces.Discrete(4)
    params = torch.randn(B, 4)
    torch.manual_seed(13)
    first = Categorical(params, space).sample()
    torch.manual_seed(13)
    assert torch.equal(Categorical(params, space).sample(), first)
    for cls, sp in CASES:
        _, dist = make(cls, sp)
        a = dist.sample(generator=torch.Generator().manual_seed(3))
        b = dist.sample(generator=torch.Generator().manual_seed(3))
        assert torch.equal(a, b)


# -- gradients, dtypes, batch shapes ----------------------------------------------------------


@pytest.mark.parametrize(("cls", "space"), CASES, ids=IDS)
def test_gradients_flow_to_params(cls, space):
    torch.manual_seed(14)
    params, dist = make(cls, space, requires_grad=True)
    with torch.inference_mode():
        actions = dist.sample()  # as in a rollout
    actions = actions.clone()
    loss = dist.log_prob(actions).sum() + dist.entropy().sum()
    loss.backward()
    assert params.grad is not None and torch.isfinite(params.grad).all()
    assert params.grad.abs().sum() > 0


@pytest.mark.parametrize(("cls", "space"), CASES, ids=IDS)
def test_bfloat16_params(cls, space):
    torch.manual_seed(15)
    params, dist = make(cls, space, requires_grad=True, dtype=torch.bfloat16)
    actions = dist.sample()
    assert actions.dtype == cls.raw_action_dtype(space)
    lp, ent = dist.log_prob(actions), dist.entropy()
    assert lp.dtype == torch.float32 and ent.dtype == torch.float32
    assert torch.isfinite(lp).all() and torch.isfinite(ent).all()
    ref = cls(params.detach().float(), space)
    torch.testing.assert_close(lp, ref.log_prob(actions), rtol=1e-5, atol=1e-5)
    (lp.sum() + ent.sum()).backward()
    assert params.grad.dtype == torch.bfloat16


@pytest.mark.parametrize(("cls", "space"), CASES, ids=IDS)
def test_extra_leading_batch_dims(cls, space):
    torch.manual_seed(16)
    params = torch.randn(4, 5, cls.param_size(space))
    dist = cls(params, space)
    actions = dist.sample()
    assert actions.shape == (4, 5, *cls.raw_action_shape(space))
    assert dist.log_prob(actions).shape == (4, 5)
    assert dist.entropy().shape == (4, 5)
    flat = cls(params.reshape(20, -1), space)
    torch.testing.assert_close(
        dist.log_prob(actions).reshape(20),
        flat.log_prob(actions.reshape(20, *cls.raw_action_shape(space))),
    )


# -- errors and defaults ----------------------------------------------------------------------


@pytest.mark.parametrize(("cls", "space"), CASES, ids=IDS)
def test_wrong_param_width_names_expected_and_given(cls, space):
    expected = cls.param_size(space)
    with pytest.raises(ValueError, match=rf"{expected} entries.*got {expected + 1}"):
        cls(torch.zeros(2, expected + 1), space)


@pytest.mark.parametrize(
    ("cls", "space"),
    [
        (Categorical, spaces.MultiDiscrete([2, 2])),
        (MultiCategorical, spaces.Discrete(3)),
        (Normal, spaces.Discrete(3)),
        (Normal, spaces.Box(0, 255, (3,), dtype=np.uint8)),
        (SquashedNormal, spaces.Box(-np.inf, np.inf, (2,))),
        (SquashedNormal, spaces.Box(np.float32([-1.0, 0.0]), np.float32([1.0, np.inf]))),
        (Bernoulli, spaces.Box(0.0, 1.0, (2,))),
    ],
)
def test_unsupported_space_raises(cls, space):
    assert not cls.supports(space)
    with pytest.raises(ValueError, match=f"{cls.__name__} does not support"):
        cls(torch.zeros(2, 4), space)


def test_action_mask_errors():
    mask = torch.ones(2, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="does not accept an action_mask"):
        Normal(torch.zeros(2, 4), spaces.Box(-1.0, 1.0, (2,)), action_mask=mask)
    mask = torch.ones(2, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"shape \[2, 3\]"):
        Categorical(torch.zeros(2, 3), spaces.Discrete(3), action_mask=mask)
    with pytest.raises(ValueError, match="bool"):
        Categorical(torch.zeros(2, 3), spaces.Discrete(3), action_mask=torch.ones(2, 3))


@pytest.mark.parametrize(
    ("space", "expected"),
    [
        (spaces.Discrete(3), Categorical),
        (spaces.MultiDiscrete([2, 3]), MultiCategorical),
        (spaces.Box(-1.0, 1.0, (2,)), Normal),
        (spaces.Box(-np.inf, np.inf, (2,), dtype=np.float64), Normal),
        (spaces.MultiBinary(3), Bernoulli),
    ],
)
def test_default_distribution_cls(space, expected):
    assert default_distribution_cls(space) is expected
    assert issubclass(expected, Distribution)


@pytest.mark.parametrize(
    "space",
    [
        spaces.Dict({"a": spaces.Discrete(2)}),
        spaces.Tuple((spaces.Discrete(2),)),
        spaces.Box(0, 255, (3,), dtype=np.uint8),
    ],
)
def test_default_distribution_cls_rejects_other_spaces(space):
    with pytest.raises(TypeError, match=rf"{type(space).__name__}.*Discrete -> Categorical"):
        default_distribution_cls(space)


def test_custom_distribution_subclass():
    """The documented way to write a distribution: implement the abstract methods."""

    class Deterministic(Distribution):
        @classmethod
        def supports(cls, action_space):
            return isinstance(action_space, spaces.Box)

        @classmethod
        def param_size(cls, action_space):
            return int(np.prod(action_space.shape))

        @classmethod
        def raw_action_shape(cls, action_space):
            return tuple(action_space.shape)

        @classmethod
        def raw_action_dtype(cls, action_space):
            return torch.float32

        def sample(self, generator=None):
            return self.params.float()

        def deterministic_sample(self):
            return self.params.float()

        def log_prob(self, actions):
            return torch.zeros(self.batch_shape)

        def entropy(self):
            return torch.zeros(self.batch_shape)

    space = spaces.Box(-1.0, 1.0, (2,))
    dist = Deterministic(torch.ones(3, 2), space)
    assert torch.equal(Deterministic.to_env_action(dist.sample(), space), torch.ones(3, 2))
    with pytest.raises(ValueError, match="2 entries"):
        Deterministic(torch.ones(3, 5), space)
