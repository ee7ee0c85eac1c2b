"""Matching a photo's local features against many references with one matrix product a block."""

from __future__ import annotations

from collections.abc import Iterator, Sequence


def gemm_groups(sizes: Sequence[int], todo: Sequence[int], block_cols: int) -> Iterator[list[int]]:
    """The references ``todo`` (indexes into ``sizes``, their keypoint counts) in consecutive groups
    of at most ``block_cols`` keypoints in all (a reference larger than that is a group of its own):
    each group is one product of the photo's descriptors with the group's stacked descriptors."""
    i = 0
    while i < len(todo):
        group = [todo[i]]
        cols = sizes[todo[i]]
        i += 1
        while i < len(todo) and cols + sizes[todo[i]] <= block_cols:
            cols += sizes[todo[i]]
            group.append(todo[i])
            i += 1
        yield group
