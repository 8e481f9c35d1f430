"""rl8.Distillation: behaviour cloning of a frozen teacher (DAgger), its hyper-parameters, and
the Trainer's checkpoints, resume and exports of a distillation run."""

from __future__ import annotations

import pytest
import torch
from group_envs import GoalPoint

from rl8 import PPO, Distillation, DistillationHParams, Trainer, load_policy, save_policy
from rl8.envs import CartPole, ContinuousDummyEnv
from rl8.policies.recurrent import LSTMModel
from rl8.ppo.distributed import Roles
from rl8.training.actors import check_actor_config
from rl8.training.config import TrainerConfig
from rl8.training.config_file import unknown_hparam

TEACHER_GROUPS = {"actor": ["teacher"], "critic": ["teacher"]}
STUDENT_GROUPS = {"actor": ["policy"], "critic": ["policy"]}
SMALL = dict(num_envs=16, horizon=8, seed=0, model_config={"hiddens": [16]})


def make_teacher(seed: int = 1):
    """An untrained policy of the teacher group: labels the student can learn to copy."""
    return PPO(GoalPoint, obs_groups=TEACHER_GROUPS, **{**SMALL, "seed": seed}).policy


def make_distillation(**hparams):
    return Distillation(
        GoalPoint, teacher=make_teacher(), **{**SMALL, "obs_groups": STUDENT_GROUPS, **hparams}
    )


def teacher_means(teacher, obs):
    return teacher.distribution(obs)[0].deterministic_sample()


@pytest.mark.parametrize("loss_type", ["mse", "huber"])
def test_updates_bring_the_students_actions_to_the_teachers(loss_type):
    algo = make_distillation(loss_type=loss_type, lr=3e-3, num_minibatches=2, num_sgd_iters=4)
    env = GoalPoint(64)
    obs = env.reset(seed=3)

    def gap():
        with torch.no_grad():
            student = algo.policy.distribution(obs)[0].deterministic_sample()
            return (student - teacher_means(algo.teacher, obs)).abs().mean().item()

    before, losses = gap(), []
    for _ in range(15):
        algo.collect()
        stats = algo.update()
        losses.append(stats["losses/behavior"])
    assert set(stats) == {"losses/behavior", "monitors/grad_norm", "coefficients/lr"}
    assert losses[-1] < 0.3 * losses[0]
    assert gap() < 0.3 * before
    assert algo.steps == 15 and algo.env_steps == 15 * 16 * 8


def test_the_loss_is_the_behaviour_loss_of_the_buffers_labels():
    # one full-batch step of plain SGD: the gradient is that of the loss written out by hand
    algo = make_distillation(
        sgd_minibatch_size=None, optimizer_cls="torch.optim.SGD", lr=0.5, loss_type="huber"
    )
    algo.collect()
    obs = algo.buffer.data["obs"][:, :8].reshape(-1)
    before = {k: v.clone() for k, v in algo.policy.named_parameters()}
    student = algo.policy.distribution(obs)[0].deterministic_sample()
    expected = torch.nn.functional.huber_loss(student, teacher_means(algo.teacher, obs).detach())
    expected.backward()
    grads = {k: p.grad.clone() for k, p in algo.policy.named_parameters() if p.grad is not None}
    algo.policy.zero_grad()
    stats = algo.update()
    assert stats["losses/behavior"] == pytest.approx(expected.item(), rel=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(dict(algo.policy.named_parameters())[name], before[name] - 0.5 * grad)


def test_the_teacher_stays_frozen():
    algo = make_distillation()
    weights = {k: v.clone() for k, v in algo.teacher.state_dict().items()}
    for _ in range(2):
        algo.collect()
        algo.update()
    assert not algo.teacher.training
    assert not any(p.requires_grad for p in algo.teacher.parameters())
    assert all(torch.equal(v, weights[k]) for k, v in algo.teacher.state_dict().items())


def test_a_recurrent_student_trains_on_sequences():
    algo = Distillation(
        GoalPoint,
        teacher=make_teacher(),
        model_cls=LSTMModel,
        model_config={"hidden_size": 16},
        obs_groups=STUDENT_GROUPS,
        num_envs=16,
        horizon=8,
        seq_len=4,
        lr=3e-3,
        num_sgd_iters=4,
        seed=0,
    )
    assert algo.recurrent and algo.seq_len == 4
    losses = []
    for _ in range(10):
        algo.collect()
        losses.append(algo.update()["losses/behavior"])
    assert losses[-1] < 0.5 * losses[0]


def test_ppos_own_hparams_are_refused():
    with pytest.raises(ValueError, match="hparam clip_param: Distillation trains by behaviour cloning"):
        make_distillation(clip_param=0.3)
    with pytest.raises(ValueError, match="hparam normalize_rewards: expected False, got True"):
        make_distillation(normalize_rewards=True)
    with pytest.raises(ValueError, match="hparam loss_type: expected 'mse' or 'huber', got 'l1'"):
        make_distillation(loss_type="l1")
    assert DistillationHParams().num_sgd_iters == 1 and DistillationHParams().max_grad_norm is None


def test_a_typo_near_loss_type_is_suggested_wherever_it_is_read():
    with pytest.raises(
        TypeError,
        match=r"unknown hyper-parameter 'loss_typ'; did you mean 'loss_type'\? \(valid: .*, loss_type\)",
    ):
        make_distillation(loss_typ="huber")
    with pytest.raises(
        ValueError, match=r"^hparams: unknown hyper-parameter 'loss_tpe'; did you mean 'loss_type'\?"
    ):
        DistillationHParams.from_config({"loss_tpe": "huber"})
    error = unknown_hparam("losstype", "--set losstype=huber")  # rl8 train's --set, any algorithm
    assert str(error).startswith(
        "--set losstype=huber: unknown hyper-parameter 'losstype'; did you mean 'loss_type'?"
    )


def test_a_teacher_that_cannot_label_the_env_is_refused():
    with pytest.raises(TypeError, match="teacher must be a rl8.Policy .* got a PPO .it holds one"):
        Distillation(GoalPoint, teacher=PPO(GoalPoint, obs_groups=TEACHER_GROUPS, **SMALL))
    point = PPO(ContinuousDummyEnv, num_envs=4, horizon=4, seed=0).policy
    with pytest.raises(ValueError, match="the teacher reads observations of Box"):
        Distillation(GoalPoint, teacher=point, **SMALL)
    recurrent = PPO(
        GoalPoint, obs_groups=TEACHER_GROUPS, model_cls=LSTMModel, **{**SMALL, "model_config": {}}
    ).policy
    with pytest.raises(
        ValueError,
        match=r"^Distillation: teacher: expected a feedforward policy, got one of the recurrent "
        r"LSTMModel; .* \(the student may be recurrent: model_cls\)$",
    ):
        Distillation(GoalPoint, teacher=recurrent, **{**SMALL, "obs_groups": STUDENT_GROUPS})
    cartpole = PPO(CartPole, num_envs=4, horizon=4, seed=0).policy
    with pytest.raises(ValueError, match="must be a Box, got Discrete"):
        Distillation(CartPole, teacher=cartpole, num_envs=4, horizon=4)


def test_a_distillation_run_checkpoints_resumes_and_exports(tmp_path):
    algo = make_distillation()
    trainer = Trainer(algo, checkpoint_dir=str(tmp_path / "ck"), progress=False)
    trainer.run(max_env_steps=2 * 16 * 8)
    path = trainer.save_checkpoint()
    trainer.step()
    after = {k: v.clone() for k, v in algo.policy.state_dict().items()}
    trainer.close()

    resumed = Trainer.from_checkpoint(path, env=GoalPoint, progress=False)
    assert type(resumed.algo) is Distillation and resumed.algo.env_steps == 2 * 16 * 8
    assert all(
        torch.equal(v, algo.teacher.state_dict()[k])
        for k, v in resumed.algo.teacher.state_dict().items()
    )
    resumed.step()  # the same step as the uninterrupted run's
    assert all(torch.equal(v, after[k]) for k, v in resumed.algo.policy.state_dict().items())
    resumed.close()

    student = load_policy(save_policy(algo.policy, tmp_path / "student.pt"))
    obs = GoalPoint(4).reset(seed=0)
    torch.testing.assert_close(student(obs), algo.policy(obs))


# ------------------------------------------------------------------------------------------
# learning: a privileged teacher distilled into a student that sees noise besides the task
# (benchmarks/distillation.py measures the same settings over seeds: docs/distillation.md)

LEARNING = {"num_envs": 64, "horizon": 32, "model_config": {"hiddens": [32, 32]}, "seed": 0}
BUDGET = 4 * 2048  # env steps: 4 updates of 64 envs * 32 steps (seeds 0, 1, 2 need 2)


def deterministic_return(algo, env):
    return algo.evaluate(env, num_steps=64)["episodes/return_mean"]


def eval_env(seed):
    env = GoalPoint(64)
    env.reset(seed=seed)
    return env


@pytest.fixture(scope="module")
def trained_teacher():
    """PPO on the privileged group alone (the error goal - x): 12 updates; its policy and return."""
    teacher = PPO(GoalPoint, obs_groups=TEACHER_GROUPS, **LEARNING)
    for _ in range(12):
        teacher.collect()
        teacher.update()
    return teacher.policy, deterministic_return(teacher, eval_env(0))


def best_return_within(algo, target, max_env_steps):
    """Train until the deterministic return reaches ``target`` or ``max_env_steps`` are spent;
    the env steps taken and the best return seen."""
    env, best = eval_env(0), -float("inf")
    while algo.env_steps < max_env_steps and best < target:
        algo.collect()
        algo.update()
        best = max(best, deterministic_return(algo, env))
    return algo.env_steps, best


@pytest.mark.slow
def test_a_distilled_student_reaches_90_percent_of_the_teacher_before_ppo_from_scratch(trained_teacher):
    teacher, teacher_return = trained_teacher
    target = 0.9 * teacher_return
    assert teacher_return > 29  # of at most 32: the privileged task is easy
    student = Distillation(
        GoalPoint,
        teacher=teacher,
        obs_groups=STUDENT_GROUPS,
        lr=3e-3,
        num_sgd_iters=4,
        num_minibatches=4,
        **LEARNING,
    )
    steps, best = best_return_within(student, target, BUDGET)
    assert best >= target, f"the student reached {best:.2f} < {target:.2f} in {steps} env steps"
    scratch = PPO(GoalPoint, obs_groups=STUDENT_GROUPS, **LEARNING)
    _, scratch_best = best_return_within(scratch, target, steps)
    assert scratch_best < target, f"PPO from scratch reached {scratch_best:.2f} in {steps} env steps too"


def test_actors_and_learners_refuse_a_distillation():
    with pytest.raises(ValueError, match="actors and learners train PPO only, got Distillation"):
        check_actor_config(
            TrainerConfig(actors=1), make_distillation(), Roles(rank=0, world_size=2, actors=1)
        )
