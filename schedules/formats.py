"""Identifiers of the file formats that cross from the runtime to the simulator.

``real.profile`` writes a cost file and ``sim.costs.profiled`` reads it; neither
imports the other (the runtime needs torch, the simulator must not), so the
contract lives here, below both. The trace format is :mod:`schedules.trace`.
"""

__all__ = ["PROFILE_SCHEMA"]

#: The ``schema`` field of a cost file; the layout is documented in :mod:`real.profile`.
PROFILE_SCHEMA = "schedlab.profile/1"
