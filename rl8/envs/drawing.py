"""Tiny numpy drawing helpers for the built-in envs' ``render``: in place on an ``uint8``
``[height, width, 3]`` image, in pixels from the top-left corner (``y`` down), clipped."""

from __future__ import annotations

import numpy as np

Color = tuple[int, int, int]


def canvas(height: int, width: int, color: Color = (255, 255, 255)) -> np.ndarray:
    """A new ``uint8`` RGB image of ``height`` x ``width`` pixels filled with ``color``."""
    return np.full((height, width, 3), color, dtype=np.uint8)


def fill_rect(img: np.ndarray, x0: float, y0: float, x1: float, y1: float, color: Color) -> None:
    """Fill the axis-aligned rectangle with corners ``(x0, y0)`` and ``(x1, y1)`` (pixels)."""
    h, w = img.shape[:2]
    c0, r0 = max(int(round(min(x0, x1))), 0), max(int(round(min(y0, y1))), 0)
    c1, r1 = min(int(round(max(x0, x1))), w), min(int(round(max(y0, y1))), h)
    if c0 < c1 and r0 < r1:
        img[r0:r1, c0:c1] = color


def draw_line(
    img: np.ndarray, x0: float, y0: float, x1: float, y1: float, width: float, color: Color
) -> None:
    """Draw a segment from ``(x0, y0)`` to ``(x1, y1)`` that is ``width`` pixels thick."""
    half = width / 2.0
    h, w = img.shape[:2]
    c0 = max(int(np.floor(min(x0, x1) - half)), 0)
    r0 = max(int(np.floor(min(y0, y1) - half)), 0)
    c1 = min(int(np.ceil(max(x0, x1) + half)) + 1, w)
    r1 = min(int(np.ceil(max(y0, y1) + half)) + 1, h)
    if c0 >= c1 or r0 >= r1:
        return
    ys, xs = np.mgrid[r0:r1, c0:c1].astype(np.float64) + 0.5
    dx, dy = x1 - x0, y1 - y0
    length2 = dx * dx + dy * dy
    # where along the segment each pixel's nearest point is, in [0, 1] (0 for a point)
    t = np.clip(((xs - x0) * dx + (ys - y0) * dy) / (length2 or 1.0), 0.0, 1.0)
    dist2 = (xs - (x0 + t * dx)) ** 2 + (ys - (y0 + t * dy)) ** 2
    img[r0:r1, c0:c1][dist2 <= half * half] = color


def fill_circle(img: np.ndarray, cx: float, cy: float, radius: float, color: Color) -> None:
    """Fill the disc of ``radius`` pixels centred at ``(cx, cy)``."""
    draw_line(img, cx, cy, cx, cy, 2.0 * radius, color)
