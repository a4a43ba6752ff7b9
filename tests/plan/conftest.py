import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# the multi-rank launcher every distributed test uses; the step measurement of benchmarks/plan_accuracy.py
sys.path.insert(0, str(TESTS / "parallel"))
sys.path.insert(0, str(TESTS.parent / "benchmarks"))
