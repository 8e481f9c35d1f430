"""A Unitree Go2 that learns to walk forward at a commanded speed, in Genesis, behind rsl_rl's
``VecEnv`` interface (``num_envs``, ``num_actions``, ``device``, ``max_episode_length``,
``episode_length_buf``, ``get_observations()``, ``reset()``, ``step(actions)``): the shape of the
env in Genesis' locomotion example, written here from Genesis' documented API (``gs.Scene``,
``gs.morphs.URDF``, ``RigidEntity.control_dofs_position``...), so that rl8 and rsl_rl train on one
real Genesis env.

The task: the Go2's URDF from Genesis' assets on a plane, 12 joints under PD control (targets =
default pose + 0.25 * action), 50 control steps per simulated second. The reward, per second of
simulated time (each term is weighted and multiplied by the step's duration): tracking the
commanded forward speed (``exp(-error^2 / 0.25)``), tracking a zero yaw rate, and penalties on
vertical speed, base height away from 0.3 m, action changes and joints away from the default
pose. An episode ends when the base rolls or pitches more than 10 degrees (terminated) or after
``episode_seconds`` (a time-out, ``extras["time_outs"]``); finished envs restart inside ``step``,
as in Genesis' example and Isaac Lab. Observations (45 values): base angular velocity, gravity in
the base frame, the command, joint positions (from the default pose) and velocities, the last
action; one group, ``"policy"``, as a TensorDict (what rsl_rl 5 reads).

Genesis must be initialised (``gs.init(backend=gs.cpu)``) before the env is built.
"""

from __future__ import annotations

import math

import genesis as gs
import torch
from genesis.utils.geom import inv_quat, quat_to_xyz, transform_by_quat
from tensordict import TensorDict

#: The actuated joints, in the order of the actions and observations.
JOINTS = tuple(
    f"{leg}_{part}_joint" for leg in ("FR", "FL", "RR", "RL") for part in ("hip", "thigh", "calf")
)
#: The standing pose (radians): hips straight, thighs 0.8 (front) and 1.0 (rear), calves -1.5.
DEFAULT_POSE = tuple(
    {"hip": 0.0, "thigh": 0.8 if name.startswith("F") else 1.0, "calf": -1.5}[name.split("_")[1]]
    for name in JOINTS
)
#: Reward weights per second of simulated time.
REWARD_WEIGHTS = {
    "forward_speed": 1.0,
    "yaw_rate": 0.2,
    "vertical_speed": -1.0,
    "base_height": -50.0,
    "action_rate": -0.005,
    "pose": -0.1,
}


class Go2Walk:
    """The Go2 walking task on ``num_envs`` envs (see the module docstring).

    Args:
        num_envs: Envs simulated together.
        episode_seconds: Simulated seconds before a time-out.
        forward_speed: The commanded forward speed, m/s.
        dt: Seconds of simulated time per control step (two physics substeps each).

    Attributes:
        cfg: The arguments above and :data:`REWARD_WEIGHTS`, as a dict: rsl_rl 5's ``VecEnv``
            has a ``cfg``, which its ``OnPolicyRunner`` hands to its logger.
    """

    num_actions = len(JOINTS)

    def __init__(
        self,
        num_envs: int,
        *,
        episode_seconds: float = 20.0,
        forward_speed: float = 0.5,
        dt: float = 0.02,
    ) -> None:
        self.num_envs, self.dt, self.device = num_envs, dt, gs.device
        self.cfg = {
            "num_envs": num_envs,
            "episode_seconds": episode_seconds,
            "forward_speed": forward_speed,
            "dt": dt,
            "reward_weights": dict(REWARD_WEIGHTS),
        }
        self.max_episode_length = math.ceil(episode_seconds / dt)
        self.scene = gs.Scene(
            sim_options=gs.options.SimOptions(dt=dt, substeps=2),
            rigid_options=gs.options.RigidOptions(enable_self_collision=False, max_collision_pairs=20),
            show_viewer=False,
        )
        self.scene.add_entity(gs.morphs.URDF(file="urdf/plane/plane.urdf", fixed=True))
        self.robot = self.scene.add_entity(
            gs.morphs.URDF(
                file="urdf/go2/urdf/go2.urdf", pos=(0.0, 0.0, 0.42), quat=(1.0, 0.0, 0.0, 0.0)
            )
        )
        self.scene.build(n_envs=num_envs)
        self.dofs = [self.robot.get_joint(name).dof_start for name in JOINTS]
        self.robot.set_dofs_kp([20.0] * self.num_actions, self.dofs)
        self.robot.set_dofs_kv([0.5] * self.num_actions, self.dofs)

        def tensor(values) -> torch.Tensor:
            return torch.tensor(values, dtype=gs.tc_float, device=self.device)

        self.default_pose = tensor(DEFAULT_POSE)
        self.start_pos, self.start_quat = tensor([0.0, 0.0, 0.42]), tensor([1.0, 0.0, 0.0, 0.0])
        self.gravity = tensor([0.0, 0.0, -1.0])
        self.command = tensor([forward_speed, 0.0, 0.0]).expand(num_envs, 3)
        self.episode_length_buf = torch.zeros(num_envs, dtype=gs.tc_int, device=self.device)
        self.actions = torch.zeros(num_envs, self.num_actions, dtype=gs.tc_float, device=self.device)
        self.last_actions = torch.zeros_like(self.actions)
        self.extras: dict = {}
        self.reset()

    def _restart(self, envs: torch.Tensor) -> None:
        """Put the envs ``envs`` (``[K]`` int64) back at the start pose, standing still."""
        self.robot.set_pos(self.start_pos.expand(len(envs), 3), envs_idx=envs, zero_velocity=True)
        self.robot.set_quat(self.start_quat.expand(len(envs), 4), envs_idx=envs, zero_velocity=True)
        self.robot.set_dofs_position(
            self.default_pose.expand(len(envs), self.num_actions),
            self.dofs,
            envs_idx=envs,
            zero_velocity=True,
        )
        self.episode_length_buf[envs] = 0
        self.actions[envs] = 0.0
        self.last_actions[envs] = 0.0

    def _read_state(self) -> None:
        """The robot's state in the base frame, for the rewards and observations."""
        to_base = inv_quat(self.robot.get_quat())
        self.base_lin_vel = transform_by_quat(self.robot.get_vel(), to_base)
        self.base_ang_vel = transform_by_quat(self.robot.get_ang(), to_base)
        self.projected_gravity = transform_by_quat(self.gravity.expand(self.num_envs, 3), to_base)
        self.base_height = self.robot.get_pos()[:, 2]
        self.roll_pitch = quat_to_xyz(self.robot.get_quat(), rpy=True, degrees=True)[:, :2]
        self.joint_pos = self.robot.get_dofs_position(self.dofs)
        self.joint_vel = self.robot.get_dofs_velocity(self.dofs)

    def get_observations(self) -> TensorDict:
        """The observation group ``"policy"``, ``[num_envs, 45]``."""
        obs = torch.cat(
            [
                self.base_ang_vel * 0.25,
                self.projected_gravity,
                self.command * torch.tensor([2.0, 2.0, 0.25], device=self.device),
                self.joint_pos - self.default_pose,
                self.joint_vel * 0.05,
                self.actions,
            ],
            dim=1,
        )
        return TensorDict({"policy": obs}, batch_size=[self.num_envs])

    def reset(self) -> tuple[TensorDict, dict]:
        """Restart every env; its observations and (empty) extras."""
        self._restart(torch.arange(self.num_envs, device=self.device))
        self._read_state()
        return self.get_observations(), {}

    def _rewards(self) -> torch.Tensor:
        terms = {
            "forward_speed": torch.exp(
                -(self.command[:, :2] - self.base_lin_vel[:, :2]).square().sum(1) / 0.25
            ),
            "yaw_rate": torch.exp(-(self.command[:, 2] - self.base_ang_vel[:, 2]).square() / 0.25),
            "vertical_speed": self.base_lin_vel[:, 2].square(),
            "base_height": (self.base_height - 0.3).square(),
            "action_rate": (self.actions - self.last_actions).square().sum(1),
            "pose": (self.joint_pos - self.default_pose).abs().sum(1),
        }
        return sum(REWARD_WEIGHTS[name] * self.dt * value for name, value in terms.items())

    def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
        """Apply ``actions`` (``[num_envs, 12]``) as joint targets, simulate one control step,
        restart the envs that finished; ``(observations, rewards, dones, extras)``."""
        self.last_actions = self.actions
        self.actions = actions.clamp(-100.0, 100.0)
        self.robot.control_dofs_position(self.default_pose + 0.25 * self.actions, self.dofs)
        self.scene.step()
        self.episode_length_buf += 1
        self._read_state()
        rewards = self._rewards()
        time_outs = self.episode_length_buf >= self.max_episode_length
        fell = (self.roll_pitch.abs() > 10.0).any(1)
        dones = time_outs | fell
        finished = dones.nonzero().view(-1)
        if len(finished):
            self._restart(finished)
            self._read_state()
        self.extras = {"time_outs": time_outs & ~fell}
        return self.get_observations(), rewards, dones, self.extras
