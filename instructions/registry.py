"""Every instruction kind's device half, found through the scheduler's registry.

``scheduler.kinds.KINDS`` names the module of each kind; that module declares the kind's
``DeviceKind`` (tile function, per-op kernel, torch reference, buffers) in its ``KINDS``. The
backends, the VM and compile_check read ``DEVICE_KINDS``; nothing else lists the kinds.
"""

from __future__ import annotations

import importlib

from scheduler.kinds import KINDS, Op

from .kind import DeviceKind


def _collect() -> dict[Op, DeviceKind]:
    found: dict[Op, DeviceKind] = {}
    for k in KINDS:
        module = importlib.import_module(f"{__package__}.{k.module}")
        for dk in getattr(module, "KINDS", ()):
            if dk.op == Op[k.name]:
                found[Op[k.name]] = dk
        if Op[k.name] not in found:
            raise ImportError(f"instructions.{k.module} declares no DeviceKind for {k.name} in its KINDS "
                              f"(scheduler.kinds says it lives there)")
    return found


DEVICE_KINDS: dict[Op, DeviceKind] = _collect()
