"""Deploying a checked pair: ``spectool build`` writes a folder, ``spectool serve`` runs it.

Modules, one concept each: :mod:`~spectool.deploy.decision` (a tune decision as build and serve
read it), :mod:`~spectool.deploy.manifest` (what a build folder records),
:mod:`~spectool.deploy.build` (check and plan a build folder) with
:mod:`~spectool.deploy.limits` (limits fitted to the GPU), :mod:`~spectool.deploy.runtime_gate`
(the decision as the engine's gate), :mod:`~spectool.deploy.render` (the config files),
:mod:`~spectool.deploy.engine_config` (the embedded engine's files, torch-free) and
:mod:`~spectool.deploy.write` (writing it), :mod:`~spectool.deploy.machine` (does this machine
match a build?), :mod:`~spectool.deploy.gate` (the cost gate: serve with speculation or
without), :mod:`~spectool.deploy.launch` (the child command for a build folder) and
:mod:`~spectool.deploy.supervise` (every server child: logs, readiness, signals, no orphans).
"""
