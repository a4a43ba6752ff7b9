"""The one exception type of a rollout that is not a config, data or file-existence error."""


class RolloutError(ValueError):
    """A checkpoint or an init time cannot serve this rollout (one line naming what and why)."""
