"""CREDIT's post blocks: the tracer fixer and the global mass, water and energy fixers,
with CREDIT's arithmetic (`fixers`), the channels and statistics CREDIT's parser derives
from a config (`settings`), and the grid and column physics they use (`physics`)."""

from credit.models.postblocks.fixers import PostBlocks, WithPostBlocks, build_post_blocks
from credit.models.postblocks.settings import PostBlockConfigError

__all__ = ["PostBlockConfigError", "PostBlocks", "WithPostBlocks", "build_post_blocks"]
