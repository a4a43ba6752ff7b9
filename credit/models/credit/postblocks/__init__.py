"""CREDIT's post blocks: the tracer fixer and the global mass, water and energy fixers,
with CREDIT's arithmetic (`fixers`), the channels and statistics CREDIT's parser derives
from a config (`settings`), the grid and column physics they use (`physics`), and their
construction from a CREDIT config or a run's config (`build`)."""

from credit.models.credit.postblocks.build import RunPostBlocks, build_post_blocks, run_post_blocks
from credit.models.credit.postblocks.fixers import OutsidePostBlocks, PostBlocks
from credit.models.credit.postblocks.settings import PostBlockConfigError

__all__ = ["OutsidePostBlocks", "PostBlockConfigError", "PostBlocks", "RunPostBlocks", "build_post_blocks",
           "run_post_blocks"]
