"""AutographError: every message names the variable, the user's file:line and the fix."""
from __future__ import annotations

import linecache


class AutographError(Exception):
  """A Python construct autograph cannot turn into lax control flow as written."""


def where(filename: str, lineno: int) -> str:
  line = linecache.getline(filename, lineno).strip()
  return f'{filename}:{lineno}' + (f'\n    {line}' if line else '')


def error(info: tuple, msg: str, fix: str) -> AutographError:
  """info is the static statement record the converter passes to every operator:
  (kind, filename, lineno, names, live, head, flags)."""
  return AutographError(f'{msg}\n  at {where(info[1], info[2])}\n  fix: {fix}')
