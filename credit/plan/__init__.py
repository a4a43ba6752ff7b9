"""`credit plan`: per-rank memory and communication of every parallel layout of a config on
N GPUs, from a trace of the real model and step under fake tensors and a fake process group."""

from credit.plan.cli import main
from credit.plan.report import Layout, Row, layouts, plan_rows, render
from credit.plan.shapes import SampleShapes, sample_shapes
from credit.plan.trace import StepTrace, trace_step

__all__ = ["Layout", "Row", "SampleShapes", "StepTrace", "layouts", "main", "plan_rows", "render",
           "sample_shapes", "trace_step"]
