"""Every converter, registered on first use (registering imports PyTensor); a user's own
registrations win over ours.
"""
from __future__ import annotations

from .registry import CONVERTERS
from .tensor import _register_tensor_ops
from .logp_ops import _register_pymc_ops
from .scan import _register_scan


_registered = False


def _ensure_registered():
    global _registered
    if not _registered:
        _register_all()
        _registered = True


def _register_all():
    """Fill CONVERTERS (imports PyTensor, hence done on first use); user registrations win."""
    user = dict(CONVERTERS)
    tb, st = _register_tensor_ops()
    _register_pymc_ops(tb, st)
    _register_scan()
    CONVERTERS.update(user)
