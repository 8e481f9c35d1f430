"""GymnasiumEnv: the adapter from gymnasium vector envs to the rl8 step contract."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import sys

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDictBase

from rl8.envs import CartPole, GymnasiumEnv
from rl8.envs.base import validate_step_output

MODES = ["sync", "async"]


# --- tiny gymnasium envs ----------------------------------------------------------------------


class EchoEnv(gymnasium.Env):
    """Observation and action spaces are ``space``; each step observes the action it got.

    Ends an episode (terminated) after ``length`` steps; the reward is the step count.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 7}

    def __init__(self, space: spaces.Space, length: int = 3, render_mode: str | None = None):
        self.observation_space = space
        self.action_space = space
        self.length = length
        self.render_mode = render_mode
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        assert self.action_space.contains(action), (action, self.action_space)
        self.t += 1
        return action, float(self.t), self.t >= self.length, False, {}

    def render(self):
        frame = np.zeros((6, 8, 3), dtype=np.uint8)
        frame[..., 0] = self.t
        return frame


class MaskedEnv(gymnasium.Env):
    """A Dict observation with a float64 Box, a nested Dict and an action mask."""

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "pos": spaces.Box(-1.0, 1.0, (2,), np.float64),
                "inner": spaces.Dict({"count": spaces.Discrete(10)}),
                "action_mask": spaces.MultiBinary(3),
            }
        )
        self.action_space = spaces.Discrete(3)
        self.t = 0

    def _obs(self):
        mask = np.array([1, 0, 1], dtype=np.int8) if self.t % 2 else np.ones(3, np.int8)
        return {
            "pos": np.full(2, 0.25 * self.t, dtype=np.float64),
            "inner": {"count": np.int64(self.t)},
            "action_mask": mask,
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, False, self.t >= 2, {}


class CrashEnv(gymnasium.Env):
    """Raises inside ``step`` on the second step."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        if self.t == 2:
            raise ValueError("CrashEnv exploded on purpose")
        return np.zeros(2, np.float32), 0.0, False, False, {}


class TextEnv(gymnasium.Env):
    observation_space = spaces.Text(8)
    action_space = spaces.Discrete(2)


# --- helpers ----------------------------------------------------------------------------------


@pytest.fixture
def make():
    """Build GymnasiumEnvs and close them all after the test."""
    envs = []

    def build(*args, **kwargs):
        env = GymnasiumEnv(*args, **kwargs)
        envs.append(env)
        return env

    yield build
    for env in envs:
        env.close()


def random_actions(env: GymnasiumEnv, generator: torch.Generator) -> torch.Tensor:
    n = int(env.action_space.n)
    return torch.randint(0, n, (env.num_envs,), generator=generator)


# --- tests ------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_cartpole_step_output_is_valid(make, mode):
    env = make(3, 16, env="CartPole-v1", vectorization_mode=mode)
    assert env.episodic
    assert env.observation_space == gymnasium.spaces.Box(
        env.observation_space.low, env.observation_space.high, (4,), np.float32
    )
    assert env.action_space == spaces.Discrete(2)
    assert env.metadata["render_fps"] == 50
    obs = env.reset(seed=0)
    assert obs.shape == (3, 4) and obs.dtype == torch.float32
    gen = torch.Generator().manual_seed(0)
    for _ in range(30):  # long enough for some CartPole episodes to terminate
        out = env.step(random_actions(env, gen))
        validate_step_output(out, env)
        assert out["rewards"].dtype == torch.float32
        done = (out["terminated"] | out["truncated"]).squeeze(-1)
        # final_obs equals obs for the envs that did not finish, and is its own tensor.
        torch.testing.assert_close(out["final_obs"][~done], out["obs"][~done])
        assert out["final_obs"].data_ptr() != out["obs"].data_ptr()


@pytest.mark.parametrize("mode", MODES)
def test_outputs_are_not_overwritten_by_the_next_step(make, mode):
    env = make(2, env="CartPole-v1", vectorization_mode=mode)
    first = env.reset(seed=1)
    saved = first.clone()
    out = env.step(torch.ones(2, dtype=torch.int64))
    saved_out = out.clone()
    env.step(torch.zeros(2, dtype=torch.int64))
    torch.testing.assert_close(first, saved)
    assert (out == saved_out).all()


@pytest.mark.parametrize("mode", MODES)
def test_truncation_final_obs_matches_a_plain_gymnasium_env(make, mode):
    n, seed, limit = 2, 11, 5
    env = make(n, env="CartPole-v1", vectorization_mode=mode, env_kwargs={"max_episode_steps": limit})
    env.reset(seed=seed)
    refs = [gymnasium.make("CartPole-v1", max_episode_steps=limit) for _ in range(n)]
    ref_obs = [ref.reset(seed=seed + i)[0] for i, ref in enumerate(refs)]
    actions = [1, 0, 1, 0, 1]  # keeps the pole up for 5 steps: truncated, not terminated
    for t, a in enumerate(actions):
        out = env.step(torch.full((n,), a, dtype=torch.int64))
        for i, ref in enumerate(refs):
            ref_obs[i], _, term, trunc, _ = ref.step(a)
            assert not term
            assert trunc == (t == limit - 1)
        last = t == limit - 1
        assert out["truncated"].squeeze(-1).tolist() == [last] * n
        assert not out["terminated"].any()
        expected_final = torch.from_numpy(np.stack(ref_obs))
        torch.testing.assert_close(out["final_obs"], expected_final)
        if last:
            # obs is the first observation of the next episode; final_obs the last of this one.
            assert (out["final_obs"] != out["obs"]).any(-1).all()
            expected_reset = torch.from_numpy(np.stack([ref.reset()[0] for ref in refs]))
            torch.testing.assert_close(out["obs"], expected_reset)
        else:
            torch.testing.assert_close(out["obs"], out["final_obs"])


@pytest.mark.parametrize("mode", MODES)
def test_seeding_distinct_per_env_and_reproducible(make, mode):
    env = make(4, env="CartPole-v1", vectorization_mode=mode)
    a = env.reset(seed=123)
    assert len({tuple(row.tolist()) for row in a}) == 4  # distinct per env
    b = env.reset(seed=123)
    torch.testing.assert_close(a, b)
    # Sub-env i gets seed + i, like a plain gymnasium env reset with that seed.
    ref = gymnasium.make("CartPole-v1")
    torch.testing.assert_close(a[2], torch.from_numpy(ref.reset(seed=125)[0]))
    # seed=None continues the stream.
    c = env.reset()
    assert not torch.equal(a, c)


def test_first_reset_without_seed_follows_torch_manual_seed(make):
    torch.manual_seed(7)
    a = make(3, env="CartPole-v1").reset()
    torch.manual_seed(7)
    b = make(3, env="CartPole-v1").reset()
    torch.testing.assert_close(a, b)
    torch.manual_seed(8)
    c = make(3, env="CartPole-v1").reset()
    assert not torch.equal(a, c)


def test_reset_config_is_rejected(make):
    env = make(2, env="CartPole-v1")
    env.reset(config={})
    env.reset(config=None)
    with pytest.raises(KeyError, match="env_kwargs"):
        env.reset(config={"gravity": 1.0})


def test_step_before_reset_and_after_close(make):
    env = make(2, env="CartPole-v1")
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(torch.zeros(2, dtype=torch.int64))
    env.reset(seed=0)
    env.close()
    env.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        env.step(torch.zeros(2, dtype=torch.int64))


def test_box_spaces_pendulum(make):
    env = make(2, env="Pendulum-v1", env_kwargs={"g": 9.81})
    assert isinstance(env.action_space, spaces.Box) and env.action_space.shape == (1,)
    obs = env.reset(seed=0)
    assert obs.shape == (2, 3) and obs.dtype == torch.float32
    out = env.step(torch.tensor([[1.5], [-2.0]]))
    validate_step_output(out, env)


@pytest.mark.parametrize(
    ("space", "action", "expected_obs_dtype"),
    [
        (spaces.Discrete(5), torch.tensor([4, 0]), torch.int64),
        (spaces.MultiDiscrete([3, 4]), torch.tensor([[2, 3], [0, 1]]), torch.int64),
        (spaces.MultiBinary(3), torch.tensor([[1, 0, 1], [0, 0, 1]]), torch.int64),
        (
            spaces.Box(-2.0, 2.0, (2,), np.float64),
            torch.tensor([[0.5, -1.0], [1.5, 2.0]]),
            torch.float32,
        ),
    ],
    ids=["Discrete", "MultiDiscrete", "MultiBinary", "Box64"],
)
@pytest.mark.parametrize("mode", MODES)
def test_action_and_observation_round_trip(make, mode, space, action, expected_obs_dtype):
    env = make(2, env=EchoEnv, vectorization_mode=mode, env_kwargs={"space": space})
    obs = env.reset(seed=0)
    assert obs.dtype == expected_obs_dtype
    out = env.step(action)
    validate_step_output(out, env)
    assert out["obs"].dtype == expected_obs_dtype
    torch.testing.assert_close(out["obs"], action.to(expected_obs_dtype))
    torch.testing.assert_close(out["rewards"], torch.ones(2, 1))


def test_float64_box_is_exposed_as_float32(make):
    env = make(2, env=EchoEnv, env_kwargs={"space": spaces.Box(-2.0, 2.0, (2,), np.float64)})
    assert env.observation_space.dtype == np.float32
    assert env.action_space.dtype == np.float64  # actions keep the space gymnasium wants


def test_discrete_start_actions_pass_through(make):
    # The distribution's to_env_action already adds `start`: the env gets the values as given.
    env = make(2, env=EchoEnv, env_kwargs={"space": spaces.Discrete(3, start=5)})
    env.reset(seed=0)
    out = env.step(torch.tensor([5, 7]))
    assert out["obs"].tolist() == [5, 7]


@pytest.mark.parametrize("mode", MODES)
def test_dict_observation_with_action_mask(make, mode):
    env = make(2, env=MaskedEnv, vectorization_mode=mode)
    assert env.observation_space["action_mask"].dtype == np.bool_
    assert env.observation_space["pos"].dtype == np.float32
    obs = env.reset(seed=0)
    assert isinstance(obs, TensorDictBase) and obs.batch_size == (2,)
    assert obs["action_mask"].dtype == torch.bool and obs["action_mask"].all()
    assert obs["pos"].dtype == torch.float32
    assert obs["inner", "count"].dtype == torch.int64
    out = env.step(torch.tensor([0, 2]))
    validate_step_output(out, env)
    assert out["obs", "action_mask"].tolist() == [[True, False, True]] * 2
    out = env.step(torch.tensor([0, 2]))  # truncated: auto-reset
    validate_step_output(out, env)
    assert out["truncated"].all()
    assert out["final_obs", "inner", "count"].tolist() == [2, 2]
    assert out["obs", "inner", "count"].tolist() == [0, 0]
    torch.testing.assert_close(out["final_obs", "pos"], torch.full((2, 2), 0.5))
    assert out["final_obs", "action_mask"].dtype == torch.bool


def test_action_mask_must_match_the_discrete_action_space():
    class BadMask(MaskedEnv):
        def __init__(self):
            super().__init__()
            self.action_space = spaces.Discrete(4)

    with pytest.raises(ValueError, match="action_mask"):
        GymnasiumEnv(1, env=BadMask)


@pytest.mark.parametrize("mode", MODES)
def test_unsupported_space_is_a_type_error(mode):
    with pytest.raises(TypeError, match="Text"):
        GymnasiumEnv(1, env=TextEnv, vectorization_mode=mode)


def test_unknown_id_lists_close_matches():
    with pytest.raises(gymnasium.error.Error, match="CartPole-v1"):
        GymnasiumEnv(1, env="CartPole-v")


def test_bad_arguments():
    with pytest.raises(ValueError, match="vectorization_mode"):
        GymnasiumEnv(1, env="CartPole-v1", vectorization_mode="threads")
    with pytest.raises(ValueError, match="num_envs"):
        GymnasiumEnv(0, env="CartPole-v1")
    with pytest.raises(TypeError, match="env must be"):
        GymnasiumEnv(1, env=3)


@pytest.mark.filterwarnings("ignore::UserWarning")  # gymnasium logs the worker error as a warning
def test_async_worker_error_surfaces_and_leaves_no_processes():
    env = GymnasiumEnv(2, env=CrashEnv, vectorization_mode="async")
    processes = list(env.vector_env.processes)
    assert all(p.is_alive() for p in processes)
    env.reset(seed=0)
    env.step(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="CrashEnv exploded on purpose") as info:
        env.step(torch.zeros(2, dtype=torch.int64))
    # The worker's traceback is chained, the note says where it came from.
    assert "in step" in str(info.value.__cause__)
    assert any("worker process" in note for note in info.value.__notes__)
    # No worker is left running, and none is left as a zombie.
    for p in processes:
        assert not p.is_alive() and p.exitcode is not None
    alive = {c.pid for c in multiprocessing.active_children()}
    assert alive.isdisjoint(p.pid for p in processes)
    if sys.platform.startswith("linux"):
        for p in processes:
            assert not os.path.exists(f"/proc/{p.pid}"), f"worker {p.pid} not reaped"
    with pytest.raises(RuntimeError, match="closed"):
        env.step(torch.zeros(2, dtype=torch.int64))


def test_sync_error_propagates_unchanged(make):
    env = make(2, env=CrashEnv)
    env.reset(seed=0)
    env.step(torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="CrashEnv exploded on purpose"):
        env.step(torch.zeros(2, dtype=torch.int64))


def test_make_factory_builds_like_ppo_does():
    factory = GymnasiumEnv.make_factory("CartPole-v1", env_kwargs={"max_episode_steps": 50})
    assert factory.episodic and factory.max_num_envs is None
    assert "CartPole-v1" in factory.__name__
    factory = pickle.loads(pickle.dumps(factory))
    env = factory(8, 32, device="cpu")
    try:
        assert isinstance(env, GymnasiumEnv)
        assert (env.num_envs, env.horizon, env.device) == (8, 32, torch.device("cpu"))
        assert env.vector_env.envs[0].spec.max_episode_steps == 50
        env.reset(seed=0)
        validate_step_output(env.step(torch.zeros(8, dtype=torch.int64)), env)
    finally:
        env.close()


def test_wrappers_are_applied(make):
    wrappers = [lambda e: gymnasium.wrappers.TransformReward(e, lambda r: 10.0 * r)]
    env = make(2, env="CartPole-v1", wrappers=wrappers)
    env.reset(seed=0)
    out = env.step(torch.zeros(2, dtype=torch.int64))
    torch.testing.assert_close(out["rewards"], torch.full((2, 1), 10.0))


@pytest.mark.parametrize("mode", MODES)
def test_render_rgb_array(make, mode):
    env = make(
        2,
        env=EchoEnv,
        vectorization_mode=mode,
        render_mode="rgb_array",
        env_kwargs={"space": spaces.Discrete(2), "length": 10},
    )
    assert env.metadata["render_fps"] == 7
    env.reset(seed=0)
    env.step(torch.zeros(2, dtype=torch.int64))
    frame = env.render(1)
    assert frame.dtype == np.uint8 and frame.shape == (6, 8, 3)
    assert frame[0, 0, 0] == 1
    with pytest.raises(IndexError):
        env.render(2)


def test_render_cartpole():
    pytest.importorskip("pygame")
    env = GymnasiumEnv(1, env="CartPole-v1", render_mode="rgb_array")
    try:
        env.reset(seed=0)
        frame = env.render()
        assert frame.dtype == np.uint8 and frame.ndim == 3 and frame.shape[-1] == 3
    finally:
        env.close()


def test_render_needs_rgb_array_mode(make):
    env = make(1, env="CartPole-v1")
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match="rgb_array"):
        env.render()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "masked"])
def test_another_device_gets_the_cpu_outputs_moved(make, env_id):
    """Off the CPU, every output leaf (nested ones, final_obs included) is the CPU one moved to
    the device: checked here on the "meta" device (shapes, dtypes, placement); the values on
    CUDA by test_cuda_device."""
    kwargs = {"env": MaskedEnv} if env_id == "masked" else {"env": "CartPole-v1"}
    cpu, meta = make(3, **kwargs), make(3, device="meta", **kwargs)

    def leaves(value):
        return dict(value.items(True, True)) if isinstance(value, TensorDictBase) else {"obs": value}

    def check(a, b):
        assert {k: (x.shape, x.dtype) for k, x in leaves(a).items()} == {
            k: (y.shape, y.dtype) for k, y in leaves(b).items()
        }
        assert all(y.device.type == "meta" for y in leaves(b).values())

    check(cpu.reset(seed=5), meta.reset(seed=5))
    for _ in range(25):
        action = torch.randint(0, 2, (3,))
        check(cpu.step(action), meta.step(action))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_device(make):
    env = make(4, env="CartPole-v1", device="cuda", env_kwargs={"max_episode_steps": 3})
    obs = env.reset(seed=0)
    assert obs.device.type == "cuda"
    cpu = make(4, env="CartPole-v1", env_kwargs={"max_episode_steps": 3})
    cpu.reset(seed=0)
    for _ in range(7):
        action = torch.ones(4, dtype=torch.int64)
        out = env.step(action.cuda())
        ref = cpu.step(action)
        validate_step_output(out, env)
        assert out.device.type == "cuda"
        assert (out.cpu() == ref).all()


def test_resume_from_state_dict_resets_gymnasium_envs():
    import copy

    from rl8 import PPO

    algo = PPO("CartPole-v1", num_envs=4, horizon=8, sgd_minibatch_size=None, seed=0)
    algo.collect()
    algo.update()
    state = copy.deepcopy(algo.state_dict())
    assert state["env"] is None and state["obs"] is None
    resumed = PPO("CartPole-v1", num_envs=4, horizon=8, sgd_minibatch_size=None, seed=0)
    resumed.load_state_dict(state)
    stats = resumed.collect()  # resets the envs instead of stepping a stale simulator
    assert resumed.env_resets == 2 and "rollout/reward_sum_mean" in stats
    algo.env.close()
    resumed.env.close()


def test_an_envs_name_in_messages_is_its_class_its_gymnasium_id_or_what_it_sets():
    class Named(CartPole):
        def __init__(self, num_envs: int, horizon: int | None = None, **kwargs) -> None:
            super().__init__(num_envs, horizon, **kwargs)
            self.name = "my cart-pole"  # a user's env may name itself

    assert CartPole(2).name == "CartPole" and Named(2).name == "my cart-pole"
    env = GymnasiumEnv(1, env="CartPole-v1")
    try:
        assert env.name == "GymnasiumEnv(CartPole-v1)"
    finally:
        env.close()
