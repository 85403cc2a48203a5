"""The call agreement: before a collective call runs with a signature it has not run with before,
the ranks exchange what each called, and a difference raises :class:`IrisCallMismatchError` on
every rank.

A collective library (``iris.collectives``) describes each call by a *signature*: a hashable
tuple without addresses (the call, its op, root and config, each tensor's shape, dtype and, where
the peers reach it in place, its heap offset or registration) and the text of the call in the
caller's terms. :meth:`CallAgreement.agree`:

- a signature agreed before costs a dictionary lookup, and no exchange: identical programs miss
  in lockstep (a signature has no address, so a rank that passes a fresh tensor finds it
  too), and every rank's cache of agreed signatures holds the same ones, in the same order,
  because only an agreement (made by every rank at once) adds to it;
- a new one is exchanged with every rank: one allgather of ``(agreement number, text)``, a host
  collective that the watchdog bounds (``iris.runtime._host_waits``: a rank that never comes is
  named, and one that makes another host call at the same point, e.g. ``close()`` because it
  skipped the collective, ends the job at once). Equal on every rank: the signature is agreed
  and its *fingerprint* (31 bits of a CRC of the text, the same in every process) is returned
  for the device-side check of later calls (``iris.device._calls``); else every rank raises the
  same error, naming each rank's call.

The cache holds :data:`CAPACITY` signatures; past it all but the newest half go, on every rank
at the same agreement, and the hooks in :data:`FORGET_HOOKS` drop what was built on them (the launch
plans of ``iris.collectives.ccl``, which would otherwise let one rank skip an agreement that
another makes). ``IRIS_CHECK_CALLS=0`` (read at import) switches the agreement off.
"""

from __future__ import annotations

from iris.device import _calls as device_calls

from ._errors import IrisCallMismatchError

#: Signatures kept agreed per context (see the module docstring).
CAPACITY = 4096
#: Called with the context when agreed signatures are dropped (on every rank at once).
FORGET_HOOKS: list = []


def enabled() -> bool:
    """Whether the call agreement is on (``IRIS_CHECK_CALLS``, read at import)."""
    return bool(device_calls.CHECK_CALLS.value)


class CallAgreement:
    """The signatures the ranks of one context have agreed on, and the calls behind fingerprints."""

    def __init__(self, ctx):
        self._ctx = ctx
        self._agreed: dict = {}  # signature -> fingerprint, oldest first
        self._texts: dict[int, str] = {}  # fingerprint -> the call's text
        #: Agreements made (every rank counts the same).
        self.count = 0

    def __len__(self) -> int:
        return len(self._agreed)

    def agree(self, signature, describe, call: str, always: bool = False) -> int:
        """The fingerprint of the call whose signature is ``signature`` (``describe()`` gives its
        text), agreed with every rank first if it is new; ``call`` names the collective in
        messages. Collective when the signature is new, or on every call with ``always`` (for a
        collective whose next step is another host exchange, not a kernel whose check would find
        a rank that skipped the agreement: see ``iris.collectives.ccl.init_p2p``). Raises
        :class:`IrisCallMismatchError` on every rank when the ranks' calls differ."""
        try:
            fp = self._agreed.get(signature)
        except TypeError:  # an unhashable part (a bad option): agreed by the call's text
            signature = describe()
            fp = self._agreed.get(signature)
        if fp is not None and not always:
            return fp
        ctx = self._ctx
        text = describe()
        number = self.count + 1
        if ctx.world_size > 1:
            with ctx._host_waits.label(f"the agreement on {text} (agreement #{number})"):
                rows = ctx._boot.allgather((number, text))
            if any(row != rows[0] for row in rows):
                raise IrisCallMismatchError(mismatch_message(call, rows))
        self.count = number
        if fp is not None:  # agreed before (always): nothing new to keep
            return fp
        fp = device_calls.fingerprint(text)
        self._agreed[signature] = fp
        self._texts[fp] = text
        if len(self._agreed) > CAPACITY:
            self._forget_oldest()
        return fp

    def describe(self, fp: int) -> str | None:
        """The text of the agreed call whose fingerprint is ``fp``, or None."""
        return self._texts.get(fp)

    def _forget_oldest(self) -> None:
        for signature in list(self._agreed)[:len(self._agreed) - CAPACITY // 2]:  # the newest half stays
            del self._agreed[signature]
        live = set(self._agreed.values())
        self._texts = {fp: text for fp, text in self._texts.items() if fp in live}
        for hook in FORGET_HOOKS:
            hook(self._ctx)

    def device_mismatch(self, rank: int, peer: int, call: int, mine: int, theirs: int,
                        found: str = "found by its kernel") -> str:
        """The message for a mismatch found on the device side (``iris.device._calls``): call
        number ``call`` of ``rank`` had fingerprint ``mine``, ``peer``'s ``theirs``."""
        def named(fp: int) -> str:
            text = self.describe(fp)
            return text if text is not None else f"a call with fingerprint {fp:#x} (its own report names it)"

        return (f"iris: rank {rank} and rank {peer} made different collective calls (an IrisCallMismatchError; call "
                f"#{call} of the context, {found}: the calls were agreed before, so the host did not agree on them "
                f"again): rank {rank} called {named(mine)}; rank {peer} called {named(theirs)}. {FIX}")


#: The fix every mismatch message ends with.
FIX = ("Every rank must make the same collective calls, in the same order, with the same shapes, dtypes, op, root "
       "and config: change the call of the rank(s) that differ (IRIS_CHECK_CALLS=0 switches this check off)")


def mismatch_message(call: str, rows: list) -> str:
    """The error of an agreement whose ``rows`` (each rank's ``(agreement number, text)``) differ.
    A row of another shape is another host exchange that met this one (a rank in another
    collective call: ``Iris.allgather``, say), named as such."""
    groups: dict[tuple, list[int]] = {}
    for rank, row in enumerate(rows):
        agreement = isinstance(row, tuple) and len(row) == 2 and isinstance(row[0], int) and isinstance(row[1], str)
        groups.setdefault(tuple(row) if agreement else (None, f"{row!r}"[:200]), []).append(rank)
    parts = []
    for (number, text), ranks in groups.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        if number is None:
            parts.append(f"{who} made another host collective call, not the agreement of a collective call "
                         f"(it sent {text})")
        else:
            parts.append(f"{who} called {text} (agreement #{number})")
    return f"{call}: the ranks made different collective calls: {'; '.join(parts)}. {FIX}"
