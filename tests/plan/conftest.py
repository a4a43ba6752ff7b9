import sys
from pathlib import Path

# the multi-rank launcher every distributed test uses
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))
