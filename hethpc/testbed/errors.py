"""Errors raised by hethpc.testbed."""

from __future__ import annotations


class TestbedError(RuntimeError):
    """The testbed cannot be brought up, used or taken down; the message says why and the fix."""

    __test__ = False  # not a pytest test class


class SpecError(ValueError):
    """A node description cannot be parsed or is out of range."""
