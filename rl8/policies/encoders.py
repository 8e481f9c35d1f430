"""Image observations and the networks that encode them: convolutional encoders, and models
built on them for image (``CNNModel``) and mixed ``Dict`` (``MultiInputModel``) observations.
``uint8`` images stay ``uint8`` up to the encoders, which scale them to ``[0, 1]``
(``docs/pixels.md``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from tensordict import TensorDictBase
from torch import nn

from rl8.fields import check_int
from rl8.policies.models import (
    ACTIVATIONS,
    MLPModel,
    Model,
    check_widths,
    flat_observation_size,
    flatten_observation,
    lookup,
    make_linear,
    make_mlp,
)

__all__ = [
    "ENCODERS",
    "CNNModel",
    "ImageEncoder",
    "ImpalaCNN",
    "MultiInputModel",
    "NatureCNN",
    "ObservationEncoder",
    "default_model_cls",
    "has_image",
    "image_layout",
    "image_shape",
]

LAYOUTS = ("HWC", "CHW")


def image_layout(space: spaces.Space, declared: str | None = None) -> str | None:
    """The layout, ``"HWC"`` or ``"CHW"``, of the space of one observation ``space`` when it is an
    image, else ``None``: a ``uint8`` Box ``[H, W]`` (``"HWC"``) or ``[A, B, C]`` (``"CHW"`` when
    ``A < C``, else ``"HWC"``), or a 3-dimensional Box of any dtype that ``declared`` (``"HWC"`` or
    ``"CHW"``; ``None``: detect ``uint8`` images only) declares an image of that layout."""
    if declared is not None:
        if declared not in LAYOUTS:
            raise ValueError(
                f"model_config image_layout: expected one of {list(LAYOUTS)} or None, got {declared!r}"
            )
        if not isinstance(space, spaces.Box) or len(space.shape) != 3:
            raise ValueError(
                f"model_config image_layout: expected a 3-dimensional Box observation to declare an image, got {space}"
            )
        return declared
    if not isinstance(space, spaces.Box) or space.dtype != np.uint8 or len(space.shape) not in (2, 3):
        return None
    return "CHW" if len(space.shape) == 3 and space.shape[0] < space.shape[-1] else "HWC"


_layout_of = image_layout  # for scopes where a parameter named image_layout hides the function


def image_shape(space: spaces.Box, layout: str) -> tuple[int, int, int]:
    """``(channels, height, width)`` of one image of the Box ``space`` in ``layout`` (HWC or CHW)."""
    shape = tuple(space.shape)
    if len(shape) == 2:
        return 1, shape[0], shape[1]
    return shape if layout == "CHW" else (shape[2], shape[0], shape[1])


def has_image(space: spaces.Space, declared: str | None = None) -> bool:
    """Whether ``space`` is an image or a ``Dict`` with an image entry (:func:`image_layout`;
    ``declared`` applies to a non-``Dict`` space)."""
    if isinstance(space, spaces.Dict):
        return any(image_layout(s) is not None for s in space.spaces.values())
    return image_layout(space, declared) is not None


def _ints(name: str, value: Any) -> tuple[int, ...]:
    return check_widths(f"encoder_config {name}", value, non_empty=True)


def _conv(
    in_channels: int, out_channels: int, kernel_size: int, stride: int, padding: int = 0
) -> nn.Conv2d:
    """A convolution with orthogonal weights of gain sqrt(2) and zero biases (CleanRL's init)."""
    conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding)
    nn.init.orthogonal_(conv.weight, math.sqrt(2))
    nn.init.zeros_(conv.bias)
    return conv


class NatureCNN(nn.Module):
    """The Nature-DQN convolutional encoder: float images ``[B, in_channels, height, width]``
    (pixels) -> ``[B, features]``, a ReLU after every layer.

    Args:
        channels: Output channels of each convolution.
        kernel_sizes: Kernel size of each convolution, in pixels.
        strides: Stride of each convolution, in pixels.
        features: Width of the linear layer after the convolutions (the encoder's output).
    """

    def __init__(
        self,
        in_channels: int,
        height: int,
        width: int,
        *,
        channels: Sequence[int] = (32, 64, 64),
        kernel_sizes: Sequence[int] = (8, 4, 3),
        strides: Sequence[int] = (4, 2, 1),
        features: int = 512,
    ) -> None:
        super().__init__()
        channels, kernel_sizes, strides = (
            _ints("channels", channels),
            _ints("kernel_sizes", kernel_sizes),
            _ints("strides", strides),
        )
        features = check_int("encoder_config features", features, 1)
        if not len(channels) == len(kernel_sizes) == len(strides):
            raise ValueError(
                f"encoder_config channels, kernel_sizes, strides: expected lists of one length, got "
                f"{list(channels)}, {list(kernel_sizes)}, {list(strides)}"
            )
        layers: list[nn.Module] = []
        c, h, w = in_channels, height, width
        sizes = [(h, w)]
        for out, k, s in zip(channels, kernel_sizes, strides):
            h, w = (h - k) // s + 1, (w - k) // s + 1
            sizes.append((h, w))
            if h < 1 or w < 1:
                raise ValueError(
                    f"encoder_config kernel_sizes, strides: a {height}x{width} image is too small for "
                    f"kernels {list(kernel_sizes)} with strides {list(strides)} (sizes after each layer: {sizes}); "
                    "use smaller kernels or strides"
                )
            layers += [_conv(c, out, k, s), nn.ReLU()]
            c = out
        self.convs = nn.Sequential(*layers)
        self.linear = make_linear(c * h * w, features, math.sqrt(2), True)
        self.features = features

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.relu(self.linear(self.convs(images).flatten(1)))


class _ResidualBlock(nn.Module):
    """``x + conv(relu(conv(relu(x))))`` with 3x3 convolutions that keep the shape."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = _conv(channels, channels, 3, 1, 1)
        self.conv1 = _conv(channels, channels, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaCNN(nn.Module):
    """The IMPALA ResNet encoder: float images ``[B, in_channels, height, width]`` (pixels) ->
    ``[B, features]``.

    Args:
        channels: Channels of each stack (a 3x3 convolution, a 3x3 max-pool of stride 2 that
            halves the size, rounding up, and two residual blocks).
        features: Width of the linear layer after the stacks (the encoder's output).
    """

    def __init__(
        self,
        in_channels: int,
        height: int,
        width: int,
        *,
        channels: Sequence[int] = (16, 32, 32),
        features: int = 256,
    ) -> None:
        super().__init__()
        channels = _ints("channels", channels)
        features = check_int("encoder_config features", features, 1)
        stacks: list[nn.Module] = []
        c, h, w = in_channels, height, width
        for out in channels:
            stacks.append(
                nn.Sequential(
                    _conv(c, out, 3, 1, 1),
                    nn.MaxPool2d(3, 2, padding=1),
                    _ResidualBlock(out),
                    _ResidualBlock(out),
                )
            )
            c, h, w = out, (h + 1) // 2, (w + 1) // 2
        self.stacks = nn.Sequential(*stacks)
        self.linear = make_linear(c * h * w, features, math.sqrt(2), True)
        self.features = features

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.relu(self.linear(F.relu(self.stacks(images)).flatten(1)))


#: Encoder names of ``model_config["encoder"]`` and their classes.
ENCODERS: dict[str, type[nn.Module]] = {"nature": NatureCNN, "impala": ImpalaCNN}


class ImageEncoder(nn.Module):
    """Images ``[B, *space.shape]`` in, features out: layout to ``[B, C, H, W]``, ``uint8``
    scaled to ``[0, 1]`` (float inputs as they are), then a convolutional encoder.

    Args:
        space: The image Box (see :func:`image_layout`).
        layout: ``"HWC"`` or ``"CHW"``; ``None``: detected.
        encoder: ``"nature"``, ``"impala"``, or an ``nn.Module`` class called as
            ``cls(in_channels, height, width, **encoder_config)`` with a ``features`` attribute.
        encoder_config: Keyword arguments of the encoder.
    """

    def __init__(
        self,
        space: spaces.Box,
        layout: str | None = None,
        encoder: str | type[nn.Module] = "nature",
        encoder_config: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        found = image_layout(space, layout)
        if found is None:
            raise ValueError(
                f"ImageEncoder: expected an image space (a uint8 Box [H, W, C] or [C, H, W]), got {space}"
            )
        self.layout = found
        self.ndim = len(space.shape)
        c, h, w = image_shape(space, found)
        try:
            self.cnn = lookup("encoder", ENCODERS, encoder)(c, h, w, **dict(encoder_config or {}))
        except TypeError as err:
            raise ValueError(
                f"model_config encoder_config: {dict(encoder_config or {})!r} refused by {encoder!r} ({err})"
            ) from err
        self.features = int(self.cnn.features)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        # float inputs (declared float images, or normalised ones) are used as they are
        x = images.float().mul_(1.0 / 255.0) if images.dtype == torch.uint8 else images.float()
        if self.ndim == 2:
            x = x.unsqueeze(1)
        elif self.layout == "HWC":
            x = x.permute(0, 3, 1, 2)
        return self.cnn(x)


class ObservationEncoder(nn.Module):
    """Any observation to features ``[B, features]``: an :class:`ImageEncoder` per image (entry),
    an MLP per other (flattened) entry, concatenated in key order without ``action_mask``, for
    observations of the ``space``; the other arguments are :class:`CNNModel`'s.
    """

    def __init__(
        self,
        space: spaces.Space,
        *,
        encoder: str | type[nn.Module] = "nature",
        encoder_config: Mapping[str, Any] | None = None,
        image_layout: str | None = None,
        image_keys: Mapping[str, str] | None = None,
        vector_hiddens: Sequence[int] = (64,),
        activation: str | type[nn.Module] = "relu",
    ) -> None:
        super().__init__()
        act = lookup("activation", ACTIVATIONS, activation)
        vector_hiddens = check_widths("model_config vector_hiddens", vector_hiddens)
        image_keys = dict(image_keys or {})
        self.space = space
        self.encoders = nn.ModuleDict()
        self.kinds: dict[str, str] = {}  # "image" or "vector", by key
        entries = space.spaces if isinstance(space, spaces.Dict) else {"obs": space}
        unknown = sorted(set(image_keys) - set(entries))
        if unknown:
            raise ValueError(
                f"model_config image_keys: {unknown} are not keys of the observation space {list(entries)}"
            )
        self.features = 0
        for key, sub in entries.items():
            if key == "action_mask" and isinstance(space, spaces.Dict):
                continue
            declared = image_layout if not isinstance(space, spaces.Dict) else image_keys.get(key)
            self.kinds[key] = "vector" if _layout_of(sub, declared) is None else "image"
            if self.kinds[key] == "image":
                self.encoders[key] = ImageEncoder(sub, declared, encoder, encoder_config)
                self.features += self.encoders[key].features
            else:
                sizes = [flat_observation_size(sub), *vector_hiddens]
                self.encoders[key] = nn.Sequential(*make_mlp(sizes, act, True))
                self.features += sizes[-1]

    def forward(self, obs: torch.Tensor | TensorDictBase) -> torch.Tensor:
        parts = []
        for key, encoder in self.encoders.items():
            x, space = (
                (obs[key], self.space[key]) if isinstance(self.space, spaces.Dict) else (obs, self.space)
            )
            parts.append(
                encoder(x) if self.kinds[key] == "image" else encoder(flatten_observation(x, space))
            )
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)


class CNNModel(Model):
    """A convolutional encoder and linear policy and value heads: the default model for image
    observations (CleanRL's ``ppo_atari``, SB3's ``CnnPolicy``). ``observation_space`` (an image; a
    ``Dict`` for :class:`MultiInputModel`), ``action_space``, ``distribution_cls``: as for
    :class:`~rl8.policies.models.Model`.

    Args:
        encoder: ``"nature"`` (default), ``"impala"``, or an ``nn.Module`` class (see
            :class:`ImageEncoder`).
        encoder_config: Keyword arguments of the encoder (``docs/pixels.md``).
        image_layout: ``"HWC"`` or ``"CHW"`` to declare a float 3-dimensional Box an image.
        image_keys: ``Dict`` observations: the keys of float 3-dimensional Boxes to encode as
            images, mapped to their layout (``{"camera": "HWC"}``); uint8 images are found anyway.
        vector_hiddens: ``Dict`` observations: MLP widths of each non-image entry (``()``: flattened only).
        hiddens: Widths of an MLP between the encoder and the heads (``()``: none).
        activation: Activation of those MLPs.
        shared: One encoder for the policy and the value (default, as CleanRL), else one each.
        state_dependent_std: Gaussian policies: the network outputs the log-std.
        init_log_std: Initial state-independent log-std.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        distribution_cls: type,
        /,
        *,
        encoder: str | type[nn.Module] = "nature",
        encoder_config: Mapping[str, Any] | None = None,
        image_layout: str | None = None,
        image_keys: Mapping[str, str] | None = None,
        vector_hiddens: Sequence[int] = (64,),
        hiddens: Sequence[int] = (),
        activation: str = "relu",
        shared: bool = True,
        state_dependent_std: bool = False,
        init_log_std: float = 0.0,
    ) -> None:
        hiddens = check_widths("model_config hiddens", hiddens)
        super().__init__(
            observation_space,
            action_space,
            distribution_cls,
            encoder=encoder,
            encoder_config=dict(encoder_config or {}),
            image_layout=image_layout,
            image_keys=dict(image_keys or {}),
            vector_hiddens=tuple(vector_hiddens),
            hiddens=hiddens,
            activation=activation,
            shared=shared,
            state_dependent_std=state_dependent_std,
            init_log_std=init_log_std,
        )
        self._check_space(observation_space, image_layout)
        act = lookup("activation", ACTIVATIONS, activation)
        head_size = self.init_policy_head(state_dependent_std, init_log_std)

        def body() -> nn.Sequential:
            enc = ObservationEncoder(
                observation_space,
                encoder=encoder,
                encoder_config=encoder_config,
                image_layout=image_layout,
                image_keys=image_keys,
                vector_hiddens=vector_hiddens,
                activation=activation,
            )
            return nn.Sequential(enc, *make_mlp([enc.features, *hiddens], act, True))

        self.shared = bool(shared)
        self.pi_body = body()
        self.vf_body = None if self.shared else body()
        width = hiddens[-1] if hiddens else self.pi_body[0].features
        self.pi = make_linear(width, head_size, 0.01, True)
        self.vf = make_linear(width, 1, 1.0, True)

    def _check_space(self, space: spaces.Space, layout: str | None) -> None:
        if isinstance(space, spaces.Dict):
            raise TypeError(
                f"{type(self).__name__}: Dict observations go to rl8.policies.encoders.MultiInputModel, got {space}"
            )
        if image_layout(space, layout) is None:
            raise TypeError(
                f"{type(self).__name__}: expected an image observation space (a uint8 Box [H, W, C] or [C, H, W], or a "
                f"float Box declared with model_config image_layout), got {space}"
            )

    def forward(self, obs: torch.Tensor | TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.pi_body(obs)
        hv = h if self.vf_body is None else self.vf_body(obs)
        return self.distribution_params(self.pi(h)), self.vf(hv)[:, 0]

    def value(self, obs: torch.Tensor | TensorDictBase) -> torch.Tensor:
        return self.vf((self.pi_body if self.vf_body is None else self.vf_body)(obs))[:, 0]


class MultiInputModel(CNNModel):
    """:class:`CNNModel` for ``Dict`` observations that mix images and vectors (SB3's
    ``MultiInputPolicy``; see :class:`ObservationEncoder`). Arguments as of :class:`CNNModel`."""

    def _check_space(self, space: spaces.Space, layout: str | None) -> None:
        if not isinstance(space, spaces.Dict):
            raise TypeError(f"MultiInputModel: expected a Dict observation space, got {space}")
        if layout is not None:
            raise ValueError(
                "model_config image_layout: Dict observations declare float images with image_keys"
            )


def default_model_cls(
    observation_space: spaces.Space, model_config: Mapping[str, Any] | None = None
) -> type[Model]:
    """The model a policy gets when none is named, for one observation's ``observation_space``:
    :class:`CNNModel` for an image, :class:`MultiInputModel` for a ``Dict`` with one, else
    :class:`~rl8.policies.models.MLPModel` (``image_layout`` and ``image_keys`` of ``model_config``
    declare images)."""
    config = dict(model_config or {})
    if isinstance(observation_space, spaces.Dict):
        return MultiInputModel if has_image(observation_space) or config.get("image_keys") else MLPModel
    if has_image(observation_space, config.get("image_layout")):
        return CNNModel
    return MLPModel
