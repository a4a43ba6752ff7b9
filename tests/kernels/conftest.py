import sys
from pathlib import Path

# gemm_checks.py is shared with the triton-interpreter subprocess.
sys.path.insert(0, str(Path(__file__).parent))
