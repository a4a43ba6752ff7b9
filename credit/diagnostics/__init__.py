"""Silent-data-corruption detection in the training step, and the standalone probe job."""

from credit.diagnostics.detector import SDC_COLUMNS, SDCDetector, SDCError, StepReport
from credit.diagnostics.verdict import Mismatch

__all__ = ["SDC_COLUMNS", "Mismatch", "SDCDetector", "SDCError", "StepReport"]
