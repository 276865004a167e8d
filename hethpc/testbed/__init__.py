"""A heterogeneous cluster on one host, enforced by the kernel (root, Linux).

Nodes are network namespaces on a bridge with links shaped by ``tc`` and CPU capped by cgroup
quotas; ``mpirun`` (and SLURM) launch across them as across real nodes. See ``docs/testbed.md``.
"""

from __future__ import annotations

from hethpc.testbed.bed import Testbed
from hethpc.testbed.errors import SpecError, TestbedError
from hethpc.testbed.spec import NodeSpec, load_nodes

__all__ = ["NodeSpec", "SpecError", "Testbed", "TestbedError", "load_nodes"]

# Not public: the command (hethpc-testbed) imports it from here.
from hethpc.testbed.bed import running  # noqa: F401
