"""Recurrent models: models that carry a hidden state from one env step to the next,
``params, values, state = model(obs, state, firsts)`` (``docs/recurrent.md``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn

from rl8.fields import check_int
from rl8.policies.encoders import ObservationEncoder, has_image
from rl8.policies.groups import group_space, resolve_obs_groups
from rl8.policies.models import (
    ACTIVATIONS,
    Model,
    check_widths,
    flat_observation_size,
    flatten_observation,
    initial_log_std,
    lookup,
    make_linear,
    make_mlp,
)

__all__ = ["RecurrentModel", "LSTMModel", "GRUModel"]


class RecurrentModel(Model):
    """Base class of recurrent models: ``(obs, state, firsts) -> (params, values, state)``.

    Subclasses implement :meth:`initial_state` and :meth:`forward` (and maybe :meth:`value`)
    under the contract of ``docs/recurrent.md``: the state is a TensorDict ``[B]``, and a
    sequence in one call gives the same outputs as step by step. Arguments as of :class:`Model`.
    """

    recurrent: ClassVar[bool] = True

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> TensorDict:
        """The state before the first step of an episode on ``device``, a TensorDict
        ``[batch_size]`` (one row per env)."""
        raise NotImplementedError

    def forward(
        self,
        obs: Tensor | TensorDictBase,
        state: TensorDictBase,  # type: ignore[override]
        firsts: Tensor,
    ) -> tuple[Tensor, Tensor, TensorDict]:
        """Run ``T`` steps for ``B`` envs: distribution parameters ``[B, T, P]``, values
        ``[B, T]`` and the state after the last step.

        Args:
            obs: Observations ``[B, T, *obs_shape]`` (a TensorDict ``[B, T]`` for ``Dict``).
            state: TensorDict ``[B]``: the state before step 0 of the sequence.
            firsts: bool ``[B, T]``, True where the state is reset right before that step.
        """
        raise NotImplementedError

    def value(
        self,
        obs: Tensor | TensorDictBase,
        state: TensorDictBase,  # type: ignore[override]
        firsts: Tensor,
    ) -> Tensor:
        """Values ``[B, T]`` of a sequence (same arguments as :meth:`forward`)."""
        return self(obs, state, firsts)[1]


class _RNNModel(RecurrentModel):
    """Shared body of :class:`LSTMModel` and :class:`GRUModel`: MLP encoder -> RNN -> heads."""

    _rnn_cls: ClassVar[type[nn.RNNBase]]
    _state_keys: ClassVar[tuple[str, ...]]

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        distribution_cls: type,
        /,
        *,
        hidden_size: int = 128,
        num_layers: int = 1,
        encoder_hiddens: Sequence[int] = (64,),
        activation: str | type[nn.Module] = "tanh",
        state_dependent_std: bool = False,
        init_log_std: float | None = None,
        init_noise_std: float | None = None,
        ortho_init: bool = True,
        encoder: str | type[nn.Module] | None = None,
        encoder_config: dict[str, Any] | None = None,
        image_layout: str | None = None,
        image_keys: dict[str, str] | None = None,
        obs_groups: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        hidden_size = check_int("model_config hidden_size", hidden_size, 1)
        num_layers = check_int("model_config num_layers", num_layers, 1)
        encoder_hiddens = check_widths("model_config encoder_hiddens", encoder_hiddens)
        super().__init__(
            observation_space,
            action_space,
            distribution_cls,
            hidden_size=hidden_size,
            num_layers=num_layers,
            encoder_hiddens=encoder_hiddens,
            activation=activation,
            state_dependent_std=state_dependent_std,
            init_log_std=init_log_std,
            init_noise_std=init_noise_std,
            ortho_init=ortho_init,
            encoder=encoder,
            encoder_config=dict(encoder_config or {}),
            image_layout=image_layout,
            image_keys=dict(image_keys or {}),
            obs_groups=obs_groups,
        )
        groups = resolve_obs_groups(observation_space, obs_groups)
        if groups["actor"] != groups["critic"]:
            raise ValueError(
                f"model_config obs_groups: {type(self).__name__} runs one network for the actor and the critic, "
                f"so both must read the same groups, got actor {groups['actor']} and critic {groups['critic']}; "
                f"give obs_groups={{'actor': [...], 'critic': [...]}} with the same lists, or use MLPModel"
            )
        self.actor_groups = groups["actor"]
        # the observation the network reads: the actor's groups, in their order
        observation_space = self.input_space = group_space(observation_space, self.actor_groups)
        act = lookup("activation", ACTIVATIONS, activation)
        head_size = self.init_policy_head(
            state_dependent_std, initial_log_std(init_log_std, init_noise_std)
        )
        # images (or encoder="nature"/"impala"): a convolutional encoder before the MLP encoder
        images = has_image(observation_space, image_layout) or bool(image_keys)
        if encoder is not None and not images:
            raise ValueError(
                f"model_config encoder: {encoder!r} encodes images, but the observation space has none "
                f"({observation_space}); declare float images with image_layout or image_keys"
            )
        self.image_encoder = (
            ObservationEncoder(
                observation_space,
                encoder=encoder or "nature",
                encoder_config=encoder_config,
                image_layout=image_layout,
                image_keys=image_keys,
                activation=activation,
            )
            if images
            else None
        )
        sizes = [
            self.image_encoder.features if images else flat_observation_size(observation_space),
            *encoder_hiddens,
        ]
        self.encoder = nn.Sequential(*make_mlp(sizes, act, ortho_init))
        self.rnn = self._rnn_cls(sizes[-1], hidden_size, num_layers, batch_first=True)
        for name, param in self.rnn.named_parameters() if ortho_init else ():
            (nn.init.orthogonal_ if name.startswith("weight") else nn.init.zeros_)(param)
        self.pi = make_linear(hidden_size, head_size, 0.01, ortho_init)
        self.vf = make_linear(hidden_size, 1, 1.0, ortho_init)

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> TensorDict:
        shape = (batch_size, self.rnn.num_layers, self.rnn.hidden_size)
        zeros = {k: torch.zeros(shape, dtype=torch.float32, device=device) for k in self._state_keys}
        return TensorDict(zeros, batch_size=[batch_size], device=device)

    def _encode(self, obs: Tensor | TensorDictBase) -> Tensor:
        b, t = obs.shape[:2]
        flat = (
            obs.reshape(b * t) if isinstance(obs, TensorDictBase) else obs.reshape(b * t, *obs.shape[2:])
        )
        x = self.encoder(
            flatten_observation(flat, self.input_space)
            if self.image_encoder is None
            else self.image_encoder(flat)
        )
        return x.reshape(b, t, x.shape[-1])

    def _run(
        self, x: Tensor, state: TensorDictBase, firsts: Tensor, starts: Sequence[int]
    ) -> tuple[Tensor, TensorDict]:
        """Run the RNN over ``x`` ``[B, T, F]`` in segments beginning at ``starts`` (0 first;
        every step where a row has ``firsts`` must begin one), one RNN call each, resetting the
        state of those rows at the segment start."""
        bounds = [*starts, x.shape[1]]
        # the state's entries [B, L, H] in the RNN's layout [L, B, H]
        hx = tuple(state.get(k).transpose(0, 1).contiguous() for k in self._state_keys)
        outs = []
        for start, end in zip(bounds[:-1], bounds[1:]):
            keep = (~firsts[:, start]).reshape(1, -1, 1)
            hx = tuple(torch.where(keep, h, torch.zeros((), dtype=h.dtype, device=h.device)) for h in hx)
            out, hx = self.rnn(x[:, start:end], hx if len(hx) > 1 else hx[0])
            hx = hx if isinstance(hx, tuple) else (hx,)
            outs.append(out)
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
        # back to [B, L, H], in the incoming dtype (autocast may return bfloat16/float16 states)
        entries = {k: h.transpose(0, 1).to(state.get(k).dtype) for k, h in zip(self._state_keys, hx)}
        return y, TensorDict(entries, batch_size=[hx[0].shape[1]], device=hx[0].device)

    def forward(
        self,
        obs: Tensor | TensorDictBase,
        state: TensorDictBase,  # type: ignore[override]
        firsts: Tensor,
    ) -> tuple[Tensor, Tensor, TensorDict]:
        b, t = firsts.shape
        if tuple(obs.shape[:2]) != (b, t) or tuple(state.batch_size) != (b,):
            raise ValueError(
                f"{type(self).__name__}: expected obs [B, T, ...], state [B] and firsts [B, T] with the "
                f"same B and T, got obs {tuple(obs.shape)}, state {tuple(state.batch_size)}, "
                f"firsts {tuple(firsts.shape)}"
            )
        # Segments begin at the steps where any row starts an episode: one host sync, none for
        # one step (collection); no start inside (usual for long episodes) is one RNN call.
        starts = (
            [0] if t == 1 else [0, *(i + 1 for i in firsts[:, 1:].any(0).nonzero().flatten().tolist())]
        )
        y, new_state = self._run(self._encode(obs), state, firsts, starts)
        return self.distribution_params(self.pi(y)), self.vf(y).squeeze(-1), new_state


_ARGS_DOC = """
    ``observation_space``, ``action_space``, ``distribution_cls``: as for :class:`~rl8.policies.models.Model`;
    ``state_dependent_std``, ``init_log_std``, ``init_noise_std``: as for
    :class:`~rl8.policies.models.MLPModel`; ``encoder_config``, ``image_layout``, ``image_keys``: as
    for :class:`~rl8.policies.encoders.CNNModel`.

    Args:
        hidden_size: Width ``H`` of the recurrent state (>= 1).
        num_layers: Number of stacked recurrent layers ``L`` (>= 1).
        encoder_hiddens: Widths of the MLP encoder before the recurrent layers (``()``: none).
        activation: Activation of the encoder: a name of ``ACTIVATIONS`` or an ``nn.Module`` class.
        ortho_init: Orthogonal initialisation with zero biases: gain sqrt(2) for the encoder,
            1 for the recurrent weights, 0.01 for the policy head and 1 for the value head.
        encoder: A convolutional encoder before ``encoder_hiddens``, as for
            :class:`~rl8.policies.encoders.CNNModel`; ``None``: ``"nature"`` for image
            observations (and ``Dict`` ones with an image), none for others.
        obs_groups: The groups (keys of a ``Dict`` observation) the network reads, in order, as
            ``{"actor": [...], "critic": [...]}`` with the same lists (one network serves both);
            ``None``: rsl_rl 5's fallbacks (:func:`rl8.policies.groups.resolve_obs_groups`), an
            error where they differ.
"""


class LSTMModel(_RNNModel):
    __doc__ = (
        """An MLP encoder, an ``nn.LSTM`` and linear policy and value heads on its output; the
    state is ``{"h": [B, L, H], "c": [B, L, H]}`` (batch first).
"""
        + _ARGS_DOC
    )

    _rnn_cls = nn.LSTM
    _state_keys = ("h", "c")


class GRUModel(_RNNModel):
    __doc__ = (
        """An MLP encoder, an ``nn.GRU`` and linear policy and value heads on its output; the
    state is ``{"h": [B, L, H]}`` (batch first).
"""
        + _ARGS_DOC
    )

    _rnn_cls = nn.GRU
    _state_keys = ("h",)
