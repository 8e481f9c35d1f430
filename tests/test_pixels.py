"""Pixels: image spaces and layouts, the convolutional encoders and the models on them, uint8
storage, the Catch pixel env (and that PPO learns it), videos from its frames, policy files,
and the Atari preset (skipped without ale-py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict

from rl8 import PPO, GRUModel, LSTMModel, MLPModel, Policy
from rl8.envs import Catch
from rl8.envs.base import validate_reset_output, validate_step_output
from rl8.policies.encoders import (
    CNNModel,
    ImageEncoder,
    ImpalaCNN,
    MultiInputModel,
    NatureCNN,
    default_model_cls,
    image_layout,
    image_shape,
)

# a small CNN for the 16x16 images of Catch (the Nature CNN's 8x8 stride-4 kernel needs >= 36 px)
SMALL_CNN = {
    "encoder_config": {"channels": (8, 16), "kernel_sizes": (3, 3), "strides": (2, 1), "features": 64}
}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Convolutions on small batches: on a shared 2-core machine a second torch thread waits
    on the busy core more than it helps; this module runs on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def uint8_box(*shape):
    return spaces.Box(0, 255, shape, np.uint8)


# --- spaces and layouts -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "layout", "chw"),
    [
        ((84, 84, 4), "HWC", (4, 84, 84)),
        ((4, 84, 84), "CHW", (4, 84, 84)),
        ((64, 48, 3), "HWC", (3, 64, 48)),
        ((1, 16, 12), "CHW", (1, 16, 12)),
        ((84, 84), "HWC", (1, 84, 84)),
    ],
)
def test_image_layout_of_uint8_boxes(shape, layout, chw):
    space = uint8_box(*shape)
    assert image_layout(space) == layout
    assert image_shape(space, layout) == chw


def test_what_is_not_an_image():
    assert image_layout(spaces.Box(-1, 1, (84, 84, 3), np.float32)) is None  # floats: only when declared
    assert image_layout(uint8_box(10)) is None
    assert image_layout(spaces.Discrete(4)) is None
    assert image_layout(spaces.Box(0, 1, (3, 8, 8), np.float32), "CHW") == "CHW"
    with pytest.raises(ValueError, match="image_layout: expected one of"):
        image_layout(uint8_box(3, 8, 8), "WHC")
    with pytest.raises(ValueError, match="3-dimensional Box"):
        image_layout(spaces.Box(0, 1, (8,), np.float32), "CHW")


def test_default_model_per_observation_space():
    assert default_model_cls(uint8_box(4, 84, 84)) is CNNModel
    assert default_model_cls(spaces.Box(-1, 1, (4,), np.float32)) is MLPModel
    assert default_model_cls(spaces.Box(0, 1, (3, 8, 8), np.float32)) is MLPModel
    assert (
        default_model_cls(spaces.Box(0, 1, (3, 8, 8), np.float32), {"image_layout": "CHW"}) is CNNModel
    )
    mixed = spaces.Dict({"image": uint8_box(16, 16, 3), "speed": spaces.Box(-1, 1, (2,), np.float32)})
    assert default_model_cls(mixed) is MultiInputModel
    assert default_model_cls(spaces.Dict({"speed": spaces.Box(-1, 1, (2,), np.float32)})) is MLPModel
    assert type(Policy(uint8_box(4, 84, 84), spaces.Discrete(6)).model) is CNNModel


# --- encoders ---------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(36, 36, 4), (4, 36, 36), (36, 36), (48, 40, 3)])
@pytest.mark.parametrize("encoder", ["nature", "impala"])
def test_encoder_output_shape_for_each_layout(shape, encoder):
    enc = ImageEncoder(uint8_box(*shape), encoder=encoder)
    out = enc(torch.randint(0, 256, (3, *shape), dtype=torch.uint8))
    assert out.shape == (3, 512 if encoder == "nature" else 256)
    assert out.dtype == torch.float32


def test_layouts_see_the_same_image():
    """An HWC image and its CHW transpose give the same features from the same weights."""
    torch.manual_seed(0)
    hwc, chw = ImageEncoder(uint8_box(36, 36, 3)), ImageEncoder(uint8_box(3, 36, 36))
    chw.load_state_dict(hwc.state_dict())
    images = torch.randint(0, 256, (2, 36, 36, 3), dtype=torch.uint8)
    torch.testing.assert_close(hwc(images), chw(images.permute(0, 3, 1, 2)))


def test_uint8_is_scaled_to_unit_range_inside_the_model():
    torch.manual_seed(0)
    images = torch.randint(0, 256, (2, 1, 36, 36), dtype=torch.uint8)
    as_uint8 = ImageEncoder(uint8_box(1, 36, 36))
    as_float = ImageEncoder(spaces.Box(0, 1, (1, 36, 36), np.float32), "CHW")
    as_float.load_state_dict(as_uint8.state_dict())
    torch.testing.assert_close(as_uint8(images), as_float(images.float() / 255))


def test_encoders_are_configurable():
    nature = NatureCNN(2, 20, 20, channels=(4, 8), kernel_sizes=(4, 3), strides=(2, 1), features=10)
    assert nature(torch.zeros(5, 2, 20, 20)).shape == (5, 10)
    assert [m.out_channels for m in nature.convs if isinstance(m, torch.nn.Conv2d)] == [4, 8]
    assert [m.kernel_size for m in nature.convs if isinstance(m, torch.nn.Conv2d)] == [(4, 4), (3, 3)]
    impala = ImpalaCNN(3, 15, 15, channels=(4, 6), features=7)
    assert impala(torch.zeros(2, 3, 15, 15)).shape == (2, 7)


def test_encoder_config_errors_name_the_field():
    with pytest.raises(ValueError, match=r"too small .*sizes after each layer"):
        NatureCNN(1, 16, 16)
    with pytest.raises(ValueError, match="one length"):
        NatureCNN(1, 84, 84, channels=(32, 64), kernel_sizes=(8, 4, 3))
    with pytest.raises(ValueError, match=r"encoder_config features must be an int >= 1, got 0"):
        NatureCNN(1, 84, 84, features=0)
    with pytest.raises(ValueError, match="model_config encoder: expected one of"):
        ImageEncoder(uint8_box(1, 84, 84), encoder="resnet")
    with pytest.raises(ValueError, match="encoder_config: .* refused"):
        ImageEncoder(uint8_box(1, 84, 84), encoder="impala", encoder_config={"kernel_sizes": (3,)})
    with pytest.raises(TypeError, match="expected an image observation space"):
        CNNModel(
            spaces.Box(-1, 1, (4,), np.float32),
            spaces.Discrete(2),
            Policy(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2)).distribution_cls,
        )


# --- models -------------------------------------------------------------------------------------


def test_cnn_model_shares_its_trunk_by_default():
    shared = Policy(uint8_box(4, 84, 84), spaces.Discrete(6)).model
    separate = Policy(uint8_box(4, 84, 84), spaces.Discrete(6), model_config={"shared": False}).model
    assert shared.vf_body is None and separate.vf_body is not None
    n_shared = sum(p.numel() for p in shared.parameters())
    n_separate = sum(p.numel() for p in separate.parameters())
    assert n_separate > 1.9 * (n_shared - 513 * 7)  # two trunks (heads: 512 * 6 + 6 and 512 + 1)
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    for model in (shared, separate):
        params, values = model(obs)
        assert params.shape == (3, 6) and values.shape == (3,)
        torch.testing.assert_close(model.value(obs), values)


def test_multi_input_model_on_image_and_vector():
    space = spaces.Dict(
        {
            "camera": uint8_box(16, 16, 3),
            "depth": spaces.Box(0, 1, (1, 16, 16), np.float32),
            "speed": spaces.Box(-1, 1, (2,), np.float32),
            "action_mask": spaces.Box(0, 1, (4,), np.bool_),
        }
    )
    policy = Policy(
        space,
        spaces.Discrete(4),
        model_config={**SMALL_CNN, "image_keys": {"depth": "CHW"}, "vector_hiddens": (8,)},
    )
    model = policy.model
    assert type(model) is MultiInputModel
    encoder = model.pi_body[0]
    assert encoder.kinds == {"camera": "image", "depth": "image", "speed": "vector"}
    assert encoder.features == 64 + 64 + 8
    obs = TensorDict(
        {
            "camera": torch.randint(0, 256, (5, 16, 16, 3), dtype=torch.uint8),
            "depth": torch.rand(5, 1, 16, 16),
            "speed": torch.randn(5, 2),
            "action_mask": torch.tensor([[True, False, True, False]] * 5),
        },
        batch_size=[5],
    )
    dist, values = policy.distribution(obs)
    assert values.shape == (5,)
    assert set(dist.sample().tolist()) <= {0, 2}  # the mask reaches the distribution
    with pytest.raises(ValueError, match=r"image_keys: \['lidar'\] are not keys"):
        Policy(space, spaces.Discrete(4), model_config={**SMALL_CNN, "image_keys": {"lidar": "CHW"}})


@pytest.mark.parametrize("model_cls", [LSTMModel, GRUModel])
def test_recurrent_models_on_images(model_cls):
    """A CNN encoder under the RNN: a sequence in one call equals step-by-step calls."""
    torch.manual_seed(0)
    policy = Policy(
        uint8_box(1, 16, 16),
        spaces.Discrete(3),
        model_cls=model_cls,
        model_config={**SMALL_CNN, "hidden_size": 16},
    )
    assert policy.model.image_encoder is not None
    obs = torch.randint(0, 256, (2, 5, 1, 16, 16), dtype=torch.uint8)
    firsts = torch.zeros(2, 5, dtype=torch.bool)
    firsts[1, 2] = True
    state = policy.initial_state(2)
    params, values, _ = policy.model(obs, state, firsts)
    for t in range(5):
        p, v, state = policy.model(obs[:, t : t + 1], state, firsts[:, t : t + 1])
        torch.testing.assert_close(p[:, 0], params[:, t])
        torch.testing.assert_close(v[:, 0], values[:, t])
    impala = Policy(
        uint8_box(16, 16, 3),
        spaces.Discrete(3),
        model_cls=model_cls,
        model_config={"encoder": "impala", "encoder_config": {"channels": (4,), "features": 8}},
    )
    assert isinstance(impala.model.image_encoder.encoders["obs"].cnn, ImpalaCNN)
    with pytest.raises(
        ValueError, match="model_config encoder: 'nature' encodes images, but the observation"
    ):
        Policy(
            spaces.Box(-1, 1, (4,), np.float32),
            spaces.Discrete(3),
            model_cls=model_cls,
            model_config={"encoder": "nature"},
        )
    assert (
        Policy(
            spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(3), model_cls=model_cls
        ).model.image_encoder
        is None
    )


def test_policy_file_round_trip(tmp_path):
    """CNN and multi-input policies save and load (weights_only) with the same outputs."""
    from rl8.io.export import load_policy, save_policy

    space = spaces.Dict({"image": uint8_box(1, 16, 16), "speed": spaces.Box(-1, 1, (2,), np.float32)})
    obs = TensorDict(
        {"image": torch.randint(0, 256, (3, 1, 16, 16), dtype=torch.uint8), "speed": torch.randn(3, 2)},
        batch_size=[3],
    )
    for policy, x in [
        (
            Policy(
                uint8_box(1, 16, 16),
                spaces.Discrete(3),
                model_config={**SMALL_CNN, "encoder": "impala", "encoder_config": {"channels": (4,)}},
            ),
            obs["image"],
        ),
        (Policy(space, spaces.Discrete(3), model_config=SMALL_CNN), obs),
    ]:
        path = save_policy(policy, tmp_path / f"{type(policy.model).__name__}.pt")
        loaded = load_policy(path)
        assert type(loaded.model) is type(policy.model)
        torch.testing.assert_close(loaded.distribution(x)[1], policy.distribution(x)[1])


# --- storage ------------------------------------------------------------------------------------


def test_buffer_keeps_images_as_uint8_and_reports_bytes_per_transition():
    algo = PPO(Catch, num_envs=4, horizon=8, seed=0, sgd_minibatch_size=16, model_config=SMALL_CNN)
    obs_space = algo.env.observation_space
    assert obs_space.shape == (1, 16, 16) and obs_space.dtype == np.uint8
    algo.collect()
    for key in ("obs", "final_obs"):
        assert algo.buffer.data[key].dtype == torch.uint8
        assert algo.buffer.data[key].shape == (4, 9, 1, 16, 16)
    assert int(algo.buffer.data["obs"].max()) == 255
    # obs + final_obs (256 B each), int64 action, float32 logp/value/reward, two bool flags
    assert algo.buffer.bytes_per_transition == 256 * 2 + 8 + 12 + 2
    algo.update()


# --- the Catch env --------------------------------------------------------------------------


def test_catch_follows_the_env_contract_and_scores_landings():
    env = Catch(3, rows=4, cols=3, scale=1)
    obs = env.reset(seed=1)
    validate_reset_output(obs, env)
    assert obs.shape == (3, 1, 4, 3) and obs.dtype == torch.uint8
    assert (obs[:, 0, 3, 1] == 255).all()  # paddle in the middle column of the bottom row
    balls = env.ball_col.clone()
    total = torch.zeros(3)
    for step in range(3):
        # chase the ball: left when the paddle is right of it, right when left
        action = torch.sign(balls - env.paddle) + 1
        out = env.step(action)
        validate_step_output(out, env)
        total += out["rewards"][:, 0]
        assert out["terminated"].all() == (step == 2)
    assert (total == 1).all()
    assert (out["final_obs"][torch.arange(3), 0, 3, balls] == 255).all()  # ball and paddle met
    env.reset(seed=1)
    out = [env.step(torch.full((3,), a)) for a in (0, 0, 0)][-1]
    assert (out["rewards"][:, 0] == torch.where(balls == 0, 1.0, -1.0)).all()
    with pytest.raises(KeyError, match="unknown config key"):
        env.reset(config={"gravity": 1})
    with pytest.raises(ValueError, match="Catch: rows must be an int >= 2, got 1"):
        Catch(1, rows=1)


def test_catch_video_uses_the_envs_own_frames(tmp_path):
    imageio = pytest.importorskip("imageio")
    pytest.importorskip("imageio_ffmpeg")
    from rl8.training.video import record_video

    env = Catch(1, rows=4, cols=4, scale=2)
    policy = Policy(env.observation_space, env.action_space, model_config=SMALL_CNN)
    obs = env.reset(seed=0)
    frame = env.render(0)
    assert frame.shape == (64, 64, 3) and frame.dtype == np.uint8
    assert (frame[::8, ::8, 0] == obs[0, 0].numpy()).all()
    path = record_video(policy, env, tmp_path / "catch.mp4", seed=0)
    reader = imageio.get_reader(path, "ffmpeg")
    frames = list(reader.iter_data())
    reader.close()
    assert len(frames) == 3 and frames[0].shape == (64, 64, 3)  # one per step of the 3-step episode


@pytest.fixture(scope="module")
def catch_run():
    """PPO on Catch (5x5 grid, 10x10 images) with a fixed seed: the mean episode return of
    each collect and the env steps taken, up to 32768 steps or a mean return >= 0.8."""
    torch.manual_seed(0)
    algo = PPO(
        Catch,
        num_envs=32,
        horizon=16,
        seed=0,
        lr=2e-3,
        num_sgd_iters=2,
        sgd_minibatch_size=256,
        entropy_coeff=0.01,
        env_kwargs={"rows": 5, "cols": 5},
        model_config=SMALL_CNN,
    )
    returns, steps = [], 0
    while steps < 32768:
        stats = algo.collect()
        algo.update()
        steps += 32 * 16
        returns.append(stats["episodes/return_mean"])
        if returns[-1] >= 0.8:
            break
    return algo, returns, steps


def test_ppo_learns_catch_from_pixels(catch_run):
    """A random policy scores about -0.6 on a 5x5 Catch; PPO reaches >= 0.8 within 32768 env
    steps (16384 with this seed)."""
    algo, returns, steps = catch_run
    assert returns[0] < 0, returns
    assert returns[-1] >= 0.8, (steps, returns)
    assert type(algo.policy.model) is CNNModel
    eval_env = Catch(32, rows=5, cols=5)
    assert algo.evaluate(eval_env, num_steps=8)["episodes/return_mean"] >= 0.8  # acting on its mode


# --- Atari ------------------------------------------------------------------------------------

try:
    import ale_py  # noqa: F401
    import cv2  # noqa: F401

    ATARI_MISSING = None
except ImportError as err:
    ATARI_MISSING = f"the Atari preset needs ale-py and opencv (pip install -e '.[atari]'): {err}"

needs_atari = pytest.mark.skipif(ATARI_MISSING is not None, reason=ATARI_MISSING or "")


def _wrappers(env):
    """The classes of a wrapper chain, outermost first."""
    chain = []
    while hasattr(env, "env"):
        chain.append(type(env).__name__)
        env = env.env
    return chain


@needs_atari
def test_pong_constructs_with_the_preset_collects_and_updates():
    algo = PPO("ALE/Pong-v5", num_envs=2, horizon=8, sgd_minibatch_size=8, num_sgd_iters=1, seed=0)
    try:
        assert algo.env.observation_space == spaces.Box(0, 255, (4, 84, 84), np.uint8)
        assert type(algo.policy.model) is CNNModel
        algo.collect()
        assert algo.buffer.data["obs"].dtype == torch.uint8
        assert algo.buffer.data["obs"].shape == (2, 9, 4, 84, 84)
        # the four stacked frames are consecutive frames of the game: the newest is last
        obs = algo.buffer.data["obs"]
        assert torch.equal(obs[:, 1, :3], obs[:, 0, 1:])
        stats = algo.update()
        assert np.isfinite(stats["losses/total"])
    finally:
        algo.env.close()


@needs_atari
@pytest.mark.parametrize("mode", ["async", "pool"])
def test_atari_preset_in_the_process_modes(mode):
    """The workers build the preset themselves (ale-py registered there too)."""
    env_kwargs = {"vectorization_mode": mode, **({"num_workers": 1} if mode == "pool" else {})}
    algo = PPO(
        "ALE/Pong-v5",
        num_envs=2,
        horizon=4,
        sgd_minibatch_size=8,
        num_sgd_iters=1,
        seed=0,
        env_kwargs=env_kwargs,
    )
    try:
        assert algo.env.observation_space == spaces.Box(0, 255, (4, 84, 84), np.uint8)
        algo.collect()
        assert algo.buffer.data["obs"].dtype == torch.uint8
        assert int(algo.buffer.data["obs"][:, 1:].max()) > 0
    finally:
        algo.env.close()


@needs_atari
def test_atari_preset_wrappers_and_options():
    from rl8.envs.atari import make_atari

    training = make_atari("ALE/Breakout-v5")
    assert _wrappers(training)[:6] == [
        "FrameStackObservation",
        "ClipReward",
        "FireReset",
        "EpisodicLife",
        "AtariPreprocessing",
        "RecordEpisodeStatistics",
    ]
    assert training.unwrapped._frameskip == 1  # AtariPreprocessing skips frames (with a max-pool)
    evaluation = make_atari("ALE/Breakout-v5", atari_preset={"training": False, "frame_stack": 1})
    assert "ClipReward" not in _wrappers(evaluation) and "EpisodicLife" not in _wrappers(evaluation)
    assert evaluation.observation_space.shape == (84, 84)
    assert "AtariPreprocessing" not in _wrappers(make_atari("ALE/Pong-v5", atari_preset=False))
    with pytest.raises(ValueError, match=r"atari_preset: unknown options \['stack'\]"):
        make_atari("ALE/Pong-v5", atari_preset={"stack": 4})
    with pytest.raises(ValueError, match="atari_preset frame_skip: expected an int >= 1, got 0"):
        make_atari("ALE/Pong-v5", atari_preset={"frame_skip": 0})
    for env in (training, evaluation):
        env.close()


def _five_point_pong(**kwargs):
    """Pong whose points are worth 5 (registered as ``ALE/FivePointPong-v0`` by the fixture)."""
    import gymnasium

    return gymnasium.wrappers.TransformReward(gymnasium.make("ALE/Pong-v5", **kwargs), lambda r: 5.0 * r)


@pytest.fixture
def five_point_pong():
    """The gymnasium id of :func:`_five_point_pong`, registered in this process for the test."""
    import gymnasium

    gymnasium.register("ALE/FivePointPong-v0", entry_point=_five_point_pong)
    yield "ALE/FivePointPong-v0"
    gymnasium.registry.pop("ALE/FivePointPong-v0")


@needs_atari
def test_training_rewards_are_clipped_while_the_episode_return_is_not(five_point_pong):
    """A Pong whose points are worth 5: the training form steps with rewards of -1/+1, while
    the game's own return (RecordEpisodeStatistics, inside the clipping) counts 5 a point."""
    import gymnasium

    from rl8.envs.atari import make_atari

    env = make_atari(five_point_pong, atari_preset={"frame_stack": 1})
    record = env
    while not isinstance(record, gymnasium.wrappers.RecordEpisodeStatistics):
        record = record.env
    env.reset(seed=0)
    clipped = []
    for _ in range(2000):
        _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        if reward:
            clipped.append(reward)
        if len(clipped) >= 2 or terminated or truncated:
            break
    assert len(clipped) >= 1 and set(clipped) <= {-1.0, 1.0}
    assert record.episode_returns == 5.0 * sum(clipped)
    env.close()


@needs_atari
def test_the_preset_reports_the_unclipped_game_score_as_env_episodes(five_point_pong):
    """Games of FivePointPong cut at 400 emulator frames: the adapter's records are the games'
    own score (5 a point) and length in frames, while the envs' rewards are clipped to -1/+1
    and their episodes count PPO steps (4 frames each)."""
    from rl8.envs import GymnasiumEnv

    env = GymnasiumEnv(2, env=five_point_pong, env_kwargs={"max_num_frames_per_episode": 400})
    try:
        env.reset(seed=0)
        returns, lengths = torch.zeros(2), torch.zeros(2)
        ended_returns, ended_lengths = [], []
        for _ in range(200):
            out = env.step(torch.randint(0, int(env.action_space.n), (2,)))
            rewards = out["rewards"][:, 0]
            assert set(rewards.tolist()) <= {-1.0, 0.0, 1.0}
            returns += rewards
            lengths += 1
            for i in (out["terminated"] | out["truncated"])[:, 0].nonzero()[:, 0].tolist():
                ended_returns.append(returns[i].item())
                ended_lengths.append(lengths[i].item())
                returns[i] = lengths[i] = 0
            if len(ended_returns) >= 2:
                break
        records = env.pop_episode_records()
        assert records.count == len(ended_returns) >= 2
        assert records.return_sum == 5.0 * sum(ended_returns)
        assert records.length_sum == 400.0 * records.count  # emulator frames
        assert max(ended_lengths) <= 400 / 4  # PPO steps, 4 frames each (some frames go to the resets)
    finally:
        env.close()
