"""``karios demo`` and the fabric lab it shares with the tests.

- :mod:`~karios.cli.demo.command`: the ``karios demo [--fabric]`` verb (``karios up`` plus the
  emulated BMCs of :mod:`~karios.cli.demo.bmc` and, with ``--fabric``, the lab);
- the lab, stdlib only (``tests/lab/fabric_lab.py`` and its self-test import it with a bare
  ``python3``, so nothing here may import a third-party package): :mod:`~karios.cli.demo.lab`
  (:class:`FabricLab`, the orchestration) over :mod:`~karios.cli.demo.topology` (addresses,
  :class:`LabNode`), :mod:`~karios.cli.demo.netns` (namespaces and links),
  :mod:`~karios.cli.demo.nodes` (keys, sshd per node), :mod:`~karios.cli.demo.route_reflector`,
  :mod:`~karios.cli.demo.packages` (Debian packages, root) and :mod:`~karios.cli.demo.host`;
- what the demo does with a started lab: :mod:`~karios.cli.demo.config` (its fabric
  configuration, the worker's settings) and :mod:`~karios.cli.demo.adopt` (adoption through the
  gateway).
"""
