"""Logging: rank 0 speaks, other ranks warn with a prefix, and the handler follows sys.stdout."""

import io
import logging
import sys

import pytest

from credit.logs import configure_logging


@pytest.fixture
def restore_logging():
    root = logging.getLogger()
    handlers, level, stdout = root.handlers[:], root.level, sys.stdout
    yield
    root.handlers[:], sys.stdout = handlers, stdout
    root.setLevel(level)


def test_rank_zero_informs_and_other_ranks_warn_with_a_prefix(restore_logging):
    sys.stdout = buffer = io.StringIO()
    configure_logging(rank=0)
    logging.getLogger("credit.test").info("zero speaks")
    configure_logging(rank=3)
    logging.getLogger("credit.test").info("three is quiet")
    logging.getLogger("credit.test").warning("three warns")
    assert buffer.getvalue().splitlines() == ["zero speaks", "rank 3: three warns"]


def test_a_swapped_and_closed_stdout_leaves_no_handler_on_a_closed_file(restore_logging):
    sys.stdout = first = io.StringIO()
    configure_logging()
    first.close()  # what a test's capture does to the stream it replaced
    sys.stdout = second = io.StringIO()
    logging.getLogger("credit.test").info("after the swap")
    assert second.getvalue() == "after the swap\n"
