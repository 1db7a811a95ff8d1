"""Deploying a checked pair: ``spectool build`` writes a folder, ``spectool serve`` runs it.

Modules, one concept each: :mod:`~spectool.deploy.decision` (a tune decision as build and serve
read it), :mod:`~spectool.deploy.manifest` (what a build folder records),
:mod:`~spectool.deploy.build` (check, fit to the GPU, render and write a build folder),
:mod:`~spectool.deploy.machine` (does this machine match a build?),
:mod:`~spectool.deploy.gate` (the cost gate: serve with speculation or without),
:mod:`~spectool.deploy.launch` (the child command for a build folder) and
:mod:`~spectool.deploy.supervise` (run a server child: logs, readiness, signals, no orphans).
"""
