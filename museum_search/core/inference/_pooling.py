"""Global pooling of convolutional feature maps, as pure functions plus a name registry.

Every function takes a feature tensor ``x`` of shape (B, C, H, W) and returns (B, C), *not*
normalized (the caller L2-normalizes the final descriptor). Conventions follow
cnnimageretrieval-pytorch (``layers/functional.py``): MAC = max, GAP/SPoC = mean,
GeM = (mean x^p)^(1/p) with x clamped at eps, R-MAC = sum of L2-normalized MACs over the
regions of Tolias et al. 2016 (L = 3 scales, 40 % overlap).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

__all__ = ["gap", "mac", "gem", "rmac", "rmac_regions", "POOLINGS", "pool", "l2n"]


def gap(x: torch.Tensor) -> torch.Tensor:
    """Global average pooling (SPoC)."""
    return x.mean(dim=(-2, -1))


def mac(x: torch.Tensor) -> torch.Tensor:
    """Maximum activation of convolutions."""
    return x.amax(dim=(-2, -1))


def gem(x: torch.Tensor, p: float = 3.0, eps: float = 1e-6) -> torch.Tensor:
    """Generalized mean pooling (Radenović et al. 2018); p=1 is GAP, p→∞ is MAC."""
    return x.clamp(min=eps).pow(p).mean(dim=(-2, -1)).pow(1.0 / p)


def rmac_regions(h: int, w: int, levels: int = 3, overlap: float = 0.4) -> list[tuple[int, int, int]]:
    """Regions (top, left, side) of R-MAC on an h×w map after cirtorch's ``rmac``: the whole map,
    then at level l squares of side floor(2·min(h,w)/(l+1)), with extra regions along the long
    side chosen so neighbouring regions overlap by about 40 %."""
    short = min(h, w)
    steps = [2, 3, 4, 5, 6, 7]
    b = [(max(h, w) - short) / (s - 1) for s in steps]
    errors = [abs(((short**2 - short * bi) / short**2) - overlap) for bi in b]
    idx = min(range(len(steps)), key=errors.__getitem__)
    wd = idx + 1 if h < w else 0
    hd = idx + 1 if h > w else 0
    regions: list[tuple[int, int, int]] = []
    for level in range(1, levels + 1):
        side = int(math.floor(2 * short / (level + 1)))
        if side == 0:
            continue
        half = math.floor(side / 2 - 1)
        step_w = 0 if level + wd == 1 else (w - side) / (level + wd - 1)
        step_h = 0 if level + hd == 1 else (h - side) / (level + hd - 1)
        lefts = [int(math.floor(half + i * step_w) - half) for i in range(level + wd)]
        tops = [int(math.floor(half + i * step_h) - half) for i in range(level + hd)]
        regions.extend((t, lft, side) for t in tops for lft in lefts)
    return regions


def rmac(x: torch.Tensor, levels: int = 3, eps: float = 1e-6) -> torch.Tensor:
    """Regional MAC: L2-normalized MAC of the whole map plus of every region, summed."""
    _, _, h, w = x.shape
    v = x.amax(dim=(-2, -1))
    out = v / (v.norm(dim=1, keepdim=True) + eps)
    for top, left, side in rmac_regions(h, w, levels):
        v = x[:, :, top : top + side, left : left + side].amax(dim=(-2, -1))
        out = out + v / (v.norm(dim=1, keepdim=True) + eps)
    return out


POOLINGS: dict[str, Callable[..., torch.Tensor]] = {"gap": gap, "mac": mac, "gem": gem, "rmac": rmac}


def pool(name: str, x: torch.Tensor, gem_p: float = 3.0) -> torch.Tensor:
    """Apply the pooling called ``name`` (one of :data:`POOLINGS`)."""
    if name == "gem":
        return gem(x, p=gem_p)
    try:
        return POOLINGS[name](x)
    except KeyError:
        raise ValueError(f"unknown pooling {name!r}; choose one of {', '.join(POOLINGS)}") from None


def l2n(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """L2-normalize the rows of ``x``."""
    return F.normalize(x, p=2.0, dim=-1, eps=eps)
